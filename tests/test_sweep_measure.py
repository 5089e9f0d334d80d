"""The sweep's task: the workload, PIP-393's formula and one measured row."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from spark_fixtures import assert_rows_agree

from pulsar_nack.index import TimeBucketIndex
from pulsar_nack.sweep.grid import GridPoint
from pulsar_nack.sweep.measure import COLUMNS, measure, pip393_bytes_per_id, workload
from pulsar_nack.sweep.workloads import Workload

# -- theory ------------------------------------------------------------------------------------------


def test_pip393_formula_matches_the_pip_and_the_blog() -> None:
    assert pip393_bytes_per_id(1024) == 4.0  # array containers, 4 B per id in PIP-393
    assert pip393_bytes_per_id(4096) == 2.0  # one 8 KiB bitset
    assert pip393_bytes_per_id(8192) == 1.0  # the blog's x=8, k=10
    assert pip393_bytes_per_id(50_000) == pytest.approx(0.16384)
    assert pip393_bytes_per_id(262_144) == pytest.approx(6 * 8192 / 262_144)  # ceil(M / 50,000) bitsets
    assert pip393_bytes_per_id(50_000 * 1000) == pytest.approx(0.16384)  # the blog's ≈0.163 B
    # A sparse tenth: a ledger holds 5,000 nacked ids, so a bucket of 8192 spans two bitsets.
    assert pip393_bytes_per_id(8192, 50_000, 0.1) == 2.0
    assert pip393_bytes_per_id(1000, 50_000, 0.1) == 4.0
    with pytest.raises(ValueError, match="ids_per_bucket"):
        pip393_bytes_per_id(0)


# -- workload ------------------------------------------------------------------------------------------


def test_unbatched_workload_is_the_blogs() -> None:
    point = GridPoint(x=4, k=6, n=5000, entries_per_ledger=1000, nack_share=0.3)
    due, ledgers, entries, batches = workload(point)
    expected = Workload(x=4, n=5000, entries_per_ledger=1000, nack_share=0.3).generate()
    for got, want in zip((due, ledgers, entries), expected, strict=True):
        np.testing.assert_array_equal(got, want)
    assert batches is None


def test_batched_workload_splits_the_message_stream_into_entries() -> None:
    due, ledgers, entries, batches = workload(GridPoint(x=2, n=24, entries_per_ledger=3, batch=4))
    assert batches is not None
    # Dense: entry e holds messages 4e..4e+3; a ledger holds 3 entries = 12 messages.
    assert entries.tolist() == [0] * 4 + [1] * 4 + [2] * 4 + [0] * 4 + [1] * 4 + [2] * 4
    assert batches.tolist() == [0, 1, 2, 3] * 6
    assert ledgers.tolist() == [10_000] * 12 + [10_001] * 12
    assert due.tolist() == (due[0] + np.arange(24) // 2).tolist()
    _, _, sparse_entries, sparse_batches = workload(GridPoint(n=3000, batch=4, nack_share=0.25))
    assert sparse_batches is not None and set(sparse_batches.tolist()) == {0, 1, 2, 3}
    messages = sparse_entries.astype(np.int64) * 4 + sparse_batches
    assert bool((np.diff(messages) > 0).all()), "a sparse subset of the stream, in order"
    assert 3000 * 4 * 0.8 < messages[-1] < 3000 * 4 * 1.2


# -- one row --------------------------------------------------------------------------------------------


def _measure(point: GridPoint) -> dict[str, Any]:
    """:func:`measure`, its cells typed loosely: the assertions below know which columns are numbers."""
    return measure(point)


def _check_types(row: dict[str, Any]) -> None:
    assert list(row) == list(COLUMNS)
    for name, kind in COLUMNS.items():
        assert row[name] is None or type(row[name]) is kind, (name, row[name])


def test_buckets_count_those_compaction_moved_to_the_packed_tier() -> None:
    """At k = 0 compact() moves the one-id buckets into the packed tier: the row still counts them (the
    buckets plot and the report's findings read this column)."""
    point = GridPoint(x=1, k=0, n=3_000)
    row = _measure(point)
    assert row["buckets"] == len(np.unique(workload(point)[0])) == 3_000


def test_index_row_counts_the_structure() -> None:
    point = GridPoint(x=8, k=10, n=20_000, compact=False)
    row = _measure(point)
    _check_types(row)
    due = workload(point)[0]
    assert row["buckets"] == len(np.unique(due >> 10))
    assert row["pending"] == 20_000 and row["ids_per_bucket"] == 8192
    # 8192 consecutive ids per bucket: one bitset container per (bucket, ledger), array containers for the
    # partial first and last buckets; nothing compacted.
    assert row["slots"] == row["bitmaps"] == row["buckets"] and row["packed_runs"] == 0
    assert row["bitset_containers"] >= 1 and row["run_containers"] == 0
    assert row["array_containers"] + row["bitset_containers"] == row["bitmaps"]
    assert row["retained_bytes"] == row["bytes_before_compact"] == row["python_bytes"] + row["roaring_bytes"]
    assert row["roaring_bytes"] >= 8192 * row["bitset_containers"]
    assert row["bytes_per_id"] == row["retained_bytes"] / 20_000
    assert row["theory_bytes_per_id"] == pip393_bytes_per_id(8192)
    assert row["memory_method"] == "memory_usage"
    assert row["build_ns_per_id"] > 0 and row["drain_ns_per_id"] > 0


def test_compaction_packs_dense_runs_and_sparse_ids_stay_in_arrays() -> None:
    dense = _measure(GridPoint(x=8, k=10, n=20_000))
    # no bitmap is left: CRoaring holds only what an empty index holds (the packed tier's membership bitmaps)
    empty = TimeBucketIndex().memory_usage().roaring_bytes
    assert dense["packed_runs"] == dense["slots"] and dense["bitmaps"] == 0
    assert dense["roaring_bytes"] == empty
    assert dense["retained_bytes"] < dense["bytes_before_compact"] / 5
    sparse = _measure(GridPoint(x=8, k=10, n=20_000, nack_share=0.1))
    assert sparse["packed_runs"] == 0 and sparse["array_containers"] > 0
    # A tenth of the entries, by SplitMix64: no runs worth having, compaction saves little.
    assert sparse["retained_bytes"] > 0.9 * sparse["bytes_before_compact"]
    assert sparse["theory_bytes_per_id"] == pip393_bytes_per_id(8192, 50_000, 0.1)


def test_theory_uses_the_filled_bucket_size() -> None:
    row = _measure(GridPoint(x=8, k=16, n=10_000))
    assert row["buckets"] <= 2
    assert row["theory_bytes_per_id"] == pip393_bytes_per_id(10_000)


def test_batched_ids_are_tracked_per_message() -> None:
    point = GridPoint(x=8, k=10, n=8_000, batch=4)
    row = _measure(point)
    _check_types(row)
    assert row["theory_bytes_per_id"] is None
    # 2,000 entries of 4 messages; an entry split across a bucket boundary is pending in both buckets.
    assert 2_000 <= row["pending"] <= 2_000 + row["buckets"]
    unbatched = _measure(replace(point, batch=1, n=2_000))
    assert row["retained_bytes"] > unbatched["retained_bytes"], "batch members cost memory"


def test_index_memory_agrees_with_the_heap_delta() -> None:
    # The delta is read right after building, before the walk and the compaction.
    for point in (GridPoint(x=1, k=4, n=20_000), GridPoint(x=8, k=10, n=20_000, nack_share=0.1)):
        row = _measure(point)
        assert row["bytes_before_compact"] > 40_000
        assert row["heap_delta_bytes"] == pytest.approx(row["bytes_before_compact"], rel=0.1)


def test_baselines_measured_by_heap_delta() -> None:
    hashmap = _measure(GridPoint(contender="hashmap", n=20_000))
    heap = _measure(GridPoint(contender="heap", n=20_000))
    for row in (hashmap, heap):
        _check_types(row)
        assert row["memory_method"] == "heap_in_use delta"
        assert row["retained_bytes"] == row["heap_delta_bytes"]
        assert row["pending"] == 20_000
        assert (
            row["buckets"] is None
            and row["theory_bytes_per_id"] is None
            and row["bytes_before_compact"] is None
        )
    # A dict entry, a 3-tuple and two or three ints per id; the heap is 24 B per triple plus spare capacity.
    assert 100 < hashmap["bytes_per_id"] < 400
    capacity = 2 ** math.ceil(math.log2(20_000))
    assert heap["retained_bytes"] == pytest.approx(24 * capacity, rel=0.02)


def test_rows_repeat() -> None:
    point = GridPoint(x=2, k=8, n=10_000, rounding="ceil")
    assert_rows_agree([measure(point)], [measure(point)])
