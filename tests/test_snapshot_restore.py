"""Snapshots wired into the tracker (issue 12), without a broker: a fake clock, a wheel driven by hand and
real files. Pending nacks reach storage, acks and redeliveries leave it, close() writes a final snapshot;
a new tracker on the same storage gets them back at their due times, holds the copies the broker
redelivers at once until then, and hands each out exactly once; a corrupt snapshot falls back to empty
with a warning that counts the nacks lost. (The same through a real broker and killed processes:
test_snapshot_restart.py.)"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from fake_clock import FakeClock

from pulsar_nack.entry_sets import EntrySets
from pulsar_nack.lowlevel import DueIds, TimerWheel
from pulsar_nack.snapshot import LocalDirectoryStorage, SegmentConfig, SegmentStore
from pulsar_nack.snapshot.keeper import SnapshotKeeper
from pulsar_nack.tracker import NackTracker, Verdict, epoch_clock

K = 8  # precision bits
EARLY_MS = 2**K - 1  # floor rounding: at most this early
EPOCH = 1_790_000_000_000.0  # a fake epoch clock (ms), as the consumer's tracker reads with snapshots
TOPIC = "persistent://public/default/t"
NATIVE_MS = 102  # a forwarded id's copy arrives this long after the forward (the native latency)


class Consumer:
    """A tracker with snapshots on ``path``, a fake clock and a hand-driven wheel. Each forward brings
    the entry's copy NATIVE_MS later (as the broker does); every hand-out is recorded."""

    def __init__(self, path: Path, now: float, config: SegmentConfig | None = None) -> None:
        self.clock = FakeClock(now)
        self.wheel = TimerWheel(clock=self.clock, start=False)
        self.store = SegmentStore(LocalDirectoryStorage(path, fsync=False), config, precision_bits=K)
        self.tracker = NackTracker(
            self.forward, precision_bits=K, clock=self.clock, wheel=self.wheel, index=self.store
        )
        self.keeper = SnapshotKeeper(self.tracker, self.store)
        self.copies: list[tuple[float, int]] = []  # (arrival time, entry id) of copies on their way
        self.handed: dict[int, list[float]] = {}  # entry id → hand-out times
        self.held = 0

    def forward(self, due: Sequence[DueIds]) -> None:
        for ids in due:
            for entry in ids.entry_ids.tolist():
                self.copies.append((self.clock.now + NATIVE_MS, entry))

    def arrive(self, entry: int) -> Verdict:
        verdict = self.tracker.arrivals.admit(1, entry, -1, TOPIC, None)
        if verdict is Verdict.DELIVER:
            self.handed.setdefault(entry, []).append(self.clock.now)
        elif verdict is Verdict.HOLD:
            self.held += 1
        return verdict

    def nack(self, entry: int, due_ms: float) -> None:
        self.tracker.schedule(due_ms, 1, entry, -1, TOPIC)

    def run_until(self, until: float) -> None:
        """Advance the clock 1 ms at a time, firing timers and delivering the copies that arrive."""
        while self.clock.now < until:
            self.clock.now += 1
            self.wheel.run_due()
            if self.copies:
                arrived = [c for c in self.copies if c[0] <= self.clock.now]
                self.copies = [c for c in self.copies if c[0] > self.clock.now]
                for _, entry in arrived:
                    self.arrive(entry)


def test_pending_nacks_survive_a_crash_held_back_until_due_then_handed_out_once(tmp_path: Path) -> None:
    rng = random.Random(3)
    a = Consumer(tmp_path, EPOCH)
    due = {entry: EPOCH + rng.uniform(2_000, 20_000) for entry in range(300)}
    for entry, at in due.items():
        a.nack(entry, at)
    a.run_until(EPOCH + 1_500)  # one checkpoint interval: the nacks are sealed into segments
    assert a.store.stats().ids_unsealed == 0
    assert any(name.endswith(".pnk") for name in os.listdir(tmp_path))
    # A dies here (no close). B starts 4 s later: some nacks are past due by then.
    restart = EPOCH + 4_000
    b = Consumer(tmp_path, restart)
    report = b.keeper.restore()
    assert report.ids == len(due) and report.lost_ids == 0
    # The broker redelivers every unacked message at once: all held back, none handed out.
    verdicts = {entry: b.arrive(entry) for entry in due}
    assert set(verdicts.values()) == {Verdict.HOLD}, "a copy redelivered at the restart was handed out"
    b.run_until(EPOCH + 21_000)
    assert set(b.handed) == set(due), f"missing: {sorted(set(due) - set(b.handed))[:10]}"
    twice = {e: t for e, t in b.handed.items() if len(t) > 1}
    assert not twice, f"handed out more than once: {twice}"
    early = {e: due[e] - t[0] for e, t in b.handed.items() if t[0] < due[e] - EARLY_MS}
    assert not early, f"handed out before due - (2^k - 1) ms: {early}"
    # past due at the restart: at once (the first forward slot, the copy a native latency later)
    late = {e: t[0] - max(due[e], restart) for e, t in b.handed.items()}
    assert max(late.values()) < 2 * NATIVE_MS + 70, f"late by up to {max(late.values())} ms"
    drained = b.keeper.stats()
    assert (drained.segments_total, drained.ids_in_memory) == (0, 0), "every restored nack went"


class _CountingSets(EntrySets):
    """The arrival filter's sets, counting the re-codes that pass over values already held."""

    __slots__ = ("recodes",)
    recodes: int

    def _recode(self, low: int) -> None:
        self.recodes += any(self.layout.bitmaps)
        super()._recode(low)


