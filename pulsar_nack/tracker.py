"""The client-side nack tracker: TimeBucket index + timer wheel + forwarding of due ids.

Data flows one way: ``schedule`` (a nack) → :class:`~pulsar_nack.index.TimeBucketIndex` → a
:class:`~pulsar_nack.timer.TimerWheel` timeout per bucket → ``forward(due_ids)``, which the consumer
layer turns into native ``negative_acknowledge`` calls (the only per-id redelivery the official Python
client has).

When forwards happen is decided by :class:`NativeTiming`, a model of the native tracker's timer (see
there): a bucket's ids are forwarded one native latency before the bucket's time, and only at moments that
neither postpone an earlier forward's redelivery nor starve the native timer.

Every message the broker delivers passes the :class:`~pulsar_nack.arrivals.ArrivalFilter` the tracker
keeps informed of nacks and forwards (see there): each nack is handed out once when due, never early, and
copies of batch messages the application acked or holds are not handed out again.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pulsar_nack.arrivals import NATIVE_MIN_DELAY_MS, ArrivalFilter, Verdict
from pulsar_nack.index import DueIds, Rounding, TimeBucketIndex
from pulsar_nack.memory import python_bytes
from pulsar_nack.timer import Timeout, TimerWheel, monotonic_ms

__all__ = ["NackStats", "NackTracker", "NativeTiming", "Verdict"]

_log = logging.getLogger(__name__)
#: The native delay pulsar_nack subscribes with: the smallest multiple of 3 above the minimum, so that the
#: native timer's third check (every delay/3) falls exactly on the due time: a deterministic latency.
NATIVE_DELAY_MS = 102


#: A timeout's share of its wheel bucket's dict (key + value + hash slots at 2/3 load).
_WHEEL_SLOT_BYTES = 48


@dataclass(frozen=True)
class NativeTiming:
    """When the native tracker (pulsar-client-cpp 3.x/4.x ``NegativeAcksTracker``) redelivers a nacked id.

    Each native nack re-arms one timer to fire ``interval = delay // 3`` ms later; each firing redelivers
    the ids nacked at least ``delay`` ago and re-arms it again. So an id forwarded at t comes back at the
    first check at or after t + delay — at t + ``latency`` — *unless* another forward re-arms the timer
    in between and shifts the checks. Hence forwards go only at moments that keep earlier forwards on time:
    exactly ``2 * interval`` after the previous one (the checks stay on the same grid, and the check in
    between still fires), or once the previous forward's ids are out (``latency`` + a margin). Forwarding
    every ``interval`` or faster would postpone the native check for ever (the native starvation).

    A timer never fires exactly on the same-grid slot; up to ``margin`` after it still counts: the
    native check of the slot has fired, and the forward re-arms the next one, so the previous forward's ids
    come back that much late. (Without this tolerance, a 1 ms late timer pushed the forward to the free
    slot: ~40 ms later.)
    """

    delay_ms: int = NATIVE_DELAY_MS
    margin_ms: float = 5.0  # timer jitter allowed for before a fresh forward may re-arm the native timer

    @property
    def interval_ms(self) -> int:
        return max(self.delay_ms, NATIVE_MIN_DELAY_MS) // 3

    @property
    def latency_ms(self) -> int:
        """Forward → redelivery request sent. Exact when ``delay_ms`` is a multiple of 3."""
        delay = max(self.delay_ms, NATIVE_MIN_DELAY_MS)
        return -(-delay // self.interval_ms) * self.interval_ms

    def forward_at(self, desired_ms: float, last_ms: float) -> float:
        """The earliest moment >= ``desired_ms`` at which a forward keeps the one at ``last_ms`` on time."""
        free_ms = last_ms + self.latency_ms + self.margin_ms
        same_grid_ms = last_ms + 2 * self.interval_ms
        if desired_ms >= free_ms:
            return desired_ms
        if desired_ms <= same_grid_ms:
            return same_grid_ms
        return desired_ms if desired_ms <= same_grid_ms + self.margin_ms else free_ms


@dataclass(frozen=True)
class NackStats:
    """A snapshot of a tracker's state and history."""

    pending: int  # ids waiting in the index (batch messages of one entry and bucket count once)
    buckets: int
    memory_bytes: int  # index + arrival filter + armed timeouts (Python objects + CRoaring heap)
    nacked: int  # ids scheduled
    forwarded: int  # entries handed to the native client for redelivery
    redelivered: int  # messages handed to the application again after a forward
    held_back: int  # arrivals not handed out because their nack is still pending
    dropped: int  # arrivals not handed out because the application acked them or holds another copy
    reforwarded: int  # forwards repeated because their copy came early or never came
    abandoned: int  # forwards given up after repeating (logged; the broker still holds the messages)
    lateness_p50_ms: float | None  # arrival - bucket time, over the recent redeliveries
    lateness_p99_ms: float | None


