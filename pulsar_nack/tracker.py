"""The client-side nack tracker: TimeBucket index + timer wheel + forwarding of due ids.

Data flows one way: ``schedule`` (a nack) → :class:`~pulsar_nack.index.TimeBucketIndex` → one
:class:`~pulsar_nack.timer.TimerWheel` timeout, armed for the earliest pending bucket → ``forward(due_ids)``,
which the consumer layer turns into native ``negative_acknowledge`` calls (the only per-id redelivery the
official Python client has). Each firing forwards every bucket due by then and re-arms for the next one, so
the timer's work is proportional to the forwards, never to the buckets: at most one callback per forward
(plus one per compaction and arrival sweep), none for a bucket already forwarded.

Lifecycle, like the official consumer's: the timer thread starts with the first nack; the timer holds the
tracker only weakly, so a tracker dropped without :meth:`NackTracker.close` is collected, which closes its
timer and ends the thread. ``forward`` (and with it the consumer's ``on_redelivery`` hook) runs without any
of the tracker's or timer's locks held, and :meth:`NackTracker.close` never waits for it.

When forwards happen is decided by :class:`~pulsar_nack.native.NativeTiming`, a model of the native
tracker's timer (see there): a bucket's ids are forwarded one native latency before the bucket's time, and
only at moments that neither postpone an earlier forward's redelivery nor starve the native timer.

Every message the broker delivers passes the :class:`~pulsar_nack.arrivals.ArrivalFilter` the tracker
keeps informed of nacks and forwards (see there): each nack is handed out once when due, never early, and
copies of batch messages the application acked or holds are not handed out again.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pulsar_nack.arrivals import ArrivalFilter, Verdict
from pulsar_nack.index import DueIds, NackIndex, Rounding, TimeBucketIndex
from pulsar_nack.ledgers import LedgerRegistry
from pulsar_nack.native import NativeTiming
from pulsar_nack.stats import NackStats
from pulsar_nack.timer import Timeout, TimerWheel, check_finite, monotonic_ms, weak_callback

__all__ = ["NackTracker", "Verdict", "epoch_clock"]

_log = logging.getLogger(__name__)
_ceil = math.ceil  # (a global and an attribute lookup less per nack)


def epoch_clock() -> Callable[[], float]:
    """A monotonic clock that reads as Unix epoch milliseconds: ``time.monotonic()`` plus one offset taken
    now. A tracker that keeps snapshots runs on it, so that due times mean the same after a restart
    (segments store epoch ms), while a step of the wall clock meanwhile moves no deadline. O(1) a call.

    One Python frame a call, as :func:`~pulsar_nack.timer.monotonic_ms`: the consumer reads the clock
    twice per message, and a lambda around ``monotonic_ms`` cost a second frame each time (~0.1 µs,
    ~1 % of a consumer's CPU at 10,000 nacks/s)."""
    monotonic = time.monotonic
    offset = time.time() * 1000.0 - monotonic() * 1000.0
    return lambda: monotonic() * 1000.0 + offset


class NackTracker:
    """Schedules nacked ids and forwards them to ``forward`` when due; classifies arrivals. Thread-safe.

    ``forward`` is called on the timer thread with the due ids, once per flush, without any lock held; it
    must not block for long (it delays the next flush) and may be called concurrently with :meth:`schedule`.
    A tracker that creates its own wheel (``wheel=None``) starts its thread on the first nack and ends it
    at :meth:`close` or when the tracker is collected.
    """

    def __init__(
        self,
        forward: Callable[[Sequence[DueIds]], object],
        *,
        precision_bits: int = 8,
        rounding: Rounding = "ceil",
        native: NativeTiming = NativeTiming(),
        linger_ms: float = 30_000.0,
        compact_after_ms: float = 1_000.0,
        clock: Callable[[], float] = monotonic_ms,
        wheel: TimerWheel | None = None,
        lateness_window: int = 4096,
        batch_size: Callable[[Any], int] = int,
        index: NackIndex | None = None,
    ) -> None:
        """``precision_bits``/``rounding``: the index's buckets of ``2**k`` ms. ``"ceil"`` (the default) files
        a nack in the bucket at or after its due time: never handed out early, up to ``2**k - 1`` ms late
        (plus delivery) — what a user of the official Python client expects. ``"floor"`` is Java's PIP-393
        choice: the bucket at or before it, up to ``2**k - 1`` ms early.

        ``batch_size(token)``: the size of a batch from what the consumer passes to the arrival filter
        (see :class:`~pulsar_nack.arrivals.ArrivalFilter`).

        ``index``: file nacks in this (empty) index instead of a :class:`~pulsar_nack.index.TimeBucketIndex`
        of its own — a :class:`~pulsar_nack.snapshot.segments.SegmentStore`, which keeps them on storage
        too (:mod:`pulsar_nack.snapshot.keeper` restores them after a restart; its due times are epoch ms:
        give a ``clock`` that reads so, :func:`epoch_clock`). Its :meth:`~pulsar_nack.index.NackIndex.upkeep`
        runs on the timer thread every ``upkeep_interval_ms`` while it has work, from the first nack or
        :meth:`rearm` on; :meth:`close` closes it (a segment store writes a final snapshot)."""
        # One numbering of the ledgers for the index's packed store and the arrival filter's sets, so that
        # each ledger is paid for once (a snapshot store keeps numberings of its own).
        self.ledgers = LedgerRegistry()
        self.index: NackIndex = (
            index if index is not None else TimeBucketIndex(precision_bits, rounding, ledgers=self.ledgers)
        )
        self._upkeep_ms = self.index.upkeep_interval_ms
        self.arrivals = ArrivalFilter(
            self._refile,
            clock=clock,
            batch_size=batch_size,
            index=self.index,
            linger_ms=linger_ms,
            lateness_window=lateness_window,
            ledgers=self.ledgers,
        )
        # The nack path's call, bound once (an attribute lookup and a method binding, per nack).
        self._file = self.arrivals.file
        self._forward = forward
        self.native = native
        self.lead_ms = float(native.latency_ms)
        self.compact_after_ms = float(compact_after_ms)
        self._compaction: Timeout | None = None
        self._sweep: Timeout | None = None
        self._upkeep: Timeout | None = None  # the index's upkeep, when it has one
        #: Called on the timer thread after each run of the index's upkeep, when set: the watch over the
        #: other members of a Shared subscription (pulsar_nack.snapshot.takeover). Keeps the upkeep running.
        #: ``close`` calls its ``stop()``, if it has one.
        self.takeover: Callable[[], object] | None = None
        #: The clock (ms) due times are measured on; :meth:`now` calls it (the nack path calls it directly).
        self.clock = clock
        self._owns_wheel = wheel is None
        self._wheel = wheel if wheel is not None else TimerWheel(clock=clock, name="pulsar-nack-redelivery")
        # A dropped tracker closes its own wheel (the wheel holds the tracker only through weak callbacks).
        self._finalizer = weakref.finalize(self, self._wheel.close, 0.0) if self._owns_wheel else None
        self._on_timer = weak_callback(self._fire)
        self._lock = threading.Lock()
        self._timeout: Timeout | None = None  # the forward timeout, armed for ...
        self._armed_bucket: float = math.inf  # ... this bucket (the earliest pending one); inf: none
        # One forward per bucket: a nack filed in a bucket the last forward covered (a short delay, a
        # repeated forward) waits for the next bucket's forward, the first bucket time after that
        # forward's horizon, instead of a forward of its own (a 200 ms backoff re-armed the
        # timer every 60-150 ms at k = 8).
        self._width = 1 << precision_bits
        self._next_bucket: float = -math.inf
        # The nack path's lock-free test: a nack below this may have to arm the timer (see _arm).
        self._arm_below: float = math.inf
        self._last_forward = -float("inf")
        self._forwarded = 0
        self._closed = False

    # -- the nack path ----------------------------------------------------------------------------

    def schedule(
        self,
        due_ms: float,
        ledger_id: int,
        entry_id: int,
        batch_index: int = -1,
        topic: str = "",
        *,
        refiled: bool = False,
    ) -> int | None:
        """File one id for redelivery at ``due_ms`` (clock ms); returns its bucket time, or None for a batch
        message the application has acked (nothing to redeliver). O(1) typically.

        ``due_ms`` must be finite (else ``ValueError``); the timer waits for one far ahead in steps. A
        fraction of a ms rounds up (truncating it let floor rounding fire up to 2**k ms early, not 2**k - 1).
        ``refiled``: an id filed again (a forward repeated, a kept copy given back), whose ``due_ms`` is not
        the application's: it adds nothing to the lateness estimate.
        """
        if self._closed:
            raise RuntimeError("the consumer is closed")
        if type(due_ms) is not float or due_ms - due_ms != 0.0:  # (the common case: a finite float)
            check_finite(due_ms, "due_ms")
        # recorded in the arrival filter and filed in the index under the filter's lock (see its `file`)
        if refiled:
            bucket = self._file(_ceil(due_ms), ledger_id, entry_id, batch_index, topic, False)
        else:
            bucket = self._file(_ceil(due_ms), ledger_id, entry_id, batch_index, topic)
        if bucket is None:
            return None
        # Most nacks land at or after the armed bucket, or in one the next forward takes along: no lock
        # needed to see that.
        if bucket < self._arm_below or self._compaction is None:
            with self._lock:
                if not self._closed:
                    self._arm_for(bucket)
                    if self._compaction is None:  # nacks moved on: buckets may have gone cold
                        self._compaction = self._wheel.schedule(
                            self.clock() + self.compact_after_ms, weak_callback(self._compact)
                        )
                    if self._upkeep is None and self._upkeep_ms is not None:
                        self._schedule_upkeep(self._upkeep_ms)
        return bucket

    def _refile(self, due_ms: float, ledger_id: int, entry_id: int, batch_index: int, topic: str) -> None:
        """The arrival filter wants a forward repeated (its copy came early, or never came)."""
        if not self._closed:
            self.schedule(max(due_ms, self.clock()), ledger_id, entry_id, batch_index, topic, refiled=True)

    def acked(
        self, ledger_id: int, entry_id: int, batch_index: int = -1, topic: str = ""
    ) -> tuple[Sequence[object], bool]:
        """The application acked a message: a pending nack of it is dropped. Returns copies of it the
        consumer must ack too, and whether it must ack the whole entry at the broker (see
        :meth:`~pulsar_nack.arrivals.ArrivalFilter.acked`). O(1) typically."""
        if batch_index >= 0 and self.arrivals.acked_plain((topic, ledger_id, entry_id), batch_index):
            return (), False  # the common batched case: nothing of the batch was nacked
        # (a pending nack of it is removed from the index by the filter, under its lock)
        copies, _, ack_entry = self.arrivals.acked(ledger_id, entry_id, batch_index, topic)
        return copies, ack_entry

    def _arm_for(self, bucket: float) -> None:
        """(Lock held.) Ids are due at ``bucket``: arm the forward for it — or, if the last forward's horizon
        covered it, for the next bucket after that horizon — unless the armed one comes no later. O(1)."""
        if bucket < self._next_bucket:
            bucket = self._next_bucket
        if bucket < self._armed_bucket:
            self._arm(bucket)

    def _arm(self, bucket: float, at_ms: float | None = None) -> None:
        """(Lock held.) Arm the one forward timeout for ``bucket`` (inf: disarm), at ``at_ms`` or else at
        the first moment :class:`~pulsar_nack.native.NativeTiming` allows a forward one native latency
        before it. O(1)."""
        if self._timeout is not None:
            self._timeout.cancel()
            self._timeout = None
        self._armed_bucket = bucket
        # A nack must take the lock only if it can arm an earlier forward: never while the next bucket is
        # at or after the armed one (its forward would be the armed one anyway).
        self._arm_below = bucket if self._next_bucket < bucket else -math.inf
        if bucket != math.inf:
            if at_ms is None:
                at_ms = self.native.forward_at(bucket - self.lead_ms, self._last_forward)
            self._timeout = self._wheel.schedule(at_ms, self._on_timer)

    def _compact(self) -> None:
        """Timer thread: :meth:`compact`, ~1 s after nacks moved on from a bucket."""
        with self._lock:
            self._compaction = None
        if not self._closed:
            self.compact()

    def compact(self) -> None:
        """Compact the buckets nacks have moved on from, and shrink the arrival filter's sets (off the
        nack path: the timer calls it). O(what the buckets and sets hold)."""
        self.index.compact()
        self.arrivals.compact()

    # -- the index's upkeep ----------------------------------------------------------------------

    def _schedule_upkeep(self, interval_ms: int) -> None:
        """(Lock held.) Run the index's upkeep one interval from now."""
        self._upkeep = self._wheel.schedule(self.clock() + interval_ms, weak_callback(self._run_upkeep))

    def _run_upkeep(self) -> None:
        """Timer thread: the index's upkeep (a segment store seals new nacks, writes removals, loads
        segments due soon, merges), then the takeover's look; again one interval later while either has
        work. O(the upkeep's work)."""
        if self._closed or self._upkeep_ms is None:
            return
        more = True
        try:
            more = self.index.upkeep(int(self.clock()))
            if self.takeover is not None:
                self.takeover()
        except Exception:  # a bug, not a storage failure (a store absorbs those): keep the timer alive
            _log.exception("the nack index's upkeep failed")
        with self._lock:
            self._upkeep = None
            if not self._closed and (more or self.takeover is not None):
                self._schedule_upkeep(self._upkeep_ms)
            following = self.index.next_due_ms()  # a segment loaded or merged may be due before the armed one
            if not self._closed and following is not None:
                self._arm_for(following)

    def rearm(self, *, upkeep: bool) -> None:
        """The index was filled behind the nack path (a restore, an adoption: see
        :mod:`pulsar_nack.snapshot.keeper`): arm the forward for its earliest pending id, and start the
        index's upkeep when ``upkeep``. O(log B + S)."""
        with self._lock:
            if not self._closed:
                following = self.index.next_due_ms()
                if following is not None:
                    self._arm_for(following)
                if upkeep and self._upkeep is None and self._upkeep_ms is not None:
                    self._schedule_upkeep(self._upkeep_ms)

    # -- the timer path ----------------------------------------------------------------------------

    def _fire(self) -> None:
        """Timer thread: forward everything that must arrive by ``now + lead``, re-arm for the next bucket.
        O(due buckets × ledgers + due ids)."""
        now = self.clock()
        with self._lock:
            timeout = self._timeout
            if self._closed or timeout is None or timeout.pending:
                return  # a timeout cancelled while it was being fired: the armed one is still to come
            bucket = self._armed_bucket
            self._timeout, self._armed_bucket, self._arm_below = None, math.inf, math.inf
            at = self.native.forward_at(now, self._last_forward)
            if at > now:  # a flush in between: now would delay its redelivery, or starve the native timer
                self._arm(bucket, at)
                return
        self.flush(now)

    def flush(self, now: float | None = None, everything: bool = False) -> int:
        """Forward due ids (all pending ids with ``everything``) now; returns how many entries went. Re-arms
        the timer for the earliest bucket left. O(due buckets × ledgers + due ids + log buckets).

        The ids due within one native latency go now, in one pop that hands them out bucket by bucket,
        each labelled for the arrival filter with its own bucket time, below which no copy is handed out
        (never early with ceil rounding; labelling every id with the armed bucket let ids of a later bucket
        out up to 2**k ms before it). The filter measures lateness from that time for the redeliveries
        whose exact due time was not sampled (:class:`~pulsar_nack.lateness.LatenessHistogram`). With
        ``everything``, all pending ids, labelled now."""
        now = self.clock() if now is None else now
        limit = 2**62 if everything else int(now + self.lead_ms)
        due: list[DueIds] = []
        forwarded = 0
        popped = self.arrivals.pop(self.index.pop_due_by_bucket, limit)  # (under the filter's lock)
        # The filter learns each bucket's ids in the order popped: it reads what an entry still has
        # pending (a quiet entry's other messages), and the ids of a later bucket are pending until then.
        learn = self.arrivals.forwarded
        for bucket, ids in popped:
            label = int(now) if everything else bucket
            waiting = learn(ids.topic, ids.ledger_id, ids.entry_ids, ids.batch_indexes, now, label)
            if waiting:  # entries whose forward under way brings these messages too
                ids = _without(ids, waiting)
                if not len(ids.entry_ids):
                    continue
            forwarded += len(ids.entry_ids)
            due.append(ids)
        with self._lock:
            if due:
                self._last_forward = now
                self._forwarded += forwarded
            if popped and not everything:  # buckets up to `limit` are done: a later nack in one waits
                self._next_bucket = max(self._next_bucket, (limit | (self._width - 1)) + 1)
            if not self._closed:
                if self._sweep is None and due:
                    sweep_at = self.arrivals.sweep_due
                    if sweep_at is not None:
                        self._sweep = self._wheel.schedule(sweep_at + 1, weak_callback(self._sweep_arrivals))
                following = self.index.next_due_ms()
                following_bucket = math.inf if following is None else max(following, self._next_bucket)
                if following_bucket != self._armed_bucket:  # no timeout left for a bucket now drained
                    self._arm(following_bucket)
        if due:
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
                self._sweep = self._wheel.schedule(
                    max(sweep_at, self.clock()) + 1, weak_callback(self._sweep_arrivals)
                )

    # -- lifecycle and stats --------------------------------------------------------------------------

    def close(self, flush: bool = False) -> None:
        """Stop the timer; forward every pending id first when ``flush``, else drop them. Idempotent.

        Returns at once whatever the timer thread is doing: a forward (an application hook) in progress is
        not waited for — it may be waiting for a lock the caller holds — and the thread ends after it."""
        if self._closed:
            return
        if flush:
            self.flush(everything=True)
        with self._lock:
            self._closed = True
            timeouts = [
                t for t in (self._timeout, self._compaction, self._sweep, self._upkeep) if t is not None
            ]
            self._timeout, self._armed_bucket, self._arm_below = None, math.inf, math.inf
        for timeout in timeouts:
            timeout.cancel()
        takeover, self.takeover = self.takeover, None
        stop = getattr(takeover, "stop", None)
        if callable(stop):
            stop()  # a takeover in progress adopts no further member (it is not waited for)
        if self._finalizer is not None:
            self._finalizer()  # closes the wheel without waiting for its thread
        # a segment store writes a final snapshot: pending nacks (none after a flush) survive the consumer
        self.index.close(int(self.clock()))
        self.arrivals.clear()

    def clear(self) -> None:
        """Forget every pending nack and what the arrival filter knows (a seek; close) — with snapshots,
        their files too."""
        self.index.clear()
        self.arrivals.clear()

    def _memory_parts(self) -> tuple[tuple[str, int], ...]:
        """The index, the arrival filter and, when it is this tracker's own, the timer wheel.
        O(index objects)."""
        parts = [
            ("index", int(self.index.memory_usage().total_bytes)),
            ("arrivals", self.arrivals.memory_bytes()),
            ("ledgers", self.ledgers.memory_bytes()),
        ]
        if self._owns_wheel:
            parts.append(("timer", self._wheel.memory_bytes()))
        return tuple(parts)

    @property
    def wheel(self) -> TimerWheel:
        """The timer wheel this tracker forwards on (its own unless one was given): the consumer's other
        timed work schedules there too (a listener's held messages). Closed with the tracker."""
        return self._wheel

    @property
    def closed(self) -> bool:
        return self._closed

    def now(self) -> float:
        """The tracker's clock (ms): what ``schedule``'s due times are measured on. O(1)."""
        return self.clock()

    def stats(self, *, with_memory: bool = False) -> NackStats:
        """Counters, pending state and lateness percentiles, without walking the index: O(histogram buckets)
        for the percentiles, plus the arrival filter's counts (O(its open batch entries)).
        ``with_memory=True`` also measures ``memory_bytes``: O(index objects), holding the index's lock
        meanwhile; else it is None."""
        lateness = self.arrivals.lateness
        p50, p99 = lateness.percentiles((0.5, 0.99)) or (None, None)
        counts = self.arrivals.counts()
        parts = self._memory_parts() if with_memory else None
        return NackStats(
            pending=len(self.index),
            buckets=self.index.bucket_count,
            memory_bytes=None if parts is None else sum(size for _, size in parts),
            memory_parts=parts,
            nacked=self.index.added + counts.kept,  # (kept: served by a copy in memory, never filed)
            forwarded=self._forwarded,
            redelivered=counts.redelivered,
            held_back=counts.held_back,
            dropped=counts.dropped,
            reforwarded=counts.reforwarded,
            abandoned=counts.abandoned,
            lateness_p50_ms=p50,
            lateness_p99_ms=p99,
            lateness_early_share=lateness.early_share,
            lateness_samples=len(lateness),
            timer_failures=self._wheel.failures,
        )


def _without(ids: DueIds, entries: set[int]) -> DueIds:
    """``ids`` less ``entries`` (and their batch indexes). O(ids)."""
    keep = ~np.isin(ids.entry_ids, np.fromiter(entries, dtype=np.uint32, count=len(entries)))
    members = {e: i for e, i in ids.batch_indexes.items() if e not in entries}
    return ids._replace(entry_ids=ids.entry_ids[keep], batch_indexes=members)
