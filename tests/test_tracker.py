"""NackTracker without a broker: forwarding times (fake clock), the arrival verdicts, backoff and limits;
the timer's cost, a failing or far timer, a dropped tracker, closing while a hook blocks."""

from __future__ import annotations

import gc
import itertools
import math
import sys
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any, TypedDict

import numpy as np
import pytest
from fake_clock import FakeClock

from pulsar_nack import MultiplierRedeliveryBackoff
from pulsar_nack.arrivals import _QUIET
from pulsar_nack.delay_limit import DelayLimitExceeded, limit_delay
from pulsar_nack.index import Rounding, TimeBucketIndex
from pulsar_nack.lowlevel import DueIds, NativeTiming, TimerWheel
from pulsar_nack.timer import monotonic_ms
from pulsar_nack.tracker import NackTracker, Verdict


class _Quiet(TypedDict, total=False):
    """The keyword arguments of :class:`NackTracker` that ``Harness(quiet=True)`` overrides."""

    compact_after_ms: float
    linger_ms: float


class Harness:
    """A tracker on a fake clock with a wheel driven by hand; records every forward."""

    def __init__(self, precision_bits: int = 0, quiet: bool = False) -> None:
        """``quiet``: no compaction or arrival sweep within the test (every timer callback is a forward's)."""
        self.clock = FakeClock()
        self.wheel = TimerWheel(clock=self.clock, start=False)
        self.forwards: list[tuple[float, list[tuple[str, int, int, tuple[int, ...] | None]]]] = []
        self.callbacks = 0
        quiet_ms = 10**9 if quiet else None
        self.tracker = NackTracker(
            self.record,
            precision_bits=precision_bits,
            clock=self.clock,
            wheel=self.wheel,
            **(_Quiet(compact_after_ms=quiet_ms, linger_ms=quiet_ms) if quiet_ms else _Quiet()),
        )

    def record(self, due: Sequence[DueIds]) -> None:
        ids = [(d.topic, d.ledger_id, e, d.batch_indexes.get(e)) for d in due for e in d.entry_ids.tolist()]
        self.forwards.append((self.clock.now, ids))

    def run_until(self, until: float) -> None:
        while self.clock.now < until:
            self.clock.now += 1
            self.callbacks += self.wheel.run_due()


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


