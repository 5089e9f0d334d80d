"""The index's packed tier (pulsar_nack/packed.py): its two code layouts answer alike."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pulsar_nack.lowlevel import DueIds, TimeBucketIndex
from pulsar_nack.packed import _ORDINAL_SHIFT, _SLOT_BITS, _SMALL_POP, PackedStore

WIDE = 1 << 22  # entry ids from here on do not fit a run's split (uint16 + uint32) codes


def _timeline(index: TimeBucketIndex, offset: int) -> list[object]:
    """Lookups, removals and pops of an index in a fixed order, entry ids shifted back by ``offset``."""
    seen: list[object] = []
    for entry in range(0, 80, 7):
        seen.append(index.due_of(1, entry + offset, 2, "t"))
        seen.append(index.take(2, entry + offset, -1, "t"))
        seen.append(index.remove(1, entry + offset, 3, "t"))
    for now in range(1_000, 45_000, 2_500):
        seen.append(
            sorted(
                (
                    d.topic,
                    d.ledger_id,
                    [e - offset for e in d.entry_ids.tolist()],
                    sorted((e - offset, m) for e, m in d.batch_indexes.items()),
                )
                for d in index.pop_due(now)
            )
        )
        seen.append((len(index), index.bucket_count, index.next_due_ms()))
    return seen


def _built(offset: int) -> TimeBucketIndex:
    rng = random.Random(23)
    index = TimeBucketIndex(precision_bits=8)
    for entry, batch_index in rng.sample([(e, i) for e in range(80) for i in (-1, *range(8))], 300):
        due = rng.randrange(1_000, 40_000)
        index.add(due, 1, entry + offset, batch_index, "t")
        index.add(due + 700, 2, entry + offset, batch_index, "t")
    assert index.compact() > 0
    return index


@pytest.mark.parametrize("offset", [WIDE, 1 << 31])
def test_runs_of_entry_ids_too_large_to_split_answer_as_split_ones(offset: int) -> None:
    """A run keeps its codes split (6 bytes a row) when every entry id is below 2^22 and whole (8 bytes)
    otherwise: the same pending ids, parts, removals and pops either way."""
    narrow, wide = _built(0), _built(offset)
    layouts = []
    for index in (narrow, wide):
        store = index._packed  # (which layout the runs took: the comparison must cover both)
        assert isinstance(store, PackedStore) and len(store) > 100
        layouts.append({run.high is None for run in store._runs})
    assert layouts == [{False}, {True}]
    assert _timeline(narrow, 0) == _timeline(wide, offset)


def _group(ids: DueIds) -> tuple[object, ...]:
    return ids.topic, ids.ledger_id, ids.entry_ids.tolist(), sorted(ids.batch_indexes.items())


@pytest.mark.parametrize("step", [2_500, 45_000])
def test_a_pop_by_bucket_is_a_pop_of_each_due_bucket_in_turn(step: int) -> None:
    """``pop_due_by_bucket`` over the packed tier — a few due rows a pop (its plain-Python path) or all
    of them at once (hundreds: numpy) — returns what ``pop_due`` of each due bucket in turn does, each
    group labelled with its bucket, in bucket order."""
    grouped, stepped = _built(0), _built(0)
    store = grouped._packed
    assert isinstance(store, PackedStore) and len(store) > _SMALL_POP
    for now in [*range(1_000, 45_000, step), 45_000]:
        expected = []
        while (bucket := stepped.next_due_ms()) is not None and bucket <= now:
            expected += [(bucket, _group(ids)) for ids in stepped.pop_due(bucket)]
        got = [(bucket, _group(ids)) for bucket, ids in grouped.pop_due_by_bucket(now)]
        assert [bucket for bucket, _ in got] == sorted(bucket for bucket, _ in got)
        assert sorted(got) == sorted(expected)
    assert len(grouped) == len(stepped) == 0


def test_both_paths_of_a_pop_by_bucket_group_rows_alike() -> None:
    """The packed tier's pop by bucket groups its rows in plain Python (a few due rows) or numpy (many):
    per (bucket, ledger), an entry due whole there comes whole even beside rows of some of its messages
    (rows of one bucket packed at two compactions), others with their due batch indexes."""
    store = _built(0)._packed
    assert isinstance(store, PackedStore)
    ordinal = store._registry.ordinals[("t", 1)]

    def row(entry_id: int, batch_index: int) -> int:
        return ordinal << _ORDINAL_SHIFT | entry_id << _SLOT_BITS | batch_index + 1

    rows = [(5, row(3, -1)), (5, row(3, 1)), (5, row(4, 0)), (5, row(4, 2)), (5, row(4, 2)), (6, row(3, 0))]
    times, codes = [t for t, _ in rows], [c for _, c in rows]
    plain = store._small_by_bucket(times, codes)
    vectors = store._by_bucket(np.array(times, np.uint32), np.array(codes, np.uint64))
    origin, k = store._origin, store._k
    expected = [
        (origin + (5 << k), ("t", 1), [3, 4], {4: (0, 2)}),
        (origin + (6 << k), ("t", 1), [3], {3: (0,)}),
    ]
    for groups in (plain, vectors):
        assert [
            (bucket, key, entries.tolist(), partial) for bucket, key, entries, partial in groups
        ] == expected


@pytest.mark.parametrize("spread_ms", [60_000, 200_000, 3_600_000])
def test_runs_keep_offsets_in_two_bytes_whatever_they_span(spread_ms: int) -> None:
    """A run keeps its bucket offsets in 2 bytes each: relative to its first, the high bits once a page
    of 65,536 buckets when it spans more — either way every id comes out once, at the first pop at or
    after its due time (k = 0: a bucket a ms)."""
    rng = random.Random(5)
    index = TimeBucketIndex(precision_bits=0)
    due_of = {}
    for entry in range(3_000):
        due, ledger = 50_000 + rng.randrange(spread_ms), rng.randrange(40)
        index.add(due, ledger, entry, -1, "t")
        due_of[ledger, entry] = due
    assert index.compact() > 0
    store = index._packed
    assert isinstance(store, PackedStore) and len(store) > 2_000  # (most rows are the packed tier's)
    pages = [0 if run.offsets.page_starts is None else len(run.offsets.page_starts) for run in store._runs]
    if spread_ms < 65_536:
        assert max(pages) == 0
    else:
        assert max(pages) > 1
    assert {run.offsets.low.dtype.itemsize for run in store._runs} == {2}
    popped: dict[tuple[int, int], int] = {}
    previous = 0
    steps = list(range(40_000, 50_000 + spread_ms, max(6_007, spread_ms // 40)))
    for now in [*steps, 50_000 + spread_ms]:
        for ids in index.pop_due(now):
            for entry in ids.entry_ids.tolist():
                key = (ids.ledger_id, entry)
                assert key not in popped and previous < due_of[key] <= now
                popped[key] = now
        previous = now
    assert popped.keys() == due_of.keys() and len(index) == 0


def test_a_pop_between_two_distant_clusters_takes_the_first_whole() -> None:
    """Two clusters of due times 400 s apart (k = 0: pages of 65,536 buckets with none between): a pop
    whose limit falls in the empty pages takes the first cluster whole and nothing of the second."""
    rng = random.Random(7)
    index = TimeBucketIndex(precision_bits=0)
    due_of = {}
    for entry in range(2_000):
        due = 50_000 + rng.randrange(10_000) + (400_000 if entry % 2 else 0)
        index.add(due, entry % 30, entry, -1, "t")
        due_of[entry % 30, entry] = due
    assert index.compact() > 0
    # a limit 2 pages + 100 buckets past the first cluster's start: its low bits (100) lie inside the
    # first cluster's span, so a bisect of the wrong page's low bits would stop inside it
    popped = {
        (d.ledger_id, e) for d in index.pop_due(50_000 + 2 * 65_536 + 100) for e in d.entry_ids.tolist()
    }
    assert popped == {key for key, due in due_of.items() if due < 100_000}
