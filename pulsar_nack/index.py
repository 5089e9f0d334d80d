"""The TimeBucket nack index: PIP-393's *bucket time → ledger → Roaring bitmap of entry ids*.

A nack's due time (ms) is trimmed to a multiple of ``2**precision_bits`` (the *bucket*). All ids of one
ledger that fall into one bucket share one bitmap, so memory grows with buckets × ledgers, not with ids:
at 8 nacks/ms and 1-s buckets an id costs about one *bit*. The buckets sit in a sorted map, so finding
what is due touches only the due buckets (PIP-393 seed, section "New Data Structure").

Beyond the Java tracker this index

* keeps each id once (*earliest due wins*): nacking a pending id again never delays it and never
  schedules a second redelivery;
* tracks batch indexes only for batched ids, so that nacks of two messages of one batch with different
  due times stay apart (``pop_due`` of the first leaves the second pending) while non-batched ids cost
  nothing extra;
* answers :meth:`TimeBucketIndex.due_of` — *is this id pending, and until when?* — without a per-id
  reverse map (see the complexity notes there);
* compacts buckets that stopped receiving ids (:meth:`TimeBucketIndex.compact`): a bitmap that holds one
  run of consecutive ids becomes a 36-byte packed int, others get ``run_optimize`` + ``shrink_to_fit``.

Thread safety: every public method takes one internal lock, so the index may be shared by user threads
(nacks) and a timer thread (``pop_due``, ``compact``). ``add_many`` and ``pop_due`` hold the lock for the
whole call.
"""

from __future__ import annotations

import inspect
import threading
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal, NamedTuple, NoReturn, TypeAlias

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap, BitMap64
from sortedcontainers import SortedDict

from pulsar_nack.memory import MemoryUsage, bitmap64_heap_bytes, bitmap_heap_bytes, python_bytes

__all__ = [
    "MAX_BATCH_INDEX",
    "MAX_ENTRY_ID",
    "MAX_PRECISION_BITS",
    "MEMBER_BITS",
    "DueIds",
    "Rounding",
    "TimeBucketIndex",
    "as_id_arrays",
    "batch_indexes",
    "batch_mask",
]

#: Entry ids are stored in 32-bit Roaring bitmaps. Pulsar caps entries per ledger with the int setting
#: ``managedLedgerMaxEntriesPerLedger`` (default 50,000), so real entry ids are far below this.
MAX_ENTRY_ID = 2**32 - 1
MAX_PRECISION_BITS = 30
Rounding = Literal["floor", "ceil"]

#: A ledger's key: its id, or ``(topic, ledger_id)`` when the id carries a topic (multi-topic consumers).
LedgerKey: TypeAlias = "int | tuple[str, int]"


class DueIds(NamedTuple):
    """The ids of one ledger that became due in one :meth:`TimeBucketIndex.pop_due` call.

    ``entry_ids`` are sorted and unique (uint32). ``batch_indexes`` lists, for entries of which only some
    messages of the batch are due, those batch indexes; every other entry is due as a whole.
    """

    topic: str
    ledger_id: int
    entry_ids: npt.NDArray[np.uint32]
    batch_indexes: Mapping[int, tuple[int, ...]] = {}


#: Batch indexes below 2**10 are stored as the low bits of a 64-bit member id, so that the members of
#: consecutive entries share Roaring containers; larger ones (batches over 1024 messages) in a dict.
MEMBER_BITS = 10
MAX_BATCH_INDEX = 2**31 - 1


class _Members:
    """One slot's batch members — entry id → bitmask of its pending batch indexes — stored as one 64-bit
    Roaring bitmap of ``entry_id << 10 | batch_index``: a few bytes per member, where a dict of Python
    ints took ~100. Indexes of 1024 and above go to a dict (batches that large are rare). The dict
    operations the index uses; each is O(log members + batch indexes of the entry)."""

    __slots__ = ("_bits", "_wide")

    def __init__(self) -> None:
        self._bits = BitMap64()
        self._wide: dict[int, int] | None = None  # entry id → mask of its indexes >= 2**MEMBER_BITS

    def get(self, entry_id: int, default: int | None = None) -> int | None:
        low = entry_id << MEMBER_BITS
        high = low + (1 << MEMBER_BITS)
        mask = 0
        for value in self._bits.iter_equal_or_larger(low):
            if value >= high:
                break
            mask |= 1 << (value - low)
        if self._wide:
            mask |= self._wide.get(entry_id, 0)
        return mask if mask else default

    def __getitem__(self, entry_id: int) -> int:
        mask = self.get(entry_id)
        if mask is None:
            raise KeyError(entry_id)
        return mask

    def __setitem__(self, entry_id: int, mask: int) -> None:
        self._clear(entry_id)
        low = entry_id << MEMBER_BITS
        narrow = mask & _NARROW_MASK
        index = 0
        while narrow:
            if narrow & 1:
                self._bits.add(low | index)
            narrow >>= 1
            index += 1
        if mask >> _NARROW_INDEXES:
            if self._wide is None:
                self._wide = {}
            self._wide[entry_id] = mask & ~_NARROW_MASK

    def add_index(self, entry_id: int, batch_index: int) -> None:
        """Mark one batch index of the entry pending. O(log members)."""
        if batch_index < _NARROW_INDEXES:
            self._bits.add(entry_id << MEMBER_BITS | batch_index)
        else:
            if self._wide is None:
                self._wide = {}
            self._wide[entry_id] = self._wide.get(entry_id, 0) | 1 << batch_index

    def discard_index(self, entry_id: int, batch_index: int) -> None:
        """Unmark one batch index of the entry. O(log members)."""
        if batch_index < _NARROW_INDEXES:
            self._bits.discard(entry_id << MEMBER_BITS | batch_index)
        elif self._wide and entry_id in self._wide:
            mask = self._wide[entry_id] & ~(1 << batch_index)
            if mask:
                self._wide[entry_id] = mask
            else:
                del self._wide[entry_id]

    def _clear(self, entry_id: int) -> None:
        low = entry_id << MEMBER_BITS
        self._bits.remove_range(low, low + (1 << MEMBER_BITS))
        if self._wide:
            self._wide.pop(entry_id, None)

    def __delitem__(self, entry_id: int) -> None:
        if self.pop(entry_id) is None:
            raise KeyError(entry_id)

    def pop(self, entry_id: int, default: int | None = None) -> int | None:
        mask = self.get(entry_id)
        if mask is None:
            return default
        self._clear(entry_id)
        return mask

    def __contains__(self, entry_id: object) -> bool:
        if not isinstance(entry_id, int):
            return False
        low = entry_id << MEMBER_BITS
        found = self._bits.range_cardinality(low, low + (1 << MEMBER_BITS))
        return bool(found) or bool(self._wide and entry_id in self._wide)

    def __bool__(self) -> bool:
        return bool(self._bits) or bool(self._wide)

    def items(self) -> Iterator[tuple[int, int]]:
        """(entry id, mask) in entry order."""
        masks: dict[int, int] = {}
        for value in self._bits:
            entry_id = value >> MEMBER_BITS
            masks[entry_id] = masks.get(entry_id, 0) | 1 << (value & (_NARROW_INDEXES - 1))
        for entry_id, wide in (self._wide or {}).items():
            masks[entry_id] = masks.get(entry_id, 0) | wide
        return iter(sorted(masks.items()))

    @property
    def bitmap(self) -> BitMap64:
        return self._bits

    @property
    def wide(self) -> dict[int, int] | None:
        return self._wide


