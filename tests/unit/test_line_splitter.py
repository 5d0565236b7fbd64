"""Lines out of arbitrary chunks, holding at most `max_line` bytes: a longer line comes out as None."""

from __future__ import annotations

import pytest

from sluicegate.jobs.files import LineSplitter


def split(data: bytes, size: int, max_line: int = 8) -> list[bytes | None]:
    s = LineSplitter(max_line)
    out: list[bytes | None] = []
    for i in range(0, len(data), size):
        out += s.feed(data[i:i + size])
    return out + s.end()


@pytest.mark.parametrize("size", [1, 2, 3, 5, 100])
def test_any_chunking_gives_the_same_lines(size: int) -> None:
    data = b"a\r\n\nbb\n0123456789abc\nccc\n" + b"x" * 30 + b"\nlast"
    assert split(data, size) == [b"a", b"", b"bb", None, b"ccc", None, b"last"]


def test_a_long_line_is_never_held() -> None:
    s = LineSplitter(8)
    assert s.feed(b"y" * 9) == [None]
    for _ in range(100):
        assert s.feed(b"y" * 1000) == []
        assert len(s._rest) == 0
    assert s.feed(b"y\nok\n") == [b"ok"]
    assert s.end() == []
