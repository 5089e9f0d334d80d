"""Restored nacks wait for the broker's re-dispatch (pulsar_nack.snapshot.redispatch), without a broker: a
fake clock, a wheel driven by hand and real files. After a restart the broker sends every unacked message
again, at the pace the consumer receives; a restored id that falls due before its copy came is not
forwarded — the copy comes and is handed out at once — unless the copy does not come while the re-dispatch
goes on. (The same through a real broker and a killed process: test_snapshot_restart.py.)"""

from __future__ import annotations

import random
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import pytest
from fake_clock import FakeClock

from pulsar_nack.lowlevel import DueIds, TimerWheel
from pulsar_nack.snapshot import LocalDirectoryStorage, SegmentConfig, SegmentStore
from pulsar_nack.snapshot.keeper import SnapshotKeeper
from pulsar_nack.snapshot.redispatch import REDISPATCH_QUIET_MS, SETTLE_MS, RedispatchStore
from pulsar_nack.tracker import NackTracker, Verdict

K = 8
EPOCH = 1_790_000_000_000.0
TOPIC = "persistent://public/default/t"
NATIVE_MS = 102  # a forwarded id's copy arrives this long after the forward


class Consumer:
    """A tracker with snapshots on ``path`` (the store: ``RedispatchStore`` unless ``plain``), a fake clock
    and a hand-driven wheel. As the wrapped consumer does, a copy of a message whose nack is pending is
    kept (unless ``keeps`` is False: a full hold) and handed out at the nack's due time; a forward brings
    the entry's copy NATIVE_MS later. Every hand-out is recorded."""

    def __init__(self, path: Path, now: float, plain: bool = False) -> None:
        self.clock = FakeClock(now)
        self.wheel = TimerWheel(clock=self.clock, start=False)
        storage = LocalDirectoryStorage(path, fsync=False)
        self.store = (
            SegmentStore(storage, precision_bits=K, rounding="ceil")
            if plain
            else RedispatchStore(storage, precision_bits=K, rounding="ceil", clock=self.clock)
        )
        self.tracker = NackTracker(
            self.forward, precision_bits=K, clock=self.clock, wheel=self.wheel, index=self.store
        )
        self.keeper = SnapshotKeeper(self.tracker, self.store)
        self.copies: list[tuple[float, int]] = []  # (arrival time, entry id) of copies on their way
        self.kept: dict[int, float] = {}  # entry id → due time of its kept copy
        self.handed: dict[int, list[float]] = {}
        self.forwarded: list[int] = []
        self.keeps = True

    def forward(self, due: Sequence[DueIds]) -> None:
        for ids in due:
            for entry in ids.entry_ids.tolist():
                self.forwarded.append(entry)
                self.copies.append((self.clock.now + NATIVE_MS, entry))

    def arrive(self, entry: int) -> None:
        verdict = self.tracker.arrivals.admit(1, entry, -1, TOPIC, None)
        if verdict is Verdict.DELIVER:
            self.handed.setdefault(entry, []).append(self.clock.now)
        elif verdict is Verdict.HOLD:  # the consumer's _keep: ask when due, take the nack, keep the copy
            due = self.tracker.index.due_of(1, entry, -1, TOPIC)
            if self.keeps and due is not None and self.tracker.arrivals.take_pending(1, entry, TOPIC):
                self.kept[entry] = due

    def run_until(self, until: float, redispatch: list[tuple[float, int]] | None = None) -> None:
        """Advance 1 ms at a time: timers, copies that arrive (forwards' and ``redispatch``'s), kept
        copies that fall due."""
        copies = self.copies
        if redispatch:
            copies.extend(redispatch)
        while self.clock.now < until:
            self.clock.now += 1
            self.wheel.run_due()
            if copies:
                arrived = [c for c in copies if c[0] <= self.clock.now]
                copies[:] = [c for c in copies if c[0] > self.clock.now]
                for _, entry in arrived:
                    self.arrive(entry)
            for entry in [e for e, due in self.kept.items() if due <= self.clock.now]:
                del self.kept[entry]
                self.handed.setdefault(entry, []).append(self.clock.now)