_NARROW_INDEXES = 1 << MEMBER_BITS  # batch indexes kept in the bitmap: 0 .. 1023
_NARROW_MASK = (1 << _NARROW_INDEXES) - 1


class _Run(int):
    """A compacted bitmap holding one run ``lo..hi`` of consecutive entry ids, packed as ``lo << 32 | hi``.

    36 bytes instead of ~190 for a one-run bitmap (40 B Python object + ~150 B of CRoaring heap).
    """

    __slots__ = ()

    @classmethod
    def of(cls, lo: int, hi: int) -> _Run:
        return cls(lo << 32 | hi)

    @property
    def lo(self) -> int:
        return self >> 32

    @property
    def hi(self) -> int:
        return self & MAX_ENTRY_ID

    def __contains__(self, entry_id: object) -> bool:
        return isinstance(entry_id, int) and self >> 32 <= entry_id <= self & MAX_ENTRY_ID

    def __len__(self) -> int:
        return self.hi - self.lo + 1

    def __bool__(self) -> bool:
        return True  # a run is never empty, though the run 0..0 packs to the int 0

    def to_bitmap(self) -> BitMap:
        bitmap = BitMap()
        bitmap.add_range(self.lo, self.hi + 1)
        return bitmap


#: What a bucket stores per ledger: a live bitmap, or a compacted run.
Entries: TypeAlias = "BitMap | _Run"


class _Ledger:
    """Bookkeeping of a ledger that has ids in more than one bucket (single-bucket ledgers need none).

    ``buckets`` (sorted) and ``entries`` are parallel lists. ``lo``/``hi`` bound every pending entry id
    (loosely after pops: ``stale`` says so), so that a nack outside them skips any search. ``mins`` holds
    each bucket's smallest entry id when the buckets hold increasing, disjoint ranges of entry ids (the
    usual in-order case), so a lookup bisects instead of probing every bucket; None = not known yet.
    """

    __slots__ = ("buckets", "entries", "hi", "lo", "mins", "ordered", "stale")

    def __init__(self, buckets: list[int], entries: list[Entries]) -> None:
        self.buckets = buckets
        self.entries = entries
        self.lo = 0
        self.hi = -1
        self.stale = True
        self.mins: list[int] | None = None
        self.ordered = False
        self.refresh_bounds()

    def refresh_bounds(self) -> None:
        """Recompute exact ``lo``/``hi``. O(buckets of this ledger)."""
        lows = [_min(e) for e in self.entries if e]
        highs = [_max(e) for e in self.entries if e]
        self.lo = min(lows) if lows else 0
        self.hi = max(highs) if highs else -1
        self.stale = False

    def candidates(self, entry_id: int) -> Iterator[tuple[int, Entries]]:
        """(bucket, entries) of the slots that may hold ``entry_id``. O(log B_l) when ordered, else O(B_l)."""
        if self.mins is None:
            self._order()
        if self.ordered:
            assert self.mins is not None
            i = bisect_right(self.mins, entry_id) - 1
            if i >= 0:
                yield self.buckets[i], self.entries[i]
            return
        yield from zip(self.buckets, self.entries, strict=True)

    def _order(self) -> None:
        if not all(self.entries):  # a new, still empty slot: no order to speak of
            self.mins, self.ordered = [], False
            return
        self.mins = [_min(e) for e in self.entries]
        highs = [_max(e) for e in self.entries]
        self.ordered = all(high < low for high, low in zip(highs, self.mins[1:], strict=False))

    def position(self, bucket: int) -> int:
        i = bisect_left(self.buckets, bucket)
        if i == len(self.buckets) or self.buckets[i] != bucket:
            raise KeyError(bucket)
        return i


def _min(entries: Entries) -> int:
    return entries.lo if isinstance(entries, _Run) else int(entries.min())


def _max(entries: Entries) -> int:
    return entries.hi if isinstance(entries, _Run) else int(entries.max())


