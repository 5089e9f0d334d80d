"""PIP-195's segment life cycle on the client: pending nacks in immutable segment files, only the segments
due soon in memory.

A :class:`SegmentStore` answers the nack index's calls (``add``, ``remove``, ``pop_due``, ``next_due_ms``,
``due_of``, ``pending_mask``) over three places an id can be:

* the **mutable** index (PIP-195's *LastMutableBucket*): nacks not yet written anywhere;
* the **loaded** index (the broker's shared queue): ids of segments due soon, read back into a
  :class:`~pulsar_nack.index.TimeBucketIndex` at their own bucket times;
* **unloaded** segments: on storage only; memory keeps their metadata (name, min/max due time, id count)
  and one run-optimized membership bitmap of entry ids per ledger (PIP-195's ``delayedIndexBitMaps``),
  so that acks and re-nacks can be matched without reading them.

Life cycle. :meth:`SegmentStore.maintain` (call it from a timer) *seals* the mutable index once it holds
``min_ids_per_segment`` ids, spans ``max_segment_span_ms``, or ``checkpoint_interval_ms`` passed since the
last seal; sealing cuts it into segments of at most that many ids / that time step (PIP-195: 5,000 ids,
300 s) and writes each through a :class:`~pulsar_nack.snapshot.storage.SnapshotStorage`. Segments due
within ``load_ahead_ms`` are loaded while the loaded ids stay under ``max_loaded_ids``; a segment whose
earliest bucket is due is loaded whatever the budget (its ids are due: a memory bound never makes a nack
late), as is one holding a copy of a re-nacked batch message, or of the whole entry of one, at a bucket
that may be earlier or later than the re-nack's (see :meth:`SegmentStore.add`). A loaded segment whose
last bucket has been popped is deleted. When more than ``max_segments`` segments are unloaded, up to
``max_merge_inputs`` (4) adjacent ones with the fewest ids are merged; the
merged file names the segments it *supersedes*, and the old files are deleted only after it is written —
a crash at any point leaves either the old files or the new one in charge (restore deletes superseded
files). A failed write falls back to memory (the ids stay loaded, a warning is logged, the write is
retried by ``maintain``).

Removals (an ack, or the pop of a second copy) of an id in a sealed segment go to that segment's
*deletion* bitmap, which is applied when the segment is loaded, merged or rewritten (a segment with
``rewrite_deleted_ratio`` of its ids deleted is rewritten); the membership bitmap is never mutated, so it
may be run-optimized, while the deletion bitmap, which is, never is (the broker's #26117).

Due times are **wall-clock epoch milliseconds**: they must mean the same after a restart.

:meth:`SegmentStore.restore` after a restart: every segment's metadata and membership are read, ids whose
due time has passed are due at once (for a client a passed due time means *redeliver now*, not *drop*:
the broker has redelivered the message already, and the consumer must hold it back only until then), the
first live segments are loaded within the budget, the rest stay on storage. A corrupt segment is deleted
with a warning that says how many nacks were lost.

Pops (redeliveries) are not written into the segments: every pop of ``now`` pops every bucket up to
``now``, so one number says which groups of every file are spent — the *pop watermark*, a 22-byte file
(``popped.pnw``: magic ``PNKPOP\r\n``, u16 version 1, i64 watermark ms, u32 CRC-32 of the first 18 bytes,
little-endian) written atomically at each checkpoint when it moved. Restore drops the groups at or before
it (clamped to the restore's ``now``), and a loaded or merged segment skips them. Rewriting every segment a
pop touched cost 2-3× the CPU of the whole tracker at 10,000 nacks/s; the watermark costs one small write.

Durability: ids nacked since the last seal are in memory only (at most ``checkpoint_interval_ms`` worth);
removals of ids in segments (acks) are persisted when the segment is rewritten at the next checkpoint,
pops when the watermark is — after a crash an id acked or redelivered in the last interval may come back
(redelivering an acked message is a no-op at the broker).

Thread safety: every public method takes one lock, ``_lock``, for the in-memory work only. Storage
*writes* (puts and deletes, each with its fsyncs on a local disk) never run under it: the in-memory work
registers a new or rewritten segment at once, its encoded bytes kept as ``pending`` (readable by a load
meanwhile), and asks for deletions in ``_undeleted``; :meth:`_write_out` then performs them holding only
``_io``, the lock that serializes the writers (:meth:`maintain`, :meth:`checkpoint`, :meth:`clear`,
:meth:`restore`), and takes ``_lock`` for a moment after each write to record it. So an ack or a re-nack
(:meth:`add`, :meth:`remove`) never waits for a disk flush — at most for the in-memory work of a seal, a
merge or a load (a load and a merge *read* files under ``_lock``). Lock order: ``_io`` before ``_lock``.
A segment dropped while its write was in flight (popped, merged, cleared) has its new file deleted right
after; files are deleted in increasing sequence order, so a merged file never goes before those it
supersedes.
"""

from __future__ import annotations

import heapq
import logging
import re
import struct
import threading
import time
import zlib
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap, BitMap64

from pulsar_nack.index import (
    MEMBER_BITS,
    DueIds,
    Rounding,
    TimeBucketIndex,
    batch_indexes,
    batch_mask,
    merge_due,
)
from pulsar_nack.memory import MemoryUsage, bitmap_heap_bytes, python_bytes
from pulsar_nack.snapshot.format import (
    Group,
    ReadLimits,
    Segment,
    SnapshotCorrupt,
    decode_segment,
    encode_segment,
    groups_from_rows,
    read_header,
)
from pulsar_nack.snapshot.storage import SnapshotStorage, SnapshotStorageError

__all__ = ["LATENCY_BOUNDS_MS", "OpStats", "RestoreReport", "SegmentConfig", "SegmentStore", "SnapshotStats"]

_log = logging.getLogger(__name__)

Key = tuple[str, int]  # (topic, ledger id)
_NAME = re.compile(r"seg-(?P<seq>[0-9a-f]{16})\.pnk")
#: The pop watermark's file: every bucket at or before the time it holds has been popped (redelivered).
WATERMARK_NAME = "popped.pnw"
_WATERMARK = struct.Struct("<8sHq")  # magic, format version, watermark (ms); then the CRC-32 of these
_WATERMARK_MAGIC = b"PNKPOP\r\n"
_EMPTY = BitMap()
_NO_ENTRIES: npt.NDArray[np.uint32] = np.zeros(0, dtype=np.uint32)
_NO_INDEXES: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)

#: A restore fills its loaded segments this many ids at a time (see ``SegmentStore._restore``): ~2 MB of
#: arrays at most (an id: due, ledger, entry and batch index), where 1M ids in one call built ~30 MB.
_FILL_IDS = 65_536

#: PIP-195's latency histogram bounds (ms); the last bucket is the overflow.
LATENCY_BOUNDS_MS = (50, 100, 500, 1_000, 5_000, 30_000, 60_000)


@dataclass(frozen=True)
class SegmentConfig:
    """When to seal, cut, load and merge. Defaults follow PIP-195 where it has a counterpart:
    ``delayedDeliveryMaxIndexesPerBucketSnapshotSegment`` (5,000) and
    ``delayedDeliveryMaxTimeStepPerBucketSnapshotSegmentSeconds`` (300)."""

    min_ids_per_segment: int = 5_000
    max_segment_span_ms: int = 300_000
    checkpoint_interval_ms: int = 1_000
    max_loaded_ids: int = 1_000_000
    load_ahead_ms: int = 60_000
    max_segments: int = 64
    max_merge_inputs: int = 4
    rewrite_deleted_ratio: float = 0.5
    limits: ReadLimits = field(default_factory=ReadLimits)

    def __post_init__(self) -> None:
        for name in ("min_ids_per_segment", "max_segment_span_ms", "max_segments"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_merge_inputs < 2:
            raise ValueError(f"max_merge_inputs must be >= 2, got {self.max_merge_inputs}")
        if not 0 < self.rewrite_deleted_ratio <= 1:
            raise ValueError(f"rewrite_deleted_ratio must be in (0, 1], got {self.rewrite_deleted_ratio}")
        if min(self.checkpoint_interval_ms, self.max_loaded_ids, self.load_ahead_ms) < 0:
            raise ValueError("checkpoint_interval_ms, max_loaded_ids and load_ahead_ms must be >= 0")


@dataclass
class OpStats:
    """Count, failures and latency of one kind of snapshot operation (PIP-195's ``op_count`` with states
    succeed/failed, and ``op_latency_ms`` with its buckets)."""

    succeeded: int = 0
    failed: int = 0
    total_ms: float = 0.0
    max_ms: float = 0.0
    #: counts per upper bound in :data:`LATENCY_BOUNDS_MS`, plus the overflow last
    histogram: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BOUNDS_MS) + 1))

    def record(self, elapsed_ms: float, ok: bool) -> None:
        if ok:
            self.succeeded += 1
        else:
            self.failed += 1
        self.total_ms += elapsed_ms
        self.max_ms = max(self.max_ms, elapsed_ms)
        slot = next((i for i, bound in enumerate(LATENCY_BOUNDS_MS) if elapsed_ms <= bound), -1)
        self.histogram[slot] += 1