def restarted(tmp_path: Path, count: int, plain: bool = False) -> tuple[Consumer, dict[int, float], float]:
    """A nacks ``count`` entries due 2-10 s on, its nacks sealed, and dies; B restores them 3 s after the
    nacks (a share is due by then). Returns B, the due times and the restart time."""
    rng = random.Random(5)
    a = Consumer(tmp_path, EPOCH)
    due = {entry: EPOCH + rng.uniform(2_000, 10_000) for entry in range(count)}
    for entry, at in due.items():
        a.tracker.schedule(at, 1, entry, -1, TOPIC)
    a.run_until(EPOCH + 1_500)  # sealed (a checkpoint interval); nothing due yet
    restart = EPOCH + 3_000
    b = Consumer(tmp_path, restart, plain=plain)
    assert b.keeper.restore().ids == count
    return b, due, restart


def redispatch(start: float, entries: Sequence[int], every_ms: float) -> list[tuple[float, int]]:
    """The broker's re-dispatch: one copy of each entry, in entry order, one every ``every_ms``."""
    return [(start + 1 + i * every_ms, entry) for i, entry in enumerate(entries)]


def test_restored_nacks_are_handed_out_from_the_redispatched_copies_none_forwarded(tmp_path: Path) -> None:
    b, due, restart = restarted(tmp_path, 400)
    # 400 copies over 2 s: many ids fall due (or are due already) before their copy comes
    b.run_until(EPOCH + 12_000, redispatch(restart, sorted(due), 5.0))
    assert b.forwarded == [], f"{len(b.forwarded)} forwarded"
    assert set(b.handed) == set(due) and all(len(t) == 1 for t in b.handed.values())
    arrival = {entry: restart + 1 + i * 5.0 for i, entry in enumerate(sorted(due))}
    # never early; due before its copy came: handed out as it came; else at its bucket (ceil: < 2^K later)
    for entry, (at,) in b.handed.items():
        assert at >= due[entry], (entry, at - due[entry])
        assert at <= max(due[entry] + 2**K, arrival[entry] + 1), (entry, at - max(due[entry], arrival[entry]))
    assert isinstance(b.store, RedispatchStore)
    assert not b.store.waiting and b.store.deferred_total > 0  # (over: a plain store again)


def test_the_plain_store_forwards_ids_due_before_their_copy_came(tmp_path: Path) -> None:
    """The behaviour the store changes: without it the ids due at the restart are forwarded at once."""
    b, due, restart = restarted(tmp_path, 400, plain=True)
    b.run_until(EPOCH + 12_000, redispatch(restart, sorted(due), 5.0))
    assert b.forwarded


def test_ids_whose_copy_never_comes_are_forwarded_once_the_redispatch_is_quiet(tmp_path: Path) -> None:
    """The broker re-sends 300 of 400 (the rest went to another member of the subscription, say): the
    other 100 are forwarded REDISPATCH_QUIET_MS after the last copy came (or at their due time, if later),
    and come back through the forward, once."""
    b, due, restart = restarted(tmp_path, 400)
    entries = sorted(due)
    sent, missing = entries[:300], entries[300:]
    copies = redispatch(restart, sent, 5.0)
    last_copy = copies[-1][0]
    b.run_until(EPOCH + 14_000, copies)
    assert sorted(b.forwarded) == missing
    assert set(b.handed) == set(due) and all(len(t) == 1 for t in b.handed.values())
    for entry in missing:
        (at,) = b.handed[entry]
        assert at >= due[entry]
        released = max(due[entry], last_copy + REDISPATCH_QUIET_MS)
        assert at <= released + 2**K + 2 * NATIVE_MS, (entry, at - released)


def test_a_copy_that_came_and_was_not_kept_is_forwarded_after_it_settled(tmp_path: Path) -> None:
    """A full hold: the copies come and are not kept. Each id is forwarded SETTLE_MS after its entry's
    copy came (or at its due time) — not held back for the rest of the re-dispatch."""
    b, due, restart = restarted(tmp_path, 400)
    b.keeps = False
    copies = redispatch(restart, sorted(due), 5.0)
    came = {entry: at for at, entry in copies}
    b.run_until(EPOCH + 14_000, copies)
    assert sorted(b.forwarded) == sorted(due)
    assert set(b.handed) == set(due) and all(len(t) == 1 for t in b.handed.values())
    for entry, (at,) in b.handed.items():
        assert at >= due[entry]
        assert at <= max(due[entry], came[entry] + SETTLE_MS) + 2**K + 2 * NATIVE_MS, entry