class TimeBucketIndex:
    """Pending nacks by due time: ``bucket_ms → ledger → entry ids``, as in Apache Pulsar's PIP-393.

    ``precision_bits`` (0..30) is *k*: due times are trimmed to multiples of ``2**k`` ms. ``rounding``
    ``"floor"`` (Java's behaviour) puts an id in the bucket at or before its due time, so it may fire up to
    ``2**k - 1`` ms early and never late; ``"ceil"`` uses the bucket at or after it: never early, up to
    ``2**k - 1`` ms late.

    Complexity (B = buckets, L = ledgers with ids in a bucket, B_l = buckets of one ledger):

    * :meth:`add` — O(1) when the id's bucket and ledger repeat the previous call or the entry id lies
      outside the ledger's pending range (the usual in-order nack); O(log B) when it opens a bucket;
      O(B_l) when the id might already be pending (re-nack inside the ledger's pending range).
    * :meth:`add_many` — O(n) numpy work plus O(1) Python work per run of ids sharing bucket and ledger;
      unsorted input is sorted first (O(n log n)).
    * :meth:`pop_due` — O(due buckets × L + due ids) (ids are copied out by CRoaring in bulk).
    * :meth:`due_of`, :meth:`pending_mask`, :meth:`remove` — O(1) for an id outside its ledger's pending
      range, else O(B_l).
    * ``len``, :attr:`bucket_count` — O(1); :meth:`next_due_ms` — O(log B).
    """

    def __init__(self, precision_bits: int = 8, rounding: Rounding = "floor") -> None:
        if isinstance(precision_bits, bool) or not isinstance(precision_bits, int | np.integer):
            raise TypeError(f"precision_bits must be an int, got {type(precision_bits).__name__}")
        if not 0 <= precision_bits <= MAX_PRECISION_BITS:
            raise ValueError(f"precision_bits must be in 0..{MAX_PRECISION_BITS}, got {precision_bits}")
        precision_bits = int(precision_bits)
        if not isinstance(rounding, str) or rounding not in ("floor", "ceil"):
            raise ValueError(f"rounding must be 'floor' or 'ceil', got {rounding!r}")
        self._precision_bits = precision_bits
        self._rounding: Rounding = rounding
        self._mask = -1 << precision_bits
        self._round_up = (1 << precision_bits) - 1 if rounding == "ceil" else 0
        self._lock = threading.Lock()
        # bucket_ms → {ledger key → entry ids}: the PIP-393 map.
        self._schedule: SortedDict = SortedDict()
        # ledger key → its only bucket (an int), or a _Ledger when it has ids in several buckets.
        self._ledgers: dict[LedgerKey, int | _Ledger] = {}
        # (bucket, key) → {entry id → bitmask of pending batch indexes}, for entries that are pending
        # only for some messages of their batch. Entries absent here are pending as a whole.
        self._members: dict[tuple[int, LedgerKey], _Members] = {}
        # Buckets the add path has moved away from: candidates for compact(). Ordered set.
        self._cold: dict[int, None] = {}
        self._count = 0
        self._added = 0  # ids accepted by add/add_many, repeats included
        self._forget_slot()

    # -- properties ---------------------------------------------------------------------------------

    @property
    def precision_bits(self) -> int:
        return self._precision_bits

    @property
    def rounding(self) -> Rounding:
        return self._rounding

    @property
    def bucket_count(self) -> int:
        """Number of non-empty buckets. O(1)."""
        return len(self._schedule)

    @property
    def added(self) -> int:
        """Ids accepted by :meth:`add`/:meth:`add_many` so far, repeats included."""
        return self._added

    def __len__(self) -> int:
        """Pending ids, counting an entry once per bucket (batch messages of one entry count once)."""
        return self._count

    def bucket_of(self, due_ms: int) -> int:
        """The bucket time an id due at ``due_ms`` is stored under (and popped at)."""
        return (_check_due(due_ms) + self._round_up) & self._mask

    def next_due_ms(self) -> int | None:
        """The earliest bucket time, or None when nothing is pending. O(log B)."""
        with self._lock:
            if not self._schedule:
                return None
            return int(self._schedule.keys()[0])

    # -- adding ---------------------------------------------------------------------------------------

    def add(
        self,
        due_ms: int,
        ledger_id: int,
        entry_id: int,
        batch_index: int = -1,
        topic: str = "",
        fresh: bool = False,
    ) -> int:
        """Schedule one id; returns the bucket time it was filed under.

        A pending id keeps its earlier due time (earliest wins).

        ``batch_index`` -1 means the whole entry; ``>= 0`` one message of a batch. A pending whole entry
        covers its batch messages, so adding a batch message it covers is a no-op.
        ``fresh``: the caller knows that neither this id nor its whole entry is pending (and, for a whole
        entry, none of its batch messages), so the dedupe against the ledger's other buckets is skipped —
        O(1) even for ids inside the ledger's pending range (the consumer's arrival filter knows this for
        every nack). A wrong ``fresh`` makes an id pending twice.
        Raises ``ValueError``/``TypeError`` naming the bad parameter; the index is then unchanged.
        """
        if type(due_ms) is not int or due_ms < 0:  # bools, floats, negatives: rejected, whatever rounding
            due_ms = _check_due(due_ms)
        bucket = (due_ms + self._round_up) & self._mask
        if type(entry_id) is not int or type(ledger_id) is not int:
            entry_id, ledger_id = _entry(entry_id), _ledger(ledger_id)
        with self._lock:
            if bucket == self._slot_bucket and ledger_id == self._slot_ledger and topic == self._slot_topic:
                entries = self._slot_entries
            else:
                entries = self._select(bucket, ledger_id, topic)
            if batch_index == -1 and self._slot_members is None:
                record = self._slot_record
                try:
                    if record is None:
                        # The ledger's only bucket: membership is exact.
                        if entry_id not in entries:
                            entries.add(entry_id)
                            self._count += 1
                        self._added += 1
                        return bucket
                    if entry_id > record.hi or entry_id < record.lo:
                        # Outside every pending id of the ledger: cannot be a duplicate.
                        entries.add(entry_id)
                        self._count += 1
                        if entry_id > record.hi:
                            record.hi = entry_id
                            if not self._slot_is_last:
                                record.mins = None  # ranges may overlap now
                        else:
                            record.lo = entry_id
                            record.mins = None
                        self._added += 1
                        return bucket
                except OverflowError:  # pyroaring: negative or >= 2**32
                    self._reject(_bad_entry(entry_id))
            if fresh:
                self._insert(entry_id, self._checked_batch_index(batch_index))
            else:
                self._add_checked(entry_id, batch_index)
            self._added += 1
        return bucket

    def add_many(
        self,
        due_ms: Any,
        ledger_ids: Any,
        entry_ids: Any,
        batch_indexes: Any = None,
        topic: str = "",
    ) -> None:
        """Schedule many ids at once from array-likes (numpy arrays, lists, or scalars to broadcast).

        Same semantics as calling :meth:`add` for each position in order. All input is validated before
        anything changes. Ids with a batch index >= 0 go through the per-id path.
        """
        due, ledgers, entries, batches = as_id_arrays(due_ms, ledger_ids, entry_ids, batch_indexes)
        if not isinstance(topic, str):
            raise TypeError(f"topic must be a str, got {type(topic).__name__}")
        if len(entries) == 0:
            return
        buckets = (due + self._round_up) & self._mask
        with self._lock:
            self._added += len(entries)
            self._forget_slot()
            if batches is not None and (batches >= 0).any():
                whole = batches < 0
                for b, led, e, bi in zip(
                    buckets[~whole].tolist(),
                    ledgers[~whole].tolist(),
                    entries[~whole].tolist(),
                    batches[~whole].tolist(),
                    strict=True,
                ):
                    self._select(b, led, topic)
                    self._add_checked(e, bi)
                self._forget_slot()
                buckets, ledgers, entries = buckets[whole], ledgers[whole], entries[whole]
            if len(entries) == 0:
                return
            for bucket, ledger_id, run in _runs(buckets, ledgers, entries):
                self._add_run(bucket, ledger_id, topic, run)
            self._forget_slot()

    # -- popping, querying, removing --------------------------------------------------------------

    def pop_due(self, now_ms: int) -> list[DueIds]:
        """Remove and return every id whose bucket time is <= ``now_ms``, one ``DueIds`` per ledger.

        Ledgers come in the order of their earliest due bucket. An entry due in several buckets comes
        once; if it is due as a whole in any of them it comes as a whole.
        """
        now_ms = _check_due(now_ms, "now_ms")
        with self._lock:
            schedule = self._schedule
            stop = schedule.bisect_right(now_ms)
            if stop == 0:
                return []
            self._forget_slot()
            if stop <= _POP_ONE_BY_ONE:  # the timer's case: SortedDict pops its first item cheaply
                due = [schedule.popitem(0) for _ in range(stop)]
            else:
                keys = schedule.keys()
                due = [(bucket, schedule[bucket]) for bucket in keys[:stop]]
                del keys[:stop]
            # ledger key → [(entries, batch masks or None for whole entries)] over the due buckets
            merged: dict[LedgerKey, list[tuple[Entries, _Members | None]]] = {}
            members = self._members
            for bucket, slots in due:
                self._cold.pop(bucket, None)
                for key, entries in slots.items():
                    masks = members.pop((bucket, key), None) if members else None
                    parts = merged.get(key)
                    if parts is None:
                        merged[key] = [(entries, masks)]
                    else:
                        parts.append((entries, masks))
                    self._count -= len(entries)
            for key, parts in merged.items():  # the popped buckets are each ledger's earliest ones
                self._unlink_first(key, len(parts))
            return [_due_ids(key, parts) for key, parts in merged.items()]

    def pending_mask(self, ledger_id: int, entry_id: int, topic: str = "") -> int:
        """The batch indexes of this entry pending in any bucket, as a bitmask; -1 if the whole entry is
        pending, 0 if nothing is. O(1) if the entry lies outside the ledger's pending range, else O(B_l)."""
        with self._lock:
            key = _key(ledger_id, topic)
            mask = 0
            for bucket, _ in self._holding(key, entry_id):
                masks = self._members.get((bucket, key)) if self._members else None
                member = masks.get(entry_id) if masks else None
                if member is None:
                    return -1
                mask |= member
            return mask

    def due_of(self, ledger_id: int, entry_id: int, batch_index: int = -1, topic: str = "") -> int | None:
        """The bucket time at which this id will be popped, or None if it is not pending.

        With ``batch_index`` -1: the earliest bucket holding any part of the entry. With a batch index:
        the earliest bucket holding that message or the whole entry. O(1) if the entry lies outside the
        ledger's pending range, else O(B_l) bitmap probes.
        """
        with self._lock:
            key = _key(ledger_id, topic)
            best: int | None = None
            for bucket, _ in self._holding(key, entry_id):
                if best is not None and bucket >= best:
                    continue
                masks = self._members.get((bucket, key)) if self._members else None
                mask = masks.get(entry_id) if masks else None
                if batch_index < 0 or mask is None or mask >> batch_index & 1:
                    best = bucket
            return best

    def remove(self, ledger_id: int, entry_id: int, batch_index: int = -1, topic: str = "") -> bool:
        """Forget a pending id; True if something was removed.

        ``batch_index`` -1 removes every pending part of the entry. A batch index removes that message
        where it is pending on its own (a message covered by a pending whole entry stays).
        """
        with self._lock:
            self._forget_slot()
            key = _key(ledger_id, topic)
            removed = False
            for bucket, entries in list(self._holding(key, entry_id)):
                slot = (bucket, key)
                masks = self._members.get(slot) if self._members else None
                mask = masks.get(entry_id) if masks else None
                if batch_index >= 0:
                    if mask is None or not mask >> batch_index & 1:
                        continue
                    mask &= ~(1 << batch_index)
                    if mask:
                        assert masks is not None
                        masks.discard_index(entry_id, batch_index)
                        removed = True
                        continue
                self._discard(bucket, key, entries, entry_id)
                removed = True
            return removed

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._schedule.clear()
            self._ledgers.clear()
            self._members.clear()
            self._cold.clear()
            self._count = 0
            self._forget_slot()

    def compact(self, max_buckets: int | None = None) -> int:
        """Compact buckets the add path has moved away from; returns how many were compacted.

        A bitmap holding one run of consecutive ids becomes a packed int (``_Run``); others are
        ``run_optimize``-d and ``shrink_to_fit``-ed. Adding to a compacted bucket later is fine (it is
        turned back into a bitmap). O(bitmaps in the compacted buckets). Call it off the nack path, e.g.
        from the timer thread; never needed for correctness.
        """
        done = 0
        with self._lock:
            for bucket in list(self._cold):
                if max_buckets is not None and done >= max_buckets:
                    break
                if bucket == self._slot_bucket:
                    continue  # still receiving ids
                del self._cold[bucket]
                slots = self._schedule.get(bucket)
                if slots is None:
                    continue
                for key, entries in slots.items():
                    if isinstance(entries, BitMap):
                        self._replace(bucket, key, _compacted(entries))
                done += 1
        return done

    def __iter__(self) -> Iterator[tuple[int, str, int, npt.NDArray[np.uint32]]]:
        """Yield ``(bucket_ms, topic, ledger_id, entry_ids)`` in bucket order (a snapshot). O(n)."""
        with self._lock:
            snapshot = [
                (int(bucket), key, _as_array(entries))
                for bucket, slots in self._schedule.items()
                for key, entries in slots.items()
            ]
        for bucket, key, entry_ids in snapshot:
            topic, ledger_id = _split_key(key)
            yield bucket, topic, ledger_id, entry_ids

    def structure(self) -> dict[str, int]:
        """Buckets, (bucket, ledger) slots and the Roaring container mix: ``slots``, ``bitmaps``,
        ``packed_runs`` (slots compacted to one run), ``array_containers``, ``bitset_containers``,
        ``run_containers``. O(slots)."""
        counts = dict.fromkeys(("buckets", "slots", "bitmaps", "packed_runs"), 0)
        counts |= dict.fromkeys(("array_containers", "bitset_containers", "run_containers"), 0)
        with self._lock:
            counts["buckets"] = len(self._schedule)
            for slots in self._schedule.values():
                for entries in slots.values():
                    counts["slots"] += 1
                    if isinstance(entries, _Run):
                        counts["packed_runs"] += 1
                        continue
                    stats = entries.get_statistics()
                    counts["bitmaps"] += 1
                    for kind in ("array", "bitset", "run"):
                        counts[f"{kind}_containers"] += stats[f"n_{kind}_containers"]
        return counts

    def memory_usage(self) -> MemoryUsage:
        """Bytes held by the index: Python objects at the sizes the allocator hands out
        (:func:`~pulsar_nack.memory.python_bytes`) and CRoaring's C heap
        (:func:`~pulsar_nack.memory.bitmap_heap_bytes`), by part. O(objects in the index).

        Shared objects (a bucket's int key stored in several places, a topic string) count once; small
        ints that CPython caches count nothing.
        """
        with self._lock:
            return self._walk_memory()

    def _walk_memory(self) -> MemoryUsage:
        """:meth:`memory_usage`'s walk of the live structure (caller holds the lock)."""
        seen: set[int] = set()
        parts = {"schedule": 0, "buckets": 0, "ledgers": 0, "batch_members": 0, "bitmap_objects": 0}
        roaring = 0

        def once(obj: object) -> int:
            if id(obj) in seen or (isinstance(obj, int) and -5 <= obj <= 256 and type(obj) is int):
                return 0
            seen.add(id(obj))
            return python_bytes(obj)

        def key_bytes(key: object) -> int:
            if isinstance(key, tuple):
                return once(key) + once(key[0]) + once(key[1])
            return once(key)

        schedule = self._schedule
        # Fixed part: the index object, its attributes' holders, SortedDict's per-instance bound methods.
        for holder in (self, self._lock, schedule, schedule._list):
            parts["schedule"] += once(holder)
            attributes = getattr(holder, "__dict__", None)
            if attributes is not None:
                parts["schedule"] += once(attributes)
                parts["schedule"] += sum(once(v) for v in attributes.values() if inspect.ismethod(v))
        parts["schedule"] += _sorted_list_bytes(schedule._list)
        for bucket, slots in schedule.items():
            parts["schedule"] += once(bucket)
            parts["buckets"] += python_bytes(slots)
            for key, entries in slots.items():
                parts["buckets"] += key_bytes(key)
                parts["bitmap_objects"] += once(entries)
                if isinstance(entries, BitMap):
                    roaring += bitmap_heap_bytes(entries)
                elif not isinstance(entries, _Run):
                    raise TypeError(f"unexpected entries type {type(entries).__name__}")
        parts["ledgers"] += python_bytes(self._ledgers)
        for key, record in self._ledgers.items():
            parts["ledgers"] += key_bytes(key) + once(record)
            if isinstance(record, _Ledger):
                parts["ledgers"] += python_bytes(record.buckets) + python_bytes(record.entries)
                parts["ledgers"] += once(record.lo) + once(record.hi)
        parts["batch_members"] += python_bytes(self._members)
        for slot, members in self._members.items():
            parts["batch_members"] += once(slot) + once(members) + once(members.bitmap)
            roaring += bitmap64_heap_bytes(members.bitmap)
            if members.wide:
                parts["batch_members"] += python_bytes(members.wide)
                parts["batch_members"] += sum(once(e) + once(m) for e, m in members.wide.items())
        parts["schedule"] += python_bytes(self._cold)
        return MemoryUsage(sum(parts.values()), roaring, len(self), parts)

    # -- internals: the add path ------------------------------------------------------------------

    def _forget_slot(self) -> None:
        """Drop the add path's cache of the last (bucket, ledger) slot; its bucket becomes cold."""
        left: int | None = getattr(self, "_slot_bucket", None)
        if left is not None and left in self._schedule:
            self._cold[left] = None
        self._slot_bucket: int | None = None
        self._slot_ledger: int | None = None
        self._slot_topic: str | None = None
        self._slot_key: LedgerKey = 0
        self._slot_entries: BitMap = _EMPTY
        self._slot_record: _Ledger | None = None
        self._slot_is_last = False  # the slot is its ledger's latest bucket
        self._slot_members: _Members | None = None

    def _select(self, bucket: int, ledger_id: int, topic: str) -> BitMap:
        """Find or create the slot (bucket, ledger) and make it the cached one. O(log B) if new."""
        bucket = _check_due(bucket, "due_ms")
        ledger_id = _ledger(ledger_id)
        if not isinstance(topic, str):
            raise TypeError(f"topic must be a str, got {type(topic).__name__}")
        if self._slot_bucket is not None and self._slot_bucket != bucket:
            self._cold[self._slot_bucket] = None
        key = _key(ledger_id, topic)
        slots: dict[LedgerKey, Entries] | None = self._schedule.get(bucket)
        if slots is None:
            slots = self._schedule[bucket] = {}
        entries = slots.get(key)
        if entries is None:
            entries = slots[key] = BitMap()
            self._link(key, bucket, entries)
        elif isinstance(entries, _Run):
            entries = entries.to_bitmap()  # thaw: ids arrive again
            self._replace(bucket, key, entries)
        record = self._ledgers[key]
        self._slot_bucket = bucket
        self._slot_ledger = ledger_id
        self._slot_topic = topic
        self._slot_key = key
        self._slot_entries = entries
        self._slot_record = record if isinstance(record, _Ledger) else None
        self._slot_is_last = self._slot_record is not None and self._slot_record.buckets[-1] == bucket
        self._slot_members = self._members.get((bucket, key)) if self._members else None
        return entries

    def _reject(self, error: Exception) -> NoReturn:
        """Raise ``error`` for bad input, first dropping the cached slot if it is a new, empty one."""
        if self._slot_bucket is not None and not self._slot_entries:
            self._drop_slot(self._slot_bucket, self._slot_key)
        self._forget_slot()
        raise error

    def _add_checked(self, entry_id: int, batch_index: int) -> None:
        """The general add into the cached slot: dedupe against every bucket of the ledger."""
        bucket, key = self._slot_bucket, self._slot_key
        assert bucket is not None
        if not 0 <= entry_id <= MAX_ENTRY_ID:
            self._reject(_bad_entry(entry_id))
        batch_index = self._checked_batch_index(batch_index)
        for other, other_entries in list(self._holding(key, entry_id)):
            masks = self._members.get((other, key)) if self._members else None
            mask = masks.get(entry_id) if masks else None
            if mask is None:  # the whole entry is pending at `other`
                if other <= bucket:
                    self._drop_if_empty()
                    return  # covers this id, no later than asked
                if batch_index >= 0:
                    continue  # this message alone becomes due earlier
            elif batch_index >= 0:
                if not mask >> batch_index & 1:
                    continue
                if other <= bucket:
                    self._drop_if_empty()
                    return
                mask &= ~(1 << batch_index)
                if mask:
                    assert masks is not None
                    masks.discard_index(entry_id, batch_index)
                    continue
            elif other < bucket:
                continue  # some messages become due earlier than the whole entry; keep them
            # The pending id at `other` is later than (or covered by) this one: move it here.
            self._discard(other, key, other_entries, entry_id)
        # _discard may have emptied and dropped the cached slot; re-select it.
        topic, ledger_id = _split_key(key)
        self._select(bucket, ledger_id, topic)
        self._insert(entry_id, batch_index)

    def _checked_batch_index(self, batch_index: Any) -> int:
        if type(batch_index) is not int:
            if isinstance(batch_index, bool) or not isinstance(batch_index, np.integer):
                self._reject(TypeError(f"batch_index must be an int, got {type(batch_index).__name__}"))
            batch_index = int(batch_index)
        if not -1 <= batch_index <= MAX_BATCH_INDEX:
            self._reject(ValueError(f"batch_index must be in -1..{MAX_BATCH_INDEX}, got {batch_index}"))
        return int(batch_index)

    def _insert(self, entry_id: int, batch_index: int) -> None:
        """Put the id into the cached slot, no other bucket of the ledger holding it. O(1)."""
        bucket, key = self._slot_bucket, self._slot_key
        assert bucket is not None
        if not 0 <= entry_id <= MAX_ENTRY_ID:
            self._reject(_bad_entry(entry_id))
        entries = self._slot_entries
        if entry_id in entries:
            masks = self._slot_members
            if masks is None or entry_id not in masks:
                return  # whole entry already here
            if batch_index < 0:
                del masks[entry_id]  # the whole entry now covers its messages
                if not masks:
                    del self._members[(bucket, key)]
                    self._slot_members = None
            else:
                masks.add_index(entry_id, batch_index)
            return
        entries.add(entry_id)
        self._count += 1
        record = self._slot_record
        if record is not None:
            record.lo = min(record.lo, entry_id)
            record.hi = max(record.hi, entry_id)
            record.mins = None
        if batch_index >= 0:
            masks = self._slot_members
            if masks is None:
                masks = self._members[(bucket, key)] = self._slot_members = _Members()
            masks.add_index(entry_id, batch_index)

    def _add_run(self, bucket: int, ledger_id: int, topic: str, run: npt.NDArray[np.uint32]) -> None:
        """Add sorted unique entry ids of one (bucket, ledger) run; ids maybe pending elsewhere go the
        per-id way."""
        entries = self._select(bucket, ledger_id, topic)
        key, record = self._slot_key, self._slot_record
        lo, hi = int(run[0]), int(run[-1])
        fresh: npt.NDArray[np.uint32] | BitMap = run
        repeated: BitMap | None = None
        if record is not None and not (lo > record.hi or hi < record.lo):
            incoming = BitMap(run)
            for other, other_entries in zip(record.buckets, record.entries, strict=True):
                if other != bucket:
                    incoming -= _as_bitmap(other_entries)
            if len(incoming) != len(run):
                repeated = BitMap(run) - incoming
                fresh = incoming
        if len(fresh):
            before = len(entries)
            entries.update(fresh)
            self._count += len(entries) - before
            masks = self._slot_members
            if masks:
                for entry_id in fresh if isinstance(fresh, BitMap) else fresh.tolist():
                    masks.pop(entry_id, None)  # the whole entry covers its messages
                if not masks:
                    del self._members[(bucket, key)]
                    self._slot_members = None
            if record is not None:
                record.lo = min(record.lo, lo)
                record.hi = max(record.hi, hi)
                record.mins = None
        for entry_id in repeated or ():
            self._select(bucket, ledger_id, topic)
            self._add_checked(entry_id, -1)
        self._select(bucket, ledger_id, topic)
        self._drop_if_empty()

    # -- internals: structure maintenance ---------------------------------------------------------

    def _drop_if_empty(self) -> None:
        """Drop the cached slot if nothing went into it (an add that turned out to be a no-op)."""
        if self._slot_bucket is not None and not self._slot_entries:
            self._drop_slot(self._slot_bucket, self._slot_key)
            self._forget_slot()

    def _link(self, key: LedgerKey, bucket: int, entries: Entries) -> None:
        """Register a new slot (bucket, key) in the ledger's bookkeeping."""
        record = self._ledgers.get(key)
        if record is None:
            self._ledgers[key] = bucket
        elif isinstance(record, _Ledger):
            i = bisect_left(record.buckets, bucket)
            record.buckets.insert(i, bucket)
            record.entries.insert(i, entries)
            record.mins = None
        else:
            first = self._schedule[record][key]
            pairs = sorted([(record, first), (bucket, entries)], key=lambda p: p[0])
            self._ledgers[key] = _Ledger([p[0] for p in pairs], [p[1] for p in pairs])

    def _unlink(self, key: LedgerKey, bucket: int) -> None:
        """Forget slot (bucket, key) in the ledger's bookkeeping (the schedule is the caller's job)."""
        record = self._ledgers[key]
        if not isinstance(record, _Ledger):
            del self._ledgers[key]
            return
        i = 0 if record.buckets[0] == bucket else record.position(bucket)
        del record.buckets[i]
        del record.entries[i]
        record.stale = True  # lo/hi still bound the rest, loosely
        if i == 0 and record.mins:
            del record.mins[0]  # dropping the first of ordered ranges keeps them ordered
        else:
            record.mins = None
        if len(record.buckets) == 1:
            self._ledgers[key] = record.buckets[0]

    def _unlink_first(self, key: LedgerKey, count: int) -> None:
        """Forget the ledger's ``count`` earliest slots in one go: O(remaining buckets of the ledger)."""
        record = self._ledgers[key]
        if not isinstance(record, _Ledger) or count >= len(record.buckets):
            del self._ledgers[key]
            return
        del record.buckets[:count]
        del record.entries[:count]
        record.stale = True  # lo/hi still bound the rest, loosely
        if record.mins:
            del record.mins[:count]  # dropping the first of ordered ranges keeps them ordered
        else:
            record.mins = None
        if len(record.buckets) == 1:
            self._ledgers[key] = record.buckets[0]

    def _replace(self, bucket: int, key: LedgerKey, entries: Entries) -> None:
        """Swap the stored object of slot (bucket, key) (thaw or compaction)."""
        self._schedule[bucket][key] = entries
        record = self._ledgers[key]
        if isinstance(record, _Ledger):
            record.entries[record.position(bucket)] = entries

    def _drop_slot(self, bucket: int, key: LedgerKey) -> None:
        slots = self._schedule[bucket]
        del slots[key]
        if not slots:
            del self._schedule[bucket]
            self._cold.pop(bucket, None)
        self._members.pop((bucket, key), None)
        self._unlink(key, bucket)

    def _discard(self, bucket: int, key: LedgerKey, entries: Entries, entry_id: int) -> None:
        """Remove every pending part of ``entry_id`` from slot (bucket, key)."""
        if self._members:
            masks = self._members.get((bucket, key))
            if masks is not None:
                masks.pop(entry_id, None)
                if not masks:
                    del self._members[(bucket, key)]
        self._count -= 1
        if len(entries) == 1:
            self._drop_slot(bucket, key)
            return
        if isinstance(entries, _Run):
            bitmap = entries.to_bitmap()
            self._replace(bucket, key, bitmap)
        else:
            bitmap = entries
        bitmap.discard(entry_id)
        record = self._ledgers[key]
        if isinstance(record, _Ledger):
            record.mins = None  # the slot's smallest entry may have changed

    def _holding(self, key: LedgerKey, entry_id: int) -> Iterator[tuple[int, Entries]]:
        """(bucket, entries) of every slot of this ledger that holds ``entry_id``."""
        record = self._ledgers.get(key)
        if record is None:
            return
        if not isinstance(record, _Ledger):
            entries = self._schedule[record][key]
            if entry_id in entries:
                yield record, entries
            return
        if entry_id > record.hi or entry_id < record.lo:
            return
        if record.stale:
            record.refresh_bounds()
            if entry_id > record.hi or entry_id < record.lo:
                return
        for bucket, entries in record.candidates(entry_id):
            if entry_id in entries:
                yield bucket, entries