@pytest.mark.parametrize(("rounding", "delay"), [("floor", 200), ("ceil", 30)])
def test_nacks_in_a_bucket_already_forwarded_wait_for_the_next_buckets_forward(
    rounding: Rounding, delay: int
) -> None:
    """Issue 24: a steady stream of nacks whose bucket the last forward already covered — the demo's
    200 ms backoff with floor rounding, a short delay with ceil. Each such nack joins the next bucket's
    forward instead of re-arming the timer for a forward of its own: forwards stay 2^k ms apart (they
    were 60–150 ms apart), every id is forwarded once, none before its bucket's forward time."""
    h = Harness(precision_bits=8, quiet=True)
    h.tracker = NackTracker(
        h.record, precision_bits=8, rounding=rounding, clock=h.clock, wheel=h.wheel, compact_after_ms=1e9
    )
    start = h.clock.now = 1_024_000.0
    due: dict[int, float] = {}
    entry = 0
    while h.clock.now < start + 3_000:
        h.clock.now += 1
        h.callbacks += h.wheel.run_due()
        if int(h.clock.now) % 10 == 0:
            due[entry] = h.clock.now + delay
            h.tracker.schedule(due[entry], 1, entry)
            entry += 1
    h.run_until(start + 4_000)
    times = [at for at, _ in h.forwards]
    # (the first forward may come at the first nack: with floor rounding its bucket is due at once)
    gaps = [b - a for a, b in itertools.pairwise(times)][1:]
    assert min(gaps) >= 2**8 - 2 * NativeTiming().margin_ms, gaps
    up = 255 if rounding == "ceil" else 0
    buckets = {(math.ceil(d) + up) & -256 for d in due.values()}
    assert len(times) <= len(buckets) + 1, "one forward per bucket due"
    forwarded = [(at, e) for at, ids in h.forwards for _, _, e, _ in ids]
    assert sorted(e for _, e in forwarded) == sorted(due)
    if rounding == "ceil":
        assert all(at + NativeTiming().latency_ms >= due[e] for at, e in forwarded), "never early"


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
    is handed out; msg1 is held back until its own redelivery; the copy of msg2 is dropped — covered by
    the ack of the whole entry that follows its last message's ack — and a second copy of msg0 waits for
    its ack."""
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
    assert arrive(h, 5, 9, 2) is Verdict.COVERED
    assert arrive(h, 5, 9, 0) is Verdict.DUPLICATE, "handed out once per redelivery"
    h.tracker.acked(5, 9, batch_index=0)
    h.run_until(start + 5_000)
    assert h.forwards[1][1] == [("", 5, 9, (1,))]
    assert arrive(h, 5, 9, 0) is Verdict.COVERED
    assert arrive(h, 5, 9, 1) is Verdict.DELIVER
    assert arrive(h, 5, 9, 2) is Verdict.COVERED
    stats = h.tracker.stats()
    assert (stats.redelivered, stats.held_back, stats.dropped) == (2, 1, 4)


def test_a_batch_acked_but_for_its_nacked_message_is_one_bit_and_still_classified() -> None:
    """PIP-393's case: one message of a batch nacked, the rest acked. The filter keeps no record for the
    entry (one bit), yet copies are classified as before: acked siblings acked, the nacked one held until
    its forward and handed out once; a nack-then-ack drops the pending nack."""
    h = Harness(precision_bits=0)
    start = h.clock.now
    arrivals = h.tracker.arrivals

    def held_bytes() -> int:  # less the fixed-size statistics (pulsar_nack.lateness)
        return arrivals.memory_bytes() - arrivals.lateness.nbytes - arrivals.dues.nbytes

    empty = held_bytes()
    for entry_id in (1, 2):
        for batch_index in range(5):
            assert arrive(h, 8, entry_id, batch_index, size=5) is Verdict.DELIVER
        for batch_index in (0, 1, 3, 4):
            h.tracker.acked(8, entry_id, batch_index)
        h.tracker.schedule(start + 1_000, 8, entry_id, batch_index=2)
    assert not arrivals._entries, "two quiet entries: bits, not records"
    assert len(arrivals._sets.ids(_QUIET, ("", 8))) == 2
    assert held_bytes() - empty < 1_000
    assert arrive(h, 8, 1, 0, size=5) is Verdict.ACKED, "a reconnect copy: acked sibling"
    assert arrive(h, 8, 1, 2, size=5) is Verdict.HOLD, "its nack is pending"
    assert h.tracker.acked(8, 2, 2) == ((), False), "nack-then-ack"
    assert h.tracker.index.pending_mask(8, 2) == 0
    h.run_until(start + 1_000)
    assert h.forwards[0][1] == [("", 8, 1, (2,))]
    assert [arrive(h, 8, 1, i, size=5) for i in range(5)] == [
        Verdict.COVERED,
        Verdict.COVERED,
        Verdict.DELIVER,
        Verdict.COVERED,
        Verdict.COVERED,
    ]  # forwarded: the whole entry is acked with its last message, which covers these copies
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


def test_ids_due_in_the_native_latencys_last_ms_are_never_handed_out_before_it() -> None:
    """One flush forwards what is due within one native latency (102 ms). Ids due by 100 ms after it need
    no label of their own (no copy our forward asks for comes sooner); those due in the last 2 ms are
    held until then. Both members of a quiet batch entry (the rest acked), due on either side of 100 ms,
    are forwarded, and each is handed out once, none before its bucket (issue 24)."""
    h = Harness(precision_bits=0, quiet=True)
    now = h.clock.now
    for batch_index in range(10):
        assert arrive(h, 1, 1, batch_index, size=10) is Verdict.DELIVER
    for batch_index in range(2, 10):
        h.tracker.acked(1, 1, batch_index)
    h.tracker.schedule(now + 50, 1, 1, 1)
    h.tracker.schedule(now + 101, 1, 1, 0)  # in (now + 100, now + 102]: the last 2 ms
    assert h.tracker.flush(now) >= 1 and h.tracker.stats().pending == 0
    h.clock.now = now + 100.5  # a copy 100.5 ms after the forward: m1's, not yet m0's
    assert arrive(h, 1, 1, 1, size=10) is Verdict.DELIVER
    assert arrive(h, 1, 1, 0, size=10) is Verdict.HOLD, "before its bucket"
    h.clock.now = now + 102
    assert arrive(h, 1, 1, 0, size=10) is Verdict.HOLD, "the early copy was forwarded again: wait for it"
    h.run_until(now + 1_000)
    assert arrive(h, 1, 1, 0, size=10) is Verdict.DELIVER, "m0 once, from its repeated forward"


@pytest.mark.parametrize("rounding", ["ceil", "floor"])
def test_lateness_is_measured_against_the_due_time_the_application_asked_for(rounding: str) -> None:
    """Issue 24: nack_stats' lateness is arrival − (nack time + delay), not − the bucket time, nor − the
    time the forward was armed for: ids of three buckets, one flush (a late timer), each arrival 3 ms after
    its bucket (ceil) — the app sees its own due time's lateness. With floor the arrivals are early: a
    negative lateness and an early share."""
    h = Harness(precision_bits=8, quiet=True)
    h.tracker = NackTracker(h.record, precision_bits=8, rounding=rounding, clock=h.clock, wheel=h.wheel)  # type: ignore[arg-type]
    start = h.clock.now = 1_024_000.0  # a bucket boundary (k = 8)
    dues = [start + 1_000 + 25 * i for i in range(10)]  # in two 256-ms buckets: +1,024 and +1,280 (ceil)
    for i, due in enumerate(dues):
        h.tracker.schedule(due, 1, i)
    h.clock.now = start + 1_300
    h.tracker.flush()  # one flush for both: the timer was late
    h.clock.now += 110
    expected = []
    for i, due in enumerate(dues):
        assert arrive(h, 1, i) is Verdict.DELIVER
        expected.append(h.clock.now - due)
    stats = h.tracker.stats()
    assert stats.lateness_samples == 10
    p50, p99 = (float(v) for v in np.percentile(expected, [50, 99]))
    assert stats.lateness_p50_ms == pytest.approx(p50, abs=3.0)
    assert stats.lateness_p99_ms == pytest.approx(p99, abs=3.0)
    assert stats.lateness_early_share == 0.0


def test_lateness_reports_early_redeliveries_of_floor_rounding() -> None:
    h = Harness(precision_bits=8, quiet=True)
    h.tracker = NackTracker(h.record, precision_bits=8, rounding="floor", clock=h.clock, wheel=h.wheel)
    start = h.clock.now = 1_024_000.0
    h.tracker.schedule(start + 1_200, 1, 1)  # floor: bucket start + 1,024, forwarded 102 ms before it
    h.tracker.schedule(start + 1_100, 1, 2)
    h.run_until(start + 1_024 + 5)
    assert arrive(h, 1, 1) is Verdict.DELIVER and arrive(h, 1, 2) is Verdict.DELIVER
    stats = h.tracker.stats()
    assert stats.lateness_early_share == 1.0
    assert stats.lateness_p50_ms == pytest.approx(1_029 - 1_150, abs=2.0)


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


def test_a_batch_message_whose_forwards_were_abandoned_comes_back_with_the_next_copy() -> None:
    """Issue 27 item 6: a broker that ignores redelivery requests (pulsar-lite on a partitioned topic) gets
    the forwards of a batch message up to ``max_reforwards`` times, then they are abandoned. The message is
    still unacked at the broker; the next copy it sends (a reconnect's) is the message's way back: handed
    out, not taken for a duplicate of a copy the application holds. A sibling the application does hold
    stays a duplicate."""
    h = Harness(precision_bits=0)
    start = h.clock.now
    for batch_index in range(3):
        assert arrive(h, 1, 1, batch_index) is Verdict.DELIVER
    h.tracker.acked(1, 1, batch_index=0)
    h.tracker.schedule(start + 200, 1, 1, batch_index=1)
    linger = h.tracker.arrivals.linger_ms
    h.run_until(start + 200 + (linger + 1_000) * 5)
    assert h.tracker.stats().abandoned == 1
    assert arrive(h, 1, 1, 1) is Verdict.DELIVER, "its next copy is the message"
    assert arrive(h, 1, 1, 2) is Verdict.DUPLICATE, "the application holds it"
    assert arrive(h, 1, 1, 0) is Verdict.COVERED, "acked: the entry is acked whole with its last message"


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


# -- the timer's cost: proportional to the forwards ----------------------------------------------


@pytest.mark.parametrize("precision_bits", [0, 4, 8])
def test_timer_callbacks_are_one_per_forward_not_per_bucket(precision_bits: int) -> None:
    """5,000 one-ms-apart due times: at k = 0 they are 5,000 buckets, due faster than the native timer
    allows forwards (every 68 ms). Each timer callback forwards something; there are no more callbacks
    than buckets (before: every bucket's timeout re-armed itself until a forward took its ids — 4.3M
    callbacks for 100k buckets)."""
    h = Harness(precision_bits, quiet=True)
    start = h.clock.now
    ids = 5_000
    for entry_id in range(ids):
        h.tracker.schedule(start + 1_000 + entry_id, 1, entry_id)
    buckets = h.tracker.index.bucket_count
    h.run_until(start + 1_000 + ids + 1_000)
    assert sum(len(forwarded) for _, forwarded in h.forwards) == ids and len(h.tracker.index) == 0
    assert h.callbacks == len(h.forwards), "every callback forwards"
    assert h.callbacks <= buckets + 2
    assert h.callbacks <= ids / 68 + 3, "at most one forward per native-grid slot, whatever k"


def test_no_callback_for_a_bucket_already_drained() -> None:
    h = Harness(precision_bits=0, quiet=True)
    start = h.clock.now
    for i in range(3):
        h.tracker.schedule(start + 1_000 + i, 1, i)
    h.clock.now = start + 1_000
    assert h.tracker.flush() == 3  # drains all three buckets
    h.run_until(start + 3_000)
    assert h.callbacks == 0, "the drained buckets' timeout went with them"
    h.tracker.schedule(h.clock.now + 500, 1, 9)  # and the timer still serves later nacks
    h.run_until(h.clock.now + 1_000)
    assert h.callbacks == 1 and [ids for _, ids in h.forwards][-1] == [("", 1, 9, None)]


def test_an_acked_bucket_costs_one_callback_and_the_next_bucket_still_fires() -> None:
    h = Harness(precision_bits=0, quiet=True)
    start = h.clock.now
    h.tracker.schedule(start + 1_000, 1, 1)
    h.tracker.schedule(start + 2_000, 1, 2)
    h.tracker.acked(1, 1)  # bucket start + 1000 is empty now
    h.run_until(start + 3_000)
    assert [(t - start, ids) for t, ids in h.forwards] == [(2_000 - 102, [("", 1, 2, None)])]
    assert h.callbacks == 2


# -- far, non-finite, failing ---------------------------------------------------------------------


@pytest.mark.parametrize("due", [math.inf, -math.inf, math.nan, pytest.param(10**400, id="int-beyond-float")])
def test_a_non_finite_due_time_is_rejected_naming_it(due: float) -> None:
    h = Harness()
    with pytest.raises(ValueError, match="due_ms must be a finite"):
        h.tracker.schedule(due, 1, 1)
    assert len(h.tracker.index) == 0 and len(h.wheel) == 0
    assert h.tracker.arrivals.idle, "nothing half-filed"


def test_a_nack_centuries_ahead_does_not_stop_redelivery() -> None:
    """A real timer thread: a nack 10**13 ms (317 years) ahead heads the wheel, then a short one."""
    forwarded = threading.Event()
    tracker = NackTracker(lambda _due: forwarded.set(), precision_bits=0)
    try:
        tracker.schedule(tracker.clock() + 10**13, 1, 1)
        tracker.schedule(tracker.clock() + 1e300, 1, 2)
        time.sleep(0.05)  # the thread goes to sleep for the far bucket
        tracker.schedule(tracker.clock() + 150, 1, 3)
        assert forwarded.wait(5.0), "the short nack is forwarded"
        assert tracker.stats().timer_failures == 0
        assert len(tracker.index) == 2
    finally:
        tracker.close()


def test_a_failing_timer_thread_is_restarted_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    """The clock fails once on the timer thread: the failure is logged and counted in the stats, and
    nacks filed after it are still forwarded."""
    failed = threading.Event()

    def flaky_clock() -> float:
        if threading.current_thread().name == "pulsar-nack-redelivery" and not failed.is_set():
            failed.set()
            raise OSError("clock source gone")
        return monotonic_ms()

    forwards: list[list[int]] = []
    done = threading.Event()

    def forward(due: Sequence[DueIds]) -> None:
        forwards.append([e for d in due for e in d.entry_ids.tolist()])
        if [4] in forwards:
            done.set()

    tracker = NackTracker(forward, precision_bits=0, clock=flaky_clock)
    try:
        tracker.schedule(flaky_clock() + 150, 1, 1)
        assert failed.wait(5.0)
        tracker.schedule(flaky_clock() + 300, 1, 4)
        assert done.wait(5.0), "forwarding went on after the failure"
        assert tracker.stats().timer_failures == 1
    finally:
        tracker.close()
    assert forwards == [[1], [4]]
    assert "restarting it" in caplog.text


# -- lifecycle --------------------------------------------------------------------------------------


def test_a_tracker_starts_its_thread_on_the_first_nack() -> None:
    tracker = NackTracker(lambda _due: None)
    try:
        assert tracker._wheel._thread is None, "no thread before a nack"
        tracker.schedule(tracker.clock() + 60_000, 1, 1)
        thread = tracker._wheel._thread
        assert thread is not None and thread.is_alive()
    finally:
        tracker.close()
    thread.join(5.0)
    assert not thread.is_alive(), "close ends it"


def test_a_dropped_unclosed_tracker_is_collected_and_its_thread_ends() -> None:
    """As the official consumer is: the timer must not keep the tracker (and the consumer) alive."""
    forwards: list[int] = []
    tracker: NackTracker | None = NackTracker(lambda due: forwards.append(len(due)))
    assert tracker is not None
    tracker.schedule(tracker.clock() + 60_000, 1, 1)  # pending: its bucket is armed
    tracker.schedule(tracker.clock(), 1, 2)  # and one forwarded at once
    deadline = time.monotonic() + 5.0
    while not forwards and time.monotonic() < deadline:
        time.sleep(0.01)
    assert forwards == [1] and len(tracker.index) == 1
    thread = tracker._wheel._thread
    assert thread is not None and thread.is_alive()
    dropped = weakref.ref(tracker)
    tracker = None
    gc.collect()
    assert dropped() is None, "collected although nacks were pending and its timer armed"
    thread.join(5.0)
    assert not thread.is_alive(), "its timer thread ended"


def test_close_does_not_wait_for_a_hook_blocked_on_the_callers_lock() -> None:
    """apache/pulsar #23650's shape: the forward hook waits for a lock the thread calling close() holds.
    close() must return at once (it used to wait 10 s for the timer), and the hook runs without the
    tracker's or the timer's locks (else close() would deadlock: run on a thread here, so that the test
    fails instead of hanging)."""
    app_lock = threading.Lock()
    entered = threading.Event()
    left = threading.Event()
    locks_held: list[bool] = []
    elapsed: list[float] = []
    tracker = NackTracker(lambda _due: hook(), precision_bits=0)

    def hook() -> None:
        locks_held.append(tracker._lock.locked() or tracker._wheel._lock.locked())
        entered.set()
        with app_lock:
            left.set()

    def closer() -> None:
        with app_lock:
            tracker.schedule(tracker.clock(), 1, 1)
            if entered.wait(5.0):
                started = time.monotonic()
                tracker.close()
                elapsed.append(time.monotonic() - started)

    closing = threading.Thread(target=closer, daemon=True)
    closing.start()
    closing.join(8.0)
    assert not closing.is_alive(), "close() deadlocked with the hook"
    assert entered.is_set() and len(elapsed) == 1
    assert elapsed[0] < 3.0, f"close() waited {elapsed[0]:.1f} s for the hook"
    assert tracker.closed
    assert left.wait(5.0), "the hook finished once the lock was free"
    thread = tracker._wheel._thread
    assert thread is not None
    thread.join(5.0)
    assert not thread.is_alive()
    assert locks_held == [False]


@pytest.mark.parametrize("batch_index", [-1, 0], ids=["single", "batched"])
def test_an_ack_racing_a_nack_of_the_same_message_leaves_nothing_pending(
    batch_index: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One thread nacks a message while another acks it (issue 9: mixed acks and nacks from several
    threads). The nack's arrival record and its index add happen under the arrival filter's lock, and so
    does the ack's removal: the ack comes after both, and nothing stays pending. (When the ack could land
    between the two, the index kept a nack of an acked message: forwarded, and a non-batched copy was
    handed out again.) The index's add waits here for the ack to be under way, to open that window."""
    in_add, ack_started = threading.Event(), threading.Event()
    add = TimeBucketIndex.add

    def slow_add(index: TimeBucketIndex, *args: Any, **kwargs: Any) -> int:
        in_add.set()
        ack_started.wait(5)
        time.sleep(0.05)  # the ack, unless it waits for the nack, is done by now
        return add(index, *args, **kwargs)

    monkeypatch.setattr(TimeBucketIndex, "add", slow_add)  # before the tracker binds it
    harness = Harness(quiet=True)
    tracker = harness.tracker
    errors: list[BaseException] = []

    def acker() -> None:
        try:
            assert in_add.wait(5), "the nack never reached the index"
            ack_started.set()
            tracker.acked(7, 5, batch_index, "t")
        except BaseException as error:  # recorded: asserted on the test's thread
            errors.append(error)

    thread = threading.Thread(target=acker, daemon=True)
    thread.start()
    tracker.schedule(harness.clock.now + 1_000, 7, 5, batch_index, "t")
    thread.join(10)
    assert not thread.is_alive() and not errors, errors
    assert len(tracker.index) == 0, "the index holds a nack of a message acked after it"
    tracker.flush(everything=True)
    assert harness.forwards == [], "a nack of an acked message was forwarded"
    assert tracker.arrivals.admit(7, 5, batch_index, "t", 1) is not Verdict.HOLD


def test_a_cleared_tracker_keeps_no_offsets_of_the_nacks_it_forgot() -> None:
    """Issue 23: a consumer with nothing pending keeps ≤ 16 KiB. A clear (a seek) forgets the pending nacks
    and with them where their due times lie in their buckets (the lateness estimator's offsets, 6 KiB);
    the lateness counted so far stays."""
    h = Harness(precision_bits=8)
    start = h.clock.now
    h.tracker.schedule(start + 1_000, 7, 1)
    h.run_until(start + 1_500)  # one forwarded, its copy on its way
    for entry in range(2, 42):  # (in 40 buckets: every row of offsets made)
        h.tracker.schedule(start + 5_000 + 300 * entry, 7, entry)
    lateness = h.tracker.arrivals.lateness
    before = lateness.nbytes
    h.tracker.clear()
    assert h.tracker.stats().pending == 0
    assert lateness.nbytes < before - 4_096


def test_a_tracker_with_nothing_pending_lets_the_lateness_offsets_go_at_its_sweep() -> None:
    """Issue 23: once no nack is pending or on its way, the arrival filter's sweep (``linger_ms`` after
    the last forward) lets the estimator's offsets and its sample of due times go — not while one nack is
    still pending: the histogram alone stays, with the redeliveries it counted."""
    h = Harness(precision_bits=8)
    start = h.clock.now
    linger = h.tracker.arrivals.linger_ms
    for entry in range(1, 6):
        h.tracker.schedule(start + 1_000 + 97 * entry, 7, entry)
    h.tracker.schedule(start + 3 * linger, 7, 6)  # pending through the first sweeps
    lateness, dues = h.tracker.arrivals.lateness, h.tracker.arrivals.dues

    def redeliver(entries: range) -> None:
        for entry in entries:
            assert arrive(h, 7, entry) is Verdict.DELIVER
            h.tracker.arrivals.acked(7, entry, -1, "")

    h.run_until(start + 2_000)
    redeliver(range(1, 6))
    held = lateness.nbytes
    assert len(lateness) == 5 and dues.nbytes > 512
    h.run_until(start + 2 * linger)
    assert h.tracker.stats().pending == 1
    assert lateness.nbytes == held and dues.nbytes > 512, "one nack pending: its offset and due time kept"
    h.run_until(start + 3 * linger + 1_000)
    redeliver(range(6, 7))
    h.run_until(start + 4 * linger + 2_000)
    assert len(lateness) == 6
    assert lateness.nbytes < held - 1_024 and dues.nbytes < 512  # (offsets of 6 buckets: 1.6 KiB)


def test_ids_popped_for_a_forward_keep_their_lateness_offsets_through_a_sweep() -> None:
    """A flush pops the index under the filter's lock and tells the filter what it forwarded after it: a
    sweep between the two (another thread's) finds the index empty and no copy on its way yet, and must
    not let the estimator's offsets of the popped ids go — their redeliveries draw from them."""
    h = Harness(precision_bits=8)
    start = h.clock.now
    h.tracker.schedule(start + 1_000, 7, 1)
    arrivals, lateness = h.tracker.arrivals, h.tracker.arrivals.lateness
    held = lateness.nbytes
    h.clock.now = start + 2_000
    popped = arrivals.pop(h.tracker.index.pop_due_by_bucket, int(h.clock.now))
    assert len(popped) == 1 and h.tracker.stats().pending == 0
    arrivals.sweep()
    assert lateness.nbytes == held


def test_a_forward_of_many_ledgers_leaves_no_grown_table_behind() -> None:
    """A flush's pop is remembered per ledger until its forward is learned, then dropped ledger by
    ledger: the emptied table is let go (a dict keeps its grown table when emptied key by key: 37 KB
    after a forward of 1,000 ledgers, uncounted by the report)."""
    h = Harness(precision_bits=0, quiet=True)
    due = h.clock.now + 1_000
    for ledger in range(1_000):
        h.tracker.schedule(due, 10_000 + ledger, 1)
    h.run_until(due + 100)
    assert sum(len(ids) for _, ids in h.forwards) == 1_000
    assert sys.getsizeof(h.tracker.arrivals._popped) == sys.getsizeof({})


def test_acked_redeliveries_are_kept_once_in_the_recent_sets() -> None:
    """Issue 23: the filter remembers the non-batched messages it handed out for a forward (a later copy
    is a duplicate, or acked once the application acked it) as *delivered* and *not acked yet*: an
    application acks what it is handed, so once it has, each message is held once — where *delivered*
    and *acked* held it twice. A late copy of an acked one is ACKED, of one not acked DUPLICATE."""
    from pulsar_nack.arrivals import _RECENT, _SETS

    h = Harness(precision_bits=8)
    start = h.clock.now
    for entry in range(1, 2_001):
        h.tracker.schedule(start + 1_000, 7, entry)
    h.run_until(start + 2_000)
    for entry in range(1, 2_001):
        assert arrive(h, 7, entry) is Verdict.DELIVER
        if entry > 1:
            h.tracker.acked(7, entry)
    bitmaps = h.tracker.arrivals._sets.layout.bitmaps
    assert sum(len(bitmaps[which]) for which in range(_RECENT, _SETS)) == 2_000 + 1
    assert arrive(h, 7, 2) is Verdict.ACKED and arrive(h, 7, 2_000) is Verdict.ACKED
    assert arrive(h, 7, 1) is Verdict.DUPLICATE, "handed out, not acked yet"
    h.tracker.acked(7, 1)
    assert arrive(h, 7, 1) is Verdict.ACKED
    assert sum(len(bitmaps[which]) for which in range(_RECENT, _SETS)) == 2_000