class NackTracker:
    """Schedules nacked ids and forwards them to ``forward`` when due; classifies arrivals. Thread-safe.

    ``forward`` is called on the timer thread with the due ids, once per flush; it must not block for
    long (it delays the next flush) and may be called concurrently with :meth:`schedule`.
    """

    def __init__(
        self,
        forward: Callable[[Sequence[DueIds]], object],
        *,
        precision_bits: int = 8,
        rounding: Rounding = "floor",
        native: NativeTiming = NativeTiming(),
        linger_ms: float = 30_000.0,
        compact_after_ms: float = 1_000.0,
        clock: Callable[[], float] = monotonic_ms,
        wheel: TimerWheel | None = None,
        lateness_window: int = 4096,
        batch_size: Callable[[Any], int] = int,
    ) -> None:
        """``batch_size(token)``: the size of a batch from what the consumer passes to the arrival filter
        (see :class:`~pulsar_nack.arrivals.ArrivalFilter`)."""
        self.index = TimeBucketIndex(precision_bits, rounding)
        self.arrivals = ArrivalFilter(
            self._refile,
            clock=clock,
            batch_size=batch_size,
            pending_mask=self.index.pending_mask,
            linger_ms=linger_ms,
            lateness_window=lateness_window,
        )
        self._forward = forward
        self.native = native
        self.lead_ms = float(native.latency_ms)
        self.compact_after_ms = float(compact_after_ms)
        self._compaction: Timeout | None = None
        self._sweep: Timeout | None = None
        self._clock = clock
        self._owns_wheel = wheel is None
        self._wheel = wheel if wheel is not None else TimerWheel(clock=clock, name="pulsar-nack-redelivery")
        self._lock = threading.Lock()
        self._armed: dict[int, Timeout] = {}  # bucket time → its timeout
        self._last_forward = -float("inf")
        self._forwarded = 0
        self._closed = False

    # -- the nack path ----------------------------------------------------------------------------

    def schedule(
        self, due_ms: float, ledger_id: int, entry_id: int, batch_index: int = -1, topic: str = ""
    ) -> int | None:
        """File one id for redelivery at ``due_ms`` (clock ms); returns its bucket time, or None for a batch
        message the application has acked (nothing to redeliver). O(1) typically."""
        if self._closed:
            raise RuntimeError("the consumer is closed")
        fresh = self.arrivals.pending(ledger_id, entry_id, batch_index, topic)
        if fresh is None:
            return None
        try:
            bucket = self.index.add(int(due_ms), ledger_id, entry_id, batch_index, topic, fresh=fresh)
        except BaseException:
            self.arrivals.withdraw(ledger_id, entry_id, batch_index, topic)
            raise
        if bucket not in self._armed:  # most nacks land in an armed bucket: no lock needed to see that
            with self._lock:
                if bucket not in self._armed and not self._closed:
                    self._arm(bucket, bucket - self.lead_ms)
        return bucket

    def _refile(self, due_ms: float, ledger_id: int, entry_id: int, batch_index: int, topic: str) -> None:
        """The arrival filter wants a forward repeated (its copy came early, or never came)."""
        if not self._closed:
            self.schedule(max(due_ms, self._clock()), ledger_id, entry_id, batch_index, topic)

    def acked(
        self, ledger_id: int, entry_id: int, batch_index: int = -1, topic: str = ""
    ) -> tuple[Sequence[object], bool]:
        """The application acked a message: a pending nack of it is dropped. Returns copies of it the
        consumer must ack too, and whether it must ack the whole entry at the broker (see
        :meth:`~pulsar_nack.arrivals.ArrivalFilter.acked`). O(1) typically."""
        copies, was_pending, ack_entry = self.arrivals.acked(ledger_id, entry_id, batch_index, topic)
        if was_pending:
            self.index.remove(ledger_id, entry_id, batch_index, topic)
        return copies, ack_entry

    def _arm(self, bucket: int, at_ms: float) -> None:
        """One timeout per bucket (lock held); a new bucket also means an older one may have gone cold."""
        self._armed[bucket] = self._wheel.schedule(at_ms, functools.partial(self._fire, bucket))
        if self._compaction is None:
            self._compaction = self._wheel.schedule(self._clock() + self.compact_after_ms, self._compact)

    def _compact(self) -> None:
        """Timer thread: compact the buckets nacks have moved on from (off the nack path)."""
        with self._lock:
            self._compaction = None
        if not self._closed:
            self.index.compact()

    # -- the timer path ----------------------------------------------------------------------------

    def _fire(self, bucket: int) -> None:
        """Timer thread: forward everything that must arrive by ``now + lead``."""
        now = self._clock()
        with self._lock:
            self._armed.pop(bucket, None)
            if self._closed:
                return
            at = self.native.forward_at(now, self._last_forward)
            if at > now:
                self._arm(bucket, at)  # now would delay the last forward's redelivery, or starve the timer
                return
        self.flush(now, target=bucket)

    def flush(self, now: float | None = None, target: int | None = None, everything: bool = False) -> int:
        """Forward due ids (all pending ids with ``everything``) now; returns how many entries went."""
        now = self._clock() if now is None else now
        due = self.index.pop_due(2**62 if everything else int(now + self.lead_ms))
        if not due:
            return 0
        target = int(now + self.lead_ms) if target is None else target
        forwarded = 0
        for ids in due:
            self.arrivals.forwarded(ids.topic, ids.ledger_id, ids.entry_ids, ids.batch_indexes, now, target)
            forwarded += len(ids.entry_ids)
        with self._lock:
            self._last_forward = now
            self._forwarded += forwarded
            if self._sweep is None and not self._closed:
                sweep_at = self.arrivals.sweep_due
                if sweep_at is not None:
                    self._sweep = self._wheel.schedule(sweep_at + 1, self._sweep_arrivals)
        try:
            self._forward(due)
        except Exception:
            _log.exception("forwarding %d due entries to the native client failed", forwarded)
        return forwarded

    def _sweep_arrivals(self) -> None:
        """Timer thread: retire old forwards; repeat those whose copy never came."""
        abandoned = self.arrivals.counts().abandoned
        again = self.arrivals.sweep()
        if self.arrivals.counts().abandoned > abandoned:
            _log.warning(
                "gave up redelivering %d nacked messages after %d forwards without a copy arriving; "
                "the broker still holds them (they return on reconnect or to another consumer)",
                self.arrivals.counts().abandoned - abandoned,
                self.arrivals.max_reforwards + 1,
            )
        for due_ms, ledger_id, entry_id, batch_index, topic in again:
            self._refile(due_ms, ledger_id, entry_id, batch_index, topic)
        with self._lock:
            self._sweep = None
            sweep_at = self.arrivals.sweep_due
            if sweep_at is not None and not self._closed:
                self._sweep = self._wheel.schedule(max(sweep_at, self._clock()) + 1, self._sweep_arrivals)

    # -- lifecycle and stats --------------------------------------------------------------------------

    def close(self, flush: bool = False) -> None:
        """Stop the timer; forward every pending id first when ``flush``, else drop them. Idempotent."""
        if self._closed:
            return
        if flush:
            self.flush(everything=True)
        self._closed = True
        with self._lock:
            armed = list(self._armed.values())
            armed.extend(t for t in (self._compaction, self._sweep) if t is not None)
            self._armed.clear()
        for timeout in armed:
            timeout.cancel()
        if self._owns_wheel:
            self._wheel.close()
        self.clear()

    def clear(self) -> None:
        """Forget every pending nack and what the arrival filter knows (a seek; close)."""
        self.index.clear()
        self.arrivals.clear()

    def _memory_bytes(self) -> int:
        """The index, the arrival filter and the armed buckets' timeouts. O(index objects)."""
        index_bytes: int = self.index.memory_usage().total_bytes
        return index_bytes + self.arrivals.memory_bytes() + self._timer_bytes()

    def _timer_bytes(self) -> int:
        """One timeout per armed bucket: the ``_armed`` dict plus, per bucket (from one sample), its key,
        the timeout, its callback and deadline, and its slot in the wheel's bucket dict. O(1)."""
        with self._lock:
            total = python_bytes(self._armed)
            sample = next(iter(self._armed.items()), None)
            count = len(self._armed)
        if sample is None:
            return total
        bucket, timeout = sample
        callback = timeout.callback
        per = python_bytes(bucket) + python_bytes(timeout) + python_bytes(timeout.deadline_ms)
        per += python_bytes(callback) + python_bytes(getattr(callback, "args", ())) + _WHEEL_SLOT_BYTES
        return total + count * per

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self, with_memory: bool = True) -> NackStats:
        """Counters, pending state and lateness percentiles. O(1), or O(index objects) ``with_memory``."""
        samples = np.array(list(self.arrivals.lateness), dtype=float)  # list(): one atomic copy
        p50, p99 = (float(v) for v in np.percentile(samples, [50, 99])) if len(samples) else (None, None)
        counts = self.arrivals.counts()
        return NackStats(
            pending=len(self.index),
            buckets=self.index.bucket_count,
            memory_bytes=self._memory_bytes() if with_memory else 0,
            nacked=self.index.added,
            forwarded=self._forwarded,
            redelivered=counts.redelivered,
            held_back=counts.held_back,
            dropped=counts.dropped,
            reforwarded=counts.reforwarded,
            abandoned=counts.abandoned,
            lateness_p50_ms=p50,
            lateness_p99_ms=p99,
        )
