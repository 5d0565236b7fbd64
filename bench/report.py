"""What every benchmark reports with: one percentile, one median, and one writer of docs/benchmarks.md sections.

Percentiles are nearest-rank: `percentile(xs, q)` is the smallest measured value with at least a fraction `q`
of the measurements at or below it, `sorted(xs)[ceil(q * n) - 1]` (the first value for q = 0). It is always a
value that was measured (no interpolation), so a p99 over 100 requests is the 99th slowest, not a blend of the
two slowest. `median` is the middle value (the mean of the two middle ones for an even count), as
`statistics.median`. docs/benchmarks.md, "Method", says the same.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

BENCHMARKS_MD = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def percentile(xs: list[float], q: float) -> float:
    """The nearest-rank q-quantile of `xs` (0 <= q <= 1); NaN for no measurements."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be within [0, 1], got {q}")
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def median(xs: list[float]) -> float:
    """The middle value; the mean of the two middle values for an even count."""
    return float(statistics.median(xs))


def write_section(heading: str, text: str, path: Path = BENCHMARKS_MD) -> None:
    """Replace the docs/benchmarks.md section that starts with `heading` by `text` (append it when absent)."""
    old = path.read_text()
    start = old.find(heading)
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + text
    else:
        nxt = old.find("\n## ", start + len(heading))
        new = old[:start] + text + ("" if nxt < 0 else old[nxt + 1:])
    path.write_text(new.rstrip("\n") + "\n")


def publish(heading: str, text: str, write: bool) -> None:
    """Print a benchmark's markdown; with `write`, also replace its section in docs/benchmarks.md."""
    print(text)
    if write:
        write_section(heading, text)
