"""NackTracker without a broker: forwarding times (fake clock), the arrival verdicts, backoff and limits."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest

from pulsar_nack import DueIds, MultiplierRedeliveryBackoff, NativeTiming, TimerWheel
from pulsar_nack.delay_limit import DelayLimitExceeded, limit_delay
from pulsar_nack.tracker import NackTracker, Verdict


class FakeClock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Harness:
    """A tracker on a fake clock with a wheel driven by hand; records every forward."""

    def __init__(self, precision_bits: int = 0) -> None:
        self.clock = FakeClock()
        self.wheel = TimerWheel(clock=self.clock, start=False)
        self.forwards: list[tuple[float, list[tuple[str, int, int, tuple[int, ...] | None]]]] = []
        self.tracker = NackTracker(
            self.record, precision_bits=precision_bits, clock=self.clock, wheel=self.wheel
        )

    def record(self, due: Sequence[DueIds]) -> None:
        ids = [(d.topic, d.ledger_id, e, d.batch_indexes.get(e)) for d in due for e in d.entry_ids.tolist()]
        self.forwards.append((self.clock.now, ids))

    def run_until(self, until: float) -> None:
        while self.clock.now < until:
            self.clock.now += 1
            self.wheel.run_due()


# -- NativeTiming ---------------------------------------------------------------------------------


def test_native_timing_matches_the_cpp_tracker() -> None:
    timing = NativeTiming()  # 102 ms: checks every 34 ms, the third lands on the due time
    assert (timing.interval_ms, timing.latency_ms) == (34, 102)
    assert NativeTiming(100).latency_ms == 132, "100/3 = 33: the third check at 99 ms is 1 ms short"
    assert NativeTiming(60_000).interval_ms == 20_000


def test_forward_times_keep_the_previous_forward_on_time() -> None:
    timing = NativeTiming()
    last = 1_000.0
    assert timing.forward_at(last + 500, last) == last + 500, "free once the last forward's ids are out"
    assert timing.forward_at(last + 10, last) == last + 68, "soon after: on the same check grid"
    assert timing.forward_at(last + 80, last) == last + 102 + timing.margin_ms
    # A timer re-armed for the same-grid slot fires a little late: it still takes the slot.
    assert timing.forward_at(last + 68.9, last) == last + 68.9
    assert timing.forward_at(last + 68 + timing.margin_ms, last) == last + 68 + timing.margin_ms
    assert timing.forward_at(last + 68.1 + timing.margin_ms, last) == last + 102 + timing.margin_ms
    assert timing.forward_at(5.0, -float("inf")) == 5.0


# -- forwarding ------------------------------------------------------------------------------------


def test_ids_are_forwarded_one_native_latency_before_their_bucket() -> None:
    h = Harness(precision_bits=0)
    start = h.clock.now
    h.tracker.schedule(start + 1_000, 7, 1)
    h.tracker.schedule(start + 1_000, 7, 2, topic="persistent://t/a-partition-2")
    h.run_until(start + 2_000)
    assert h.forwards == [
        (start + 1_000 - 102, [("", 7, 1, None), ("persistent://t/a-partition-2", 7, 2, None)]),
    ]
    stats = h.tracker.stats()
    assert (stats.nacked, stats.forwarded, stats.pending) == (2, 2, 0)


def test_close_buckets_are_forwarded_on_the_native_grid_not_faster() -> None:
    """Buckets 10 ms apart cannot be forwarded 10 ms apart (the native timer would be re-armed before its
    check): the second waits for the same-grid slot 68 ms after the first."""
    h = Harness(precision_bits=0)
    start = h.clock.now
    for i in range(3):
        h.tracker.schedule(start + 1_000 + 10 * i, 1, i)
    h.run_until(start + 2_000)
    times = [t - start for t, _ in h.forwards]
    assert times[0] == 1_000 - 102
    assert all(b - a >= 68 for a, b in itertools.pairwise(times))
    assert sorted(e for _, ids in h.forwards for _, _, e, _ in ids) == [0, 1, 2]


def test_a_later_nack_never_delays_an_earlier_one_and_vice_versa() -> None:
    h = Harness(precision_bits=0)
    start = h.clock.now
    h.tracker.schedule(start + 60_000, 1, 1)
    h.tracker.schedule(start + 500, 1, 2)  # shorter, scheduled after a long one
    h.run_until(start + 1_000)
    assert [(t - start, [e for *_, e, _ in ids]) for t, ids in h.forwards] == [(500 - 102, [2])]


def test_flush_everything_and_close() -> None:
    h = Harness()
    h.tracker.schedule(h.clock.now + 60_000, 1, 1)
    h.tracker.close(flush=True)
    assert len(h.forwards) == 1 and h.tracker.closed
    with pytest.raises(RuntimeError, match="closed"):
        h.tracker.schedule(h.clock.now + 1, 1, 2)
    h.tracker.close()  # idempotent


# -- arrivals (the filter itself: tests/test_arrivals.py) ------------------------------------------


def arrive(h: Harness, ledger_id: int, entry_id: int, batch_index: int = -1, size: int = 3) -> Verdict:
    return h.tracker.arrivals.admit(ledger_id, entry_id, batch_index, "", size)


def test_arrival_verdicts_for_a_batch() -> None:
    """msg0 of entry (5, 9) is due first, msg1 later, msg2 was acked: when the entry comes back only msg0
    is handed out; msg1 is held back until its own redelivery; the copy of msg2 is acked for the
    application (so this copy of the entry can complete), and a second copy of msg0 waits for its ack."""
    h = Harness(precision_bits=0)
    start = h.clock.now
    for batch_index in range(3):
        assert arrive(h, 5, 9, batch_index) is Verdict.DELIVER
    h.tracker.schedule(start + 1_000, 5, 9, batch_index=0)
    h.tracker.schedule(start + 5_000, 5, 9, batch_index=1)
    assert h.tracker.acked(5, 9, batch_index=2) == ((), False)
    h.run_until(start + 1_000)
    assert h.forwards[0][1] == [("", 5, 9, (0,))]
    assert arrive(h, 5, 9, 0) is Verdict.DELIVER
    assert arrive(h, 5, 9, 1) is Verdict.HOLD
    assert arrive(h, 5, 9, 2) is Verdict.ACKED
    assert arrive(h, 5, 9, 0) is Verdict.DUPLICATE, "handed out once per redelivery"
    h.tracker.acked(5, 9, batch_index=0)
    h.run_until(start + 5_000)
    assert h.forwards[1][1] == [("", 5, 9, (1,))]
    assert arrive(h, 5, 9, 0) is Verdict.ACKED
    assert arrive(h, 5, 9, 1) is Verdict.DELIVER
    assert arrive(h, 5, 9, 2) is Verdict.ACKED
    stats = h.tracker.stats()
    assert (stats.redelivered, stats.held_back, stats.dropped) == (2, 1, 4)


def test_a_batch_acked_but_for_its_nacked_message_is_one_bit_and_still_classified() -> None:
    """PIP-393's case: one message of a batch nacked, the rest acked. The filter keeps no record for the
    entry (one bit), yet copies are classified as before: acked siblings acked, the nacked one held until
    its forward and handed out once; a nack-then-ack drops the pending nack."""
    h = Harness(precision_bits=0)
    start = h.clock.now
    for entry_id in (1, 2):
        for batch_index in range(5):
            assert arrive(h, 8, entry_id, batch_index, size=5) is Verdict.DELIVER
        for batch_index in (0, 1, 3, 4):
            h.tracker.acked(8, entry_id, batch_index)
        h.tracker.schedule(start + 1_000, 8, entry_id, batch_index=2)
    assert h.tracker.arrivals.memory_bytes() < 2_000, "two quiet entries: bits, not records"
    assert arrive(h, 8, 1, 0, size=5) is Verdict.ACKED, "a reconnect copy: acked sibling"
    assert arrive(h, 8, 1, 2, size=5) is Verdict.HOLD, "its nack is pending"
    assert h.tracker.acked(8, 2, 2) == ((), False), "nack-then-ack"
    assert h.tracker.index.pending_mask(8, 2) == 0
    h.run_until(start + 1_000)
    assert h.forwards[0][1] == [("", 8, 1, (2,))]
    assert [arrive(h, 8, 1, i, size=5) for i in range(5)] == [
        Verdict.ACKED, Verdict.ACKED, Verdict.DELIVER, Verdict.ACKED, Verdict.ACKED
    ]
    assert arrive(h, 8, 1, 2, size=5) is Verdict.DUPLICATE, "once per nack"
    assert h.tracker.arrivals.counts().open_entries == 1, "entry 2, all acked on one copy, is forgotten"
    h.tracker.acked(8, 1, 2)
    h.run_until(start + 1_000 + h.tracker.arrivals.linger_ms + 2_000)
    assert h.tracker.arrivals.counts().open_entries == 0


def test_early_arrivals_are_held_and_new_messages_pass() -> None:
    h = Harness()
    h.tracker.schedule(h.clock.now + 10_000, 3, 4)
    assert arrive(h, 3, 4) is Verdict.HOLD
    assert arrive(h, 3, 5) is Verdict.DELIVER
    assert arrive(h, 4, 4) is Verdict.DELIVER
    assert h.tracker.arrivals.admit(3, 4, -1, "other", 0) is Verdict.DELIVER


def test_lateness_is_measured_against_the_bucket() -> None:
    h = Harness(precision_bits=0)
    start = h.clock.now
    h.tracker.schedule(start + 1_000, 1, 1)
    h.run_until(start + 1_000 + 3)  # the redelivery reaches the app 3 ms after the bucket time
    assert arrive(h, 1, 1) is Verdict.DELIVER
    stats = h.tracker.stats()
    assert stats.lateness_p50_ms == pytest.approx(3.0)


def test_a_forward_whose_copy_never_comes_is_repeated_then_abandoned() -> None:
    """A redelivery request lost with a broker connection: forwarded again after ``linger_ms``, at most
    ``max_reforwards`` times, then counted as abandoned (and the state is gone)."""
    h = Harness(precision_bits=0)
    start = h.clock.now
    h.tracker.schedule(start + 200, 1, 1)
    linger = h.tracker.arrivals.linger_ms
    h.run_until(start + 200 + (linger + 1_000) * 5)
    forwards = [at for at, ids in h.forwards if ids == [("", 1, 1, None)]]
    assert len(forwards) == 1 + h.tracker.arrivals.max_reforwards
    stats = h.tracker.stats()
    assert (stats.reforwarded, stats.abandoned) == (h.tracker.arrivals.max_reforwards, 1)
    assert h.tracker.arrivals.idle
    assert arrive(h, 1, 1) is Verdict.DELIVER, "long after: treated as a new delivery"


# -- backoff and limits ----------------------------------------------------------------------------


def test_multiplier_backoff_matches_java_and_go() -> None:
    default = MultiplierRedeliveryBackoff(1000, 600_000)
    assert [default.next(n) for n in (-1, 0, 1, 4, 5, 100, 10**9)] == [
        1000,
        1000,
        2000,
        16000,
        32000,
        600_000,
        600_000,
    ]
    fives = MultiplierRedeliveryBackoff(2000, 6_000_000, 5)
    assert [fives.next(n) for n in (1, 2, 4, 100)] == [10_000, 50_000, 1_250_000, 6_000_000]
    assert MultiplierRedeliveryBackoff(0, 0).next(50) == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((-1, 10), "min_delay_ms"),
        ((10, 5), "max_delay_ms"),
        ((10, 20, 0.5), "multiplier"),
        ((1.5, 20), "min_delay_ms"),
    ],
)
def test_backoff_rejects_bad_arguments(args: tuple[float, ...], message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        MultiplierRedeliveryBackoff(*args)  # type: ignore[arg-type]


def test_limit_delay() -> None:
    assert limit_delay(500, 0, "error") == 500, "0 = no limit"
    assert limit_delay(500, 1000, "error") == 500
    assert limit_delay(5000, 1000, "clamp") == 1000
    with pytest.raises(
        DelayLimitExceeded, match="Exceeds max allowed delivery delay of 1000 milliseconds"
    ) as info:
        limit_delay(5000, 1000, "error")
    assert isinstance(info.value, ValueError) and info.value.max_delay_ms == 1000


def test_buckets_left_behind_are_compacted_by_the_timer() -> None:
    h = Harness(precision_bits=8)
    start = h.clock.now
    for entry in range(20_000):  # a steady stream over 2 s: a new bucket every 2560 nacks
        h.clock.now = start + entry / 10
        h.tracker.schedule(h.clock.now + 60_000, 1, entry)
    heavy = h.tracker.index.memory_usage().total_bytes
    h.run_until(h.clock.now + h.tracker.compact_after_ms + 1)
    assert not h.forwards, "nothing due yet: only compaction ran"
    assert h.tracker.index.memory_usage().total_bytes < heavy / 2
    assert len(h.tracker.index) == 20_000