_EMPTY = BitMap()


def _key(ledger_id: int, topic: str) -> LedgerKey:
    return (topic, ledger_id) if topic else ledger_id


def _split_key(key: LedgerKey) -> tuple[str, int]:
    return key if isinstance(key, tuple) else ("", key)


def _check_due(value: Any, name: str = "due_ms") -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int (milliseconds), got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return int(value)


def _entry(entry_id: Any) -> int:
    """Accept numpy integers as entry ids; reject floats and bools (a BitMap would truncate them)."""
    if isinstance(entry_id, bool) or not isinstance(entry_id, int | np.integer):
        raise _bad_entry(entry_id)
    return int(entry_id)


def _ledger(ledger_id: Any) -> int:
    if isinstance(ledger_id, bool) or not isinstance(ledger_id, int | np.integer):
        raise TypeError(f"ledger_id must be an int, got {type(ledger_id).__name__}")
    if ledger_id < 0:
        raise ValueError(f"ledger_id must be >= 0, got {ledger_id}")
    return int(ledger_id)


def _bad_entry(entry_id: object) -> Exception:
    if isinstance(entry_id, bool) or not isinstance(entry_id, int):
        return TypeError(f"entry_id must be an int, got {type(entry_id).__name__}")
    return ValueError(f"entry_id must be in 0..{MAX_ENTRY_ID}, got {entry_id}")


