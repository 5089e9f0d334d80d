"""The baselines behave like trackers: every id comes back once, at or after its due time."""

from __future__ import annotations

import numpy as np
import pytest

from pulsar_nack.sweep.baselines import HashMapTracker, TripleLongHeap

TRACKERS = [HashMapTracker, TripleLongHeap]


@pytest.mark.parametrize("tracker_type", TRACKERS)
def test_scalar_and_bulk_adds_come_back_once_in_time(tracker_type: type) -> None:
    rng = np.random.default_rng(7)
    due = rng.integers(0, 1_000, 500)
    ledgers = rng.integers(1, 4, 500)
    entries = np.arange(500)
    tracker = tracker_type()
    tracker.add_many(due[:250], ledgers[:250], entries[:250])
    for d, led, e in zip(due[250:].tolist(), ledgers[250:].tolist(), entries[250:].tolist(), strict=True):
        tracker.add(d, led, e)
    assert len(tracker) == 500
    assert tracker.next_due_ms() == int(due.min())
    expected = {(int(led), int(e)): int(d) for d, led, e in zip(due, ledgers, entries, strict=True)}
    seen: set[tuple[int, int]] = set()
    for now in range(0, 1_001, 50):
        for due_ids in tracker.pop_due(now):
            for entry in due_ids.entry_ids.tolist():
                key = (due_ids.ledger_id, entry)
                assert key not in seen
                assert expected[key] <= now, "never early"
                assert expected[key] > now - 50, "popped at the first pop after its due time"
                seen.add(key)
    assert seen == set(expected) and len(tracker) == 0


def test_heap_stays_a_heap_after_unordered_bulk_adds() -> None:
    heap = TripleLongHeap()
    heap.add_many([5, 6, 7], [1, 1, 1], [0, 1, 2])
    heap.add_many([1, 9], [2, 2], [0, 1])  # earlier than the heap's largest: must re-heapify
    heap.add(3, 3, 0)
    order = []
    for now in range(0, 10):
        order += [(now, d.ledger_id, e) for d in heap.pop_due(now) for e in d.entry_ids.tolist()]
    assert order == [(1, 2, 0), (3, 3, 0), (5, 1, 0), (6, 1, 1), (7, 1, 2), (9, 2, 1)]


def test_hash_map_renack_overwrites() -> None:
    tracker = HashMapTracker()
    tracker.add(10, 1, 1)
    tracker.add(50, 1, 1)
    assert tracker.pop_due(10) == [] and len(tracker) == 1
