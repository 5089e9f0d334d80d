"""TimeBucketIndex: behaviours the official clients assert, bad input, compaction, memory, threads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import NotRequired, TypedDict

import numpy as np
import pytest

from pulsar_nack import TimeBucketIndex
from pulsar_nack.index import MAX_ENTRY_ID
from pulsar_nack.memory import MEASURING_ENV


def drain(index: TimeBucketIndex, now: int) -> dict[tuple[str, int, int], tuple[int, ...] | None]:
    return {
        (d.topic, d.ledger_id, e): d.batch_indexes.get(e)
        for d in index.pop_due(now)
        for e in d.entry_ids.tolist()
    }


def test_batch_ids_in_one_bucket_count_as_one_entry() -> None:
    """Java J3: (3,1,0,0), (3,1,0,1), (3,1,0,2) nacked together are one pending entry."""
    index = TimeBucketIndex()
    for batch_index in range(3):
        index.add(10_000, 3, 1, batch_index)
    assert len(index) == 1 and index.bucket_count == 1
    assert drain(index, 10_000) == {("", 3, 1): (0, 1, 2)}


def test_go_batch_indexes_and_another_entry_make_two_entries() -> None:
    """Go: batch indexes 1, 2, 3 of entry (1,1) plus entry (2,2) -> exactly 2 entries redelivered."""
    index = TimeBucketIndex()
    for batch_index in (1, 2, 3):
        index.add(500, 1, 1, batch_index)
    index.add(500, 2, 2)
    assert len(index) == 2
    assert drain(index, 500) == {("", 1, 1): (1, 2, 3), ("", 2, 2): None}


def test_pip393_headline_batch_nacks_stay_apart() -> None:
    """J4: msg0 nacked at 0, msg1 of the same batch at 2000, delay 3000: msg0 due at ~3000, msg1 ~5000."""
    index = TimeBucketIndex(precision_bits=8)
    index.add(0 + 3_000, 7, 4, batch_index=0)
    index.add(2_000 + 3_000, 7, 4, batch_index=1)
    assert index.due_of(7, 4, 0) == index.bucket_of(3_000)
    assert index.due_of(7, 4, 1) == index.bucket_of(5_000)
    assert drain(index, 3_000) == {("", 7, 4): (0,)}, "the second nack must not push msg0 back"
    assert index.due_of(7, 4, 1) == index.bucket_of(5_000), "popping msg0 must not drop msg1"
    assert drain(index, 4_999 - 256) == {}
    assert drain(index, 5_000) == {("", 7, 4): (1,)}
    assert len(index) == 0


def test_renack_keeps_the_earliest_due_time() -> None:
    index = TimeBucketIndex(precision_bits=0)
    index.add(1_000, 1, 5)
    index.add(9_000, 1, 5)  # later: no effect
    assert index.due_of(1, 5) == 1_000 and len(index) == 1
    index.add(500, 1, 5)  # earlier: moves it
    assert index.due_of(1, 5) == 500 and len(index) == 1 and index.bucket_count == 1
    assert drain(index, 10_000) == {("", 1, 5): None}


def test_topics_keep_ledgers_apart() -> None:
    index = TimeBucketIndex()
    index.add(100, 1, 1, topic="persistent://t/a-partition-0")
    index.add(100, 1, 1, topic="persistent://t/a-partition-1")
    index.add(100, 1, 1)
    assert len(index) == 3
    assert set(drain(index, 100)) == {
        ("persistent://t/a-partition-0", 1, 1),
        ("persistent://t/a-partition-1", 1, 1),
        ("", 1, 1),
    }


def test_due_of_and_remove() -> None:
    index = TimeBucketIndex(precision_bits=4)
    index.add(1_000, 2, 3)
    index.add(2_000, 2, 4)
    index.add(3_000, 2, 6, batch_index=1)
    assert index.due_of(2, 3) == 992 and index.due_of(2, 4) == 2_000 and index.due_of(2, 5) is None
    assert index.due_of(2, 6, 0) is None and index.due_of(2, 6, 1) == 2_992 and index.due_of(2, 6) == 2_992
    assert index.due_of(9, 3) is None
    assert index.remove(2, 3) and not index.remove(2, 3)
    assert not index.remove(2, 6, 0) and index.remove(2, 6, 1)
    assert len(index) == 1 and index.bucket_count == 1
    assert drain(index, 10_000) == {("", 2, 4): None}


@pytest.mark.parametrize("rounding", ["floor", "ceil"])
@pytest.mark.parametrize("k", [0, 1, 5, 8, 12])
def test_ids_come_out_within_their_bucket(rounding: str, k: int) -> None:
    """floor: never later than due, at most 2**k - 1 early; ceil: never early, at most 2**k - 1 late."""
    rng = np.random.default_rng(k)
    due = rng.integers(10_000, 60_000, 2_000)
    index = TimeBucketIndex(k, rounding)  # type: ignore[arg-type]
    index.add_many(due, 1, np.arange(2_000))
    popped_at: dict[int, int] = {}
    now = 0
    while len(index):
        next_due = index.next_due_ms()
        assert next_due is not None
        now = next_due
        for d in index.pop_due(now):
            popped_at.update(dict.fromkeys(d.entry_ids.tolist(), now))
    width = 1 << k
    for entry, at in popped_at.items():
        if rounding == "floor":
            assert due[entry] - width < at <= due[entry]
        else:
            assert due[entry] <= at < due[entry] + width
    assert len(popped_at) == 2_000


def test_add_many_equals_scalar_adds_in_any_order() -> None:
    rng = np.random.default_rng(3)
    n = 5_000
    due = rng.integers(0, 20_000, n)
    ledgers = rng.integers(100, 104, n)
    entries = rng.integers(0, 3_000, n)
    scalar, bulk = TimeBucketIndex(6), TimeBucketIndex(6)
    for d, led, e in zip(due.tolist(), ledgers.tolist(), entries.tolist(), strict=True):
        scalar.add(d, led, e)
    bulk.add_many(due, ledgers, entries)  # unsorted input: sorted internally
    assert len(scalar) == len(bulk) and scalar.bucket_count == bulk.bucket_count
    assert sorted((b, t, led, e.tolist()) for b, t, led, e in scalar) == sorted(
        (b, t, led, e.tolist()) for b, t, led, e in bulk
    )


def test_compaction_keeps_content_and_accepts_new_ids() -> None:
    index = TimeBucketIndex(precision_bits=10)
    index.add_many(
        np.arange(100_000) // 8 + 1_000_000, 10 + np.arange(100_000) // 50_000, np.arange(100_000) % 50_000
    )
    before = [(b, led, e.tolist()) for b, _, led, e in index]
    heavy = index.memory_usage().total_bytes
    index.compact()  # add_many left every bucket cold
    assert [(b, led, e.tolist()) for b, _, led, e in index] == before
    assert index.memory_usage().total_bytes < heavy / 10
    first_bucket = before[0][0]
    index.add(first_bucket, 10, 60_000)  # into a compacted run: thawed and extended
    index.add(first_bucket, 10, 3)  # already there
    assert index.due_of(10, 60_000) == first_bucket and len(index) == 100_001


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((-1, 1, 1), ValueError, "due_ms"),
        ((1.5, 1, 1), TypeError, "due_ms"),
        ((1, -1, 1), ValueError, "ledger_id"),
        ((1, 1.0, 1), TypeError, "ledger_id"),
        ((1, 1, -1), ValueError, "entry_id"),
        ((1, 1, MAX_ENTRY_ID + 1), ValueError, "entry_id"),
        ((1, 1, 2.5), TypeError, "entry_id"),
        ((1, 1, True), TypeError, "entry_id"),
        ((1, 1, 1, -2), ValueError, "batch_index"),
        ((1, 1, 1, 0.5), TypeError, "batch_index"),
        ((1, 1, 1, -1, b"topic"), TypeError, "topic"),
    ],
)
def test_bad_input_names_the_parameter_and_changes_nothing(
    args: tuple[object, ...], error: type[Exception], message: str
) -> None:
    index = TimeBucketIndex()
    index.add(5, 1, 1)
    with pytest.raises(error, match=message):
        index.add(*args)  # type: ignore[arg-type]
    assert len(index) == 1 and index.bucket_count == 1 and next(iter(index))[3].tolist() == [1]


class _AddManyArgs(TypedDict):
    """The array-like arguments of :meth:`TimeBucketIndex.add_many` (all typed ``Any`` there)."""

    due_ms: Sequence[object]
    ledger_ids: Sequence[object]
    entry_ids: Sequence[object]
    batch_indexes: NotRequired[Sequence[object]]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"due_ms": [1, 2], "ledger_ids": [1], "entry_ids": [1, 2, 3]}, "equal lengths"),
        ({"due_ms": [-1], "ledger_ids": [1], "entry_ids": [1]}, "due_ms"),
        ({"due_ms": [1], "ledger_ids": [1], "entry_ids": [2**32]}, "entry_ids"),
        ({"due_ms": [1.5], "ledger_ids": [1], "entry_ids": [1]}, "due_ms"),
        ({"due_ms": [1], "ledger_ids": [1], "entry_ids": [1], "batch_indexes": [-3]}, "batch_indexes"),
        ({"due_ms": [[1]], "ledger_ids": [1], "entry_ids": [1]}, "one-dimensional"),
    ],
)
def test_add_many_validates_before_changing_anything(kwargs: _AddManyArgs, message: str) -> None:
    index = TimeBucketIndex()
    index.add(5, 1, 1)
    with pytest.raises((ValueError, TypeError), match=message):
        index.add_many(**kwargs)
    assert len(index) == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"precision_bits": -1}, "precision_bits"),
        ({"precision_bits": 31}, "precision_bits"),
        ({"rounding": "nearest"}, "rounding"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TimeBucketIndex(**kwargs)  # type: ignore[arg-type]


def test_concurrent_adds_and_pops_lose_nothing() -> None:
    index = TimeBucketIndex(precision_bits=3)
    popped: list[tuple[int, int]] = []
    stop = threading.Event()

    def nacker(ledger: int) -> None:
        for entry in range(20_000):
            index.add(entry // 10, ledger, entry)

    def timer() -> None:
        while not stop.is_set() or len(index):
            popped.extend(
                (d.ledger_id, e)
                for d in index.pop_due(10**9 if stop.is_set() else 1_000)
                for e in d.entry_ids.tolist()
            )

    threads = [threading.Thread(target=nacker, args=(ledger,)) for ledger in (1, 2, 3)]
    popper = threading.Thread(target=timer)
    popper.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    stop.set()
    popper.join(60)
    assert sorted(popped) == [(ledger, e) for ledger in (1, 2, 3) for e in range(20_000)]


_FRESH_PROCESS = """
import gc, json, sys
from pulsar_nack import TimeBucketIndex
from pulsar_nack.memory import heap_in_use
from pulsar_nack.sweep.workloads import Workload
x, k, share, compact, n = json.loads(sys.argv[1])
due, ledgers, entries = Workload(x=x, n=n, nack_share=share).generate()
warm_up = TimeBucketIndex(k)  # first-use allocations of numpy/pyroaring/sortedcontainers are not the index's
warm_up.add_many(due[:1000], ledgers[:1000], entries[:1000]); warm_up.compact(); warm_up.memory_usage()
del warm_up
gc.collect(); before = heap_in_use()
index = TimeBucketIndex(k)
index.add_many(due, ledgers, entries)
if compact:
    index.compact()