@dataclass
class SnapshotStats:
    """PIP-195's metrics, client side: gauges at the time of :meth:`SegmentStore.stats`, counters since
    the store was made."""

    segments_total: int = 0
    segments_loaded: int = 0
    segments_unpersisted: int = 0
    bytes_total: int = 0
    ids_in_memory: int = 0
    ids_on_storage: int = 0
    ids_unsealed: int = 0  # nacked since the last seal: in memory only (lost if the process dies now)
    # not on storage: unsealed, or in a new segment whose write has not succeeded (lost if the process dies)
    ids_not_durable: int = 0
    storage_failing: bool = False  # the last write (put) failed; told once per change (a WARNING)
    create: OpStats = field(default_factory=OpStats)
    load: OpStats = field(default_factory=OpStats)
    delete: OpStats = field(default_factory=OpStats)
    merge: OpStats = field(default_factory=OpStats)
    fallbacks: int = 0
    corrupt_segments: int = 0
    lost_ids: int = 0
    forced_loads: int = 0


@dataclass(frozen=True)
class RestoreReport:
    segments: int
    ids: int
    loaded_ids: int
    corrupt_segments: int
    lost_ids: int
    superseded_removed: int


@dataclass
class _Record:
    """What memory keeps of a segment."""

    seq: int
    min_due: int
    max_due: int
    count: int
    nbytes: int
    has_members: bool
    membership: dict[Key, BitMap]  # frozen: run-optimized once, never mutated
    # For a segment with batch members (None without: every entry it holds is pending whole): the entries
    # pending whole, and the members' codes (``entry << MEMBER_BITS | index``; wide ones apart), so that
    # :meth:`member_mask` is exact while the segment is on storage. Frozen as ``membership``.
    whole: dict[Key, BitMap] | None = None
    members: dict[Key, BitMap64] = field(default_factory=dict)
    wide: dict[Key, dict[int, int]] = field(default_factory=dict)
    supersedes: tuple[int, ...] = ()
    loaded: bool = False
    persisted: bool = True
    pending: bytes | None = None  # the encoded file, until _write_out has written it
    merged: bool = False  # a merge's (or rewrite's) output: its write counts in the merge stats
    failed: bool = False  # a write of it failed (logged once; retried by every _write_out)
    deleted: dict[Key, BitMap] = field(default_factory=dict)  # whole-entry removals; mutated, never optimized
    deleted_members: dict[Key, set[tuple[int, int]]] = field(default_factory=dict)
    deleted_count: int = 0
    popped_through: int | None = None  # loaded: every bucket <= this was popped
    dirty: bool = False  # removals or pops not yet in the file

    @property
    def name(self) -> str:
        return segment_name(self.seq)

    def holds(self, key: Key, entry_id: int) -> bool:
        """Entry-level membership, deletions applied. O(1) bitmap probes."""
        members = self.membership.get(key)
        if members is None or entry_id not in members:
            return False
        gone = self.deleted.get(key)
        return gone is None or entry_id not in gone

    def member_mask(self, key: Key, entry_id: int) -> int:
        """The batch indexes of an entry this segment holds (:meth:`holds`) pending, as a bitmask; -1 if
        the entry is pending whole. Deletions applied. O(log members + the entry's members)."""
        whole = self.whole
        if whole is None:
            return -1
        entries = whole.get(key)
        if entries is not None and entry_id in entries:
            return -1
        return self.own_mask(key, entry_id)

    def own_mask(self, key: Key, entry_id: int) -> int:
        """The batch indexes of an entry pending on their own (as batch messages; the entry may be pending
        whole beside them, at a later bucket), as a bitmask. Deletions applied. O(log members + the
        entry's members)."""
        mask = 0
        codes = self.members.get(key)
        if codes is not None:
            for code in codes.iter_equal_or_larger(entry_id << MEMBER_BITS):
                if code >> MEMBER_BITS != entry_id:
                    break
                mask |= 1 << (code & _MEMBER_INDEX)
        wide = self.wide.get(key)
        if wide is not None:
            mask |= wide.get(entry_id, 0)
        deleted = self.deleted_members.get(key)
        if deleted:
            for index in batch_indexes(mask):
                if (entry_id, index) in deleted:
                    mask &= ~(1 << index)
        return mask

    @property
    def live(self) -> int:
        return self.count - self.deleted_count


_MEMBER_INDEX = (1 << MEMBER_BITS) - 1  # a member code's batch index bits


def segment_name(seq: int) -> str:
    return f"seg-{seq:016x}.pnk"


