"""Helpers of the sweep tests: the session's one SparkSession and a comparison of measured rows.

conftest.py loads this module as a plugin, so any test can ask for ``spark`` and ``spark_rows``; being
session-scoped, they start one JVM and measure the ``small`` grid once for the whole test session.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from pulsar_nack.sweep.grid import load_grid
from pulsar_nack.sweep.measure import MEMORY_COLUMNS, TIMING_COLUMNS

#: The ``small`` grid: a dozen quick points that touch every axis.
SMALL = load_grid("small")

#: How far two measurements of the same memory may differ (see MEMORY_COLUMNS): the index's walk by
#: allocator rounding (tens of bytes), a heap delta also by what else the process allocated meanwhile —
#: notably the first build in a fresh Python worker, which also fills interpreter caches despite the
#: warm-up: 54.6 KB against 50.0 KB for the next 30 builds of x=8, k=8 in one process, and once 60.7 KB in
#: a Spark worker against 49.3 KB in-process, and with the shared-bitmap index 110.5 KB against 93.8 KB at
#: x=1, k=8, and on CI (2026-11-29) 127.6 KB against 101.3 KB there (hence 32 KiB, not 8). Neither
#: process turns glibc's tcache off (MEASURING_ENV), so freed chunks it keeps count too. The baselines'
#: heap deltas are megabytes, where the 5 % applies; the index's structure columns compare exactly and
#: its walk within WALK_TOLERANCE.
WALK_TOLERANCE = (1024, 0.02)
HEAP_DELTA_TOLERANCE = (32768, 0.05)


@pytest.fixture(scope="session", name="spark")
def spark_fixture() -> Iterator[Any]:
    """A light local[2] SparkSession for the whole test session (started on first use)."""
    from pulsar_nack.sweep.spark import spark_session

    with spark_session("local[2]") as session:
        yield session


@pytest.fixture(scope="session", name="spark_rows")
def spark_rows_fixture(spark: Any) -> list[dict[str, Any]]:
    """The rows of the ``small`` grid, measured once on the session's Spark."""
    from pulsar_nack.sweep.spark import sweep

    return sweep(spark, SMALL, progress=False)


def assert_rows_agree(got: Sequence[dict[str, Any]], want: Sequence[dict[str, Any]]) -> None:
    """Rows of the same points agree: every column exactly, except timings (ignored) and memory (within
    the tolerances above; ``bytes_per_id`` follows ``retained_bytes``)."""
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert list(a) == list(b)
        exact = {name for name in a if name not in MEMORY_COLUMNS | TIMING_COLUMNS}
        assert {name: a[name] for name in exact} == {name: b[name] for name in exact}
        for name in MEMORY_COLUMNS - {"bytes_per_id"}:
            if a[name] is None or b[name] is None:
                assert a[name] is b[name], name
                continue
            from_heap = name == "heap_delta_bytes" or (
                name == "retained_bytes" and a["memory_method"] != "memory_usage"
            )
            absolute, share = HEAP_DELTA_TOLERANCE if from_heap else WALK_TOLERANCE
            allowed = max(absolute, share * abs(b[name]))
            assert abs(a[name] - b[name]) <= allowed, (a["contender"], a["x"], a["k"], name, a[name], b[name])
