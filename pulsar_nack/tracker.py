"""The client-side nack tracker: TimeBucket index + timer wheel + forwarding of due ids.

Data flows one way: ``schedule`` (a nack) → :class:`~pulsar_nack.index.TimeBucketIndex` → a
:class:`~pulsar_nack.timer.TimerWheel` timeout per bucket → ``forward(due_ids)``, which the consumer
layer turns into native ``negative_acknowledge`` calls (the only per-id redelivery the official Python
client has).

When forwards happen is decided by :class:`NativeTiming`, a model of the native tracker's timer (see
there): a bucket's ids are forwarded one native latency before the bucket's time, and only at moments that
neither postpone an earlier forward's redelivery nor starve the native timer.

Redelivered entries come back whole. :meth:`NackTracker.on_arrival` decides per message whether the
application sees it: batch messages it acked or still holds, or whose own nack is pending for later, are
not handed out again — but siblings it has not seen yet are (their first copies may still be queued in
the native client). Neither is a message the broker redelivers early (e.g. after a reconnect) while its
nack is pending: it comes back when due.

Without batch-index acks the broker acks a batch entry only once every message of *one delivered copy*
of it is acked. So copies of messages the application already acked are acked for it (``ACKED``), and
copies of messages it still holds are acked when it acks its own copy (``DUPLICATE``): the last copy of
every entry completes, and the broker forgets the entry.
"""

from __future__ import annotations

import enum
import functools
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from pulsar_nack.index import DueIds, Rounding, TimeBucketIndex
from pulsar_nack.timer import Timeout, TimerWheel, monotonic_ms

__all__ = ["NackStats", "NackTracker", "Verdict"]

_log = logging.getLogger(__name__)

#: The native client's minimum nack delay (``max(delay, 100)`` in pulsar-client-cpp).
NATIVE_MIN_DELAY_MS = 100
#: The native delay pulsar_nack subscribes with: the smallest multiple of 3 above the minimum, so that the
#: native timer's third check (every delay/3) falls exactly on the due time: a deterministic latency.
NATIVE_DELAY_MS = 102


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


class Verdict(enum.Enum):
    """What to do with a message that just arrived from the broker."""

    DELIVER = "deliver"  # hand it to the application
    HOLD = "hold"  # its nack is pending: it comes back when due
    ACKED = "acked"  # the application acked this message: ack this copy too, don't hand it out
    DUPLICATE = "duplicate"  # the application holds another copy: ack this one when it acks that


@dataclass(frozen=True)
class NackStats:
    """A snapshot of a tracker's state and history."""

    pending: int  # ids waiting in the index (batch messages of one entry and bucket count once)
    buckets: int
    memory_bytes: int  # the index's memory (Python objects + CRoaring heap)
    nacked: int  # ids scheduled
    forwarded: int  # entries handed to the native client for redelivery
    redelivered: int  # messages handed to the application again after a forward
    held_back: int  # arrivals not handed out because their nack is still pending
    dropped: int  # arrivals not handed out because the application acked them or holds another copy
    lateness_p50_ms: float | None  # arrival - bucket time, over the recent redeliveries
    lateness_p99_ms: float | None


#: "Every message of the batch has been handed out" (batch indexes are far below this).
_ALL_SEEN = 2**31


class _Batch:
    """What the application has seen and acked of a batched entry, while any of it is unacked.

    The native client queues a batch's messages together and hands them out in index order, so "seen"
    is one number: the highest batch index taken from the queue. ``size`` is learned when the queue
    moves on to another entry; with it, a fully acked batch is forgotten.
    """

    __slots__ = ("acked", "seen", "size")

    def __init__(self, seen: int) -> None:
        self.seen = seen
        self.acked = 0  # bitmask of acked batch indexes
        self.size: int | None = None

    @property
    def settled(self) -> bool:
        return self.size is not None and self.acked == (1 << self.size) - 1


class _Forwarded:
    """An entry handed to the native client, until its redelivery has arrived (or ``ttl`` passed)."""

    __slots__ = ("at", "batch", "delivered", "expected", "targets")

    def __init__(self, at: float, target: int, expected: int, batch: _Batch | None) -> None:
        self.at = at  # when it was last forwarded (clock ms)
        self.expected = expected  # bitmask of batch indexes to hand out again; -1: the whole entry
        self.targets = [(expected, target)]  # (batch indexes, the bucket time they were due at), newest last
        self.batch = batch if batch is not None else _Batch(_ALL_SEEN)
        self.delivered = 0  # bitmask of batch indexes handed out again

    def merge(self, at: float, target: int, expected: int) -> None:
        """The entry was forwarded again: expect these messages too (again, if handed out already)."""
        self.at = at
        self.expected = -1 if expected == -1 or self.expected == -1 else self.expected | expected
        self.delivered = 0 if expected == -1 else self.delivered & ~expected
        self.targets.append((expected, target))

    def target_of(self, bit: int) -> int:
        """When the message with this batch-index bit (0: non-batched) was due."""
        for expected, target in reversed(self.targets):
            if expected == -1 or expected & bit:
                return target
        return self.targets[-1][1]


