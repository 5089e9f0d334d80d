"""bench/nack_memory.py's grid points: each asks for enough messages that the nacks pending at the end
reach the count the grid promises (issue 23: every point at >= 100,000), whatever came due by then."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pulsar_nack.profile import run_probe

# bench/ is a directory of scripts that import each other by name, as `python bench/x.py` lets them.
sys.path.append(str(Path(__file__).resolve().parent.parent / "bench"))

from nack_memory import Point

PENDING = 2_000


@pytest.mark.parametrize(
    "point",
    [
        # k = 12 at 10 s: floor rounding puts the first ~1.7 s of nacks in a bucket the last flush takes
        Point(1, 1, 1.0, 10, "fixed", 12),
        # 1 % nacked: how many are nacked is drawn at random
        Point(1_000, 1, 0.01, 10, "fixed", 0),
        Point(100, 10, 0.10, 60, "uniform", 8),
    ],
    ids=lambda point: point.name,
)
def test_a_grid_point_ends_with_at_least_the_pending_nacks_asked_for(point: Point) -> None:
    result = run_probe("malloc", point.workload(PENDING), lambda _done: None)
    assert PENDING <= result["pending"] <= 1.8 * PENDING
