"""bench/nack_memory.py's grid points: each ends with at least the pending nacks the grid promises
(issue 23: every point at >= 100,000), none of its nacks come due by then."""

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
        # k = 12 at 10 s: floor rounding files a nack up to 4 s early (over the whole delay, the first
        # 1.7 s of nacks came due by the end)
        Point(1, 1, 1.0, 10, "fixed", 12),
        # 1 % nacked: how many are nacked is drawn at random
        Point(1_000, 1, 0.01, 10, "fixed", 0),
        Point(100, 10, 0.10, 60, "uniform", 8),
    ],
    ids=lambda point: point.name,
)
def test_a_grid_point_ends_with_at_least_the_pending_nacks_asked_for(point: Point) -> None:
    result = run_probe("default", point.workload(PENDING), lambda _done: None)
    assert PENDING <= result["pending"] <= 1.25 * PENDING
    assert result["forwards"] == 0  # nothing came due


def test_a_row_names_the_workload_the_estimate_is_fitted_to() -> None:
    """bench/fit_estimate.py fits the estimate to grid rows: the scenario it reads from a row is the
    workload that ran (its rate and duration), whose pending nacks are the ones measured."""
    from fit_estimate import scenario
    from nack_memory import measure

    row = measure(Point(1, 1, 1.0, 10, "fixed", 12), PENDING)
    assert scenario(row, PENDING).pending == pytest.approx(row["pending"], rel=0.05)