gc.collect(); outside = heap_in_use() - before
print(json.dumps({"outside": outside, "inside": index.memory_usage().total_bytes}))
"""


@pytest.mark.parametrize(
    ("x", "k", "share", "compact", "n"),
    [
        (1, 10, 1.0, False, 1_000_000),
        (1, 10, 1.0, True, 1_000_000),
        (8, 10, 0.1, False, 1_000_000),
        (1, 8, 1.0, True, 1_000_000),
        (8, 15, 1.0, True, 10_000_000),  # ~60 KB: at 1M ids the whole index is ~8 KB, below the noise
    ],
)
def test_memory_usage_matches_what_a_fresh_process_retains(
    x: int, k: int, share: float, compact: bool, n: int
) -> None:
    """memory_usage() (walked from inside) within ±20 % of the heap retained, measured from outside."""
    out = subprocess.run(
        [sys.executable, "-c", _FRESH_PROCESS, json.dumps([x, k, share, compact, n])],
        env={**os.environ, **MEASURING_ENV},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    figures = json.loads(out.stdout)
    assert figures["outside"] > 0
    assert abs(figures["inside"] - figures["outside"]) <= 0.2 * figures["outside"], figures


def test_memory_usage_reports_roaring_heap_not_serialized_size() -> None:
    index = TimeBucketIndex()
    index.add(1, 1, 1)
    usage = index.memory_usage()
    assert usage.roaring_bytes >= 100, "one bitmap holds ~150 B of CRoaring heap (24 B serialized)"
    assert usage.total_bytes == usage.python_bytes + usage.roaring_bytes
    assert usage.bytes_per_entry == usage.total_bytes


@pytest.mark.parametrize("batch_index", [0, 99, 1023, 1024, 5000])
def test_batch_members_of_any_index_round_trip(batch_index: int) -> None:
    """Batch indexes below 1024 share a Roaring bitmap, larger ones a dict: both come back alike."""
    index = TimeBucketIndex(0)
    index.add(10, 1, 7, batch_index)
    index.add(10, 1, 7, 3)
    index.add(10, 1, 8, batch_index)
    assert index.pending_mask(1, 7) == 1 << batch_index | 1 << 3
    assert index.due_of(1, 8, batch_index) == 10 and index.due_of(1, 8, 3) is None
    assert index.remove(1, 7, 3) and index.pending_mask(1, 7) == 1 << batch_index
    (due,) = index.pop_due(10)
    assert due.batch_indexes == {7: (batch_index,), 8: (batch_index,)}
