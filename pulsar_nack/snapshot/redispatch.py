"""Restored nacks wait for the broker's re-dispatch: a :class:`~pulsar_nack.snapshot.segments.SegmentStore`
that does not forward a restored id falling due before its message came back, for a while.

After a restart the broker re-dispatches every message the dead consumer left unacked to the new one at
once — the copies of every restored pending nack among them. The consumer keeps each such copy and hands it
out at the nack's due time (the copy *is* the message): nothing needs to be forwarded. But the copies come
at the pace the application receives (through the receiver queue), and ids fall due meanwhile — those
already due at the restore at once. Forwarding them (a native nack: the broker dispatches the entry again)
before their copy came hurt twice: the copy that came a moment later was taken for something other than
the forward's answer and not handed out, so the message waited for the forward's copy; and the forwards
doubled what the broker had to send (on pulsar-lite, 10,000 batched nacks restored with ids due at once:
every entry forwarded, the re-dispatch slowed to a trickle, 1,638 messages more than 5 s late in one
run at load 4).

So a restored id that falls due while the re-dispatch is under way and its entry's copy has not come is
*deferred*: kept here, out of the index, pending all the same (:meth:`due_of`, :meth:`pending_mask` and
:meth:`remove` answer for it), until its copy comes — the consumer takes it out with :meth:`remove` and
hands its copy out at once — or the re-dispatch is over. The re-dispatch counts as under way while copies
of restored entries keep coming: until :data:`REDISPATCH_QUIET_MS` passes without one (from the restore
on), and at most :data:`REDISPATCH_MAX_MS` after the restore. Then every deferred id is forwarded, and the
store is a plain :class:`SegmentStore` again. A deferred id whose entry's copy came but was not kept (the
hold was full) is forwarded :data:`SETTLE_MS` after that copy came.

A Shared member that adopts a dead member's snapshot (:mod:`~pulsar_nack.snapshot.takeover`) is in the
same place: the broker hands it the dead member's unacked messages at once. Adopted entries wait for their
copy the same way (:meth:`adopt`; the wait is timed again from the adoption).

How the store learns that a copy came: the consumer asks :meth:`due_of` about every copy of a message whose
nack is pending before it keeps it, and removes the id (:meth:`remove`) when it does. Nothing else calls
them for an id whose message has not come (an ack or a nack needs the message — or a bare id, which at
worst ends the wait for that entry early).

A deferred id is popped in the store's terms (its bucket is under the pop watermark): a crash while it is
deferred loses it from the snapshot — it is due, and the next restart's re-dispatch hands it out at once,
on time.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from pyroaring import BitMap

from pulsar_nack.index import DueIds, Rounding, batch_indexes, merge_due, pop_by_bucket
from pulsar_nack.snapshot.format import Group
from pulsar_nack.snapshot.segments import RestoreReport, SegmentConfig, SegmentStore
from pulsar_nack.snapshot.storage import SnapshotStorage

__all__ = ["REDISPATCH_MAX_MS", "REDISPATCH_QUIET_MS", "SETTLE_MS", "RedispatchStore"]

#: The re-dispatch is over once no copy of a restored entry came for this long (from the restore on).
REDISPATCH_QUIET_MS = 2_000
#: ... and at the latest this long after the restore (a broker that re-dispatches slowly, or to other
#: members of a Shared subscription, makes the ids wait no longer).
REDISPATCH_MAX_MS = 60_000
#: A deferred id whose entry's copy came this long ago and was not kept is forwarded (the rest of a batch's
#: messages arrive with the first, within milliseconds; this leaves them time to be admitted).
SETTLE_MS = 500

Key = tuple[str, int]  # (topic, ledger id)


class _Deferred:
    """A restored entry's due ids held back: when they fell due (the pop's time) and which batch indexes
    (-1: the whole entry)."""

    __slots__ = ("due", "mask")

    def __init__(self, due: int, mask: int) -> None:
        self.due = due
        self.mask = mask

    def covers(self, batch_index: int) -> bool:
        """Whether this holds back that id (-1: the whole entry, held back only whole)."""
        return self.mask < 0 or (batch_index >= 0 and bool(self.mask >> batch_index & 1))


class RedispatchStore(SegmentStore):
    """A :class:`SegmentStore` whose restored ids wait for the broker's re-dispatch (module docstring).

    ``clock``: epoch ms, the tracker's (the store's due times are epoch ms). While the re-dispatch is under
    way, :meth:`pop_due` costs O(due ids + deferred entries) more, :meth:`next_due_ms` O(deferred and
    settling entries) more, the other calls a lock and a few dict lookups more; after it (and without a
    restore) one attribute test per call."""

    def __init__(
        self,
        storage: SnapshotStorage,
        config: SegmentConfig | None = None,
        *,
        precision_bits: int = 8,
        rounding: Rounding = "floor",
        clock: Callable[[], float],
    ) -> None:
        super().__init__(storage, config, precision_bits=precision_bits, rounding=rounding)
        self._clock = clock
        self._waiting: dict[Key, BitMap] = {}  # restored entries whose copy has not come
        # (topic, ledger, entry) of restored entries whose copy came less than SETTLE_MS ago → when
        self._came: dict[tuple[str, int, int], float] = {}
        self._deferred: dict[tuple[str, int, int], _Deferred] = {}  # (topic, ledger, entry) → held back
        self._last_copy = 0.0  # when the latest copy of a restored entry came (or the restore)
        self._deadline = math.inf  # the restore + REDISPATCH_MAX_MS
        self.deferred_total = 0  # ids ever deferred (a figure for tests and benchmarks)

    @property
    def waiting(self) -> bool:
        """Whether restored ids still wait for (or have just had) their re-dispatched copy. O(1)."""
        return bool(self._waiting or self._deferred or self._came)

    def restore(self, now_ms: int, visit: Callable[[Group], object] | None = None) -> RestoreReport:
        """As :meth:`SegmentStore.restore`; every restored entry waits for its re-dispatched copy."""
        report = super().restore(now_ms, self._noting(visit))
        self._wait_from_now()
        return report

    def adopt(
        self, peer: SnapshotStorage, now_ms: int, visit: Callable[[Group], object] | None = None
    ) -> int:
        """As :meth:`SegmentStore.adopt`; every adopted entry waits for its re-dispatched copy, as a
        restored one does: the broker hands the dead member's unacked messages to the members at once,
        and an adopted id due meanwhile was forwarded before its copy came (the broker then sent its
        entry twice). The wait (:data:`REDISPATCH_QUIET_MS`, :data:`REDISPATCH_MAX_MS`) starts again,
        for the restored entries still waiting too. O(adopted ids) more than the store's."""
        self._wait_from_now(always=True)  # (before the adds: a wait timed from long ago ends at once)
        adopted = super().adopt(peer, now_ms, self._noting(visit))
        self._wait_from_now()
        return adopted

    def _noting(self, visit: Callable[[Group], object] | None) -> Callable[[Group], None]:
        """A ``visit`` for :meth:`restore` and :meth:`adopt` that makes each group's entries wait for
        their copy (before the adopt adds them: a pop in between holds them back), then calls ``visit``."""

        def note(group: Group) -> None:
            with self._lock:
                waiting = self._waiting.get((group.topic, group.ledger_id))
                if waiting is None:
                    self._waiting[(group.topic, group.ledger_id)] = BitMap(group.entries)
                else:
                    waiting |= group.entries
            if visit is not None:
                visit(group)

        return note

    def _wait_from_now(self, always: bool = False) -> None:
        """Time the re-dispatch from now: from the end of a restore or adoption (reading the segments took
        0.8 s at load 3, and more under load: timed from its start, the wait was over before the first
        pop). O(1)."""
        with self._lock:
            if self._waiting or always:
                self._last_copy = self._clock()
                self._deadline = self._last_copy + REDISPATCH_MAX_MS

    # -- a copy came -----------------------------------------------------------------------------------

    def _copy_came(self, ledger_id: int, entry_id: int, topic: str) -> None:
        """(Lock held.) A copy of this entry came: a sign the re-dispatch goes on; the entry's ids wait
        :data:`SETTLE_MS` more (the rest of its batch is being admitted), then no more. O(1)."""
        ledger = (topic, ledger_id)
        waiting = self._waiting.get(ledger)
        if waiting is None or entry_id not in waiting:
            return
        now = self._clock()
        self._last_copy = now
        self._came[(topic, ledger_id, entry_id)] = now
        waiting.discard(entry_id)
        if not waiting:
            del self._waiting[ledger]

    def _holds_back(self, key: tuple[str, int, int], now_ms: float) -> bool:
        """(Lock held.) Whether ids of this entry due now are held back: a restored entry whose copy has not
        come, or came less than :data:`SETTLE_MS` ago. O(1)."""
        waiting = self._waiting.get((key[0], key[1]))
        if waiting is not None and key[2] in waiting:
            return True
        came = self._came.get(key)
        return came is not None and now_ms < came + SETTLE_MS

    def due_of(self, ledger_id: int, entry_id: int, batch_index: int = -1, topic: str = "") -> int | None:
        """As :meth:`SegmentStore.due_of`, deferred ids included (at the time they fell due). The consumer
        asks it of every copy of a pending message: a restored entry's copy came."""
        if not (self._waiting or self._deferred or self._came):
            return super().due_of(ledger_id, entry_id, batch_index, topic)
        with self._lock:
            self._copy_came(ledger_id, entry_id, topic)
            due = super().due_of(ledger_id, entry_id, batch_index, topic)
            deferred = self._deferred.get((topic, ledger_id, entry_id))
            if deferred is not None and (batch_index < 0 or deferred.covers(batch_index)):
                return deferred.due if due is None else min(due, deferred.due)
            return due

    def remove(self, ledger_id: int, entry_id: int, batch_index: int = -1, topic: str = "") -> bool:
        """As :meth:`SegmentStore.remove`, deferred ids included."""
        if not (self._waiting or self._deferred or self._came):
            return super().remove(ledger_id, entry_id, batch_index, topic)
        with self._lock:
            self._copy_came(ledger_id, entry_id, topic)
            removed = self._take(ledger_id, entry_id, batch_index, topic)
            return super().remove(ledger_id, entry_id, batch_index, topic) or removed

    def take(
        self, ledger_id: int, entry_id: int, batch_index: int = -1, topic: str = ""
    ) -> tuple[int | None, bool]:
        """As :meth:`SegmentStore.take` (:meth:`due_of` then :meth:`remove` in one call), deferred ids
        included: what a kept copy of a pending message asks."""
        if not (self._waiting or self._deferred or self._came):
            return super().take(ledger_id, entry_id, batch_index, topic)
        with self._lock:
            self._copy_came(ledger_id, entry_id, topic)
            due, removed = super().take(ledger_id, entry_id, batch_index, topic)
            deferred = self._deferred.get((topic, ledger_id, entry_id))
            if deferred is not None and (batch_index < 0 or deferred.covers(batch_index)):
                due = deferred.due if due is None else min(due, deferred.due)
            removed = self._take(ledger_id, entry_id, batch_index, topic) or removed
            return due, removed

    def _take(self, ledger_id: int, entry_id: int, batch_index: int, topic: str) -> bool:
        """(Lock held.) Drop a deferred id; True if it was deferred. A batch message of an entry deferred
        whole is not (the whole entry's forward covers it, as in the index). O(1)."""
        key = (topic, ledger_id, entry_id)
        deferred = self._deferred.get(key)
        if deferred is None:
            return False
        if batch_index < 0 or deferred.mask < 0:
            if batch_index >= 0:
                return False
            del self._deferred[key]
            return True
        bit = 1 << batch_index
        if not deferred.mask & bit:
            return False
        deferred.mask &= ~bit
        if not deferred.mask:
            del self._deferred[key]
        return True

    # -- the index's other calls -------------------------------------------------------------------------

    def add(
        self,
        due_ms: int,
        ledger_id: int,
        entry_id: int,
        batch_index: int = -1,
        topic: str = "",
        fresh: bool = False,
    ) -> int:
        """As :meth:`SegmentStore.add`; a nack of a deferred id (earliest due wins) stays deferred, or
        replaces it if it is earlier."""
        if fresh or not self._deferred:  # (a fresh id is pending nowhere: not deferred either)
            return super().add(due_ms, ledger_id, entry_id, batch_index, topic, fresh)
        with self._lock:
            deferred = self._deferred.get((topic, ledger_id, entry_id))
            if deferred is not None and deferred.covers(batch_index):
                if deferred.due <= due_ms:
                    return deferred.due
                self._take(ledger_id, entry_id, batch_index, topic)
            return super().add(due_ms, ledger_id, entry_id, batch_index, topic, fresh)

    def pending_mask(self, ledger_id: int, entry_id: int, topic: str = "") -> int:
        """As :meth:`SegmentStore.pending_mask`, deferred ids included."""
        if not self._deferred:
            return super().pending_mask(ledger_id, entry_id, topic)
        with self._lock:  # (both answers at one time: a pop may defer or release the id in between)
            mask = super().pending_mask(ledger_id, entry_id, topic)
            deferred = self._deferred.get((topic, ledger_id, entry_id))
            if deferred is None:
                return mask
            return -1 if mask < 0 or deferred.mask < 0 else mask | deferred.mask

    def __len__(self) -> int:
        """As :meth:`SegmentStore.__len__`, deferred ids included."""
        with self._lock:
            held = sum(1 if d.mask < 0 else d.mask.bit_count() for d in self._deferred.values())
            return super().__len__() + held

    def clear(self) -> None:
        """As :meth:`SegmentStore.clear`; nothing waits any more."""
        super().clear()
        with self._lock:
            self._waiting.clear()
            self._came.clear()
            self._deferred.clear()

    def pop_due(self, now_ms: int) -> list[DueIds]:
        """As :meth:`SegmentStore.pop_due`, but while the re-dispatch is under way the ids of restored
        entries whose copy has not come (or is being admitted) are deferred, and deferred ids are released
        when it is over, or :data:`SETTLE_MS` after their entry's copy came if it was not kept.
        O(due ids + deferred and settling entries)."""
        if not (self._waiting or self._deferred or self._came):
            return super().pop_due(now_ms)
        with self._lock:
            if now_ms >= self._deadline or now_ms >= self._last_copy + REDISPATCH_QUIET_MS:
                self._waiting.clear()  # the re-dispatch is over: the copies not come are not coming
            # Two pops: the ids due by now (a deferred one is handed out as soon as its copy comes), then
            # those due by ``now_ms`` (the tracker pops a native latency ahead: no sooner than that).
            now = min(now_ms, int(self._clock()))
            out: list[DueIds] = []
            for until in (now, now_ms) if now < now_ms else (now_ms,):
                for ids in super().pop_due(until):
                    self._defer(ids, until, now_ms, out)
            out.extend(self._release(now_ms))
            self._came = {k: at for k, at in self._came.items() if now_ms < at + SETTLE_MS}
            if len(out) < 2:
                return out
            merged: dict[Key, DueIds] = {}  # one DueIds per ledger, as a pop gives
            for ids in out:
                key = (ids.topic, ids.ledger_id)
                other = merged.get(key)
                merged[key] = ids if other is None else merge_due(other, ids)
            return list(merged.values())

    def _defer(self, ids: DueIds, due_ms: int, now_ms: int, out: list[DueIds]) -> None:
        """(Lock held.) Hold back the ids (due by ``due_ms``) of entries :meth:`_holds_back` names; append
        the rest to ``out``. O(ids)."""
        ledger = (ids.topic, ids.ledger_id)
        if ledger not in self._waiting and not self._came:
            out.append(ids)
            return
        keep: list[int] = []
        for entry_id in ids.entry_ids.tolist():
            key = (ids.topic, ids.ledger_id, entry_id)
            if not self._holds_back(key, now_ms):
                keep.append(entry_id)
                continue
            indexes = ids.batch_indexes.get(entry_id)
            mask = -1 if indexes is None else sum(1 << index for index in indexes)
            deferred = self._deferred.get(key)
            if deferred is None:
                self._deferred[key] = _Deferred(due_ms, mask)
            else:  # (popped again: earlier ids of the entry were deferred at an earlier pop)
                deferred.mask = -1 if mask < 0 or deferred.mask < 0 else deferred.mask | mask
            self.deferred_total += 1 if mask < 0 else mask.bit_count()
        if len(keep) == len(ids.entry_ids):
            out.append(ids)
        elif keep:
            kept = {e: ids.batch_indexes[e] for e in keep if e in ids.batch_indexes}
            out.append(DueIds(ids.topic, ids.ledger_id, np.array(keep, dtype=np.uint32), kept))

    def _release(self, now_ms: int) -> list[DueIds]:
        """(Lock held.) The deferred ids to forward now: those no longer held back (:meth:`_holds_back`:
        their copy came and settled, or the re-dispatch is over). One ``DueIds`` per ledger.
        O(deferred entries)."""
        go = [key for key in self._deferred if not self._holds_back(key, now_ms)]
        by_ledger: dict[Key, tuple[list[int], dict[int, tuple[int, ...]]]] = {}
        for key in go:
            deferred = self._deferred.pop(key)
            topic, ledger_id, entry_id = key
            entries, partial = by_ledger.setdefault((topic, ledger_id), ([], {}))
            entries.append(entry_id)
            if deferred.mask >= 0:
                partial[entry_id] = tuple(batch_indexes(deferred.mask))
        return [
            DueIds(topic, ledger_id, np.array(sorted(entries), dtype=np.uint32), partial)
            for (topic, ledger_id), (entries, partial) in by_ledger.items()
        ]

    def pop_due_by_bucket(self, now_ms: int) -> list[tuple[int, DueIds]]:
        """As :meth:`SegmentStore.pop_due_by_bucket`; while the re-dispatch is under way, a :meth:`pop_due`
        a due bucket (:func:`~pulsar_nack.index.pop_by_bucket`: its times include when deferred ids may
        be released, which pop nothing of their own)."""
        if not (self._waiting or self._deferred or self._came):
            return super().pop_due_by_bucket(now_ms)
        return pop_by_bucket(self, now_ms)

    def next_due_ms(self) -> int | None:
        """As :meth:`SegmentStore.next_due_ms`; while the re-dispatch is under way, also when deferred ids
        may be released and when it may be over (its end clears the state). O(log B + S + deferred and
        settling entries)."""
        following = super().next_due_ms()
        if not (self._waiting or self._deferred or self._came):
            return following
        with self._lock:
            times = [following] if following is not None else []
            if self._waiting or self._deferred:
                times.append(math.ceil(min(self._deadline, self._last_copy + REDISPATCH_QUIET_MS)))
            came = self._came
            settled = [came[key] for key in self._deferred if key in came]
            if settled:  # deferred ids whose copy came and was not taken: forwarded once it settled
                times.append(math.ceil(min(settled) + SETTLE_MS))
            elif came:  # one pop once the last copy settled clears the state (not one per copy: a pop
                # per entry that came kept the timer thread busy every ~20 ms during the re-dispatch)
                times.append(math.ceil(self._last_copy + SETTLE_MS))
            return min(times) if times else None
