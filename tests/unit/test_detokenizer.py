from __future__ import annotations

from sluicegate.engine.detokenizer import IncrementalDetokenizer, StopMatcher, decode_all


def byte_tokens(text: str) -> list[int]:
    return list(text.encode())


def tb(t: int) -> bytes:
    return bytes([t])


def test_split_multibyte_characters_never_become_replacement_chars() -> None:
    text = "é東🐱 ok"
    d = IncrementalDetokenizer(tb)
    pieces = [d.push(t) for t in byte_tokens(text)] + [d.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    # the first byte of a 4-byte emoji releases nothing yet
    d2 = IncrementalDetokenizer(tb)
    assert d2.push("🐱".encode()[0]) == ""


def test_invalid_bytes_are_replaced_not_raised() -> None:
    d = IncrementalDetokenizer(tb)
    assert d.push(0xFF) == "\ufffd"
    assert decode_all(tb, [0x61, 0xFF]) == "a\ufffd"


def test_stop_matcher_holds_back_possible_prefix_and_cuts_at_match() -> None:
    m = StopMatcher(["END"])
    assert m.feed("hello E") == "hello "
    assert m.feed("N") == ""
    assert m.feed("Dtail") == ""
    assert m.matched == "END"
    assert m.flush() == ""


def test_stop_matcher_releases_held_text_when_it_is_not_a_stop() -> None:
    m = StopMatcher(["END"])
    assert m.feed("E") == ""
    assert m.feed("X") == "EX"
    assert m.feed("EN") == ""
    assert m.flush() == "EN"
    assert m.matched is None


def test_the_stop_completed_first_wins_whatever_the_chunking() -> None:
    whole = StopMatcher(["b", "abc"])
    assert whole.feed("xabc") == "xa"
    assert whole.matched == "b"
    pieces = StopMatcher(["b", "abc"])
    assert "".join(pieces.feed(ch) for ch in "xabc") == "xa"
    assert pieces.matched == "b"
