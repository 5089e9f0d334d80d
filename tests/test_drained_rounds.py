"""A soak without a broker: rounds of batched traffic through a real NackTracker (index, timer wheel,
arrival filter, lateness sample), every nack forwarded and its copy handed out and acked — once a round
has drained and the linger has passed, everything the tracker keeps for it is gone again (issue 23: the
process heap of a soak grew with run time; the structures must not)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from fake_clock import FakeClock

from pulsar_nack.arrivals import Verdict
from pulsar_nack.index import DueIds
from pulsar_nack.timer import TimerWheel, _Wheel
from pulsar_nack.tracker import NackTracker

TOPIC = "persistent://public/default/soak"
BATCH = 10
LINGER_MS = 2_000.0
DELAY_MS = 1_000.0
COPY_AFTER_MS = 110.0  # a forward's copy arrives this long after it (the native delay and the broker's)


class DrainedSoak:
    """The broker's part, simulated: a forward redelivers every message of its entries (a batch comes
    back whole) ``COPY_AFTER_MS`` later; the application nacks half its first deliveries and acks the
    rest and every redelivery. The clock moves by hand, the wheel fires on this thread."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.wheel = TimerWheel(clock=self.clock, start=False)
        self.tracker = NackTracker(self._forward, clock=self.clock, wheel=self.wheel, linger_ms=LINGER_MS)
        self.copies: list[tuple[float, int, int]] = []  # (arrival time, ledger, entry)
        self.rng = random.Random(23)
        self.entry = 0
        self.handed_out = 0

    def _forward(self, due: Sequence[DueIds]) -> None:
        for ids in due:
            self.copies.extend(
                (self.clock.now + COPY_AFTER_MS, ids.ledger_id, e) for e in ids.entry_ids.tolist()
            )

    def _deliver(self, ledger: int, entry: int, first: bool) -> None:
        arrivals, tracker = self.tracker.arrivals, self.tracker
        for index in range(BATCH):
            if arrivals.admit_message((TOPIC, ledger, entry), index, BATCH) is not Verdict.DELIVER:
                continue
            self.handed_out += 1
            if first and self.rng.random() < 0.5:
                tracker.schedule(self.clock.now + DELAY_MS, ledger, entry, index, TOPIC)
            else:
                tracker.acked(ledger, entry, index, TOPIC)

    def _step(self, ms: float) -> None:
        self.clock.now += ms
        self.wheel.run_due()
        arrived = [c for c in self.copies if c[0] <= self.clock.now]
        self.copies = [c for c in self.copies if c[0] > self.clock.now]
        for _, ledger, entry in arrived:
            self._deliver(ledger, entry, first=False)

    def round(self, entries: int, ledger: int) -> None:
        """``entries`` batches of the ledger, one a ms, then until every nack is handed out and acked and
        the linger has passed (the filter's records of forwards expire)."""
        for _ in range(entries):
            self._deliver(ledger, self.entry, first=True)
            self.entry += 1
            self._step(1.0)
        for _ in range(int((DELAY_MS + 3 * LINGER_MS) / 10)):
            self._step(10.0)


def test_drained_rounds_leave_nothing_behind() -> None:
    soak = DrainedSoak()
    tracker, arrivals = soak.tracker, soak.tracker.arrivals
    for round_number in range(12):
        soak.round(300, ledger=100 + round_number // 3)  # a new ledger every 3 rounds
        # every message handed out once, every nack redelivered: nothing pending, in flight or followed
        assert not soak.copies
        assert len(tracker.index) == 0 and tracker.index.bucket_count == 0
        assert not arrivals._entries and not arrivals._flights and not arrivals._forwards
        assert not arrivals._taken and not arrivals._popped
        assert all(not bitmap for bitmap in arrivals._sets.layout.bitmaps)
        assert not arrivals._recent  # both generations rotated out
        assert arrivals.idle
        # ledgers are released: the tracker's one numbering of them (index, packed tier, filter) is empty
        assert len(tracker.ledgers) == 0 and tracker.ledgers.span == 0
        assert arrivals.dues.used == 0  # every sampled due time read back by its forward
        # the wheel keeps the slots of pending timeouts only (at most the compaction's and a sweep's)
        assert len(soak.wheel) <= 2
        level: _Wheel | None = soak.wheel._wheel
        buckets = 0
        while level is not None:
            buckets += sum(bucket is not None for bucket in level.buckets)
            level = level.overflow
        assert buckets <= 2
    stats = tracker.stats()
    assert stats.redelivered == stats.nacked > 0  # (every nack came back: the rounds did drain)
    assert soak.handed_out == 12 * 300 * BATCH + stats.nacked
    tracker.close()