def test_new_nacks_after_the_restart_are_not_held_back(tmp_path: Path) -> None:
    """Ids nacked by B itself (not restored) are forwarded at their due time while the re-dispatch of the
    restored ones goes on."""
    b, due, restart = restarted(tmp_path, 400)
    b.tracker.schedule(restart + 500, 2, 7, -1, TOPIC)  # another ledger, nacked by B
    b.run_until(restart + 1_000, redispatch(restart, sorted(due), 5.0))
    assert isinstance(b.store, RedispatchStore) and b.store.waiting
    assert b.forwarded == [7]


def test_deferred_batch_messages_stay_pending_to_the_index_calls(tmp_path: Path) -> None:
    """A restored batch entry's due messages deferred: due_of, pending_mask, len and remove answer for
    them (the arrival filter takes a copy of a message not in pending_mask for acked)."""
    a = RedispatchStore(
        LocalDirectoryStorage(tmp_path, fsync=False), precision_bits=K, clock=FakeClock(EPOCH)
    )
    for index in (1, 4):
        a.add(int(EPOCH) + 1_000, 1, 9, index, TOPIC)
    a.add(int(EPOCH) + 60_000, 1, 9, 6, TOPIC)
    a.checkpoint(int(EPOCH))
    clock = FakeClock(EPOCH + 2_000)
    b = RedispatchStore(LocalDirectoryStorage(tmp_path, fsync=False), precision_bits=K, clock=clock)
    b.restore(int(clock.now))
    assert b.pop_due(int(clock.now)) == []  # 1 and 4 are due: deferred
    assert len(b) == 3
    assert b.pending_mask(1, 9, TOPIC) == 0b1010010
    assert b.due_of(1, 9, 4, TOPIC) == int(clock.now)  # (when it was popped: no earlier than due)
    assert b.due_of(1, 9, 6, TOPIC) is not None
    assert b.remove(1, 9, 4, TOPIC) and not b.remove(1, 9, 4, TOPIC)
    assert b.pending_mask(1, 9, TOPIC) == 0b1000010
    clock.now += SETTLE_MS  # the entry's copy came (due_of, above), and message 1 was not taken
    (released,) = b.pop_due(int(clock.now))
    assert (released.ledger_id, released.entry_ids.tolist(), dict(released.batch_indexes)) == (
        1,
        [9],
        {9: (1,)},
    )
    assert b.pending_mask(1, 9, TOPIC) == 0b1000000 and len(b) == 1


def test_a_pop_by_bucket_during_the_redispatch_labels_released_ids_no_earlier_than_due(
    tmp_path: Path,
) -> None:
    """The timer's pop (``pop_due_by_bucket``) while the re-dispatch defers ids: nothing while they wait
    for their copy; once released, labelled with a time no earlier than their bucket and no later than
    the pop's limit (the store's next due time is when they may be released, not their bucket)."""
    a = RedispatchStore(
        LocalDirectoryStorage(tmp_path, fsync=False), precision_bits=K, clock=FakeClock(EPOCH)
    )
    due = int(EPOCH) + 1_000
    for index in (1, 4):
        a.add(due, 1, 9, index, TOPIC)
    a.checkpoint(int(EPOCH))
    clock = FakeClock(EPOCH + 2_000)
    b = RedispatchStore(LocalDirectoryStorage(tmp_path, fsync=False), precision_bits=K, clock=clock)
    b.restore(int(clock.now))
    assert b.pop_due_by_bucket(int(clock.now)) == []  # due: deferred
    assert b.due_of(1, 9, 4, TOPIC) is not None  # (the entry's copy came)
    clock.now += SETTLE_MS
    limit = int(clock.now) + 100
    ((label, released),) = b.pop_due_by_bucket(limit)
    assert due <= label <= limit
    assert (released.entry_ids.tolist(), dict(released.batch_indexes)) == ([9], {9: (1, 4)})
    assert len(b) == 0


