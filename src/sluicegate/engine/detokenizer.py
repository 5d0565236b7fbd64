"""Incremental UTF-8 detokenisation and stop-string holdback.

Tokens carry bytes, and a character may be split across tokens: the decoder keeps an incomplete sequence
until the next token completes it, so a split character never becomes two U+FFFD. Text that could still be
the start of a stop string is held back until it is known not to be one.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence


class IncrementalDetokenizer:
    def __init__(self, token_bytes: Callable[[int], bytes]) -> None:
        self._token_bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._decoder.decode(self._token_bytes(token_id))

    def flush(self) -> str:
        """The sequence ended. Bytes still held are the start of a character that never came (a length limit
        cut it): they are dropped, not shown as U+FFFD; they stay in the token ids."""
        self._decoder.reset()
        return ""


def decode_all(token_bytes: Callable[[int], bytes], token_ids: Sequence[int]) -> str:
    return b"".join(token_bytes(t) for t in token_ids).decode("utf-8", errors="replace")


class StopMatcher:
    """Feeds text in, releases what is safe to show, and reports a stop-string match.

    After a match, the released text ends just before the stop string; nothing after it is ever released.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._pending = ""
        self.matched: str | None = None

    def feed(self, text: str) -> str:
        if self.matched is not None:
            return ""
        if not self._stops:
            return text
        buf = self._pending + text
        # The match that completes first wins (then the one starting first), as if fed one character at a
        # time: so the result does not depend on how the text was cut into tokens.
        first = min(((buf.find(s) + len(s), buf.find(s), s) for s in self._stops if s in buf), default=None)
        if first is not None:
            _, idx, stop = first
            self.matched = stop
            self._pending = ""
            return buf[:idx]
        hold = 0
        for s in self._stops:
            for k in range(min(len(s) - 1, len(buf)), 0, -1):
                if buf.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        self._pending = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold]

    def flush(self) -> str:
        out, self._pending = self._pending, ""
        return "" if self.matched is not None else out