class SegmentStore:
    """Pending nacks over the mutable index, the loaded index and segment files. See the module docstring.

    Complexities (S = segments, S_l = segments holding a given ledger): :meth:`add` and :meth:`remove` —
    the index's cost plus O(S_l) bitmap probes; :meth:`pop_due` — the index's plus O(due ids) when
    segments are loaded; :meth:`next_due_ms` — O(log B + S); seal/load/merge — O(ids involved).
    """

    def __init__(
        self,
        storage: SnapshotStorage,
        config: SegmentConfig | None = None,
        *,
        precision_bits: int = 8,
        rounding: Rounding = "floor",
    ) -> None:
        self.storage = storage
        self.config = config if config is not None else SegmentConfig()
        self._mutable = TimeBucketIndex(precision_bits, rounding)
        self._loaded = TimeBucketIndex(precision_bits, rounding)
        self._mask = -1 << precision_bits
        self._round_up = (1 << precision_bits) - 1 if rounding == "ceil" else 0
        self._records: dict[int, _Record] = {}
        self._by_key: dict[Key, set[int]] = {}
        self._dupes: dict[Key, BitMap] = {}  # entries that may be pending in the mutable index and a segment
        self._moved = 0  # ids moved from the loaded into the mutable index (add): not counted as added
        # seq → its supersedes, of files to delete (asked for by the in-memory work, or whose delete failed):
        # _write_out deletes them, outside _lock
        self._undeleted: dict[int, tuple[int, ...]] = {}
        self._next_seq = 1
        self._last_seal: float | None = None
        self._watermark: int | None = None  # every bucket <= this has been popped (pop_due's latest now)
        self._watermark_saved: int | None = None  # ... as last written to storage
        self._lock = threading.RLock()  # the in-memory state; never held across a storage write
        self._io = threading.Lock()  # serializes the writers (_write_out and what asks it for work)
        self._stats = SnapshotStats()
        self._failing = False  # the last put failed: the application was told, and is told when it heals

    # -- the index's calls ------------------------------------------------------------------------------

    def add(
        self,
        due_ms: int,
        ledger_id: int,
        entry_id: int,
        batch_index: int = -1,
        topic: str = "",
        fresh: bool = False,
    ) -> int:
        """Schedule one id (earliest due wins); returns the bucket it is due at, or — when an unloaded
        segment already holds it no later — that segment's first bucket (a lower bound to wake up at).

        The new due time is compared with each unloaded segment's time range *before* its membership is
        consulted (#26230): membership alone says neither when nor whether the copy is still pending.
        Inside the range the order is unknown: a whole entry then stays pending twice (the first copy
        popped retires the other), but where batch messages are involved — the nack is one, or the
        segment or the mutable index holds messages of the entry — the order decides which messages are
        pending on their own (``remove``, ``pending_mask``, what ``pop_due`` hands out), so the segment is
        loaded (a read under the lock, whatever the memory budget; counted in ``forced_loads``) and the
        nack filed among its parts.

        ``fresh``: as :meth:`TimeBucketIndex.add <pulsar_nack.index.TimeBucketIndex.add>` — the caller
        knows the id is pending nowhere (the consumer's arrival filter knows it for every first nack of a
        message): no segment holds it live and the loaded index does not have it, so it goes straight to
        the mutable index, as does an id of a ledger no segment holds (the loaded index only holds ids of
        segments). That is the nack path, O(1): a fresh id does not even take the store's lock (the
        mutable index has its own, and a seal or load running meanwhile cannot hold a copy of an id that
        is pending nowhere). Else O(S_l) bitmap probes, plus — when the loaded index holds a part of the
        entry later than this nack — moving the entry's loaded parts to the mutable index (the index's
        rule then files the nack among them; a segment cannot drop a whole entry and keep its messages),
        plus the loads above (O(ids of the segments loaded)).
        """
        if fresh:
            return self._mutable.add(due_ms, ledger_id, entry_id, batch_index, topic, fresh=True)
        key = (topic, ledger_id)
        with self._lock:
            if key not in self._by_key:
                return self._mutable.add(due_ms, ledger_id, entry_id, batch_index, topic)
            bucket = (int(due_ms) + self._round_up) & self._mask
            return self._add(bucket, ledger_id, entry_id, batch_index, topic, may_load=True)

    def _add(
        self, bucket: int, ledger_id: int, entry_id: int, batch_index: int, topic: str, may_load: bool
    ) -> int:
        """(Lock held.) :meth:`add` of a nack of a ledger some segment holds, at its bucket; ``may_load``:
        segments that hold a copy of it at an unknown bucket may be loaded to decide."""
        key = (topic, ledger_id)
        parts = self._loaded.parts(ledger_id, entry_id, topic)
        for due, mask in parts:
            if due <= bucket and (mask is None or (batch_index >= 0 and mask >> batch_index & 1)):
                return due  # a copy no later (or the whole entry, no later) covers this nack
        if parts and (batch_index < 0 or any(mask is None or mask >> batch_index & 1 for _, mask in parts)):
            # Some loaded part of the entry is later than this nack and holds it: the entry's loaded
            # parts move to the mutable index, where the index's own rule files the nack among them (a
            # segment can drop a whole entry and keep its earlier messages only by dropping the entry:
            # the whole entry loaded at 30 and its message 0 at 10, then the whole entry nacked at 20).
            # Parts with other messages of the entry only stay: moving them made every message of a
            # batch move (and be sealed and written again) each time one of its messages was filed
            # again — the arrival filter re-files due messages whose entry's copy is on its way at
            # every bucket, and a consumer's pending nacks were durable only between two such moves.
            self._move_to_mutable(ledger_id, entry_id, topic, [])
        covered: int | None = None
        unsure: list[_Record] = []
        for rec in self._holding(key):
            if rec.loaded or not rec.holds(key, entry_id):
                continue  # the loaded index answered for it (membership may be stale: popped ids)
            mask = rec.member_mask(key, entry_id)  # -1: the whole entry is pending there
            if batch_index >= 0 and mask != -1 and not mask >> batch_index & 1:
                continue  # other messages of the entry only: no copy of this one, none covers it
            if bucket < rec.min_due or (batch_index < 0 and bucket == rec.min_due):
                self._delete_in(rec, key, entry_id, batch_index)  # due no earlier there: this one wins
            elif rec.max_due <= bucket and (mask == -1 or batch_index >= 0):
                # the whole entry (or this message) there is due no later: it covers this nack
                covered = rec.min_due if covered is None else min(covered, rec.min_due)
            elif batch_index >= 0 or rec.max_due >= bucket:
                # maybe earlier, maybe later (only the file knows the buckets): see below. (A whole
                # entry due after every message of it there is filed beside them: not this branch.)
                unsure.append(rec)
        if covered is not None:
            return covered
        if unsure and may_load and self._involves_messages(key, entry_id, batch_index, unsure):
            # Which copy wins decides which of the entry's messages are pending on their own (what
            # remove() and pending_mask() answer, what pop_due() hands out); the segments' files say
            # it: they are loaded (a read, whatever the budget), and the nack is filed among their
            # parts as above. Only for batch messages: for whole entries a second copy is exact (the
            # first popped retires the other).
            for rec in unsure:
                if len(self._loaded) + rec.live > self.config.max_loaded_ids:
                    self._stats.forced_loads += 1
                self._load(rec)
            return self._add(bucket, ledger_id, entry_id, batch_index, topic, may_load=False)
        if unsure:  # keep both, the first popped retires the other
            self._dupes.setdefault(key, BitMap()).add(entry_id)
        return self._mutable.add(bucket, ledger_id, entry_id, batch_index, topic)

    def _involves_messages(self, key: Key, entry_id: int, batch_index: int, unsure: list[_Record]) -> bool:
        """(Lock held.) Whether a nack of an entry whose copy's bucket is unknown (in ``unsure``, on
        storage) involves batch messages: it is one, or one of those segments or the mutable index holds
        some of the entry's messages. O(segments + the entry's parts)."""
        if batch_index >= 0 or any(rec.own_mask(key, entry_id) for rec in unsure):
            return True
        return any(mask is not None for _, mask in self._mutable.parts(key[1], entry_id, key[0]))

    def remove(self, ledger_id: int, entry_id: int, batch_index: int = -1, topic: str = "") -> bool:
        """Forget a pending id (acked) wherever it is; True if it was pending somewhere. O(S_l)."""
        with self._lock:
            key = (topic, ledger_id)
            removed = self._mutable.remove(ledger_id, entry_id, batch_index, topic)
            removed = self._loaded.remove(ledger_id, entry_id, batch_index, topic) or removed
            removed = self._mark_deleted(key, entry_id, batch_index, "all") or removed
            if batch_index < 0 and key in self._dupes:
                self._dupes[key].discard(entry_id)
            return removed

    def take(
        self, ledger_id: int, entry_id: int, batch_index: int = -1, topic: str = ""
    ) -> tuple[int | None, bool]:
        """:meth:`due_of` then :meth:`remove`, both answers (the due time before the removal; whether the
        id was pending somewhere), in one call: a kept copy of a pending message asks both, and each walked
        the entry's buckets in the indexes — one walk here (:meth:`TimeBucketIndex.take
        <pulsar_nack.index.TimeBucketIndex.take>`). Complexity as :meth:`remove`."""
        with self._lock:
            key = (topic, ledger_id)
            due, removed = self._mutable.take(ledger_id, entry_id, batch_index, topic)
            known = [] if due is None else [due]
            due, removed_loaded = self._loaded.take(ledger_id, entry_id, batch_index, topic)
            if due is not None:
                known.append(due)
            for rec in self._holding(key):  # (as due_of; before _mark_deleted changes the members)
                if not rec.loaded and rec.holds(key, entry_id):
                    mask = rec.member_mask(key, entry_id)
                    if mask == -1 or (mask >> batch_index & 1 if batch_index >= 0 else mask):
                        known.append(rec.min_due)
            removed = self._mark_deleted(key, entry_id, batch_index, "all") or removed_loaded or removed
            if batch_index < 0 and key in self._dupes:
                self._dupes[key].discard(entry_id)
            return (min(known) if known else None), removed

    def pop_due(self, now_ms: int) -> list[DueIds]:
        """Remove and return every id due by ``now_ms``: segments that are due are loaded first (whatever
        the memory budget), loaded segments fully popped are deleted from storage."""
        with self._lock:
            self._load_ahead(now_ms)
            from_loaded = self._loaded.pop_due(now_ms)
            for ids in from_loaded:
                self._consumed(ids)
            due = _one_per_ledger(self._mutable.pop_due(now_ms), from_loaded)
            self._popped(due, now_ms)
            return due

    def pop_due_by_bucket(self, now_ms: int) -> list[tuple[int, DueIds]]:
        """:meth:`pop_due` as a pop of each due bucket in turn would return it: (bucket time, one ledger's
        ids due in it), in bucket order. The segments due by ``now_ms`` are loaded first, so each id
        comes labelled with its own bucket. O(as :meth:`pop_due`) plus O(due groups)."""
        with self._lock:
            self._load_ahead(now_ms)
            from_loaded = self._loaded.pop_due_by_bucket(now_ms)
            for _, ids in from_loaded:
                self._consumed(ids)
            due = _one_per_group(self._mutable.pop_due_by_bucket(now_ms), from_loaded)
            self._popped([ids for _, ids in due], now_ms)
            return due

    def _popped(self, due: list[DueIds], now_ms: int) -> None:
        """A pop's bookkeeping (lock held): copies of the popped ids in unloaded segments retired, loaded
        segments fully popped deleted, the others' popped groups spent (the watermark)."""
        if self._dupes:
            for ids in due:  # a second copy may sit in an unloaded segment: retire it
                key = (ids.topic, ids.ledger_id)
                dup = self._dupes.get(key)
                if not dup:
                    continue
                for entry in dup & BitMap(ids.entry_ids):
                    indexes = ids.batch_indexes.get(entry)
                    if indexes is None:
                        self._mark_deleted(key, entry, -1, "unloaded")
                        # a copy nacked while the whole entry was pending in a segment (kept
                        # beside it, due later): the whole entry covered it
                        self._mutable.remove(ids.ledger_id, entry, -1, ids.topic)
                        dup.discard(entry)
                    else:
                        for index in indexes:
                            self._mark_deleted(key, entry, index, "unloaded")
        for rec in [r for r in self._records.values() if r.loaded and r.min_due <= now_ms]:
            if rec.max_due <= now_ms:
                self._retire(rec)
            else:  # the file keeps the popped groups: the watermark says they are spent
                rec.popped_through = now_ms
        if self._watermark is None or now_ms > self._watermark:
            self._watermark = now_ms

    def next_due_ms(self) -> int | None:
        """The earliest bucket time pending anywhere — unloaded segments included (#26080), so a timer
        armed with it wakes up for ids that are still on storage. O(log B + S)."""
        with self._lock:
            times = [self._mutable.next_due_ms(), self._loaded.next_due_ms()]
            times += [r.min_due for r in self._records.values() if not r.loaded and r.live > 0]
            known = [t for t in times if t is not None]
            return min(known) if known else None

    def due_of(self, ledger_id: int, entry_id: int, batch_index: int = -1, topic: str = "") -> int | None:
        """The bucket an id is due at; for an id in an unloaded segment, that segment's first bucket (a
        lower bound: the exact time is on storage). None if not pending (an unloaded segment's batch
        messages are matched by their kept members, :meth:`_Record.member_mask`). O(S_l + the entry's
        members) plus the indexes'."""
        with self._lock:
            found = [
                self._mutable.due_of(ledger_id, entry_id, batch_index, topic),
                self._loaded.due_of(ledger_id, entry_id, batch_index, topic),
            ]
            key = (topic, ledger_id)
            for rec in self._holding(key):
                if not rec.loaded and rec.holds(key, entry_id):
                    mask = rec.member_mask(key, entry_id)
                    if mask == -1 or (mask >> batch_index & 1 if batch_index >= 0 else mask):
                        found.append(rec.min_due)
            known = [t for t in found if t is not None]
            return min(known) if known else None

    def pending_mask(self, ledger_id: int, entry_id: int, topic: str = "") -> int:
        """As :meth:`TimeBucketIndex.pending_mask`, exact for ids in unloaded segments too (their members
        are kept in memory, :meth:`_Record.member_mask`): the arrival filter expands an entry it kept as
        one bit from this mask, and takes every message of it not pending for acked — a whole-entry answer
        for an entry pending in part lost the acked messages' state, and an inexact one the pending
        messages (571 of 10,000 batched nacks never came back after a restart).
        O(S_l + the entry's members) plus the index's."""
        with self._lock:
            key = (topic, ledger_id)
            mask = 0
            for rec in self._holding(key):
                if not rec.loaded and rec.holds(key, entry_id):
                    member = rec.member_mask(key, entry_id)
                    if member < 0:
                        return -1
                    mask |= member
            masks = (
                self._mutable.pending_mask(ledger_id, entry_id, topic),
                self._loaded.pending_mask(ledger_id, entry_id, topic),
            )
            return -1 if -1 in masks else mask | masks[0] | masks[1]

    def __len__(self) -> int:
        """Pending ids (an id pending in two places counts twice). O(S)."""
        with self._lock:
            unloaded = sum(r.live for r in self._records.values() if not r.loaded)
            return len(self._mutable) + len(self._loaded) + unloaded

    def items(self) -> Iterator[tuple[int, str, int, npt.NDArray[np.uint32]]]:
        """``(bucket, topic, ledger, entry ids)`` of the ids in memory (mutable and loaded). O(n)."""
        with self._lock:
            rows = list(self._mutable) + list(self._loaded)
        yield from rows

    @property
    def bucket_count(self) -> int:
        """Buckets in memory (mutable and loaded index); segments on storage not counted. O(1)."""
        return self._mutable.bucket_count + self._loaded.bucket_count

    @property
    def added(self) -> int:
        """Ids accepted by :meth:`add` so far (repeats included), as the index counts them. O(1)."""
        return self._mutable.added - self._moved

    @property
    def unsealed(self) -> int:
        """Ids nacked since the last seal: in memory only, lost by a crash now. O(1)."""
        return len(self._mutable)

    def compact(self) -> int:
        """Compact the in-memory indexes' cold buckets (see :meth:`TimeBucketIndex.compact
        <pulsar_nack.index.TimeBucketIndex.compact>`); returns how many. O(buckets compacted)."""
        return self._mutable.compact() + self._loaded.compact()

    def memory_usage(self) -> MemoryUsage:
        """Bytes held in memory: both indexes, plus each segment's membership, batch member and deletion
        bitmaps (Python objects and CRoaring heap). O(objects)."""
        with self._lock:
            parts = [self._mutable.memory_usage(), self._loaded.memory_usage()]
            records = self._records.values()
            bitmaps = [
                b for r in records for maps in (r.membership, r.deleted, r.whole or {}) for b in maps.values()
            ] + list(self._dupes.values())
            codes = [c for r in records for c in r.members.values()]
            python = sum(p.python_bytes for p in parts) + python_bytes(self._records)
            python += sum(python_bytes(b) for b in bitmaps) + sum(python_bytes(r.wide) for r in records)
            python += sum(python_bytes(r) for r in records)
            roaring = sum(p.roaring_bytes for p in parts) + sum(bitmap_heap_bytes(b) for b in bitmaps)
            # 64-bit member codes: their serialized size (the heap walk reads 32-bit bitmaps only)
            roaring += sum(len(c.serialize()) for c in codes)
            ids = sum(p.ids for p in parts)
            return MemoryUsage(python, roaring, ids, {"segments": len(self._records)})

    def clear(self) -> None:
        """Forget every pending id — in memory *and on storage* (a seek: the pending nacks are void, and
        a restart must not bring them back). A file that cannot be deleted now is retried by
        :meth:`maintain`. O(segments)."""
        with self._io:
            try:
                listed = self.storage.list()
            except SnapshotStorageError as exc:
                listed = []
                _log.warning("cannot list snapshot segments to clear them (%s)", exc)
            with self._lock:
                names = [r.name for r in self._records.values()] + listed
                self._mutable.clear()
                self._loaded.clear()
                self._records.clear()
                self._by_key.clear()
                self._dupes.clear()
                for name in sorted(set(names)):
                    if _NAME.fullmatch(name):
                        self._delete_file(name)
                self._watermark = self._watermark_saved = None
            self._write_out()
            try:
                self.storage.delete(WATERMARK_NAME)
            except SnapshotStorageError as exc:  # harmless: no segment is left for it to cover
                _log.warning("cannot delete the snapshot's pop watermark (%s)", exc)

    # -- life cycle -----------------------------------------------------------------------------------

    def maintain(self, now_ms: int) -> None:
        """Timer work: retry failed writes and deletes, seal when due, load ahead, rewrite segments with
        many deletions, merge when there are too many segments; then the storage writes all that asked
        for, outside the store's lock. O(ids sealed/loaded/merged)."""
        with self._io:
            with self._lock:
                self._maintain(now_ms)
            self._write_out()

    def _maintain(self, now_ms: int) -> None:
        """(Both locks held.) :meth:`maintain`'s in-memory work."""
        cfg = self.config
        interval = self._last_seal is None or now_ms - self._last_seal >= cfg.checkpoint_interval_ms
        if interval or len(self._mutable) >= cfg.min_ids_per_segment:
            self._checkpoint(now_ms)
        elif len(self._mutable):  # the span: a walk of the mutable index, only when nothing else seals
            first = self._mutable.next_due_ms()
            last = max((b for b, *_ in self._mutable), default=first)
            if first is not None and last is not None and last - first >= cfg.max_segment_span_ms:
                self._checkpoint(now_ms)
        self._load_ahead(now_ms)
        for rec in [r for r in self._records.values() if r.persisted and r.live <= 0]:
            self._retire(rec)
        for rec in [
            r
            for r in self._records.values()
            if r.persisted and not r.loaded and r.deleted_count >= cfg.rewrite_deleted_ratio * r.count
        ]:
            self._merge([rec])
        while self._merge_once():
            pass

    def checkpoint(self, now_ms: int) -> int:
        """Persist the state now (also at close): seal every id of the mutable index into segments, and
        rewrite the segments that had ids removed or popped since they were written (so that a restart
        never brings back an acked or redelivered copy that a later nack of the same id would then
        precede). Returns how many ids were sealed. O(ids sealed + ids of rewritten segments); the writes
        run outside the store's lock."""
        with self._io:
            with self._lock:
                sealed = self._checkpoint(now_ms)
            self._write_out()
            return sealed

    def _checkpoint(self, now_ms: int) -> int:
        """(Both locks held.) :meth:`checkpoint`'s in-memory work: seal, rewrite; writes asked for."""
        self._last_seal = now_ms
        # (bucket, topic, ledger) → (entry ids, batch masks). Fresh nacks reach the mutable index
        # without the store's lock (see add), so a bucket popped here may fill again before the
        # loop ends: its second pop joins the first (a segment has one group per bucket and ledger).
        slots: dict[tuple[int, str, int], tuple[BitMap, dict[int, int]]] = {}
        bucket = self._mutable.next_due_ms()
        while bucket is not None:
            for ids in self._mutable.pop_due(bucket):
                masks = {e: batch_mask(ix) for e, ix in ids.batch_indexes.items()}
                _join(slots, (bucket, ids.topic, ids.ledger_id), BitMap(ids.entry_ids), masks)
            bucket = self._mutable.next_due_ms()
        rows = [(b, t, led, e, m or None) for (b, t, led), (e, m) in sorted(slots.items())]
        sealed = 0
        for groups in self._cut(groups_from_rows(rows)):
            sealed += sum(len(g.entries) for g in groups)
            self._create(groups, now_ms)
        for rec in [r for r in self._records.values() if r.dirty and r.persisted]:
            self._merge([rec])
        return sealed

    def _write_out(self) -> None:
        """(``_io`` held, ``_lock`` not.) The storage writes the in-memory work asked for: every segment
        not yet written (new, merged, rewritten, or whose write failed before), then the deletions, in
        increasing sequence order, then the pop watermark. ``_lock`` is taken only between writes, to
        record them, so acks and nacks go on meanwhile. A failed put stops the puts (the storage is
        failing: retried by the next call); its segment's ids stay in memory. O(bytes written)."""
        with self._lock:
            writes = sorted(
                ((r, r.pending) for r in self._records.values() if not r.persisted and r.pending is not None),
                key=lambda item: item[0].seq,
            )
        for rec, data in writes:
            assert data is not None
            started = time.perf_counter()
            try:
                self.storage.put(rec.name, data)
            except SnapshotStorageError as exc:
                with self._lock:
                    self._write_failed(rec, data, exc, _ms(started))
                break
            with self._lock:
                (self._stats.merge if rec.merged else self._stats.create).record(_ms(started), True)
                self._storage_ok(rec.name, 0 if rec.merged else rec.live)
                if self._records.get(rec.seq) is rec:
                    rec.persisted, rec.pending, rec.failed = True, None, False
                    for seq in rec.supersedes:  # only now that their replacement exists
                        self._undeleted.setdefault(seq, ())
                else:  # dropped while it was written (popped, merged, cleared): its file goes too
                    self._forget_file(rec)
        with self._lock:
            deletes = dict(self._undeleted)
        for seq in sorted(deletes):  # a merged file after the (older) files it supersedes
            started = time.perf_counter()
            try:
                self.storage.delete(segment_name(seq))
            except SnapshotStorageError as exc:
                with self._lock:
                    self._stats.delete.record(_ms(started), False)
                    self._storage_failed(exc)  # (retried by the next call)
                break
            with self._lock:
                self._stats.delete.record(_ms(started), True)
                self._undeleted.pop(seq, None)
                self._storage_ok(segment_name(seq) + " deleted", 0)
        self._write_watermark()

    def _write_failed(self, rec: _Record, data: bytes, exc: SnapshotStorageError, elapsed_ms: float) -> None:
        """(Lock held.) A put failed: counted; a new segment's ids fall back to memory (loaded into the
        in-memory index), a merge's inputs stay on storage. The application is told once when the storage
        starts failing — with every pending nack not on storage then, not one segment's — and once when a
        write succeeds again (``stats().storage_failing`` and ``ids_not_durable`` follow it meanwhile)."""
        (self._stats.merge if rec.merged else self._stats.create).record(elapsed_ms, False)
        if not rec.failed:
            rec.failed = True
            if not rec.merged:
                self._stats.fallbacks += 1
                if self._records.get(rec.seq) is rec and not rec.loaded:
                    self._fill((rec, decode_segment(data, self.config.limits)))
        self._storage_failed(exc)

    def _storage_failed(self, exc: SnapshotStorageError) -> None:
        """(Lock held.) A write (put or delete) failed: told once, when the storage starts failing."""
        if not self._failing:
            self._failing = True
            _log.warning(
                "cannot write snapshots (%s): %d pending nacks are in memory only — lost if this process "
                "dies before the storage recovers; retrying at every checkpoint",
                exc,
                self._not_durable(),
            )

    def _storage_ok(self, written: str, now_durable: int) -> None:
        """(Lock held.) A write succeeded (``now_durable`` ids with it): told once, if it was failing."""
        if self._failing:
            self._failing = False
            _log.warning(
                "snapshot storage writes again (%s); %d pending nacks not on it yet",
                written,
                self._not_durable() - now_durable,
            )

    def _not_durable(self) -> int:
        """(Lock held.) Pending ids not on storage: unsealed, or in new segments not written. O(S)."""
        unwritten = sum(r.live for r in self._records.values() if not r.persisted and not r.merged)
        return len(self._mutable) + unwritten

    def _write_watermark(self) -> None:
        """(``_io`` held, ``_lock`` not.) Write the pop watermark if it moved and a segment file may hold
        popped groups: 22 bytes, atomically, instead of rewriting every segment a pop touched; delete it
        when no segment is left. A failure is retried by the next :meth:`_write_out` (until then a
        restart re-fires the ids popped since the last write)."""
        with self._lock:
            mark, saved, empty = self._watermark, self._watermark_saved, not self._records
        if empty:
            if saved is None:
                return
            try:
                self.storage.delete(WATERMARK_NAME)
            except SnapshotStorageError as exc:
                with self._lock:
                    self._storage_failed(exc)  # (retried by the next _write_out)
                return
            with self._lock:
                self._storage_ok(WATERMARK_NAME + " deleted", 0)
                if self._watermark_saved == saved:
                    self._watermark_saved = None
            return
        if mark is None or mark == saved:
            return
        body = _WATERMARK.pack(_WATERMARK_MAGIC, 1, mark)
        try:
            self.storage.put(WATERMARK_NAME, body + struct.pack("<I", zlib.crc32(body)))
        except SnapshotStorageError as exc:
            with self._lock:
                self._storage_failed(exc)  # (retried by the next _write_out)
            return
        with self._lock:
            self._storage_ok(WATERMARK_NAME, 0)
            self._watermark_saved = mark

    def _read_watermark(self, names: list[str]) -> int | None:
        """The pop watermark on storage, or None (absent, unreadable or corrupt: logged; then ids popped
        before the restart but still in segment files are due again at once — the old behaviour)."""
        if WATERMARK_NAME not in names:
            return None
        try:
            data = self.storage.get(WATERMARK_NAME)
        except SnapshotStorageError as exc:
            _log.warning("cannot read the snapshot's pop watermark (%s)", exc)
            return None
        size = _WATERMARK.size
        if len(data) == size + 4 and zlib.crc32(data[:size]) == struct.unpack("<I", data[size:])[0]:
            magic, version, mark = _WATERMARK.unpack(data[:size])
            if magic == _WATERMARK_MAGIC and version == 1:
                return int(mark)
        _log.warning(
            "the snapshot's pop watermark is corrupt: ids redelivered before the restart may come again"
        )
        return None

    def restore(self, now_ms: int, visit: Callable[[Group], object] | None = None) -> RestoreReport:
        """Read every segment on storage into an empty store (see the module docstring). O(total size).

        ``visit`` is called with every restored group (corrupt and superseded segments left out), under
        the store's lock: how a consumer learns which ids are pending — also those left on storage — to
        hold back the copies the broker redelivers at once. An id in two segments is visited twice.
        Corrupt and superseded files are deleted before it returns."""
        with self._io:
            with self._lock:
                report = self._restore(now_ms, visit)
            self._write_out()
            return report

    def _restore(self, now_ms: int, visit: Callable[[Group], object] | None) -> RestoreReport:
        """(Both locks held.) :meth:`restore`'s work; deletions asked for."""
        if self._records or len(self._mutable) or len(self._loaded):
            raise RuntimeError("restore() needs an empty store")
        try:
            names = self.storage.list()
        except SnapshotStorageError as exc:
            _log.warning("cannot list snapshot segments (%s): starting with no pending nacks", exc)
            return RestoreReport(0, 0, 0, 0, 0, 0)
        # Clamped to now: after a close that flushed everything (a pop at 2**62) it must not cover
        # the nacks of this life.
        mark = self._read_watermark(names)
        if mark is not None:
            mark = min(mark, int(now_ms))
            self._watermark = self._watermark_saved = mark
        # Newest first: a merge's output has a higher sequence number than its inputs, so a segment's
        # superseders have been read when it is — each segment is settled (superseded and deleted, or
        # restored) as it is read, and its decoded groups are dropped unless it may be loaded now.
        numbered = sorted(
            ((int(m["seq"], 16), n) for n in names if (m := _NAME.fullmatch(n)) is not None), reverse=True
        )
        if numbered:
            self._next_seq = max(self._next_seq, numbered[0][0] + 1)
        superseded: set[int] = set()
        horizon = now_ms + self.config.load_ahead_ms
        candidates: list[tuple[int, int, _Record, Segment]] = []  # a max-heap on (min due, seq), negated
        candidate_ids = 0
        corrupt = lost = removed = 0
        for seq, name in numbered:
            if seq in superseded:
                self._delete_file(name)  # an interrupted merge: its output is in charge
                removed += 1
                continue
            started = time.perf_counter()
            try:
                data = self.storage.get(name)
            except SnapshotStorageError as exc:
                self._stats.load.record(_ms(started), False)
                _log.warning("cannot read snapshot segment %s (%s): not restored", name, exc)
                continue
            try:
                segment = decode_segment(data, self.config.limits)
                if segment.seq != seq:
                    raise SnapshotCorrupt(f"segment {name} holds sequence number {segment.seq}")
            except SnapshotCorrupt as exc:
                self._stats.load.record(_ms(started), False)
                corrupt += 1
                lost += self._lost(name, data, exc)
                self._delete_file(name)
                continue
            self._stats.load.record(_ms(started), True)
            superseded.update(segment.supersedes)
            if mark is not None and segment.groups and segment.min_due_ms <= mark:
                live = tuple(g for g in segment.groups if g.bucket_ms > mark)
                segment = replace(segment, groups=live)
            if not segment.groups:  # every id of it was popped before the restart
                self._delete_file(name, segment.supersedes)
                continue
            rec = self._record(segment, len(data))
            del data
            rec.popped_through = mark
            self._add_record(rec)
            if visit is not None:
                for group in segment.groups:
                    visit(group)
            if rec.min_due <= horizon:  # due ones whatever the budget; the others earliest first
                heapq.heappush(candidates, (-rec.min_due, -rec.seq, rec, segment))
                candidate_ids += rec.count
                while candidate_ids > self.config.max_loaded_ids and -candidates[0][0] > now_ms:
                    candidate_ids -= heapq.heappop(candidates)[2].count  # the latest: stays on storage
        # A second copy: an id in two segments (restore order must not matter, so after all are read).
        for key, seqs in self._by_key.items():
            if len(seqs) > 1:
                union = BitMap()
                for seq in sorted(seqs):
                    members = self._records[seq].membership[key]
                    both = union & members
                    if both:
                        self._dupes.setdefault(key, BitMap()).update(both)
                    union |= members
        # Several segments at a time, one add_many per topic: an entry whose batch messages are spread over
        # segments is filed once, not settled against each segment filed before. (The mutable index is
        # empty, so no entry's parts meet there, and the order does not matter: the loaded index keeps
        # the earliest copy. Chunks of _FILL_IDS bound the arrays a fill builds.)
        chunk: list[tuple[_Record, Segment]] = []
        chunk_ids = 0
        for _, _, rec, segment in sorted(candidates, key=lambda c: (-c[0], -c[1])):
            chunk.append((rec, segment))
            chunk_ids += rec.count
            if chunk_ids >= _FILL_IDS:
                self._fill(*chunk)
                chunk, chunk_ids = [], 0
        if chunk:
            self._fill(*chunk)
        del candidates, chunk
        self._dupes = {k: v for k, v in self._dupes.items() if v}
        ids = sum(r.count for r in self._records.values())
        return RestoreReport(len(self._records), ids, len(self._loaded), corrupt, lost, removed)

    def adopt(
        self, peer: SnapshotStorage, now_ms: int, visit: Callable[[Group], object] | None = None
    ) -> int:
        """Take over another store's snapshot — a dead member of the subscription — into this live one:
        its pending ids (read as :meth:`restore` reads them: its pop watermark applied, corrupt and
        superseded files dropped) are added here at their bucket times (earliest due wins against ids
        pending here already), written into this store's segments, and only then is the other's snapshot
        deleted — a crash in between leaves both, and the ids pending twice fire once per copy held.
        ``visit`` as :meth:`restore`'s. Returns how many ids were adopted. O(ids adopted) calls of
        :meth:`add`."""
        other = SegmentStore(
            peer, replace(self.config, max_loaded_ids=0, load_ahead_ms=0), precision_bits=0
        )  # precision 0: reading it loads nothing, rounds nothing
        groups: list[Group] = []
        other.restore(now_ms, visit=groups.append)
        adopted = 0
        for group in groups:
            if visit is not None:  # (before its ids are pending: a subclass may hold them back from pops)
                visit(group)
            masks = group.batch_masks()
            for entry in group.entries:
                mask = masks.get(entry)
                for index in batch_indexes(mask) if mask is not None else (-1,):
                    self.add(group.bucket_ms, group.ledger_id, entry, index, group.topic)
                    adopted += 1
        self.checkpoint(now_ms)  # the adopted ids are in this store's files ...
        other.clear()  # ... before the other's go
        return adopted

    def close(self, now_ms: int) -> None:
        """Seal what is left in memory (a clean shutdown loses nothing)."""
        self.checkpoint(now_ms)

    @property
    def upkeep_interval_ms(self) -> int:
        """The checkpoint interval (at least 1 ms): :meth:`upkeep` runs that often while it has work."""
        return max(self.config.checkpoint_interval_ms, 1)

    def upkeep(self, now_ms: int) -> bool:
        """:meth:`maintain`; True while ids are pending or segments are on storage (more work may come).
        O(ids sealed/loaded/merged + S)."""
        self.maintain(now_ms)
        with self._lock:
            return bool(len(self._mutable) + len(self._loaded) or self._records)

    def stats(self) -> SnapshotStats:
        """A copy of the counters with the gauges filled in. O(S)."""
        with self._lock:
            recs = self._records.values()
            return replace(
                self._stats,
                segments_total=len(self._records),
                segments_loaded=sum(1 for r in recs if r.loaded),
                segments_unpersisted=sum(1 for r in recs if not r.persisted),
                bytes_total=sum(r.nbytes for r in recs if r.persisted),
                ids_in_memory=len(self._mutable) + len(self._loaded),
                ids_unsealed=len(self._mutable),
                ids_not_durable=self._not_durable(),
                storage_failing=self._failing,
                ids_on_storage=sum(r.live for r in recs if not r.loaded),
                create=replace(self._stats.create, histogram=list(self._stats.create.histogram)),
                load=replace(self._stats.load, histogram=list(self._stats.load.histogram)),
                delete=replace(self._stats.delete, histogram=list(self._stats.delete.histogram)),
                merge=replace(self._stats.merge, histogram=list(self._stats.merge.histogram)),
            )

    def segments(self) -> list[tuple[str, int, int, int, bool]]:
        """``(name, min due, max due, live ids, loaded)`` of every segment, by min due. O(S log S)."""
        with self._lock:
            return [
                (r.name, r.min_due, r.max_due, r.live, r.loaded)
                for r in sorted(self._records.values(), key=lambda r: (r.min_due, r.seq))
            ]

    # -- internals: creating, loading, retiring ---------------------------------------------------------

    def _cut(self, groups: list[Group]) -> Iterator[list[Group]]:
        """Split bucket-ordered groups into segments: a new one starts when the current one holds
        ``min_ids_per_segment`` ids or the next group is ``max_segment_span_ms`` past its first bucket."""
        current: list[Group] = []
        count = 0
        for group in groups:
            if current and (
                count >= self.config.min_ids_per_segment
                or group.bucket_ms - current[0].bucket_ms >= self.config.max_segment_span_ms
            ):
                yield current
                current, count = [], 0
            current.append(group)
            count += len(group.entries)
        if current:
            yield current

    def _create(self, groups: list[Group], now_ms: int) -> None:
        seq = self._next_seq
        self._next_seq += 1
        segment = Segment(seq, tuple(groups))
        data = encode_segment(segment)
        rec = self._record(segment, len(data))
        rec.persisted, rec.pending = False, data  # written by _write_out, outside the lock
        self._add_record(rec)
        horizon = now_ms + self.config.load_ahead_ms
        if rec.min_due <= now_ms or (
            rec.min_due <= horizon and len(self._loaded) + rec.count <= self.config.max_loaded_ids
        ):
            self._fill((rec, segment))

    def _record(self, segment: Segment, nbytes: int) -> _Record:
        membership: dict[Key, BitMap] = {}
        whole: dict[Key, BitMap] = {}
        members: dict[Key, BitMap64] = {}
        wide: dict[Key, dict[int, int]] = {}
        has_members = False
        for g in segment.groups:
            key = (g.topic, g.ledger_id)
            if key in membership:
                membership[key] |= g.entries
            else:
                membership[key] = BitMap(g.entries)
            entries = g.entries
            if g.members or g.wide:
                has_members = True
                owners = BitMap()
                if g.members:
                    codes = members.get(key)
                    members[key] = BitMap64(g.members) if codes is None else codes | g.members
                    codes_array = np.asarray(g.members.to_array(), dtype=np.uint64)
                    owners = BitMap(np.unique(codes_array >> MEMBER_BITS).astype(np.uint32))
                for entry, index in g.wide:
                    table = wide.setdefault(key, {})
                    table[entry] = table.get(entry, 0) | 1 << index
                    owners.add(entry)
                entries = entries - owners
            if key in whole:
                whole[key] |= entries
            else:
                whole[key] = BitMap(entries)
        for bitmap in (*membership.values(), *whole.values()):
            bitmap.run_optimize()  # fresh and never mutated again: safe to optimize
            bitmap.shrink_to_fit()
        for codes in members.values():
            codes.run_optimize()
            codes.shrink_to_fit()
        return _Record(
            seq=segment.seq,
            min_due=segment.min_due_ms,
            max_due=segment.max_due_ms,
            count=segment.id_count,
            nbytes=nbytes,
            has_members=has_members,
            membership=membership,
            whole=whole if has_members else None,  # (without members, every entry held is whole)
            members=members,
            wide=wide,
            supersedes=segment.supersedes,
        )

    def _add_record(self, rec: _Record) -> None:
        self._records[rec.seq] = rec
        for key in rec.membership:
            self._by_key.setdefault(key, set()).add(rec.seq)

    def _drop_record(self, rec: _Record) -> None:
        self._records.pop(rec.seq, None)
        for key in rec.membership:
            seqs = self._by_key.get(key)
            if seqs is not None:
                seqs.discard(rec.seq)
                if not seqs:
                    del self._by_key[key]

    def _holding(self, key: Key) -> list[_Record]:
        return [self._records[s] for s in self._by_key.get(key, ())]

    def _load_ahead(self, now_ms: int) -> None:
        """Load every unloaded segment that is due (forced) and, within the budget, those due within
        ``load_ahead_ms``, earliest first."""
        horizon = now_ms + self.config.load_ahead_ms
        waiting = sorted(
            (r for r in self._records.values() if not r.loaded and r.min_due <= horizon),
            key=lambda r: (r.min_due, r.seq),
        )
        for rec in waiting:
            forced = rec.min_due <= now_ms
            if not forced and len(self._loaded) + rec.live > self.config.max_loaded_ids:
                break
            if forced and len(self._loaded) + rec.live > self.config.max_loaded_ids:
                self._stats.forced_loads += 1
            self._load(rec)

    def _load(self, rec: _Record) -> bool:
        started = time.perf_counter()
        try:
            data = rec.pending if rec.pending is not None else self.storage.get(rec.name)
            segment = decode_segment(data, self.config.limits)
            if segment.seq != rec.seq:
                raise SnapshotCorrupt(f"segment {rec.name} holds sequence number {segment.seq}")
        except SnapshotStorageError as exc:
            self._stats.load.record(_ms(started), False)
            _log.warning("cannot read snapshot segment %s (%s); retrying later", rec.name, exc)
            return False
        except SnapshotCorrupt as exc:
            self._stats.load.record(_ms(started), False)
            self._stats.corrupt_segments += 1
            self._stats.lost_ids += rec.live
            _log.warning("snapshot segment %s is corrupt (%s): %d nacks lost", rec.name, exc, rec.live)
            self._drop_record(rec)
            self._delete_file(rec.name)
            return False
        self._stats.load.record(_ms(started), True)
        self._fill((rec, segment))
        return True

    def _fill(self, *segments: tuple[_Record, Segment]) -> None:
        """Put segments' ids (deletions applied) into the loaded index, where its rule files them among
        the parts there (earliest wins); an entry with a second copy (``_dupes``) that the mutable index
        holds parts of goes there instead, with its loaded parts (:meth:`_move_to_mutable`). Several
        segments only while the mutable index is empty (a restore). O(ids of the segments)."""
        # ids, filed with one add_many per topic at the end — (bucket, ledger, entry ids, batch indexes or
        # None for whole entries) runs: the index's dedupe then gathers a ledger's pending ids once, not
        # once per (bucket, ledger) group, and files batch messages in bulk (one by one, a restore of
        # 10,000 batched nacks took ~400 ms where 10,000 whole entries took ~5)
        runs: dict[str, list[tuple[int, int, npt.NDArray[np.uint32], npt.NDArray[np.int64] | None]]] = {}
        # per segment: entries with a second copy (``_dupes``) → its parts of them, as (bucket, mask or
        # None) when the mutable index holds parts of them too, else None
        meets = [self._gather(rec, segment, runs) for rec, segment in segments]
        assert len(segments) == 1 or not any(any(meet.values()) for meet in meets), "several: no meets"
        for topic, topic_runs in runs.items():
            # (batch messages and whole entries in one call: add_many files the messages first)
            self._loaded.add_many(
                np.concatenate([np.full(len(ids), due, dtype=np.int64) for due, _, ids, _ in topic_runs]),
                np.concatenate([np.full(len(ids), led, dtype=np.int64) for _, led, ids, _ in topic_runs]),
                np.concatenate([ids for _, _, ids, _ in topic_runs]),
                np.concatenate([_indexes_of(ids, indexes) for _, _, ids, indexes in topic_runs]),
                topic=topic,
            )
        for (rec, _), meet in zip(segments, meets, strict=True):
            for (topic, ledger_id, entry), found in meet.items():
                if found is None:
                    continue
                # Every part of the entry in memory (this segment's, the loaded index's, the mutable
                # index's) in one index: its rule keeps the earliest copy of each, and drops the messages
                # a whole entry no later covers — exact where comparing copies one by one was not (the
                # whole entry's copy taken for due at its earliest message's bucket: whole at 2 dropped
                # beside message 0 at 0 and a later whole copy at 3). The segment's copies are deleted in
                # it.
                self._delete_in(rec, (topic, ledger_id), entry, -1)
                self._move_to_mutable(ledger_id, entry, topic, found)
            rec.loaded = True

    def _gather(
        self,
        rec: _Record,
        segment: Segment,
        runs: dict[str, list[tuple[int, int, npt.NDArray[np.uint32], npt.NDArray[np.int64] | None]]],
    ) -> dict[tuple[str, int, int], list[tuple[int, int | None]] | None]:
        """(Lock held.) :meth:`_fill`'s reading of one segment: its ids to file, as runs into ``runs``;
        returns its meets. O(ids of the segment) numpy, O(groups + second copies) Python."""
        meet: dict[tuple[str, int, int], list[tuple[int, int | None]] | None] = {}
        for g in segment.groups:
            if rec.popped_through is not None and g.bucket_ms <= rec.popped_through:
                continue  # popped before a restart (the watermark): spent
            key = (g.topic, g.ledger_id)
            entries = g.entries  # (not copied unless something is taken out)
            # batch messages (of the partly pending entries)
            member_entries, indexes = _member_arrays(g) if g.members or g.wide else (_NO_ENTRIES, _NO_INDEXES)
            if key in rec.deleted:  # entries removed whole (their messages with them)
                entries = entries - rec.deleted[key]
                if len(member_entries):
                    live = np.isin(member_entries, entries.to_array())
                    member_entries, indexes = member_entries[live], indexes[live]
            gone = rec.deleted_members.get(key)
            if gone and len(member_entries):
                live = ~np.isin(_pair_codes(member_entries, indexes), _pair_codes(*_pairs(gone)))
                # an entry whose every message pending here was removed is gone (not pending whole)
                emptied = _bitmap(member_entries) - _bitmap(member_entries[live])
                if emptied:
                    entries = entries - emptied
                member_entries, indexes = member_entries[live], indexes[live]
            dup = self._dupes.get(key)
            if dup:  # a second copy may be in the mutable index: the entry's parts meet there
                moving: list[tuple[int, list[tuple[int, int | None]]]] = []
                for entry in dup & entries:
                    entry_key = (g.topic, g.ledger_id, entry)
                    if entry_key not in meet:  # first seen in this segment: none of its parts here filed yet
                        # None: no part of it in the mutable index, filed as any id (the loaded index's
                        # rule files it among the parts there: a restore's copies, never moved)
                        meet[entry_key] = [] if self._mutable.parts(g.ledger_id, entry, g.topic) else None
                    found = meet[entry_key]
                    if found is not None:
                        moving.append((entry, found))
                if moving:
                    moved = np.array([entry for entry, _ in moving], dtype=np.uint32)
                    entries = entries - _bitmap(moved)
                    rows = np.isin(member_entries, moved)
                    masks: dict[int, int] = {}
                    pairs = zip(member_entries[rows].tolist(), indexes[rows].tolist(), strict=True)
                    for entry, index in pairs:
                        masks[entry] = masks.get(entry, 0) | 1 << index
                    for entry, found in moving:
                        found.append((g.bucket_ms, masks.get(entry)))  # None: the whole entry
                    member_entries, indexes = member_entries[~rows], indexes[~rows]
            if len(member_entries):
                runs.setdefault(g.topic, []).append((g.bucket_ms, g.ledger_id, member_entries, indexes))
                entries = entries - _bitmap(member_entries)  # the rest are pending whole
            if entries:
                array = np.frombuffer(entries.to_array(), dtype=np.uint32)
                runs.setdefault(g.topic, []).append((g.bucket_ms, g.ledger_id, array, None))
        return meet

    def _move_to_mutable(
        self, ledger_id: int, entry_id: int, topic: str, found: list[tuple[int, int | None]]
    ) -> None:
        """(Lock held.) File ``found`` parts of an entry — (bucket, batch mask or None for the whole
        entry) — and the entry's loaded parts in the mutable index, where the index's rule files them
        among its own (earliest wins); the loaded copies are deleted in their segments. Moves, not
        adds (``added`` does not count them). O(the entry's parts)."""
        parts = self._loaded.parts(ledger_id, entry_id, topic)
        if parts:
            self._loaded.remove(ledger_id, entry_id, -1, topic)
            self._mark_deleted((topic, ledger_id), entry_id, -1, "loaded")
        for due, mask in parts + found:
            for index in batch_indexes(mask) if mask is not None else (-1,):
                self._mutable.add(due, ledger_id, entry_id, index, topic)
                self._moved += 1

    def _retire(self, rec: _Record) -> None:
        """A segment all of whose ids were popped or deleted: forget it; its file (and any it supersedes
        that is still around) is deleted by the next :meth:`_write_out`."""
        self._drop_record(rec)
        self._forget_file(rec)

    def _forget_file(self, rec: _Record) -> None:
        """(Lock held.) Ask for the deletion of a dropped segment's file and of the files it supersedes
        (a merge not yet written leaves its inputs on storage). A file not written yet is harmless to
        delete: a write in flight deletes it again once done."""
        for seq in rec.supersedes:
            self._undeleted.setdefault(seq, ())
        self._delete_file(rec.name, rec.supersedes)

    def _delete_file(self, name: str, supersedes: tuple[int, ...] = ()) -> None:
        """(Lock held.) Ask for a file's deletion: :meth:`_write_out` does it, outside the lock, in
        increasing sequence order — a superseded file (older) never outlives the one that replaced it
        (it would come back at restore). O(1)."""
        self._undeleted[_seq_of(name)] = supersedes

    # -- internals: deletions, merging ------------------------------------------------------------------

    def _consumed(self, ids: DueIds) -> None:
        """Ids popped from the loaded index: every copy of them in a loaded segment is spent (the loaded
        index kept the earliest; later copies were covered by it), so they are recorded as deleted and a
        rewrite trims them from the files. Bulk bitmap work: O(ids × loaded segments of the ledger / 64)."""
        key = (ids.topic, ids.ledger_id)
        holders = [r for r in self._holding(key) if r.loaded]
        if not holders:
            return
        popped = BitMap(ids.entry_ids)
        partial = ids.batch_indexes
        whole = popped - BitMap(partial) if partial else popped
        for rec in holders:
            hit = (whole & rec.membership[key]) - rec.deleted.get(key, _EMPTY)
            if hit:
                gone = rec.deleted.get(key)
                if gone is None:
                    rec.deleted[key] = hit
                else:
                    gone |= hit
                rec.deleted_count += len(hit)
                # The copy popped was due by now: the pop watermark covers it in the file. Only a second
                # copy of the entry (at a later bucket, in another segment) must be trimmed by a rewrite.
                dup = self._dupes.get(key)
                if dup is not None and hit & dup:
                    rec.dirty = True
            for entry, indexes in partial.items():
                if rec.holds(key, entry):
                    for index in indexes:
                        self._delete_in(rec, key, entry, index, dirty=bool(self._dupes.get(key)))

    def _mark_deleted(
        self, key: Key, entry_id: int, batch_index: int, where: Literal["all", "loaded", "unloaded"]
    ) -> bool:
        """Record a removal in the segments (of the kind ``where``) whose membership holds the entry. True if
        an unloaded one held the id pending: the entry (``batch_index`` -1), or that batch message on its
        own (a message covered by a whole entry stays, as in the index). A loaded segment's membership
        may be stale (popped ids): the loaded index answers for it."""
        hit = False
        for rec in self._holding(key):
            if (where == "loaded" and not rec.loaded) or (where == "unloaded" and rec.loaded):
                continue
            if rec.holds(key, entry_id):
                if not rec.loaded and not hit:  # (an entry whose messages were all removed: nothing)
                    if batch_index < 0:
                        hit = rec.member_mask(key, entry_id) != 0
                    else:  # on its own only: a message the whole entry covers stays, as in the index
                        hit = rec.own_mask(key, entry_id) >> batch_index & 1 == 1
                self._delete_in(rec, key, entry_id, batch_index)
        return hit

    def _delete_in(self, rec: _Record, key: Key, entry_id: int, batch_index: int, dirty: bool = True) -> None:
        """Record one removal in ``rec``; ``dirty``: the file must be rewritten without it (not for a pop
        the watermark covers)."""
        if batch_index >= 0:
            rec.deleted_members.setdefault(key, set()).add((entry_id, batch_index))
            rec.dirty = rec.dirty or dirty
            return
        gone = rec.deleted.get(key)
        if gone is None:
            gone = rec.deleted[key] = BitMap()
        if _add_new(gone, entry_id):
            rec.deleted_count += 1
        rec.dirty = True

    def _merge_once(self) -> bool:
        """Merge up to ``max_merge_inputs`` adjacent unloaded segments with the fewest ids while more than
        ``max_segments`` are unloaded. True if a merge happened."""
        ordered = sorted(self._records.values(), key=lambda r: (r.min_due, r.seq))
        eligible = [r for r in ordered if r.persisted and not r.loaded]
        if len(eligible) <= self.config.max_segments:
            return False
        runs: list[list[_Record]] = [[]]
        for rec in ordered:  # maximal runs of adjacent mergeable segments
            if rec.persisted and not rec.loaded:
                runs[-1].append(rec)
            elif runs[-1]:
                runs.append([])
        best: list[_Record] | None = None
        for run in runs:
            width = min(self.config.max_merge_inputs, len(run))
            for i in range(len(run) - width + 1 if width >= 2 else 0):
                window = run[i : i + width]
                if best is None or (len(window), -_live(window)) > (len(best), -_live(best)):
                    best = window
        return best is not None and self._merge(best)

    def _merge(self, inputs: list[_Record]) -> bool:
        """Replace the inputs by one segment holding their ids (their deletions and pops applied). A single
        input is a rewrite (a loaded one stays loaded: its ids are in the loaded index already). The new
        segment is in charge at once, in memory; :meth:`_write_out` writes it, and deletes the inputs'
        files only after that. True if the inputs were replaced (False: one could not be read)."""
        started = time.perf_counter()
        combined: dict[tuple[int, str, int], tuple[BitMap, dict[int, int]]] = {}
        for rec in inputs:
            try:
                segment = decode_segment(self.storage.get(rec.name), self.config.limits)
            except SnapshotStorageError as exc:
                self._stats.merge.record(_ms(started), False)
                _log.warning("cannot read snapshot segment %s for a merge (%s)", rec.name, exc)
                return False
            except SnapshotCorrupt as exc:
                self._stats.corrupt_segments += 1
                self._stats.lost_ids += rec.live
                _log.warning("snapshot segment %s is corrupt (%s): %d nacks lost", rec.name, exc, rec.live)
                continue
            for g in segment.groups:
                if rec.popped_through is not None and g.bucket_ms <= rec.popped_through:
                    continue
                key = (g.topic, g.ledger_id)
                entries = g.entries - rec.deleted.get(key, _EMPTY)
                masks = {e: m for e, m in g.batch_masks().items() if e in entries}
                for entry, index in rec.deleted_members.get(key, ()):
                    if entry in masks:
                        masks[entry] &= ~(1 << index)
                        if not masks[entry]:
                            del masks[entry]
                            entries.discard(entry)
                if not entries:
                    continue
                _join(combined, (g.bucket_ms, g.topic, g.ledger_id), entries, masks)
        rows = [(b, t, led, e, m or None) for (b, t, led), (e, m) in sorted(combined.items())]
        groups = groups_from_rows(rows)
        pending = {s for r in inputs for s in r.supersedes if s in self._undeleted}
        seq = self._next_seq
        self._next_seq += 1
        segment = Segment(seq, tuple(groups), tuple(sorted({r.seq for r in inputs} | pending)))
        if segment.id_count > self.config.limits.max_ids:
            self._stats.merge.record(_ms(started), False)
            return False
        data = encode_segment(segment)
        rec = self._record(segment, len(data))
        rec.loaded = len(inputs) == 1 and inputs[0].loaded
        for old in inputs:
            self._drop_record(old)
        if groups:  # its inputs' files are deleted once it is written (its supersedes name them)
            rec.persisted, rec.pending, rec.merged = False, data, True
            self._add_record(rec)
        else:  # nothing of the inputs is left: their files simply go
            for old in inputs:
                self._forget_file(old)
            self._stats.merge.record(_ms(started), True)
        return True

    def _lost(self, name: str, data: bytes, exc: Exception) -> int:
        try:
            count = read_header(data, self.config.limits).id_count
            detail = f"{count} pending nacks lost"
        except SnapshotCorrupt:
            count, detail = 0, "the number of nacks lost is unknown (header unreadable)"
        self._stats.corrupt_segments += 1
        self._stats.lost_ids += count
        _log.warning("snapshot segment %s is corrupt (%s): %s", name, exc, detail)
        return count