def test_the_redispatch_does_not_make_the_timer_pop_per_copy(tmp_path: Path) -> None:
    """While copies come the store asks for a pop at the bucket cadence (and once when the last copy has
    settled), not one per entry whose copy came: that kept the timer thread popping every 10-25 ms through
    a 10,000-message re-dispatch (812 pops in these 3 s before; 2^K ms buckets make ~24)."""
    b, due, restart = restarted(tmp_path, 400)
    pops = 0
    pop_due = b.store.pop_due

    def counted(now_ms: int) -> list[DueIds]:
        nonlocal pops
        pops += 1
        return pop_due(now_ms)

    b.store.pop_due = counted  # type: ignore[method-assign]
    b.run_until(restart + 3_000, redispatch(restart, sorted(due), 5.0))  # 400 copies over 2 s, then 1 s
    assert pops <= 3 * 2 * 3_000 // 2**K, pops


def adopted(tmp_path: Path, count: int, plain: bool = False) -> tuple[Consumer, dict[int, float], float]:
    """As :func:`restarted`, but B is another member of the subscription: it restores nothing of its own
    and adopts A's snapshot (a takeover) 3 s after the nacks."""
    rng = random.Random(5)
    a = Consumer(tmp_path / "a", EPOCH)
    due = {entry: EPOCH + rng.uniform(2_000, 10_000) for entry in range(count)}
    for entry, at in due.items():
        a.tracker.schedule(at, 1, entry, -1, TOPIC)
    a.run_until(EPOCH + 1_500)
    adoption = EPOCH + 3_000
    b = Consumer(tmp_path / "b", adoption, plain=plain)
    assert b.keeper.restore().ids == 0
    assert b.keeper.adopt(LocalDirectoryStorage(tmp_path / "a", fsync=False)) == count
    return b, due, adoption


def test_adopted_nacks_wait_for_the_redispatched_copies_as_restored_ones_do(tmp_path: Path) -> None:
    """A takeover: the broker hands the dead member's messages to B at once; B adopted its nacks. The
    ids due before their copy came are not forwarded (the plain store forwards them: below); every one is
    handed out from its copy, once, never early."""
    b, due, adoption = adopted(tmp_path, 400)
    b.run_until(EPOCH + 12_000, redispatch(adoption, sorted(due), 5.0))
    assert b.forwarded == [], f"{len(b.forwarded)} forwarded"
    assert set(b.handed) == set(due) and all(len(t) == 1 for t in b.handed.values())
    arrival = {entry: adoption + 1 + i * 5.0 for i, entry in enumerate(sorted(due))}
    for entry, (at,) in b.handed.items():
        assert at >= due[entry], (entry, at - due[entry])
        assert at <= max(due[entry] + 2**K, arrival[entry] + 1), (entry, at - max(due[entry], arrival[entry]))
    assert isinstance(b.store, RedispatchStore) and b.store.deferred_total > 0 and not b.store.waiting


def test_the_plain_store_forwards_adopted_ids_due_before_their_copy_came(tmp_path: Path) -> None:
    b, due, adoption = adopted(tmp_path, 400, plain=True)
    b.run_until(EPOCH + 12_000, redispatch(adoption, sorted(due), 5.0))
    assert b.forwarded


def test_an_adoption_after_the_restores_wait_ended_waits_again(tmp_path: Path) -> None:
    """B restored a snapshot of its own long ago (its wait is over); a member dies later and B adopts its
    nacks: those wait for their copies too (the wait is timed from the adoption, not from the restore)."""
    b, _, adoption = adopted(tmp_path, 200)
    b.run_until(adoption + REDISPATCH_QUIET_MS + 1_000)  # no copy came: the wait is over, ids forwarded
    assert isinstance(b.store, RedispatchStore) and not b.store.waiting
    rng = random.Random(6)
    c = Consumer(tmp_path / "c", b.clock.now)
    later = {1_000 + entry: b.clock.now + rng.uniform(2_000, 10_000) for entry in range(200)}
    for entry, at in later.items():
        c.tracker.schedule(at, 1, entry, -1, TOPIC)
    c.run_until(b.clock.now + 1_500)  # sealed; c dies, B adopts its nacks 1.5 s after them
    b.clock.now = c.clock.now
    b.forwarded.clear()
    assert b.keeper.adopt(LocalDirectoryStorage(tmp_path / "c", fsync=False)) == 200
    start = b.clock.now
    b.run_until(start + 12_000, redispatch(start, sorted(later), 5.0))
    assert [e for e in b.forwarded if e in later] == []
    assert all(len(b.handed[e]) == 1 and b.handed[e][0] >= later[e] for e in later)