def _compacted(bitmap: BitMap) -> Entries:
    if not bitmap:
        return bitmap
    lo, hi = bitmap.min(), bitmap.max()
    if hi - lo + 1 == len(bitmap):
        return _Run.of(lo, hi)
    bitmap.run_optimize()
    bitmap.shrink_to_fit()
    return bitmap


def _as_bitmap(entries: Entries) -> BitMap:
    return entries.to_bitmap() if isinstance(entries, _Run) else entries


def _as_array(entries: Entries) -> npt.NDArray[np.uint32]:
    if isinstance(entries, _Run):
        return np.arange(entries.lo, entries.hi + 1, dtype=np.uint32)
    return np.frombuffer(entries.to_array(), dtype=np.uint32)


def _due_ids(key: LedgerKey, parts: list[tuple[Entries, _Members | None]]) -> DueIds:
    """Merge one ledger's due slots into a DueIds (whole entries win over batch masks)."""
    topic, ledger_id = _split_key(key)
    if len(parts) == 1:
        entry_ids = _as_array(parts[0][0])
    else:
        union = BitMap()
        for entries, _ in parts:
            if isinstance(entries, _Run):
                union.add_range(entries.lo, entries.hi + 1)
            else:
                union |= entries
        entry_ids = np.frombuffer(union.to_array(), dtype=np.uint32)
    if all(masks is None for _, masks in parts):
        return DueIds(topic, ledger_id, entry_ids)
    whole: set[int] = set()
    merged_masks: dict[int, int] = {}
    for entries, masks in parts:
        if masks is None:
            whole.update(_as_array(entries).tolist())
            continue
        whole.update(e for e in _as_array(entries).tolist() if e not in masks)
        for entry_id, mask in masks.items():
            merged_masks[entry_id] = merged_masks.get(entry_id, 0) | mask
    partial = {
        entry_id: tuple(batch_indexes(mask))
        for entry_id, mask in sorted(merged_masks.items())
        if entry_id not in whole
    }
    return DueIds(topic, ledger_id, entry_ids, partial)