def _join(
    slots: dict[tuple[int, str, int], tuple[BitMap, dict[int, int]]],
    key: tuple[int, str, int],
    entries: BitMap,
    masks: dict[int, int],
) -> None:
    """Add ``entries`` (``masks``: the partially pending ones) to ``slots[key]``: an entry whole in
    either is whole. O(entries + masks)."""
    slot = slots.get(key)
    if slot is None:
        slots[key] = (entries, masks)
        return
    have, have_masks = slot
    whole = (have - BitMap(have_masks)) | (entries - BitMap(masks))
    have |= entries
    for entry, mask in masks.items():
        have_masks[entry] = have_masks.get(entry, 0) | mask
    for entry in [e for e in have_masks if e in whole]:
        del have_masks[entry]


def _member_arrays(group: Group) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.int64]]:
    """A group's batch messages (of its partly pending entries) as (entry ids, batch indexes) arrays,
    narrow members then wide ones; empty arrays when every entry is pending whole. O(members) numpy,
    O(wide members) Python."""
    codes = np.asarray(group.members.to_array() if group.members else (), dtype=np.uint64)
    entries = (codes >> MEMBER_BITS).astype(np.uint32)
    indexes = (codes & _MEMBER_INDEX).astype(np.int64)
    if group.wide:
        wide = np.array(group.wide, dtype=np.int64)
        entries = np.concatenate((entries, wide[:, 0].astype(np.uint32)))
        indexes = np.concatenate((indexes, wide[:, 1]))
    return entries, indexes