def test_an_id_adopted_while_the_timer_pops_waits_for_its_copy(tmp_path: Path) -> None:
    """The timer thread may pop between two adds of an adoption: an adopted id due already is held back
    from that pop too (its entry waits from before it is added), not forwarded."""
    a = RedispatchStore(
        LocalDirectoryStorage(tmp_path / "a", fsync=False), precision_bits=K, clock=FakeClock(EPOCH)
    )
    for entry in range(50):
        a.add(int(EPOCH) + 1_000 + entry, 1, entry, -1, TOPIC)
    a.checkpoint(int(EPOCH))
    clock = FakeClock(EPOCH + 5_000)  # every adopted id is due

    class Popping(RedispatchStore):
        """Pops after every add, as a timer thread may."""

        popped: ClassVar[list[DueIds]] = []

        def add(self, *args: object, **kwargs: object) -> int:
            due = super().add(*args, **kwargs)  # type: ignore[arg-type]
            self.popped.extend(self.pop_due(int(clock.now)))
            return due

    b = Popping(LocalDirectoryStorage(tmp_path / "b", fsync=False), precision_bits=K, clock=clock)
    b.restore(int(clock.now))
    assert b.adopt(LocalDirectoryStorage(tmp_path / "a", fsync=False), int(clock.now)) == 50
    assert b.popped == [] and len(b) == 50 and b.waiting


def _twins(tmp_path: Path, seed: int) -> tuple[RedispatchStore, RedispatchStore, list[tuple[int, int]]]:
    """Two stores restored from copies of one snapshot (batch members and whole entries of 60 entries, due
    at many times, a few in two buckets; some segments left unloaded), popped at once (ids due deferred),
    and the (entry, batch index) ids to ask about."""
    rng = random.Random(seed)
    a = RedispatchStore(
        LocalDirectoryStorage(tmp_path / "a", fsync=False),
        SegmentConfig(min_ids_per_segment=40),
        precision_bits=K,
        clock=FakeClock(EPOCH),
    )
    ids = [(entry, index) for entry in range(60) for index in (-1, *range(8))]
    for entry, index in rng.sample(ids, 200):
        a.add(int(EPOCH) + rng.randrange(1_000, 20_000), 1, entry, index, TOPIC)
        if a.unsealed >= 40:  # several segments
            a.checkpoint(int(EPOCH))
    a.checkpoint(int(EPOCH))
    stores = []
    for name in ("b", "c"):
        shutil.copytree(tmp_path / "a", tmp_path / name)
        clock = FakeClock(EPOCH + 4_000)
        store = RedispatchStore(
            LocalDirectoryStorage(tmp_path / name, fsync=False),
            SegmentConfig(max_loaded_ids=50, load_ahead_ms=0),
            precision_bits=K,
            clock=clock,
        )
        store.restore(int(clock.now))
        store.pop_due(int(clock.now))  # (the ids due by now are deferred: their copies have not come)
        stores.append(store)
    rng.shuffle(ids)
    return stores[0], stores[1], ids


@pytest.mark.parametrize("seed", range(4))
def test_take_answers_as_due_of_then_remove(tmp_path: Path, seed: int) -> None:
    """The one call a kept copy makes (take) answers what due_of then remove did, and leaves the store as
    they do — ids in memory, on storage and deferred, whole entries and batch members."""
    one, other, ids = _twins(tmp_path, seed)
    assert len(one) == len(other) > 0 and one.deferred_total > 0
    removed = 0
    for entry, index in ids:
        expected = (one.due_of(1, entry, index, TOPIC), one.remove(1, entry, index, TOPIC))
        assert other.take(1, entry, index, TOPIC) == expected, (entry, index)
        assert other.pending_mask(1, entry, TOPIC) == one.pending_mask(1, entry, TOPIC)
        assert len(other) == len(one)
        removed += expected[1]
    assert removed >= 100
