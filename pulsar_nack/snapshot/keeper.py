"""A tracker's snapshot, from above: :class:`SnapshotKeeper` restores a consumer's pending nacks into its
:class:`~pulsar_nack.tracker.NackTracker` after a restart, adopts a dead member's, and deletes them on an
unsubscribe.

The tracker knows nothing of snapshots: it files nacks in the
:class:`~pulsar_nack.snapshot.segments.SegmentStore` it was given as its index, runs the store's upkeep
(seal, load, merge) on its timer and closes it (a final snapshot). What fills the store behind the nack
path — a restore, an adoption — is here, and so is teaching the tracker's arrival filter the ids it
brings, so that the copies the broker hands out again are held back until due.
"""

from __future__ import annotations

import logging

from pyroaring import BitMap

from pulsar_nack.snapshot.format import Group
from pulsar_nack.snapshot.segments import RestoreReport, SegmentStore, SnapshotStats
from pulsar_nack.snapshot.storage import SnapshotStorage
from pulsar_nack.tracker import NackTracker

__all__ = ["SnapshotKeeper"]

_log = logging.getLogger(__name__)


class SnapshotKeeper:
    """Restores into, adopts into and discards the snapshot of ``tracker``, whose index is ``store``
    (``NackTracker(..., index=store)``). Thread-safe as the store and the tracker are."""

    def __init__(self, tracker: NackTracker, store: SegmentStore) -> None:
        if tracker.index is not store:
            raise ValueError("store must be the tracker's index: NackTracker(..., index=store)")
        self.tracker = tracker
        self.store = store

    def restore(self) -> RestoreReport:
        """Read the snapshot (the consumer's pending nacks before a restart) into the fresh tracker: ids
        keep their due times — passed ones are due at once — and the arrival filter learns every pending
        id, so the copies the broker redelivers at once are held back until due. A corrupt segment is
        dropped with a warning saying how many nacks were lost. O(ids restored)."""
        learned = _Learned()  # taught to the filter after the store's lock is released (lock order)
        report = self.store.restore(int(self.tracker.clock()), visit=learned.visit)
        self._learn(learned)
        if report.lost_ids or report.corrupt_segments:
            _log.warning(
                "restored %d pending nacks from %d snapshot segments; %d corrupt segments dropped: "
                "%d pending nacks lost (their messages are redelivered at once)",
                report.ids,
                report.segments,
                report.corrupt_segments,
                report.lost_ids,
            )
        self.tracker.rearm(upkeep=bool(report.segments))
        return report

    def adopt(self, peer: SnapshotStorage) -> int:
        """Take over a dead member's snapshot (``peer``: its storage view, locked by the caller): its
        pending nacks become this tracker's, at their due times, and the arrival filter learns them, so
        the copies of its messages the broker hands to this consumer are held back until due
        (:meth:`SegmentStore.adopt <pulsar_nack.snapshot.segments.SegmentStore.adopt>`). Returns how many
        ids were adopted; 0 once the tracker is closed. O(ids adopted)."""
        if self.tracker.closed:
            return 0
        learned = _Learned()
        adopted = self.store.adopt(peer, int(self.tracker.clock()), visit=learned.visit)
        self._learn(learned)
        self.tracker.rearm(upkeep=adopted > 0)
        return adopted

    def discard(self) -> None:
        """Delete the snapshot on storage, and every pending nack with it (the subscription is gone: an
        unsubscribe). O(segments)."""
        self.store.clear()

    def stats(self) -> SnapshotStats:
        """The store's counters: ``nack_stats().snapshots`` (:class:`~pulsar_nack.stats.NackStats`). O(S)."""
        return self.store.stats()

    def _learn(self, learned: _Learned) -> None:
        """Teach the arrival filter the restored ids: whole entries in bulk (one bitmap update per ledger,
        the ledgers numbered together), batch members an entry at a time (one mask each).
        O(ledgers + entries) plus O(whole entries) numpy."""
        arrivals = self.tracker.arrivals
        arrivals.pending_entries(learned.whole)
        learned.whole.clear()
        arrivals.pending_members(learned.members)
        learned.members.clear()


class _Learned:
    """The ids a restore or an adoption visits, gathered for the arrival filter: one bitmap of whole
    entries per (topic, ledger) — the visited groups are not kept, so a restore holds one segment's
    decoded groups at a time, not all of them — and one mask of pending batch indexes per partially
    pending batch entry (its messages' masks of every group ORed)."""

    def __init__(self) -> None:
        self.whole: dict[tuple[str, int], BitMap] = {}
        self.members: dict[tuple[str, int, int], int] = {}  # (topic, ledger, entry) → batch index mask

    def visit(self, group: Group) -> None:
        """O(entries / 64 + batch members) (bitmap OR)."""
        masks = group.batch_masks()
        whole = group.entries - BitMap(masks) if masks else group.entries
        key = (group.topic, group.ledger_id)
        have = self.whole.get(key)
        if have is None:
            self.whole[key] = BitMap(whole)
        else:
            have |= whole
        if masks:
            members, topic, ledger_id = self.members, group.topic, group.ledger_id
            for entry, mask in masks.items():
                member = (topic, ledger_id, entry)
                members[member] = members.get(member, 0) | mask