def _bitmap(entry_ids: npt.NDArray[np.uint32]) -> BitMap:
    """A bitmap of entry ids (pyroaring builds from an ``array('I')`` ~10x faster than from numpy)."""
    return BitMap(array("I", np.ascontiguousarray(entry_ids, dtype=np.uint32).tobytes()))


def _pairs(pairs: set[tuple[int, int]]) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.int64]]:
    """(entry, batch index) pairs as (entry ids, batch indexes) arrays. O(pairs)."""
    table = np.array(sorted(pairs), dtype=np.int64).reshape(-1, 2)
    return table[:, 0].astype(np.uint32), table[:, 1]


def _pair_codes(entry_ids: npt.NDArray[np.uint32], indexes: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]:
    """One code per (entry, batch index): entry ids < 2**32 and batch indexes < 2**31. O(n) numpy."""
    return entry_ids.astype(np.uint64) << np.uint64(32) | indexes.astype(np.uint64)


def _indexes_of(ids: npt.NDArray[np.uint32], indexes: npt.NDArray[np.int64] | None) -> npt.NDArray[np.int64]:
    """A run's batch indexes: ``indexes``, or -1 (whole entries) for each id when None. O(ids)."""
    return np.full(len(ids), -1, dtype=np.int64) if indexes is None else indexes