def batch_mask(indexes: Iterable[int]) -> int:
    """The bitmask of batch ``indexes`` (bit i set for index i). O(indexes)."""
    mask = 0
    for index in indexes:
        mask |= 1 << index
    return mask


def batch_indexes(mask: int) -> Iterator[int]:
    """The batch indexes set in ``mask`` (>= 0), lowest first. O(highest index)."""
    index = 0
    while mask:
        if mask & 1:
            yield index
        mask >>= 1
        index += 1


def as_id_arrays(
    due_ms: Any, ledger_ids: Any, entry_ids: Any, batch_indexes: Any = None
) -> tuple[
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.uint32],
    npt.NDArray[np.int64] | None,
]:
    """Validate and broadcast :meth:`TimeBucketIndex.add_many`'s inputs into typed arrays. O(n).

    Each input is a one-dimensional array-like of integers or a scalar; they are broadcast to one
    length and returned as ``(due_ms int64, ledger_ids int64, entry_ids uint32, batch_indexes int64 or
    None)``. Raises TypeError for non-integer input and ValueError for unequal lengths or values out of
    range (negative times or ledgers, entry ids above :data:`MAX_ENTRY_ID`, batch indexes below -1,
    ledger ids of 2**63 or more). Any tracker with an ``add_many`` of the same signature can use it.
    """
    named = {"due_ms": due_ms, "ledger_ids": ledger_ids, "entry_ids": entry_ids}
    if batch_indexes is not None:
        named["batch_indexes"] = batch_indexes
    arrays = {}
    for name, value in named.items():
        array = np.asarray(value)
        if array.ndim > 1:
            raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}")
        if array.size and array.dtype.kind not in "iu":
            raise TypeError(f"{name} must hold integers, got dtype {array.dtype}")
        arrays[name] = array
    try:
        shaped = np.broadcast_arrays(*arrays.values())
    except ValueError:
        sizes = ", ".join(f"{name}={a.size}" for name, a in arrays.items())
        raise ValueError(f"add_many inputs must have equal lengths (or be scalars): {sizes}") from None
    checked = dict(zip(arrays, shaped, strict=True))
    limits = {
        "due_ms": (0, None),
        "ledger_ids": (0, None),
        "entry_ids": (0, MAX_ENTRY_ID),
        "batch_indexes": (-1, None),
    }
    for name, array in checked.items():
        if array.size == 0:
            continue
        low, high = limits[name]
        if array.min() < low or (high is not None and array.max() > high):
            bound = f"{low}..{high}" if high is not None else f">= {low}"
            raise ValueError(f"{name} values must be {bound}")
    if (
        checked["ledger_ids"].size
        and checked["ledger_ids"].dtype == np.uint64
        and (checked["ledger_ids"].max() > np.iinfo(np.int64).max)
    ):
        raise ValueError("ledger_ids values must be < 2**63")
    batches = checked.get("batch_indexes")
    return (
        checked["due_ms"].astype(np.int64, copy=False),
        checked["ledger_ids"].astype(np.int64, copy=False),
        checked["entry_ids"].astype(np.uint32, copy=False),
        None if batches is None else batches.astype(np.int64, copy=False),
    )