def test_a_restore_of_many_ledgers_teaches_the_filter_in_one_pass(tmp_path: Path) -> None:
    """The restore teaches the arrival filter the whole entries of 300 ledgers (and the batch messages
    of 100 entries) and every copy is held back — with the ledgers numbered together: the values the
    filter's sets hold are re-coded at most once. Numbered ledger by ledger, each new ordinal bit
    re-coded every value taught so far (bench/snapshot_cost.py --restore: 10M ids of 200 ledgers)."""
    a = Consumer(tmp_path, EPOCH)
    for ledger in range(2, 302):
        for entry in range(5):
            a.tracker.schedule(EPOCH + 10_000 + entry, ledger, entry, -1, TOPIC)
    for entry in range(100):
        for index in (0, 3):
            a.tracker.schedule(EPOCH + 12_000 + entry, 1, entry, index, TOPIC)
    a.tracker.close()
    b = Consumer(tmp_path, EPOCH + 100)
    spy = b.tracker.arrivals._sets = _CountingSets(b.tracker.arrivals._sets._count)
    spy.recodes = 0
    assert b.keeper.restore().ids == 300 * 5 + 100
    assert spy.recodes <= 1
    admit = b.tracker.arrivals.admit
    for ledger in range(2, 302):
        assert all(admit(ledger, entry, -1, TOPIC, None) is Verdict.HOLD for entry in range(5)), ledger
    for entry in range(100):
        assert [admit(1, entry, index, TOPIC, 4) for index in range(4)] == [
            Verdict.HOLD,
            Verdict.DELIVER,
            Verdict.DELIVER,
            Verdict.HOLD,
        ], entry


def test_acks_and_redeliveries_leave_the_snapshot(tmp_path: Path) -> None:
    a = Consumer(tmp_path, EPOCH)
    for entry in range(40):
        a.nack(entry, EPOCH + (1_000 if entry < 10 else 30_000))
    a.run_until(EPOCH + 1_200)  # sealed; entries 0..9 forwarded (redelivered) meanwhile
    for entry in range(10, 20):
        a.tracker.acked(1, entry, -1, TOPIC)
    a.run_until(EPOCH + 2_500)  # the next checkpoint rewrites the segment without them
    b = Consumer(tmp_path, EPOCH + 3_000)
    b.keeper.restore()
    pending = {e for e in range(40) if b.store.due_of(1, e, -1, TOPIC) is not None}
    assert pending == set(range(20, 40))


def test_close_writes_a_final_snapshot(tmp_path: Path) -> None:
    a = Consumer(tmp_path, EPOCH)
    for entry in range(25):
        a.nack(entry, EPOCH + 10_000 + entry)
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".pnk")], "sealed before any checkpoint"
    a.tracker.close()
    b = Consumer(tmp_path, EPOCH + 100)
    assert b.keeper.restore().ids == 25
    assert {b.store.due_of(1, e, -1, TOPIC) for e in range(25)} == {(EPOCH + 10_000) // 256 * 256}


def test_close_with_flush_leaves_nothing_to_restore(tmp_path: Path) -> None:
    a = Consumer(tmp_path, EPOCH)
    for entry in range(25):
        a.nack(entry, EPOCH + 10_000)
    a.run_until(EPOCH + 1_500)
    a.tracker.close(flush=True)  # every pending id forwarded: nothing left for a restart
    b = Consumer(tmp_path, EPOCH + 2_000)
    assert b.keeper.restore().ids == 0


def test_clear_deletes_the_snapshot(tmp_path: Path) -> None:
    a = Consumer(tmp_path, EPOCH)
    for entry in range(25):
        a.nack(entry, EPOCH + 10_000)
    a.run_until(EPOCH + 1_500)
    a.tracker.clear()  # a seek: the pending nacks are void, also after a restart
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".pnk")]
    assert Consumer(tmp_path, EPOCH + 2_000).keeper.restore().ids == 0


def test_a_corrupt_snapshot_falls_back_to_empty_with_a_count(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    a = Consumer(tmp_path, EPOCH)
    for entry in range(60):
        a.nack(entry, EPOCH + 10_000)
    a.tracker.close()
    (segment,) = [tmp_path / n for n in os.listdir(tmp_path) if n.endswith(".pnk")]
    data = bytearray(segment.read_bytes())
    data[-3] ^= 0xFF  # payload damaged: the header (and its id count) still reads
    segment.write_bytes(bytes(data))
    b = Consumer(tmp_path, EPOCH + 100)
    with caplog.at_level(logging.WARNING):
        report = b.keeper.restore()
    assert (report.ids, report.lost_ids, report.corrupt_segments) == (0, 60, 1)
    assert "60 pending nacks lost" in caplog.text
    assert b.arrive(5) is Verdict.DELIVER, "nothing pending: the broker's copy is a first delivery"


def test_batch_members_are_held_back_siblings_are_not(tmp_path: Path) -> None:
    a = Consumer(tmp_path, EPOCH)
    a.tracker.schedule(EPOCH + 5_000, 1, 7, 2, TOPIC)  # message 2 of the batch in entry 7
    a.tracker.close()
    b = Consumer(tmp_path, EPOCH + 100)
    b.keeper.restore()
    admit = b.tracker.arrivals.admit
    assert admit(1, 7, 2, TOPIC, 4) is Verdict.HOLD
    assert admit(1, 7, 1, TOPIC, 4) is Verdict.DELIVER, "a sibling with no nack is a first delivery"


def test_the_epoch_clock_reads_wall_time_and_never_goes_back() -> None:
    clock = epoch_clock()
    readings = [clock() for _ in range(1000)]
    assert readings == sorted(readings)
    assert abs(readings[-1] - time.time() * 1000) < 1_000