def _live(records: list[_Record]) -> int:
    return sum(r.live for r in records)


def _add_new(bitmap: BitMap, value: int) -> bool:
    if value in bitmap:
        return False
    bitmap.add(value)
    return True


def _seq_of(name: str) -> int:
    match = _NAME.fullmatch(name)
    return int(match["seq"], 16) if match else -1


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000.0


def _one_per_group(
    first: list[tuple[int, DueIds]], second: list[tuple[int, DueIds]]
) -> list[tuple[int, DueIds]]:
    """Two pops by bucket as one: one ``DueIds`` per (bucket, ledger) (an entry whole if whole in
    either), in bucket order. O(due ids) for groups in both, else O(groups log groups)."""
    if not second:
        return first
    if not first:
        return second
    merged = {(bucket, ids.topic, ids.ledger_id): ids for bucket, ids in first}
    for bucket, ids in second:
        key = (bucket, ids.topic, ids.ledger_id)
        other = merged.get(key)
        merged[key] = ids if other is None else merge_due(other, ids)
    return sorted(((key[0], ids) for key, ids in merged.items()), key=_bucket_of)


def _bucket_of(group: tuple[int, DueIds]) -> int:
    return group[0]


def _one_per_ledger(first: list[DueIds], second: list[DueIds]) -> list[DueIds]:
    """Two pops' due ids as one pop's: one ``DueIds`` per ledger (an entry whole if whole in either), in
    the order the ledgers first come. O(due ids) for ledgers in both, else O(ledgers)."""
    if not second:
        return first
    merged = {(ids.topic, ids.ledger_id): ids for ids in first}
    for ids in second:
        key = (ids.topic, ids.ledger_id)
        other = merged.get(key)
        merged[key] = ids if other is None else merge_due(other, ids)
    return list(merged.values())
