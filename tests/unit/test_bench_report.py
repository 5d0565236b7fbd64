"""bench/report.py: the one percentile (nearest-rank) and the section writer every benchmark uses."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from bench.report import median, percentile, write_section


def test_percentile_is_nearest_rank() -> None:
    xs = [float(x) for x in range(100, 0, -1)]  # 1..100, unsorted
    assert percentile(xs, 0.99) == 99.0  # the second slowest of 100, not the slowest
    assert percentile(xs, 0.5) == 50.0
    assert percentile(xs, 1.0) == 100.0 and percentile(xs, 0.0) == 1.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0  # a measured value, not 2.5
    assert percentile([7.0], 0.95) == 7.0
    assert math.isnan(percentile([], 0.5))


def test_percentile_refuses_a_quantile_outside_0_1() -> None:
    with pytest.raises(ValueError, match="within"):
        percentile([1.0], 95)


def test_median_averages_the_two_middle_values() -> None:
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5 and median([3.0, 1.0, 2.0]) == 2.0


def test_write_section_replaces_only_its_own_section(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# B\n\n## One\n\nold one\n\n## Two\n\nkept\n")
    write_section("## One", "## One\n\nnew one\n", doc)
    assert doc.read_text() == "# B\n\n## One\n\nnew one\n## Two\n\nkept\n"
    write_section("## Three", "## Three\n\nadded\n", doc)
    assert doc.read_text().endswith("kept\n\n## Three\n\nadded\n")