class NackTracker:
    """Schedules nacked ids and forwards them to ``forward`` when due. Thread-safe.

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
        inflight_ttl_ms: float = 30_000.0,
        compact_after_ms: float = 1_000.0,
        clock: Callable[[], float] = monotonic_ms,
        wheel: TimerWheel | None = None,
        lateness_window: int = 4096,
        max_open_batches: int = 100_000,
    ) -> None:
        self.index = TimeBucketIndex(precision_bits, rounding)
        self._forward = forward
        self.native = native
        self.lead_ms = float(native.latency_ms)
        self.inflight_ttl_ms = float(inflight_ttl_ms)
        self.compact_after_ms = float(compact_after_ms)
        self._compaction: Timeout | None = None
        self._clock = clock
        self._owns_wheel = wheel is None
        self._wheel = wheel if wheel is not None else TimerWheel(clock=clock, name="pulsar-nack-redelivery")
        self._lock = threading.Lock()
        self._armed: dict[int, Timeout] = {}  # bucket time → its timeout
        self._inflight: dict[tuple[str, int, int], _Forwarded] = {}
        self._batches: dict[tuple[str, int, int], _Batch] = {}  # batched entries not fully acked yet
        self.max_open_batches = max_open_batches
        self._cursor: dict[str, tuple[int, int, int]] = {}  # topic → last (ledger, entry, batch index) out
        self._last_forward = -float("inf")
        self._lateness: deque[float] = deque(maxlen=lateness_window)
        self._forwarded = self._redelivered = self._held_back = self._dropped = 0
        self._closed = False

    # -- the nack path ----------------------------------------------------------------------------

    def schedule(
        self, due_ms: float, ledger_id: int, entry_id: int, batch_index: int = -1, topic: str = ""
    ) -> int:
        """File one id for redelivery at ``due_ms`` (clock ms); returns its bucket time. O(1) typically."""
        if self._closed:
            raise RuntimeError("the consumer is closed")
        bucket = self.index.add(int(due_ms), ledger_id, entry_id, batch_index, topic)
        if batch_index >= 0:
            with self._lock:
                batch = self._batch((topic, ledger_id, entry_id), seen=_ALL_SEEN)
                batch.seen = max(batch.seen, batch_index)
        if bucket not in self._armed:  # most nacks land in an armed bucket: no lock needed to see that
            with self._lock:
                if bucket not in self._armed and not self._closed:
                    self._arm(bucket, bucket - self.lead_ms)
        return bucket

    def _batch(self, key: tuple[str, int, int], seen: int) -> _Batch:
        """The entry's batch state, made with ``seen`` if new (lock held). O(1)."""
        batch = self._batches.get(key)
        if batch is None:
            if len(self._batches) >= self.max_open_batches:
                # An application that never acks: forget the oldest entry (its copies may go unacked).
                self._batches.pop(next(iter(self._batches)))
            batch = self._batches[key] = _Batch(seen)
        return batch

    def _settle(self, key: tuple[str, int, int], batch: _Batch) -> None:
        """Forget a fully acked batch with nothing pending or in flight (lock held)."""
        topic, ledger_id, entry_id = key
        if (
            batch.settled
            and key not in self._inflight
            and self.index.due_of(ledger_id, entry_id, -1, topic) is None
        ):
            self._batches.pop(key, None)

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
        keys: list[tuple[str, int, int]] = []
        with self._lock:
            self._last_forward = now
            for ids in due:
                partial = ids.batch_indexes
                for entry_id in ids.entry_ids.tolist():
                    key = (ids.topic, ids.ledger_id, entry_id)
                    indexes = partial.get(entry_id)
                    expected = -1 if indexes is None else sum(1 << i for i in indexes)
                    record = self._inflight.get(key)
                    if record is None:
                        self._inflight[key] = _Forwarded(now, target, expected, self._batches.get(key))
                    else:  # an earlier redelivery of this entry may still be on its way: keep its messages
                        record.merge(now, target, expected)
                    keys.append(key)
            self._forwarded += len(keys)
            if not self._closed:
                self._wheel.schedule(now + self.inflight_ttl_ms, functools.partial(self._expire, keys, now))
        forwarded = len(keys)
        try:
            self._forward(due)
        except Exception:
            _log.exception("forwarding %d due entries to the native client failed", forwarded)
        return forwarded

    def _expire(self, keys: list[tuple[str, int, int]], forwarded_at: float) -> None:
        with self._lock:
            for key in keys:
                record = self._inflight.get(key)
                if record is not None and record.at == forwarded_at:
                    del self._inflight[key]
                batch = self._batches.get(key)
                if batch is not None:
                    self._settle(key, batch)

    # -- the receive path --------------------------------------------------------------------------

    def on_arrival(self, ledger_id: int, entry_id: int, batch_index: int = -1, topic: str = "") -> Verdict:
        """Decide what happens to a message that just came out of the native queue.

        O(1) typically (dict lookups, plus the index's ``due_of`` for ids of ledgers with pending nacks).
        """
        key = (topic, ledger_id, entry_id)
        with self._lock:
            batch = self._arrived_in_batch(key, batch_index) if batch_index >= 0 else None
            record = self._inflight.get(key)
            if record is not None:
                return self._redelivery(key, record, batch_index)
            if batch is not None:
                if batch.acked >> batch_index & 1:
                    self._dropped += 1
                    return Verdict.ACKED
                batch.seen = max(batch.seen, batch_index)
            if self.index.due_of(ledger_id, entry_id, batch_index, topic) is not None:
                self._held_back += 1
                return Verdict.HOLD
        return Verdict.DELIVER

    def _arrived_in_batch(self, key: tuple[str, int, int], batch_index: int) -> _Batch:
        """Follow the native queue's position (lock held): leaving an entry tells its batch size."""
        topic, ledger_id, entry_id = key
        previous = self._cursor.get(topic)
        if previous is not None and previous[:2] != (ledger_id, entry_id):
            left_key = (topic, previous[0], previous[1])
            left = self._batches.get(left_key)
            if left is not None and left.size is None:
                left.size = previous[2] + 1
                self._settle(left_key, left)
        self._cursor[topic] = (ledger_id, entry_id, batch_index)
        return self._batch(key, seen=-1)

    def _redelivery(self, key: tuple[str, int, int], record: _Forwarded, batch_index: int) -> Verdict:
        """A message of an entry we forwarded (lock held)."""
        if batch_index < 0:  # a non-batched message: the redelivery is complete
            del self._inflight[key]
            self._delivered(record, 0)
            return Verdict.DELIVER
        bit = 1 << batch_index
        if record.batch.acked & bit:
            self._dropped += 1
            return Verdict.ACKED
        if (record.expected == -1 or record.expected & bit) and not record.delivered & bit:
            record.delivered |= bit
            self._delivered(record, bit)
            return Verdict.DELIVER
        topic, ledger_id, entry_id = key
        if self.index.due_of(ledger_id, entry_id, batch_index, topic) is not None:
            self._held_back += 1  # a sibling whose own nack is due later
            return Verdict.HOLD
        if batch_index <= record.batch.seen:
            self._dropped += 1  # the application holds (or was handed again) a copy of it
            return Verdict.DUPLICATE
        record.batch.seen = batch_index  # a sibling the application has not seen yet: its first delivery
        return Verdict.DELIVER

    def _delivered(self, record: _Forwarded, bit: int) -> None:
        self._redelivered += 1
        self._lateness.append(self._clock() - record.target_of(bit))

    def on_ack(self, ledger_id: int, entry_id: int, batch_index: int = -1, topic: str = "") -> None:
        """Record an acked batch message, so copies of it are acked rather than handed out again. O(1)."""
        if batch_index < 0:
            return
        key = (topic, ledger_id, entry_id)
        with self._lock:
            batch = self._batch(key, seen=_ALL_SEEN)
            batch.acked |= 1 << batch_index
            self._settle(key, batch)

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
            if self._compaction is not None:
                armed.append(self._compaction)
            self._armed.clear()
        for timeout in armed:
            timeout.cancel()
        if self._owns_wheel:
            self._wheel.close()
        self.index.clear()

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self, with_memory: bool = True) -> NackStats:
        """Counters, pending state and lateness percentiles. O(1), or O(index objects) ``with_memory``."""
        samples = np.fromiter(self._lateness, dtype=float)
        p50, p99 = (float(v) for v in np.percentile(samples, [50, 99])) if len(samples) else (None, None)
        return NackStats(
            pending=len(self.index),
            buckets=self.index.bucket_count,
            memory_bytes=self.index.memory_usage().total_bytes if with_memory else 0,
            nacked=self.index.added,
            forwarded=self._forwarded,
            redelivered=self._redelivered,
            held_back=self._held_back,
            dropped=self._dropped,
            lateness_p50_ms=p50,
            lateness_p99_ms=p99,
        )
