"""pulsar_nack.snapshot.keeper: the snapshot life cycle above the tracker, and the index upkeep the tracker
runs for it (restores and adoptions themselves: test_snapshot_restore.py, test_snapshot_redispatch.py)."""

from __future__ import annotations

import pytest
from fake_clock import FakeClock

from pulsar_nack.index import TimeBucketIndex
from pulsar_nack.lowlevel import TimerWheel
from pulsar_nack.snapshot import InMemoryStorage, SegmentConfig, SegmentStore
from pulsar_nack.snapshot.keeper import SnapshotKeeper
from pulsar_nack.tracker import NackTracker

K = 4
EPOCH = 1_700_000_000_000.0


def _tracker(store: SegmentStore | None, clock: FakeClock, wheel: TimerWheel) -> NackTracker:
    return NackTracker(lambda _due: None, precision_bits=K, clock=clock, wheel=wheel, index=store)


def test_a_keeper_refuses_a_store_that_is_not_the_trackers_index() -> None:
    clock = FakeClock(EPOCH)
    wheel = TimerWheel(clock=clock, start=False)
    tracker = _tracker(None, clock, wheel)
    store = SegmentStore(InMemoryStorage(), precision_bits=K)
    with pytest.raises(ValueError, match="store must be the tracker's index"):
        SnapshotKeeper(tracker, store)
    assert isinstance(tracker.index, TimeBucketIndex) and len(store) == 0
    tracker.close()
    wheel.close(0.0)


def test_the_tracker_runs_the_stores_upkeep_from_the_first_nack_until_nothing_is_left() -> None:
    """The first nack starts the store's upkeep: its nacks are sealed into a segment one checkpoint
    interval later; once nothing is pending and no segment is left, the upkeep stops re-arming."""
    clock = FakeClock(EPOCH)
    wheel = TimerWheel(clock=clock, start=False)
    storage = InMemoryStorage()
    config = SegmentConfig(checkpoint_interval_ms=1_000)
    store = SegmentStore(storage, config, precision_bits=K)
    tracker = _tracker(store, clock, wheel)
    assert store.upkeep_interval_ms == 1_000
    tracker.schedule(EPOCH + 5_000, 1, 1)
    assert storage.list() == [], "nothing sealed before the interval"
    clock.now += 1_001
    wheel.run_due()
    assert len(storage.list()) == 1, "the upkeep sealed the nack"
    assert tracker.flush(EPOCH + 10_000) == 1  # the nack goes: nothing pending any more
    for _ in range(5):  # the upkeep deletes the emptied segment, then stops
        clock.now += 1_001
        wheel.run_due()
    assert storage.list() == [] and not store.upkeep(int(clock.now))
    assert tracker._upkeep is None, "no upkeep armed with nothing to keep"
    tracker.close()
    wheel.close(0.0)


def test_closing_the_tracker_seals_a_stores_nacks_and_clears_a_bare_index() -> None:
    clock = FakeClock(EPOCH)
    wheel = TimerWheel(clock=clock, start=False)
    storage = InMemoryStorage()
    store = SegmentStore(storage, precision_bits=K)
    kept = _tracker(store, clock, wheel)
    kept.schedule(EPOCH + 60_000, 1, 2)
    kept.close()
    again = SegmentStore(storage, precision_bits=K)
    fresh = _tracker(again, clock, wheel)
    assert SnapshotKeeper(fresh, again).restore().ids == 1, "the final snapshot holds the pending nack"
    fresh.close()
    bare = _tracker(None, clock, wheel)
    bare.schedule(EPOCH + 60_000, 1, 2)
    index = bare.index
    bare.close()
    assert len(index) == 0 and TimeBucketIndex(K).upkeep_interval_ms is None
    wheel.close(0.0)