#: pop_due takes up to this many due buckets one by one, more with one slice deletion.
_POP_ONE_BY_ONE = 8

#: Inputs with more runs than n / this are sorted first, so per-run Python work stays amortized.
_SORT_WHEN_RUNS_EXCEED = 16


def _runs(
    buckets: npt.NDArray[np.int64], ledgers: npt.NDArray[np.int64], entries: npt.NDArray[np.uint32]
) -> Iterator[tuple[int, int, npt.NDArray[np.uint32]]]:
    """Split ids into runs of equal (bucket, ledger) with sorted unique entry ids, in input order.

    Runs are found in the given order when it is already grouped (the normal, time-ordered case), and
    after a stable lexsort by (bucket, ledger, entry) otherwise.
    """
    n = len(entries)
    starts = _run_starts(buckets, ledgers)
    if len(starts) * _SORT_WHEN_RUNS_EXCEED > n and len(starts) > 1:
        order = np.lexsort((entries, ledgers, buckets))
        buckets, ledgers, entries = buckets[order], ledgers[order], entries[order]
        starts = _run_starts(buckets, ledgers)
    ends = np.append(starts[1:], n)
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        run = entries[start:end]
        if end - start > 1 and not bool((run[1:] > run[:-1]).all()):
            run = np.unique(run)
        yield int(buckets[start]), int(ledgers[start]), run


def _run_starts(buckets: npt.NDArray[np.int64], ledgers: npt.NDArray[np.int64]) -> npt.NDArray[np.intp]:
    change = (buckets[1:] != buckets[:-1]) | (ledgers[1:] != ledgers[:-1])
    return np.concatenate(([0], np.flatnonzero(change) + 1))


def _sorted_list_bytes(inner: Any) -> int:
    """A SortedList's storage: its sublists, maxes and positional index."""
    total = python_bytes(inner._lists) + python_bytes(inner._maxes)
    total += sum(python_bytes(sub) for sub in inner._lists)
    total += python_bytes(inner._index)
    return total
