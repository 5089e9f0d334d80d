"""The TimeBucket nack index: PIP-393's *bucket time → ledger → Roaring bitmap of entry ids*.

A nack's due time (ms) is trimmed to a multiple of ``2**precision_bits`` (the *bucket*). All ids of one
ledger that fall into one bucket (a *slot*) share one bitmap, so memory grows with buckets × ledgers, not
with ids: at 8 nacks/ms and 1-s buckets an id costs about one *bit*. Finding what is due touches only the
due buckets (their times sit in sorted arrays, one per chunk of 4,096 bucket times).

Unlike the Java structure, a slot does not always get a bitmap of its own: when many topics (ledgers)
share a bucket, each slot holds a few ids, and a bitmap, a map entry and a key per slot cost ~500 bytes —
60 bytes per id with 100 topics over 60 s. Small slots therefore share one 64-bit Roaring bitmap per
bucket, the low bits of the ledger's number stored *below* the entry id so that the ledgers pending share
Roaring containers (a few bytes per id). How many bits follows how many ledgers have ids pending — none
for one ledger, whose slot then keeps a container per 65,536 entry ids however its ids are spread; 7 for
100 — and the shared bitmaps are re-encoded when that number doubles or falls to a quarter (rare,
see ``TimeBucketIndex._relayout``). A slot that grows to :data:`PROMOTE_AT` ids moves to a bitmap of its
own, where dense, in-order ids become run or bitset containers as before.

Beyond the Java tracker this index

* keeps each id once (*earliest due wins*): nacking a pending id again never delays it and never
  schedules a second redelivery;
* tracks batch indexes only for batched ids, so that nacks of two messages of one batch with different
  due times stay apart (``pop_due`` of the first leaves the second pending) while non-batched ids cost
  nothing extra;
* answers :meth:`TimeBucketIndex.due_of` — *is this id pending, and until when?* — without a per-id
  reverse map (see the complexity notes there);
* compacts buckets that stopped receiving ids (:meth:`TimeBucketIndex.compact`): a slot that holds one
  run of consecutive ids becomes a 36-byte packed int, bitmaps get ``run_optimize`` + ``shrink_to_fit``.

Thread safety: every public method takes one internal lock, so the index may be shared by user threads
(nacks) and a timer thread (``pop_due``, ``compact``). ``add_many`` and ``pop_due`` hold the lock for the
whole call.
"""

from __future__ import annotations

import heapq
import inspect
import sys
import threading
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Mapping
from itertools import chain, islice, pairwise
from typing import Any, Literal, NamedTuple, NoReturn, Protocol, TypeAlias, TypeVar

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap, BitMap64

from pulsar_nack.ledgers import LedgerRegistry
from pulsar_nack.memory import (
    MemoryUsage,
    bitmap_heap_bytes,
    python_bytes,
    release_free_heap,
    shared_bitmap64_heap_bytes,
)
from pulsar_nack.packed import MAX_ORDINALS, MAX_PACKED_INDEX, PackedSlot, PackedStore

__all__ = [
    "MAX_BATCH_INDEX",
    "MAX_DUE_MS",
    "MAX_ENTRY_ID",
    "MAX_LEDGERS",
    "MAX_PRECISION_BITS",
    "MEMBER_BITS",
    "PROMOTE_AT",
    "STAGE_UP_TO",
    "DueIds",
    "NackIndex",
    "Rounding",
    "TimeBucketIndex",
    "as_id_arrays",
    "batch_indexes",
    "batch_mask",
    "merge_due",
    "pop_by_bucket",
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


class NackIndex(Protocol):
    """What the tracker, its arrival filter and the consumer ask of a nack index: the calls
    :class:`TimeBucketIndex` answers, and :class:`~pulsar_nack.snapshot.segments.SegmentStore` answers
    over its mutable index, loaded index and segment files (with its own bounds: see there).

    Semantics and complexity are :class:`TimeBucketIndex`'s; ``tests/test_index_model.py`` runs both
    implementations against one reference model.
    """

    def add(
        self,
        due_ms: int,
        ledger_id: int,
        entry_id: int,
        batch_index: int = -1,
        topic: str = "",
        fresh: bool = False,
    ) -> int:
        """Schedule one id (earliest due wins); returns the bucket time it is due at."""
        ...

    def remove(self, ledger_id: int, entry_id: int, batch_index: int = -1, topic: str = "") -> bool:
        """Forget a pending id; True if something was removed."""
        ...

    def pop_due(self, now_ms: int) -> list[DueIds]:
        """Remove and return every id whose bucket time is <= ``now_ms``."""

    def pop_due_by_bucket(self, now_ms: int) -> list[tuple[int, DueIds]]:
        """As :meth:`pop_due` of each due bucket in turn: (bucket time, one ledger's ids due in it), in
        bucket order (a store that holds due ids back — a re-dispatch — labels those it releases with a
        time no earlier than their bucket, up to ``now_ms``: see :func:`pop_by_bucket`)."""
        ...

    def next_due_ms(self) -> int | None:
        """The earliest bucket time pending, or None."""
        ...

    def due_of(self, ledger_id: int, entry_id: int, batch_index: int = -1, topic: str = "") -> int | None:
        """The bucket time at which this id will be popped, or None if it is not pending."""
        ...

    def pending_mask(self, ledger_id: int, entry_id: int, topic: str = "") -> int:
        """The entry's batch indexes pending, as a bitmask; -1 if the whole entry is pending, 0 if none."""
        ...

    def compact(self) -> int:
        """Compact cold buckets (never needed for correctness); returns how many."""
        ...

    def clear(self) -> None:
        """Forget everything."""
        ...

    @property
    def upkeep_interval_ms(self) -> int | None:
        """How often :meth:`upkeep` wants to run while it has work (None: never)."""
        ...

    def upkeep(self, now_ms: int) -> bool:
        """Periodic work off the nack path (a segment store's seal, load and merge); True while there is
        more to come (pending ids, or files on storage)."""
        ...

    def close(self, now_ms: int) -> None:
        """The consumer is closing: free the memory (a segment store first seals what is pending, so
        that its snapshot survives the consumer)."""
        ...

    def memory_usage(self) -> MemoryUsage:
        """The bytes the index holds."""
        ...

    def __len__(self) -> int:
        """Pending ids."""
        ...

    @property
    def bucket_count(self) -> int:
        """Non-empty buckets (in memory)."""
        ...

    @property
    def added(self) -> int:
        """Ids accepted by ``add`` so far, repeats included."""
        ...


#: The snapshot format stores a batch member as ``entry_id << MEMBER_BITS | batch_index``.
MEMBER_BITS = 10
MAX_BATCH_INDEX = 2**31 - 1

#: A batch member's key in ``TimeBucketIndex._members``: ``(bucket << 32 | entry id) << _SERIAL_BITS |
#: ledger serial`` (see ``_Ledger.serial``).
_SERIAL_BITS = 40
_SERIAL_MASK = (1 << _SERIAL_BITS) - 1
#: A slot with a bitmap of its own (dense: ``PROMOTE_AT`` ids or more) keeps the members of entries below
#: 2**22 with batch indexes below 2**10 as ``entry_id << 10 | batch_index`` (``TimeBucketIndex._dense``,
#: :class:`_NarrowMembers`): a sorted array, 4 bytes a member, or a 32-bit Roaring bitmap where that is
#: smaller. The bitmap alone cost ~70 bytes a member where nacks are sparse (1 % of batches of 10 nacked,
#: delays spread over 60 s: a member or two in each container, a container spanning 64 entries), 76 B a
#: pending nack in all at such a grid point.
_NARROW_INDEXES = 1 << MEMBER_BITS
_NARROW_ENTRIES = 1 << (32 - MEMBER_BITS)
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
        return (self & MAX_ENTRY_ID) - (self >> 32) + 1

    def __bool__(self) -> bool:
        return True  # a run is never empty, though the run 0..0 packs to the int 0

    def to_bitmap(self) -> BitMap:
        bitmap = BitMap()
        bitmap.add_range(self.lo, self.hi + 1)
        return bitmap


#: What a ledger's own bitmap slot stores: a live bitmap, or a compacted run.
Entries: TypeAlias = "BitMap | _Run"

# -- the packed layout ---------------------------------------------------------------------------------
# Small slots of one bucket share one 64-bit Roaring bitmap. A ledger gets an *ordinal* (reused once the
# ledger has nothing pending) and an id is stored as a *code*
# ``ordinal >> b << (32 + b) | entry_id << b | ordinal & (2**b - 1)``: the low ``b`` bits of the ordinal
# sit *below* the entry id, so that 2**b ledgers share each Roaring container (65,536 codes: 2**(16 - b)
# entry ids of 2**b ledgers). That is what makes many small slots cheap — 100 topics with ~8 ids per
# (bucket, ledger) slot share a few containers per bucket, ~2 B per id, where a container per slot cost
# ~100 B (12 B per id). But the more ledgers share a container, the fewer entry ids it spans: with b = 8,
# one ledger nacked with random delays had every 256 of its entry ids in a container of their own (191 B
# per id). So ``b`` follows the number of ledgers: the fewest bits that number the ordinals handed out
# (0 for one ledger, 7 for 100; at most _MAX_LOW_BITS, the rest of the ordinal goes above the entry id).
# Changing ``b`` re-encodes every shared bitmap (O(ids in shared bitmaps)); see
# TimeBucketIndex._relayout for when that happens and why it stays rare.
_MAX_LOW_BITS = 8
MAX_LEDGERS: int = 1 << 32  # ledgers with ids pending at one time (ordinals are 32 bits)


class _Layout:
    """The code layout for ``bits`` = b low ordinal bits (see above); numpy forms of its constants."""

    __slots__ = ("bits", "entry_mask", "low", "shift", "u_bits", "u_entry_mask", "u_low", "u_shift")

    def __init__(self, bits: int) -> None:
        self.bits = bits
        self.low = (1 << bits) - 1
        self.shift = 32 + bits
        self.entry_mask = (1 << self.shift) - 1  # entry id and low ordinal bits
        self.u_bits, self.u_low = np.uint64(bits), np.uint64(self.low)
        self.u_shift, self.u_entry_mask = np.uint64(self.shift), np.uint64(self.entry_mask)

    def base(self, ordinal: int) -> int:
        """The part of a code that names the ledger (entry id bits zero). O(1)."""
        return (ordinal >> self.bits) << self.shift | ordinal & self.low

    def ordinal(self, base: int) -> int:
        """The ordinal of a ledger's ``base``. O(1)."""
        return (base >> self.shift) << self.bits | base & self.low

    def decode(self, codes: npt.NDArray[np.uint64]) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint32]]:
        """(ordinals, entry ids) of codes. O(n) numpy."""
        ordinals: npt.NDArray[np.uint64] = (codes >> self.u_shift) << self.u_bits | codes & self.u_low
        return ordinals, self.entries(codes)

    def entries(self, codes: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint32]:
        """The entry ids of codes. O(n) numpy."""
        return ((codes & self.u_entry_mask) >> self.u_bits).astype(np.uint32)

    def encode(self, ordinals: npt.NDArray[np.uint64], entry_ids: npt.NDArray[np.uint32]) -> array[int]:
        """Codes of (ordinal, entry id) pairs as an ``array('Q')``. O(n) numpy."""
        values = (
            (ordinals >> self.u_bits) << self.u_shift
            | entry_ids.astype(np.uint64) << self.u_bits
            | ordinals & self.u_low
        )
        return array("Q", values.tobytes())

    def codes(self, base: int, entry_ids: npt.NDArray[np.uint32]) -> array[int]:
        """Codes of one ledger's entry ids, as an ``array('Q')`` (pyroaring reads it as a buffer)."""
        values = entry_ids.astype(np.uint64) << self.u_bits | np.uint64(base)
        return array("Q", values.tobytes())

    def mine(self, codes: npt.NDArray[np.uint64], base: int) -> npt.NDArray[np.uint64]:
        """The codes of the ledger with this ``base``, in entry order. O(n) numpy."""
        mine: npt.NDArray[np.uint64] = codes[
            (codes & ~self.u_entry_mask | codes & self.u_low) == np.uint64(base)
        ]
        return mine


#: A shared bitmap of at most this many ids is compacted in plain Python (numpy's per-call cost dominates).
_SMALL_SHARED = 32

#: A packed slot that reaches this many ids moves to a bitmap of its own: there it can become a run or
#: bitset container (dense, in-order nacks) and its lookups skip the shared bitmap. Sizes are kept in a
#: byte per slot, so this stays below _OWN.
PROMOTE_AT = 128
_OWN = 255  # the size byte of a slot that has its own bitmap
#: The member masks of batches nacked whole (``2**size - 1``), one int object each for every entry that has
#: one: an int past 256 is an object of its own (28 B for a batch of 10), and every message of a batch
#: nacked keeps a mask an entry in ``_HotIndex._members`` (2.8 B a pending nack at batches of 10).
_WHOLE_BATCHES: dict[int, int] = {}

#: :meth:`TimeBucketIndex.compact` gives a slot of the shared bitmap holding one run of this many
#: consecutive ids a ``_Run`` of its own (36 bytes plus its dict entry, against 2 bytes per id).
RUN_AT = 16

#: compact() gives the C heap back to the system (glibc ``malloc_trim``) once the bitmaps it compacted
#: have shrunk by this many bytes in all (serialized sizes, see ``_Bucket.compact_own``).
_RELEASE_AFTER = 1 << 20

#: compact() gives a ledger with at most this many slot positions exact-size arrays (and no sizes if all
#: its slots have bitmaps of their own): O(this) per ledger and compacted bucket.
_TRIM_SLOTS = 8

#: A ledger's slots are checked for ordered entry ranges (lookups then bisect) if at most this many of
#: them are in shared bitmaps, whose extremes cost O(P) to find.
_ORDER_SHARED = 4

#: What ``_HotIndex._evict`` counts a row of the packed tier (8 bytes of code, a few of membership
#: bitmap and bucket offsets: ~8.5 measured; counted high, as the live tier's shared bitmaps are weighed
#: before compaction shrinks them — at 11, 100 topics, all nacked, k = 12 packed half its ids and grew
#: from 5.5 to 7.8 B an id), a compacted bucket's fixed part in the live tier (object, map entry, key,
#: time), a slot's place in its ledger's arrays and record, and a batch member's dict entry (key and mask
#: ints, the dict's table: 131 B measured at 1,000 topics, batches of 100, 10 % nacked).
_PACKED_ROW_BYTES = 15
_BUCKET_BYTES = 300
_SLOT_BYTES = 24
_MEMBER_BYTES = 130

#: compact() copies the bucket and ledger dicts when their tables hold this many bytes per entry (a
#: right-sized table is ~40 B an entry; a dict shrinks on copy, never on delete).
_OVERSIZED = 160

#: Bucket times are kept in signed 64-bit arrays (ceil rounding may add up to 2**30 - 1): a later due
#: time (~292 million years ahead) is filed as this one.
MAX_DUE_MS: int = 2**63 - 2**MAX_PRECISION_BITS

#: Fresh ids :meth:`TimeBucketIndex.add` appends to its staging log before the nack path files them in bulk
#: itself (the timer files them sooner: see ``TimeBucketIndex._unstage``): 16 bytes a row.
STAGE_UP_TO = 1 << 14
#: A staging log of fewer rows is filed one id at a time (numpy's per-call cost dominates below).
_BULK_FROM = 16
_NOT_STAGED = 1 << 63  # the earliest staged bucket when nothing is staged: later than any bucket
_MAX_I64 = (1 << 63) - 1
# The packed tier's row code, which the staging log uses too: ordinal << 42 | entry_id << 10 | slot.
_CODE_SLOT_BITS = 10
_CODE_ORDINAL_SHIFT = 42
_CODE_ENTRY_MASK = (1 << 32) - 1
_CODE_SLOT_MASK = (1 << _CODE_SLOT_BITS) - 1


def _u32(entry_ids: npt.NDArray[np.uint32]) -> array[int]:
    """An ``array('I')`` of entry ids: pyroaring builds from it ~10x faster than from a numpy array."""
    return array("I", np.ascontiguousarray(entry_ids, dtype=np.uint32).tobytes())


def _array_of(bitmap: BitMap | BitMap64, dtype: type[np.unsignedinteger[Any]]) -> Any:
    return np.frombuffer(bitmap.to_array(), dtype=dtype)


#: _Times keeps the bucket times of one chunk of 2**(k + _CHUNK_BITS) ms in one sorted array.
_CHUNK_BITS = 12


class _Times:
    """The pending bucket times, sorted: a heap of *chunk* numbers (``time >> (k + 12)``) and, per chunk,
    a sorted ``array('q')`` of its (at most 4,096) bucket times.

    Why not one heap of the times: the timer pops many buckets at a time (68 one-ms buckets per forward
    at k = 0), and a heap pop compares Python ints scattered over the heap — ~17 of them per pop with
    100,000 buckets, cold in the cache between two forwards (measured: ~5 us per bucket in the timer
    thread against ~1 us back to back). Here popping the due buckets is one bisect and one slice of a
    contiguous array per chunk; popping part of the first chunk only moves its ``head`` (deleting the
    prefix at every pop moved up to 32 KB, ~25 us with cold caches) until half the chunk is popped, when
    the prefix goes (moving no more than was popped: O(1) amortized a time); adding a time appends
    (in-order nacks) or inserts into one chunk's array (a memmove of at most 32 KB); removing one is the
    same. Chunks emptied
    by :meth:`discard` stay in the heap until they come first (``first``/``pop_until`` drop them).
    """

    __slots__ = ("_chunks", "_head", "_keys", "_shift")

    def __init__(self, precision_bits: int) -> None:
        self._shift = precision_bits + _CHUNK_BITS
        self._chunks: dict[int, array[int]] = {}
        self._keys: list[int] = []  # heap of the chunk numbers in _chunks
        self._head = 0  # positions of the first chunk (_keys[0]) already popped

    def add(self, time: int) -> None:
        """Add a bucket time not present. O(1) at the end of its chunk, else O(log + chunk) memmove."""
        chunk = time >> self._shift
        times = self._chunks.get(chunk)
        if times is None:
            if self._head and chunk < self._keys[0]:  # a new first chunk: the old one drops its head
                del self._chunks[self._keys[0]][: self._head]
                self._head = 0
            self._chunks[chunk] = array("q", (time,))
            heapq.heappush(self._keys, chunk)
        elif not times or times[-1] < time:  # (positions below the head may hold any popped time)
            times.append(time)
        else:
            times.insert(bisect_left(times, time, self._start(chunk)), time)

    def _start(self, chunk: int) -> int:
        """The first live position of a chunk's array."""
        return self._head if chunk == self._keys[0] else 0

    def discard(self, time: int) -> None:
        """Remove a bucket time (if present). O(log + chunk) memmove. A chunk other than the first that
        this empties leaves the dict (its number stays in the heap until it comes first: ``first`` and
        ``pop_until`` skip numbers without a chunk): compact() moving sparse buckets to the packed tier
        empties chunks all along the schedule, ~1 KB each (10 B a nack at k = 0, 1 h)."""
        chunk = time >> self._shift
        times = self._chunks.get(chunk)
        if times:
            start = self._start(chunk)
            i = bisect_left(times, time, start)
            if i < len(times) and times[i] == time:
                del times[i]
                if not times and chunk != self._keys[0]:
                    del self._chunks[chunk]
                elif len(times) * 32 + 64 < sys.getsizeof(times):
                    # an array keeps its allocation when items leave one by one: a chunk compact()
                    # emptied kept 4.4 KB for one time. A quarter used: copied (positions unchanged).
                    self._chunks[chunk] = array("q", times)

    def first(self) -> int | None:
        """The earliest time, or None. O(1), plus O(log chunks) per empty chunk dropped."""
        keys, chunks = self._keys, self._chunks
        while keys:
            times = chunks.get(keys[0])
            if times is not None and self._head < len(times):
                return times[self._head]
            chunks.pop(heapq.heappop(keys), None)
            self._head = 0
        return None

    def pop_until(self, now: int) -> list[int]:
        """Remove and return (ascending) every time <= ``now``. O(log B + popped) plus one memmove of at
        most a chunk."""
        keys, chunks = self._keys, self._chunks
        limit = now >> self._shift
        out: list[int] = []
        while keys and keys[0] <= limit:
            times, head = chunks.get(keys[0]), self._head
            if times is None:  # emptied by discard (see there)
                heapq.heappop(keys)
                self._head = 0
                continue
            end = bisect_right(times, now, head)
            if end == len(times):
                out.extend(times[head:].tolist() if head else times.tolist())
                del chunks[heapq.heappop(keys)]
                self._head = 0
                continue
            if end > head:
                out.extend(times[head:end].tolist())
                if 2 * end >= len(times):
                    # Most of the chunk popped: its prefix goes, else a consumer left with a nack or two
                    # pending kept up to 32 KB of popped times. Moves at most what was popped.
                    del times[:end]
                    end = 0
                self._head = end
            break
        return out

    def clear(self) -> None:
        self._chunks.clear()
        self._keys.clear()
        self._head = 0

    def memory_bytes(self) -> int:
        """Bytes of the structure (its arrays, dict and heap; the chunk numbers). O(chunks)."""
        total = python_bytes(self) + python_bytes(self._chunks) + python_bytes(self._keys)
        return total + sum(python_bytes(t) + python_bytes(c) for c, t in self._chunks.items())


#: A bucket keeps up to this many compacted runs (``_Run``) in two exact-size arrays; past it, in its dict.
_INLINE_RUNS = 32


class _NarrowMembers:
    """The narrow batch members of a slot with a bitmap of its own (``TimeBucketIndex._dense``): values
    ``entry_id << 10 | batch_index``, kept as a sorted ``array('I')`` (4 bytes a member), or — once a
    32-bit Roaring bitmap of them holds them in at most 3/4 of that — as that bitmap: where an entry's
    messages are nacked one by one (all of a batch of 100, at k = 12: ~1.2 B a member), where the array
    is the small one when nacks are sparse (a member or two a container: ~70 B a member as a bitmap).
    Weighed each time the array doubles from 64 values: O(1) amortized a member."""

    __slots__ = ("values",)

    def __init__(self) -> None:
        self.values: array[int] | BitMap = array("I")

    def __iter__(self) -> Iterator[int]:
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def add(self, value: int) -> None:
        """One member. O(log n) plus, in the array, a move of the values after it (members come in
        entry order mostly: appended)."""
        values = self.values
        if type(values) is BitMap:
            values.add(value)
            return
        assert isinstance(values, array)
        at = bisect_left(values, value)
        if at == len(values) or values[at] != value:
            values.insert(at, value)
            if len(values) >= _WEIGH_MEMBERS_FROM and not len(values) & (len(values) - 1):
                self._weigh()

    def update(self, added: npt.NDArray[np.uint32]) -> None:
        """Many members. O(n + added)."""
        values = self.values
        if type(values) is BitMap:
            values.update(_u32(added))
            return
        assert isinstance(values, array)
        before = len(values)
        self.values = _u32(np.union1d(np.frombuffer(values, np.uint32), added))
        # (weighed as the array's length passes a power of two: many small updates stay O(1) amortized)
        if len(self.values) >= _WEIGH_MEMBERS_FROM and len(self.values).bit_length() > before.bit_length():
            self._weigh()

    def mask(self, entry_id: int) -> int:
        """The batch indexes of ``entry_id`` as a bitmask (0: none). O(log n + its members)."""
        low, mask, values = entry_id << MEMBER_BITS, 0, self.values
        if type(values) is BitMap:
            following: Iterator[int] = values.iter_equal_or_larger(low)
        else:
            assert isinstance(values, array)
            following = islice(values, bisect_left(values, low), None)
        for value in following:
            if value >= low + _NARROW_INDEXES:
                break
            mask |= 1 << (value - low)
        return mask

    def replace(self, entry_id: int, indexes: Iterable[int]) -> None:
        """Make ``indexes`` the members of ``entry_id``. O(log n + members), plus a move in the array."""
        low, values = entry_id << MEMBER_BITS, self.values
        if type(values) is BitMap:
            values.remove_range(low, low + _NARROW_INDEXES)
            values.update([low | index for index in indexes])
            return
        assert isinstance(values, array)
        start = bisect_left(values, low)
        end = bisect_left(values, low + _NARROW_INDEXES, start)
        values[start:end] = array("I", [low | index for index in indexes])

    def memory_bytes(self) -> tuple[int, int]:
        """(Python bytes, CRoaring heap bytes): the object and the array with its buffer, or the bitmap's
        object and C heap. O(containers)."""
        values = self.values
        if type(values) is BitMap:
            return python_bytes(self) + python_bytes(values), bitmap_heap_bytes(values)
        return python_bytes(self) + python_bytes(values), 0

    def _weigh(self) -> None:
        values = self.values
        assert isinstance(values, array)
        bitmap = BitMap(values)
        bitmap.run_optimize()
        bitmap.shrink_to_fit()
        if 4 * (python_bytes(bitmap) + bitmap_heap_bytes(bitmap)) <= 3 * python_bytes(values):
            self.values = bitmap


#: An array of narrow members is weighed against a bitmap of them from this many on (see _NarrowMembers).
_WEIGH_MEMBERS_FROM = 64


class _Bucket:
    """One bucket: the slots that have their own entries, keyed by ledger key, and one shared ``packed``
    bitmap of the small slots (None when there are none).

    A mapping of ledger key → entries (the dict operations the index uses). Live bitmaps sit in a dict
    (``None`` until the first); compacted runs (``_Run``) sit in a tuple of ledger keys and an
    ``array('Q')`` of the runs, aligned — 8 bytes a run plus its key pointer, where a dict entry and a
    ``_Run`` object cost ~90 bytes and the dict's table ~300 per bucket (a bucket of six one-run ledgers
    at (x, k) = (8, 15): ~270 bytes in all, was ~660). A bucket with more than :data:`_INLINE_RUNS` runs
    keeps the rest in the dict, so that finding a run stays O(1) (a tuple search is O(runs), in C).
    Reading a run returns a new ``_Run``. Each operation O(1), plus O(runs) ≤ 32 to add or drop a run.
    """

    __slots__ = ("_keys", "_own", "_runs", "members", "packed")

    def __init__(self) -> None:
        self._own: dict[LedgerKey, Entries] | None = None
        self._keys: tuple[LedgerKey, ...] = ()
        self._runs: array[int] | None = None
        self.packed: BitMap64 | None = None
        self.members = 0  # TimeBucketIndex._members entries and _dense bitmaps of the bucket

    def own(self, key: LedgerKey) -> Entries:
        """The slot's entries (KeyError if the ledger has none of its own here). O(1)."""
        own = self._own
        if own is not None:
            entries = own.get(key)
            if entries is not None:
                return entries
        if self._keys:
            try:
                i = self._keys.index(key)
            except ValueError:
                raise KeyError(key) from None
            assert self._runs is not None
            return _Run(self._runs[i])
        raise KeyError(key)

    __getitem__ = own

    def holds(self, key: LedgerKey, entry_id: int) -> bool:
        """Whether the slot of ``key`` (which must exist) holds ``entry_id``. O(1)."""
        own = self._own
        entries = own.get(key) if own is not None else None
        if entries is not None:
            return entry_id in entries
        run = self._runs[self._keys.index(key)] if self._runs is not None else None
        assert run is not None, key
        return run >> 32 <= entry_id <= run & MAX_ENTRY_ID

    def __setitem__(self, key: LedgerKey, entries: Entries) -> None:
        own = self._own
        if own is not None and key in own:
            if type(entries) is not _Run:
                own[key] = entries
                return
            del own[key]
            if not own:
                self._own = None
        elif self._keys and key in self._keys:
            self._drop_run(key)
        if type(entries) is _Run and len(self._keys) < _INLINE_RUNS:
            self._keys += (key,)
            if self._runs is None:
                self._runs = array("Q", (entries,))
            else:
                self._runs.append(entries)
            return
        if self._own is None:
            self._own = {}
        self._own[key] = entries

    def __delitem__(self, key: LedgerKey) -> None:
        if self._own is not None and key in self._own:
            del self._own[key]
            if not self._own:
                self._own = None
        elif self._keys and key in self._keys:
            self._drop_run(key)
        else:
            raise KeyError(key)

    def _drop_run(self, key: LedgerKey) -> None:
        keys, runs = self._keys, self._runs
        assert runs is not None
        i = keys.index(key)
        self._keys = keys[:i] + keys[i + 1 :]
        if self._keys:
            self._runs = runs[:i] + runs[i + 1 :]  # exact size
        else:
            self._runs = None

    def compact_own(self) -> int:
        """Compact every live bitmap (``_compacted``): runs move to the arrays, which are rebuilt at
        their exact size. Returns how many bytes the bitmaps' serialized forms shrank by (a cheap measure
        of the heap compaction freed: 8 KiB a bitset container that became a run). O(bitmaps + their
        containers)."""
        own = self._own
        if own is None:
            return 0
        keys, runs = list(self._keys), self._runs.tolist() if self._runs is not None else []
        kept: dict[LedgerKey, Entries] = {}
        shrunk = 0
        for key, entries in own.items():
            if isinstance(entries, BitMap):
                before = sys.getsizeof(entries)  # pyroaring: the serialized size
                entries = _compacted(entries)  # same ids: the ledger's order still holds
                shrunk += before - (sys.getsizeof(entries) if isinstance(entries, BitMap) else 0)
            if type(entries) is _Run and len(keys) < _INLINE_RUNS:
                keys.append(key)
                runs.append(entries)
            else:
                kept[key] = entries
        self._own = kept or None
        self._keys = tuple(keys)
        self._runs = array("Q", runs) if runs else None
        return shrunk

    def __len__(self) -> int:
        return len(self._keys) + (len(self._own) if self._own is not None else 0)

    def __bool__(self) -> bool:
        return bool(self._keys) or bool(self._own)

    def __iter__(self) -> Iterator[LedgerKey]:
        if self._own is not None:
            yield from self._own
        yield from self._keys

    def items(self) -> Iterable[tuple[LedgerKey, Entries]]:
        """(key, entries) of every own slot: live bitmaps first, then runs (as new ``_Run``-s). C-level
        iterators (no generator frame: pop_due calls this once per due bucket)."""
        own, runs = self._own, self._runs
        if runs is None:
            return own.items() if own is not None else ()
        if own is None and len(runs) == 1:  # one ledger (small k): a tuple beats zip and map objects
            return ((self._keys[0], _Run(runs[0])),)
        inline = zip(self._keys, map(_Run, runs))  # noqa: B905 (aligned by construction; strict costs ~0.2 us)
        return inline if own is None else chain(own.items(), inline)

    def values(self) -> Iterator[Entries]:
        for _, entries in self.items():
            yield entries

    def memory_bytes(self) -> int:
        """Bytes of the bucket's own objects: the bucket, its dict, key tuple and run array — not the
        bitmaps or the keys. O(1)."""
        total = python_bytes(self) + (python_bytes(self._keys) if self._keys else 0)
        if self._own is not None:
            total += python_bytes(self._own)
        if self._runs is not None:
            total += python_bytes(self._runs)
        return total


class _Ledger:
    """One ledger with ids pending: its ``base`` in the shared bitmaps' codes (its ordinal, see
    ``_Layout``) and its slots.

    ``buckets`` (``array('q')``, sorted) holds the bucket times of its slots and ``sizes`` (a
    ``bytearray``, parallel) each slot's id count while it is in the shared bitmap, or ``_OWN``; ``sizes``
    is None when every slot has a bitmap of its own (set by compact() for a ledger of few slots, which
    then costs one exact-size array: ~250 bytes in all, where two grown arrays and a wider record took
    ~420 — 200 ledgers of one or two slots each at (x, k) = (8, 15)). Positions below
    ``head`` are slots already popped: popping the earliest slots only moves ``head``, and the arrays drop
    that prefix once it is half of them (amortized O(1) per popped slot, where deleting the prefix at
    every pop cost O(B_l) — 100,000 slots of one ledger at k = 0). Positions are absolute.
    ``lo``/``hi`` bound every pending entry id (loosely after removals: ``stale`` says so), so that an id
    outside them skips any search. ``mins`` (aligned with the positions) holds each slot's smallest
    entry id when all slots have bitmaps of their own holding increasing, disjoint ranges of entry ids
    (the usual in-order case), so a lookup bisects instead of probing every slot; None = not known yet,
    ``[]`` = not ordered.
    """

    __slots__ = (
        "base",
        "buckets",
        "head",
        "hi",
        "key",
        "lo",
        "mins",
        "serial",
        "sizes",
        "stale",
    )

    def __init__(self, key: LedgerKey, base: int, serial: int) -> None:
        self.key = key
        self.base = base
        self.serial = serial  # names the ledger in batch members' keys; unlike ``base``, never renumbered
        self.buckets: array[int] | tuple[int, ...] = array("q")
        self.sizes: bytearray | None = bytearray()
        self.head = 0
        self.lo = 0
        self.hi = -1  # empty: no bound yet
        self.stale = False
        self.mins: list[int] | None = None

    def __len__(self) -> int:
        """Slots (live positions). O(1)."""
        return len(self.buckets) - self.head

    def is_own(self, i: int) -> bool:
        """Whether the slot at position ``i`` has a bitmap of its own. O(1)."""
        sizes = self.sizes
        return sizes is None or sizes[i] == _OWN

    def shared(self) -> int:
        """Slots in shared bitmaps. O(B_l) in C."""
        sizes = self.sizes
        return 0 if sizes is None else len(self) - sizes[self.head :].count(_OWN)

    def _thaw(self) -> array[int]:
        """The bucket times as an array again, to change them (see ``trim``). O(B_l)."""
        buckets = self.buckets
        if type(buckets) is tuple:
            buckets = self.buckets = array("q", buckets)
        assert isinstance(buckets, array)
        return buckets

    def insert(self, i: int, bucket: int) -> None:
        """Open a slot at position ``i`` (empty, in the shared bitmap). O(B_l) memmove."""
        self._thaw().insert(i, bucket)
        if self.sizes is None:
            self.sizes = bytearray([_OWN]) * (len(self.buckets) - 1)
        self.sizes.insert(i, 0)
        self.mins = None

    def delete(self, i: int) -> None:
        """Forget the slot at position ``i``. O(B_l) memmove."""
        del self._thaw()[i]
        if self.sizes is not None:
            del self.sizes[i]
        self.stale = True  # lo/hi still bound the rest, loosely
        self.mins = None

    def trim(self, single: tuple[int]) -> None:
        """Drop popped positions and spare capacity, and ``sizes`` if every slot has a bitmap of its own.
        The bucket times become a tuple (the next change of the slots makes it an array again) holding
        the int ``single[0]`` — the schedule's key of the bucket being compacted, which holds a slot of
        this ledger — rather than a copy; a ledger whose only slot is there takes ``single`` itself,
        one tuple for all such ledgers of the bucket (an array cost 96 bytes a ledger: ~30 KB of the
        (x, k) = (8, 15) row's 97 KB were these arrays and the ledgers' other parts). O(B_l)."""
        head, (bucket,) = self.head, single
        times = self.buckets[head:]
        if len(times) == 1 and times[0] == bucket:
            self.buckets = single
        else:
            self.buckets = tuple(bucket if time == bucket else time for time in times)
        if self.sizes is not None:
            live = self.sizes[head:]
            self.sizes = None if live.count(_OWN) == len(live) else live
        if self.mins:
            self.mins = self.mins[head:]
        self.head = 0

    def position(self, bucket: int) -> int:
        """Position of the slot at ``bucket``. O(log B_l)."""
        i = bisect_left(self.buckets, bucket, self.head)
        if i == len(self.buckets) or self.buckets[i] != bucket:
            raise KeyError(bucket)
        return i

    def drop_first(self, count: int) -> None:
        """Forget the ``count`` earliest slots. Amortized O(count)."""
        self.head += count
        self.stale = True  # lo/hi still bound the rest, loosely
        # The first of ordered ranges dropped: the rest stay ordered, and mins stays aligned.
        if self.head * 2 > len(self.buckets) and self.head >= 16:
            del self._thaw()[: self.head]
            if self.sizes is not None:
                del self.sizes[: self.head]
            if self.mins:
                del self.mins[: self.head]
            self.head = 0

    def widen(self, entry_id: int, last: bool) -> None:
        """Make ``lo``/``hi`` cover a new id of the slot (``last``: the ledger's latest slot). O(1)."""
        if self.hi < self.lo:
            self.lo = self.hi = entry_id
        elif entry_id > self.hi:
            self.hi = entry_id
            if not last:
                self.mins = None  # ranges may overlap now
        elif entry_id < self.lo:
            self.lo = entry_id
            self.mins = None
        else:
            self.mins = None

    def _extremes(self, schedule: Mapping[int, _Bucket], layout: _Layout) -> list[tuple[int, int]] | None:
        """(smallest, largest) entry id of every slot, or None when that would cost more than O(B_l):
        slots in a shared bitmap are read with numpy (O(P)), so at most _ORDER_SHARED of them."""
        if self.shared() > _ORDER_SHARED:
            return None
        out = []
        for i in range(self.head, len(self.buckets)):
            slots = schedule[self.buckets[i]]
            if self.is_own(i):
                entries = slots.own(self.key)
                if not entries:
                    return None
                out.append((_min(entries), _max(entries)))
                continue
            if slots.packed is None:  # a new slot, still empty: no order to speak of
                return None
            codes = _array_of(slots.packed, np.uint64)
            mine = layout.mine(codes, self.base)
            if not len(mine):
                return None
            entry_ids = layout.entries(mine)
            out.append((int(entry_ids[0]), int(entry_ids[-1])))  # codes of one ledger: by entry id
        return out

    def refresh_bounds(self, schedule: Mapping[int, _Bucket], layout: _Layout) -> None:
        """Exact ``lo``/``hi`` when the slots' extremes are cheap to find (O(B_l), see ``_extremes``);
        else the loose bounds stay."""
        self.stale = False
        extremes = self._extremes(schedule, layout)
        if extremes:
            self.lo = min(low for low, _ in extremes)
            self.hi = max(high for _, high in extremes)

    def candidates(self, schedule: Mapping[int, _Bucket], layout: _Layout, entry_id: int) -> Iterable[int]:
        """Positions of the slots that may hold ``entry_id``: O(log B_l) when ordered, else all B_l."""
        if self.mins is None:
            self._order(schedule, layout)
        if self.mins:  # ordered
            i = bisect_right(self.mins, entry_id, self.head) - 1
            return (i,) if i >= self.head else ()
        return range(self.head, len(self.buckets))

    def _order(self, schedule: Mapping[int, _Bucket], layout: _Layout) -> None:
        self.mins = []  # known: not ordered (unless found so below)
        extremes = self._extremes(schedule, layout)
        if extremes is None:
            return
        lows = [low for low, _ in extremes]
        if lows and all(a[1] < b[0] for a, b in pairwise(extremes)):
            self.mins = [-1] * self.head + lows  # aligned with the positions; dead ones sort first


def _first_bucket(record: _Ledger) -> int:
    return record.buckets[record.head]


def _min(entries: Entries) -> int:
    return entries.lo if isinstance(entries, _Run) else int(entries.min())


def _max(entries: Entries) -> int:
    return entries.hi if isinstance(entries, _Run) else int(entries.max())


class _HotIndex:
    """Pending nacks by due time: ``bucket_ms → ledger → entry ids``, as in Apache Pulsar's PIP-393.

    ``precision_bits`` (0..30) is *k*: due times are trimmed to multiples of ``2**k`` ms. ``rounding``
    ``"floor"`` (Java's behaviour) puts an id in the bucket at or before its due time, so it may fire up to
    ``2**k - 1`` ms early and never late; ``"ceil"`` uses the bucket at or after it: never early, up to
    ``2**k - 1`` ms late.

    Layout: a (bucket, ledger) *slot* with fewer than :data:`PROMOTE_AT` ids lives in its bucket's one
    shared 64-bit bitmap (see ``_Layout``: a few bytes per id however many ledgers share the bucket); a
    larger slot has a 32-bit bitmap of its own (dense slots become run or bitset containers). Per ledger
    the index keeps the sorted bucket times of its slots in a compact array.

    Complexity (n = ids in the call, B = buckets, L = ledgers with ids in a bucket, B_l = slots of one
    ledger, P = ids in one bucket's shared bitmap):

    * :meth:`add` — O(1) when the id's bucket and ledger repeat the previous call or the entry id lies
      outside the ledger's pending range (the usual in-order nack); O(log B + log B_l) when it opens a
      slot (plus a C memmove of the ledger's arrays when the slot is not its latest); O(B_l) when the id
      might already be pending (re-nack inside the ledger's pending range); O(P) once per slot, when it
      reaches :data:`PROMOTE_AT` ids and moves to its own bitmap; O(S) (S = ids in all shared bitmaps)
      when a new ledger makes the ledgers pending outgrow the shared bitmaps' ordinal bits (each time
      their number doubles past a power of two, see ``_relayout``).
    * :meth:`add_many` — O(n) numpy work plus O(1) Python work per run of ids sharing bucket and ledger;
      O(B_l + P) once per ledger and call if a run overlaps the ledger's pending range (the ids it may
      have pending are gathered into one bitmap); unsorted input is sorted first (O(n log n)). Batch
      messages: O(n log n) numpy plus O(1) Python per entry of a run, and O(B_l) probes per entry the
      ledger has parts of already (``_add_members``).
    * :meth:`pop_due` — O(log B) to find the due buckets, O(due ids log due ids) in numpy and CRoaring
      (the due buckets' shared bitmaps are merged in one call), plus O(1) Python work per due bucket,
      per slot with its own bitmap, and per due ledger; O(S) when the ledgers left pending fall to a
      quarter of what the ordinal bits number (see ``_relayout``; :meth:`remove` likewise).
    * :meth:`due_of`, :meth:`pending_mask`, :meth:`remove` — O(1) for an id outside its ledger's pending
      range, else O(log B_l) when the ledger's slots hold ordered ranges (and at most 4 of them are
      shared), else O(B_l) bitmap probes. Finding the order costs O(B_l) (+ O(P) per shared slot) once
      after each change of the ledger.
    * ``len``, :attr:`bucket_count` — O(1); :meth:`next_due_ms` — O(1) (amortized: O(log B) per chunk of
      bucket times emptied by :meth:`remove`). :meth:`remove` of a slot's last id also takes its bucket
      time out of its chunk (O(log B + 4,096) memmove).
    """

    def __init__(
        self,
        precision_bits: int = 8,
        rounding: Rounding = "floor",
        *,
        promote_at: int = PROMOTE_AT,
        ledgers: LedgerRegistry | None = None,
    ) -> None:
        """``promote_at`` (1..254): a slot with this many ids moves from its bucket's shared bitmap to a
        bitmap of its own; 1 gives every slot its own bitmap from its first id. ``ledgers``: a registry
        the index holds its ledgers in while they have ids pending, sharing their keys with the other
        holders (None: no registry; the index's own numbering of the shared bitmaps stays its own).
        O(1)."""
        if isinstance(promote_at, bool) or not isinstance(promote_at, int | np.integer):
            raise TypeError(f"promote_at must be an int, got {type(promote_at).__name__}")
        if not 1 <= promote_at < _OWN:
            raise ValueError(f"promote_at must be in 1..{_OWN - 1}, got {promote_at}")
        if isinstance(precision_bits, bool) or not isinstance(precision_bits, int | np.integer):
            raise TypeError(f"precision_bits must be an int, got {type(precision_bits).__name__}")
        if not 0 <= precision_bits <= MAX_PRECISION_BITS:
            raise ValueError(f"precision_bits must be in 0..{MAX_PRECISION_BITS}, got {precision_bits}")
        precision_bits = int(precision_bits)
        if not isinstance(rounding, str) or rounding not in ("floor", "ceil"):
            raise ValueError(f"rounding must be 'floor' or 'ceil', got {rounding!r}")
        self._precision_bits = precision_bits
        self._rounding: Rounding = rounding
        self._promote_at = int(promote_at)
        self._mask = -1 << precision_bits
        self._round_up = (1 << precision_bits) - 1 if rounding == "ceil" else 0
        self._lock = threading.Lock()
        # bucket_ms → _Bucket: the PIP-393 map, its bucket times sorted in _Times. Popping the earliest
        # buckets is what the timer does all the time: a prefix of one sorted array (see _Times), where
        # deleting a sorted map's first keys one by one cost ~0.5 us of Python each.
        self._schedule: dict[int, _Bucket] = {}
        self._times = _Times(precision_bits)
        # ledger key → its record; ordinal → record (None: free); free ordinals (the smallest reused first).
        self._ledgers: dict[LedgerKey, _Ledger] = {}
        self._ordinals: list[_Ledger | None] = []
        # (a bitmap, not a heap of ints: ~2 B a free ordinal, where a list slot and an int cost ~40 —
        # 1,000 sparse ledgers moved to the packed tier left ~40 KB of free ordinals behind)
        self._free = BitMap()
        self._layout = _Layout(0)  # codes of the shared bitmaps: see _relayout
        self._narrow_at = -1  # no low ordinal bits: nothing to narrow
        self._registry = ledgers
        # Batch members: an entry pending in a slot for some messages of its batch only has the bitmask
        # of those batch indexes here, under _member_key(bucket, ledger serial, entry id); an entry of a
        # slot absent here is pending as a whole. One flat dict: ~100 bytes per such entry, where a
        # dict entry, a tuple key and a Roaring bitmap per slot cost ~390.
        self._members: dict[int, int] = {}
        # Slots with bitmaps of their own: bucket << _SERIAL_BITS | serial → their narrow members, sorted.
        self._dense: dict[int, _NarrowMembers] = {}
        self._serial = 0  # the next ledger's serial
        # Buckets the add path has moved away from: candidates for compact(). Ordered set.
        self._cold: dict[int, None] = {}
        self._count = 0
        self._added = 0  # ids accepted by add/add_many, repeats included
        self._freed = 0  # serialized bytes compaction shrank bitmaps by since the heap was last trimmed
        self._forget_slot()

    # -- properties ---------------------------------------------------------------------------------

    @property
    def precision_bits(self) -> int:
        """*k*: bucket times are multiples of ``2**k`` ms. O(1)."""
        return self._precision_bits

    @property
    def rounding(self) -> Rounding:
        """``"floor"`` or ``"ceil"``. O(1)."""
        return self._rounding

    @property
    def promote_at(self) -> int:
        """Ids at which a slot moves to a bitmap of its own. O(1)."""
        return self._promote_at

    @property
    def bucket_count(self) -> int:
        """Number of non-empty buckets. O(1)."""
        return len(self._schedule)

    @property
    def added(self) -> int:
        """Ids accepted by :meth:`add`/:meth:`add_many` so far, repeats included. O(1)."""
        return self._added

    def __len__(self) -> int:
        """Pending ids, counting an entry once per bucket (batch messages of one entry count once). O(1)."""
        return self._count

    def bucket_of(self, due_ms: int) -> int:
        """The bucket time an id due at ``due_ms`` is stored under (and popped at). O(1)."""
        return (_check_due(due_ms) + self._round_up) & self._mask

    def next_due_ms(self) -> int | None:
        """The earliest bucket time, or None when nothing is pending. O(1) (amortized: O(log) per chunk
        of 4,096 bucket times emptied by :meth:`remove`, see ``_Times``)."""
        with self._lock:
            return self._times.first()

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
        """The live tier's :meth:`TimeBucketIndex.add` (its docstring holds the contract). Complexity: see
        the class."""
        if type(due_ms) is not int or not 0 <= due_ms <= MAX_DUE_MS:  # bools, floats, negatives, huge
            due_ms = _check_due(due_ms)
        bucket = (due_ms + self._round_up) & self._mask
        if type(entry_id) is not int or type(ledger_id) is not int:
            entry_id, ledger_id = _entry(entry_id), _ledger(ledger_id)
        # (The caller, TimeBucketIndex.add, holds the lock: this is the nack path.)
        if not (bucket == self._slot_bucket and ledger_id == self._slot_ledger and topic == self._slot_topic):
            self._select(bucket, ledger_id, topic)
        if fresh and type(batch_index) is int and 0 <= batch_index <= MAX_BATCH_INDEX:
            # The batched nack (the nack path; _insert's work, inlined). An entry already here
            # without members is pending whole and covers the message.
            record, slots = self._slot_record, self._slot_slots
            assert record is not None and slots is not None
            if slots.members and self._slot_own is None and 0 <= entry_id <= MAX_ENTRY_ID:
                # Another message of an entry with members here (a burst of one batch's nacks): one
                # lookup of its mask, which also says the entry is in the slot, not pending whole
                # (_put, _member_mask and _add_member each looked, ~0.35 µs a nack).
                members = self._members
                key = (bucket << 32 | entry_id) << _SERIAL_BITS | record.serial  # _member_key
                mask = members.get(key)
                if mask is not None:
                    mask |= 1 << batch_index  # (_member_mask, inlined: the nack path)
                    members[key] = _WHOLE_BATCHES.setdefault(mask, mask) if not mask & mask + 1 else mask
                    self._added += 1
                    return bucket
            if self._put(entry_id) or (
                slots.members and self._member_mask(bucket, record, entry_id) is not None
            ):
                self._add_member(entry_id, batch_index)
            self._added += 1
            return bucket
        if batch_index == -1:
            record = self._slot_record
            assert record is not None
            own = self._slot_own
            if own is not None and record.lo <= record.hi < entry_id <= MAX_ENTRY_ID:
                # The in-order nack into a slot with its own bitmap: above every pending id of the
                # ledger, so new. (_put's work, inlined: this is the nack path.)
                own.add(entry_id)
                self._count += 1
                record.hi = entry_id
                if not self._slot_is_last:
                    record.mins = None  # ranges may overlap now
                self._added += 1
                return bucket
            if (
                entry_id > record.hi
                or entry_id < record.lo
                or (len(record) == 1 and not self._members and not self._dense)
            ):
                # Outside every pending id of the ledger, or the ledger's only slot (membership is
                # exact) and no batch members anywhere (slots with bitmaps of their own keep theirs in
                # _dense): cannot be a duplicate elsewhere, and covers no pending message of its batch.
                self._put(entry_id)
                self._added += 1
                return bucket
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
        anything changes. Ids with a batch index >= 0 are filed first, in bulk (``_add_members``).
        Complexity: see the class (O(n) numpy work plus O(1) Python work per run of ids sharing bucket and
        ledger).
        """
        due, ledgers, entries, batches = as_id_arrays(due_ms, ledger_ids, entry_ids, batch_indexes)
        if not isinstance(topic, str):
            raise TypeError(f"topic must be a str, got {type(topic).__name__}")
        if len(entries) == 0:
            return
        if int(due.max()) > MAX_DUE_MS:
            due = np.minimum(due, MAX_DUE_MS)  # as add(): the last bucket the arrays can hold
        buckets = (due + self._round_up) & self._mask
        with self._lock:
            self._added += len(entries)
            self._forget_slot()
            if batches is not None and (batches >= 0).any():
                whole = batches < 0
                self._add_members(buckets[~whole], ledgers[~whole], entries[~whole], batches[~whole], topic)
                self._forget_slot()
                buckets, ledgers, entries = buckets[whole], ledgers[whole], entries[whole]
            if len(entries) == 0:
                return
            known: dict[LedgerKey, BitMap] = {}  # ledger → ids it may have pending (see _add_run)
            for bucket, ledger_id, run in _runs(buckets, ledgers, entries):
                self._add_run(bucket, ledger_id, topic, run, known)
            self._forget_slot()

    # -- popping, querying, removing --------------------------------------------------------------

    def pop_due(self, now_ms: int) -> list[tuple[int, DueIds]]:
        """Remove and return every id whose bucket time is <= ``now_ms``, one ``DueIds`` per ledger, each
        with the ledger's first due bucket.

        Ledgers come in the order of their earliest due bucket. An entry due in several buckets comes
        once; if it is due as a whole in any of them it comes as a whole. Complexity: O(log B) to find the
        due buckets (one bisect per chunk of 4,096 bucket times, see ``_Times``), O(due ids log due ids)
        in numpy/CRoaring — the due buckets' shared bitmaps are merged by one CRoaring union — plus O(1)
        Python work per due bucket, per due slot with its own bitmap and per due ledger (and per due slot
        with batch members); one-id slots of a ledger are merged without numpy (see ``_merge_own``).

        The loop over the due buckets reads their fields directly (no ``_Bucket.items`` call, no ``_Run``
        object per run) and one due ledger skips the set and the sort of the ledgers: the timer called this
        every 68 ms at small k, with the caches cold after its sleep (it calls :meth:`pop_due_by_bucket`
        now).
        """
        with self._lock:
            times, due = self._take_due(now_ms)
            if not times:
                return []
            packed: list[BitMap64] = []  # their shared bitmaps
            # ledger → its own due entries: bitmaps, _Run-s, or runs as plain ints (see _merge_own)
            owned: dict[LedgerKey, list[tuple[int, Entries | int]]] = {}
            for bucket, slots in zip(times, due):  # noqa: B905 (same length; strict costs a check a turn)
                if slots.packed is not None:
                    packed.append(slots.packed)
                runs, own = slots._runs, slots._own
                if runs is not None:
                    if len(runs) == 1:  # one ledger's run (small k): no zip, no _Run
                        key = slots._keys[0]
                        parts = owned.get(key)
                        if parts is None:
                            owned[key] = [(bucket, runs[0])]
                        else:
                            parts.append((bucket, runs[0]))
                    else:
                        for key, run in zip(slots._keys, runs):  # noqa: B905 (aligned by construction)
                            owned.setdefault(key, []).append((bucket, run))
                if own is not None:
                    for key, entries in own.items():
                        owned.setdefault(key, []).append((bucket, entries))
            last = times[-1]
            shared = self._decode_union(packed) if packed else {}
            if packed:
                self._count -= sum(map(len, packed))
            ledgers = self._ledgers
            if not shared and len(owned) == 1:
                records = [ledgers[key] for key in owned]
            else:
                records = [ledgers[key] for key in (shared.keys() | owned.keys() if owned else shared)]
                records.sort(key=_first_bucket)
            out = []
            # serial → bucket → {entry id: mask}: the due buckets' batch members, per ledger
            due_masks: dict[int, dict[int, dict[int, int]]] = {}
            for bucket, slots in zip(times, due):  # noqa: B905 (same length)
                if slots.members:
                    self._pop_members(bucket, slots, due_masks)
            due_map = dict(zip(times, due, strict=True)) if due_masks else None
            for record in records:
                key = record.key
                gone = bisect_right(record.buckets, last, record.head) - record.head
                parts = owned.get(key)
                entry_ids = self._entries_due(shared.get(key), parts)
                topic, ledger_id = _split_key(key)
                masks = due_masks.get(record.serial)
                partial = None
                if masks and due_map is not None:
                    partial = self._due_members(record, gone, masks, due_map, parts)
                first = record.buckets[record.head]
                if partial:
                    out.append((first, DueIds(topic, ledger_id, entry_ids, partial)))
                else:
                    out.append((first, DueIds(topic, ledger_id, entry_ids)))
                self._unlink_first(record, gone)
            if len(self._ledgers) <= self._narrow_at:
                self._narrow_if_sparse()
            return out

    def _entries_due(
        self, shared: npt.NDArray[np.uint32] | None, parts: list[tuple[int, Entries | int]] | None
    ) -> npt.NDArray[np.uint32]:
        """A due ledger's entry ids: from the due shared bitmaps (decoded) and its own due slots, which
        leave the count (lock held). See :func:`_merge_own`."""
        if parts:
            shared, count = _merge_own(shared, parts)
            self._count -= count
        assert shared is not None
        return shared

    def _take_due(self, now_ms: int) -> tuple[list[int], list[_Bucket]]:
        """The due bucket times and their buckets, in bucket order, taken out of the schedule (lock held;
        their ledgers' records are the caller's to unlink; a bad ``now_ms`` raises first). O(log B + due
        buckets)."""
        if type(now_ms) is not int or now_ms < 0:
            now_ms = _check_due(now_ms, "now_ms", bounded=False)
        times = self._times.pop_until(now_ms)
        if not times:
            return times, []
        if self._slot_bucket is not None:
            self._forget_slot()
        due = list(map(self._schedule.pop, times))
        cold = self._cold
        if cold:
            for bucket in times:
                cold.pop(bucket, None)
        return times, due

    def pop_due_by_bucket(self, now_ms: int) -> list[tuple[int, DueIds]]:
        """Remove every id whose bucket time is <= ``now_ms`` and return it as :meth:`pop_due` of each due
        bucket in turn would: (bucket time, one ledger's ids due in it), in bucket order. O(log B) to find
        the due buckets, plus per due bucket one decode of its shared bitmap and O(1) Python work per due
        slot and batch member — one call where a pop a bucket paid the call's fixed cost per bucket."""
        with self._lock:
            times, due = self._take_due(now_ms)
            if not times:
                return []
            ledgers = self._ledgers
            touched: dict[LedgerKey, _Ledger] = {}
            out: list[tuple[int, DueIds]] = []
            for bucket, slots in zip(times, due):  # noqa: B905 (same length)
                masks: dict[int, dict[int, dict[int, int]]] = {}  # serial → {bucket: {entry: mask}}
                if slots.members:
                    self._pop_members(bucket, slots, masks)
                shared: dict[LedgerKey, npt.NDArray[np.uint32]] = {}
                if slots.packed is not None:
                    shared = self._decode_union([slots.packed])
                    self._count -= len(slots.packed)
                owned: dict[LedgerKey, list[tuple[int, Entries | int]]] = {}
                for key, entries in slots.items():
                    owned[key] = [(bucket, entries)]
                for key in (shared.keys() | owned.keys()) if shared and owned else (shared or owned):
                    entry_ids = self._entries_due(shared.get(key), owned.get(key))
                    record = touched.get(key)
                    if record is None:
                        record = touched[key] = ledgers[key]
                    topic, ledger_id = _split_key(key)
                    members = masks.get(record.serial, {}).get(bucket)
                    if members:  # (an entry with members in a slot is due for those only)
                        partial = {e: tuple(batch_indexes(m)) for e, m in sorted(members.items())}
                        out.append((bucket, DueIds(topic, ledger_id, entry_ids, partial)))
                    else:
                        out.append((bucket, DueIds(topic, ledger_id, entry_ids)))
            last = times[-1]
            for record in touched.values():
                self._unlink_first(record, bisect_right(record.buckets, last, record.head) - record.head)
            if len(self._ledgers) <= self._narrow_at:
                self._narrow_if_sparse()
            return out

    def pending_mask(self, ledger_id: int, entry_id: int, topic: str = "") -> int:
        """The batch indexes of this entry pending in any bucket, as a bitmask; -1 if the whole entry is
        pending, 0 if nothing is. Complexity as :meth:`due_of`."""
        with self._lock:
            record = self._ledgers.get(_key(ledger_id, topic))
            if record is None:
                return 0
            mask = 0
            for bucket in self._holding(record, entry_id):
                member = self._member_mask(bucket, record, entry_id)
                if member is None:
                    return -1
                mask |= member
            return mask

    def parts(self, ledger_id: int, entry_id: int, topic: str = "") -> list[tuple[int, int | None]]:
        """(bucket time, batch mask or None for the whole entry) of each bucket holding the entry, earliest
        first. Complexity as :meth:`due_of`."""
        with self._lock:
            record = self._ledgers.get(_key(ledger_id, topic))
            if record is None:
                return []
            return [(b, self._member_mask(b, record, entry_id)) for b in self._holding(record, entry_id)]

    def due_of(self, ledger_id: int, entry_id: int, batch_index: int = -1, topic: str = "") -> int | None:
        """The bucket time at which this id will be popped, or None if it is not pending.

        With ``batch_index`` -1: the earliest bucket holding any part of the entry. With a batch index:
        the earliest bucket holding that message or the whole entry. O(1) if the entry lies outside the
        ledger's pending range, O(log B_l) if the ledger's slots hold ordered ranges in bitmaps of their
        own, else O(B_l) bitmap probes.
        """
        with self._lock:
            record = self._ledgers.get(_key(ledger_id, topic))
            if record is None:
                return None
            for bucket in self._holding(record, entry_id):  # earliest first
                mask = self._member_mask(bucket, record, entry_id)
                if batch_index < 0 or mask is None or mask >> batch_index & 1:
                    return bucket
            return None

    def remove(self, ledger_id: int, entry_id: int, batch_index: int = -1, topic: str = "") -> bool:
        """Forget a pending id; True if something was removed. Complexity as :meth:`due_of`, plus
        O(log B_l) per slot the id leaves.

        ``batch_index`` -1 removes every pending part of the entry. A batch index removes that message
        where it is pending on its own (a message covered by a pending whole entry stays).
        """
        return self.take(ledger_id, entry_id, batch_index, topic)[1]

    def take(
        self, ledger_id: int, entry_id: int, batch_index: int = -1, topic: str = ""
    ) -> tuple[int | None, bool]:
        """:meth:`due_of` then :meth:`remove`, both answers, in one walk of the entry's buckets where the
        two calls made two (a kept copy of a pending message asks both). Complexity as :meth:`remove`."""
        with self._lock:
            self._forget_slot()
            record = self._ledgers.get(_key(ledger_id, topic))
            if record is None:
                return None, False
            due: int | None = None
            removed = False
            for bucket in self._holding(record, entry_id):  # earliest first
                mask = self._member_mask(bucket, record, entry_id)
                if due is None and (batch_index < 0 or mask is None or mask >> batch_index & 1):
                    due = bucket
                if batch_index >= 0:
                    if mask is None or not mask >> batch_index & 1:
                        continue
                    mask &= ~(1 << batch_index)
                    if mask:
                        self._set_mask(bucket, record, entry_id, mask)
                        removed = True
                        continue
                self._discard(record, bucket, entry_id)
                removed = True
            if removed:
                self._narrow_if_sparse()
            return due, removed

    def clear(self) -> None:
        """Forget everything. O(B + ledgers) (the structures are dropped)."""
        with self._lock:
            self._schedule.clear()
            self._times.clear()
            if self._registry is not None:
                release, ordinals = self._registry.release, self._registry.ordinals
                for key in self._ledgers:
                    release(ordinals[key])
            self._ledgers.clear()
            self._ordinals.clear()
            self._free = BitMap()
            self._layout = _Layout(0)
            self._narrow_at = -1
            self._members.clear()
            self._dense.clear()
            self._cold.clear()
            self._count = 0
            self._forget_slot()

    def compact(
        self, max_buckets: int | None = None, store: PackedStore | None = None, pack_below: int = PROMOTE_AT
    ) -> int:
        """Compact buckets the add path has moved away from; returns how many were compacted.

        ``store``: a bucket whose slots all hold fewer than ``pack_below`` ids moves there whole (see
        :meth:`_evict`) instead of being compacted here.

        A bitmap of its own holding one run of consecutive ids becomes a packed int (``_Run``); others
        are ``run_optimize``-d and ``shrink_to_fit``-ed; shared bitmaps see ``_compact_shared``. Adding
        to a compacted bucket later is fine (a run is turned back into a bitmap). O(bitmaps and
        containers in the compacted buckets, plus O(P log P) numpy work per shared bitmap). Call it off
        the nack path, e.g. from the timer thread; never needed for correctness.
        """
        done = 0
        evicted = False
        with self._lock:
            for bucket in list(self._cold):
                if max_buckets is not None and done >= max_buckets:
                    break
                if bucket == self._slot_bucket:
                    continue  # still receiving ids
                del self._cold[bucket]
                slots: _Bucket | None = self._schedule.get(bucket)
                if slots is None:
                    continue
                if store is not None and self._evict(bucket, slots, store, pack_below):
                    evicted = True
                    done += 1
                    continue
                if slots.packed is not None:
                    self._compact_shared(bucket, slots, slots.packed)
                self._freed += slots.compact_own()
                single = (bucket,)  # shared by the ledgers whose only slot is this one (see trim)
                for key in slots:  # ledgers of few slots: exact-size tuples (see _Ledger)
                    record = self._ledgers[key]
                    if len(record.buckets) <= _TRIM_SLOTS and record is not self._slot_record:
                        record.trim(single)
                done += 1
            # A dict keeps its grown table when entries leave: the buckets, ledgers and batch members
            # that moved to the packed tier or were popped would leave ~40 B each behind (the cold
            # buckets' table: 590 KB for one after 20,000 popped uncompacted). O(live) when oversized.
            self._schedule, self._ledgers = _fitted(self._schedule), _fitted(self._ledgers)
            self._members, self._dense = _fitted(self._members), _fitted(self._dense)
            self._cold = _fitted(self._cold)
            # No narrowing here: the ledgers a compaction moved to the packed tier come back with the
            # next bucket's nacks, and narrowing then widening again re-encoded the shared bitmaps ~3
            # times a compaction (0.4 a nack at 100 topics, 1 h delays: a third of the nack path).
            if evicted and self._slot_record is not None:
                # Slots of the add path's ledger left: its cached position may have moved.
                assert self._slot_bucket is not None and self._slot_ledger is not None
                assert self._slot_topic is not None
                self._select(self._slot_bucket, self._slot_ledger, self._slot_topic)
            if not self._cold:
                self._cold = {}  # a dict keeps its grown table when emptied (~1 KB per 40 buckets)
            if self._freed >= _RELEASE_AFTER:
                # The bitmaps freed by compaction stay in glibc's heap, resident, unless it is trimmed
                # (measured at (x, k) = (1, 10), 10M ids: RSS 24 MB after compact(), 1.8 MB after a
                # trim; 2-3 ms a trim then, ~0.2 ms when there is nothing to give back).
                self._freed = 0
                release_free_heap()
        return done

    def _evict(self, bucket: int, slots: _Bucket, store: PackedStore, below: int) -> bool:
        """Move a bucket whose slots all hold fewer than ``below`` ids into the packed ``store`` and
        forget it here; False (nothing changed) if a slot is larger, a batch index does not fit a packed
        row, or the store cannot take the bucket. O(ids in the bucket) numpy plus O(slots + batch
        members) Python."""
        if slots._own:
            for entries in slots._own.values():
                if len(entries) >= below:
                    return False
        if slots._runs is not None:
            for run in slots._runs:
                if (run & MAX_ENTRY_ID) - (run >> 32) + 1 >= below:
                    return False
        ledgers = self._ledgers
        found: list[tuple[_Ledger, list[int]]] = [
            (ledgers[key], list(range(e.lo, e.hi + 1)) if isinstance(e, _Run) else list(e))
            for key, e in slots.items()
        ]
        if slots.packed is not None:
            shared = self._decode_shared(slots.packed)
            if below < self._promote_at and any(len(ids) >= below for ids in shared.values()):
                return False
            found.extend((ledgers[key], ids) for key, ids in shared.items())
        moved: list[PackedSlot] = []
        rows = members = 0
        for record, entry_ids in found:
            masks: dict[int, int] = {}
            if slots.members:
                for entry_id in entry_ids:
                    mask = self._member_mask(bucket, record, entry_id)
                    if mask is not None:
                        if mask >> (MAX_PACKED_INDEX + 1):
                            return False
                        masks[entry_id] = mask
                        rows += mask.bit_count() - 1
                members += len(masks)
            rows += len(entry_ids)
            moved.append((record.key, entry_ids, masks))
        packed_bytes = rows * _PACKED_ROW_BYTES  # (below a bucket's fixed part: packing wins, no estimate)
        if packed_bytes >= _BUCKET_BYTES and packed_bytes >= self._live_bytes(slots, len(found), members):
            return False  # dense enough: cheaper as it is (shared bitmaps of many ids a bucket)
        if not store.accepts(bucket, (record.key for record, _ in found)):
            return False
        store.stage(bucket, moved)
        dense = self._dense
        for (record, entry_ids), (_, _, masks) in zip(found, moved, strict=True):
            for entry_id in masks:
                self._members.pop(_member_key(bucket, record, entry_id), None)
            if dense:
                dense.pop(bucket << _SERIAL_BITS | record.serial, None)
            self._count -= len(entry_ids)
            self._unlink(record, record.position(bucket))
        del self._schedule[bucket]
        self._times.discard(bucket)
        return True

    def _live_bytes(self, slots: _Bucket, ledgers: int, members: int) -> int:
        """A compacted bucket's bytes in the live tier, roughly (what ``_evict`` weighs against packed
        rows): its objects, map entries and key, each slot's place in its ledger's arrays, its bitmaps'
        heap (shared: the fitted model; own: 2 B an id) and its batch members' dict entries.
        O(slots)."""
        total = _BUCKET_BYTES + ledgers * _SLOT_BYTES + members * _MEMBER_BYTES
        if slots.packed is not None:
            total += shared_bitmap64_heap_bytes(slots.packed, True)
        for entries in slots.values():
            total += 16 if isinstance(entries, _Run) else 200 + 2 * len(entries)
        return total

    def _decode_shared(self, packed: BitMap64) -> dict[LedgerKey, list[int]]:
        """Ledger key → entry ids of one shared bitmap: plain Python for a small one (see
        :data:`_SMALL_SHARED`), else numpy. O(P)."""
        if len(packed) > _SMALL_SHARED:
            return {key: ids.tolist() for key, ids in self._decode_union([packed]).items()}
        layout, ordinals = self._layout, self._ordinals
        low, entry_mask, bits = layout.low, layout.entry_mask, layout.bits
        out: dict[LedgerKey, list[int]] = {}
        for code in packed:
            record = ordinals[layout.ordinal(code & ~entry_mask | code & low)]
            assert record is not None
            out.setdefault(record.key, []).append((code & entry_mask) >> bits)
        return out

    def _compact_shared(self, bucket: int, slots: _Bucket, packed: BitMap64) -> None:
        """Compact a bucket's shared bitmap: a slot holding one run of consecutive ids becomes a ``_Run``
        of its own if it has :data:`RUN_AT` ids or more, or if every slot of the shared bitmap is such a
        run (the bitmap then goes away: ~400 bytes for one id); the rest is ``shrink_to_fit``-ed if that
        frees memory. O(P log P) numpy work plus O(log B_l) per converted slot; a small bitmap (at most
        :data:`_SMALL_SHARED` ids: a bucket of a ms or so, at k = 0) in plain Python — ten numpy calls cost
        ~20 µs, which 100,000 one-id buckets made 2 s of timer-thread CPU."""
        if len(packed) <= _SMALL_SHARED:
            self._compact_small_shared(bucket, slots, packed)
            return
        codes = _array_of(packed, np.uint64)
        ordinals, entries = self._layout.decode(codes)
        if len(ordinals) > 1 and not bool((ordinals == ordinals[0]).all()):
            order = np.argsort(ordinals, kind="stable")
            codes, ordinals, entries = codes[order], ordinals[order], entries[order]
        starts = np.concatenate(([0], np.flatnonzero(ordinals[1:] != ordinals[:-1]) + 1))
        ends = np.append(starts[1:], len(ordinals))
        counts = ends - starts
        lows, highs = entries[starts].astype(np.int64), entries[ends - 1].astype(np.int64)
        runs = highs - lows + 1 == counts
        convert = runs if bool(runs.all()) else runs & (counts >= RUN_AT)
        if not convert.any():
            _shrink(packed)
            return
        for ordinal, lo, hi in zip(
            ordinals[starts[convert]].tolist(), lows[convert].tolist(), highs[convert].tolist(), strict=True
        ):
            record = self._ordinals[ordinal]
            assert record is not None
            slots[record.key] = _Run.of(lo, hi)
            sizes = record.sizes
            assert sizes is not None  # the slot was in the shared bitmap
            sizes[record.position(bucket)] = _OWN
            record.mins = None
        if bool(convert.all()):
            slots.packed = None
            return
        moved = np.repeat(convert, counts)
        packed.difference_update(BitMap64(array("Q", codes[moved].tobytes())))
        _shrink(packed)

    def _compact_small_shared(self, bucket: int, slots: _Bucket, packed: BitMap64) -> None:
        """:meth:`_compact_shared` of a bitmap of few ids, without numpy. O(P + log B_l a converted slot)."""
        layout = self._layout
        groups: dict[int, list[int]] = {}  # base → codes, in entry order (codes ascend so within a ledger)
        for code in packed:
            groups.setdefault(code & ~layout.entry_mask | code & layout.low, []).append(code)
        runs: list[tuple[int, int, int, list[int]]] = []  # (ordinal, lo, hi, codes) of one-run slots
        for base, codes in groups.items():
            lo, hi = (
                (codes[0] & layout.entry_mask) >> layout.bits,
                (codes[-1] & layout.entry_mask) >> layout.bits,
            )
            if hi - lo + 1 == len(codes):
                runs.append((layout.ordinal(base), lo, hi, codes))
        every = len(runs) == len(groups)
        if not every:
            runs = [run for run in runs if len(run[3]) >= RUN_AT]
        if not runs:
            _shrink(packed)
            return
        for ordinal, lo, hi, _ in runs:
            record = self._ordinals[ordinal]
            assert record is not None
            slots[record.key] = _Run.of(lo, hi)
            sizes = record.sizes
            assert sizes is not None  # the slot was in the shared bitmap
            sizes[record.position(bucket)] = _OWN
            record.mins = None
        if every:
            slots.packed = None
            return
        for *_, codes in runs:
            for code in codes:
                packed.discard(code)
        _shrink(packed)

    def __iter__(self) -> Iterator[tuple[int, str, int, npt.NDArray[np.uint32]]]:
        """Yield ``(bucket_ms, topic, ledger_id, entry_ids)`` per slot in bucket order (a snapshot).
        O(n + B log B)."""
        with self._lock:
            snapshot: list[tuple[int, LedgerKey, npt.NDArray[np.uint32]]] = []
            for bucket, slots in sorted(self._schedule.items(), key=_item_time):
                snapshot.extend((int(bucket), key, _as_array(entries)) for key, entries in slots.items())
                if slots.packed is not None:
                    for key, entry_ids in self._decode_union([slots.packed]).items():
                        snapshot.append((int(bucket), key, entry_ids))
        for bucket, key, entry_ids in snapshot:
            topic, ledger_id = _split_key(key)
            yield bucket, topic, ledger_id, entry_ids

    def structure(self) -> dict[str, int]:
        """Buckets, (bucket, ledger) slots and the Roaring container mix: ``slots``, ``packed_slots``
        (slots in their bucket's shared bitmap), ``bitmaps`` (slots with their own bitmap, and shared
        bitmaps), ``packed_runs`` (slots compacted to one run), ``ledgers`` (with ids pending),
        ``ordinals`` (ledger numbers handed out: the most ledgers pending at one time), ``ordinal_bits``
        (low ordinal bits in the shared bitmaps' codes, see ``_Layout``), ``array_containers``,
        ``bitset_containers``, ``run_containers``. O(slots + containers)."""
        counts = dict.fromkeys(("buckets", "slots", "packed_slots", "bitmaps", "packed_runs"), 0)
        counts |= dict.fromkeys(("ledgers", "ordinals", "ordinal_bits"), 0)
        counts |= dict.fromkeys(("array_containers", "bitset_containers", "run_containers"), 0)
        with self._lock:
            counts["buckets"] = len(self._schedule)
            counts["ledgers"] = len(self._ledgers)
            counts["ordinals"] = len(self._ordinals)
            counts["ordinal_bits"] = self._layout.bits
            for record in self._ledgers.values():
                counts["slots"] += len(record)
                counts["packed_slots"] += record.shared()
            for slots in self._schedule.values():
                bitmaps: list[BitMap | BitMap64] = [e for e in slots.values() if not isinstance(e, _Run)]
                counts["packed_runs"] += len(slots) - len(bitmaps)
                if slots.packed is not None:
                    bitmaps.append(slots.packed)
                for bitmap in bitmaps:
                    stats = bitmap.get_statistics()
                    counts["bitmaps"] += 1
                    counts["array_containers"] += stats["n_array_containers"]
                    counts["bitset_containers"] += stats["n_bitset_containers"]
                    counts["run_containers"] += stats["n_run_containers"]
        return counts

    def memory_usage(self) -> MemoryUsage:
        """Bytes held by the index: Python objects at the sizes the allocator hands out
        (:func:`~pulsar_nack.memory.python_bytes`) and CRoaring's C heap
        (:func:`~pulsar_nack.memory.bitmap_heap_bytes`, :func:`~pulsar_nack.memory.bitmap64_heap_bytes`),
        by part. O(objects in the index + Roaring containers).

        Shared objects (a bucket's int key stored in several places, a topic string) count once; small
        ints that CPython caches count nothing.
        """
        with self._lock:
            return self._walk_memory()

    def _walk_memory(self) -> MemoryUsage:
        """:meth:`memory_usage`'s walk of the live structure (caller holds the lock)."""
        seen: set[int] = set()
        if self._registry is not None:
            # The ledger keys are the registry's objects (one a ledger), which its own memory_bytes counts:
            # counted here too they were ~90 B a ledger twice (+12 % at 1,000 ledgers of 100 nacks each).
            for key in self._registry.ordinals:
                seen.add(id(key))
                if isinstance(key, tuple):
                    seen.add(id(key[1]))
        parts = {"schedule": 0, "buckets": 0, "ledgers": 0, "batch_members": 0, "bitmap_objects": 0}
        roaring = 0

        def once(obj: object) -> int:
            if id(obj) in seen or (isinstance(obj, int) and -5 <= obj <= 256 and type(obj) is int):
                return 0
            seen.add(id(obj))
            return python_bytes(obj)

        def key_bytes(key: object) -> int:
            if isinstance(key, tuple):
                # (the topic string is the caller's — the consumer's name of the topic, one per topic and
                # held by the client anyway — not the index's)
                return once(key) + once(key[1])
            return once(key)

        schedule = self._schedule
        # Fixed part: the index object and its attributes' holders.
        parts["schedule"] += self._times.memory_bytes()
        for holder in (self, self._lock, schedule):
            parts["schedule"] += once(holder)
            attributes = getattr(holder, "__dict__", None)
            if attributes is not None:
                parts["schedule"] += once(attributes)
                parts["schedule"] += sum(once(v) for v in attributes.values() if inspect.ismethod(v))
        for bucket, slots in schedule.items():
            parts["schedule"] += once(bucket)
            parts["buckets"] += slots.memory_bytes()
            for key, entries in slots.items():
                parts["buckets"] += key_bytes(key)
                if isinstance(entries, BitMap) or entries is slots.own(key):  # (inline runs: in the array)
                    parts["bitmap_objects"] += once(entries)
                if isinstance(entries, BitMap):
                    roaring += bitmap_heap_bytes(entries)
                elif not isinstance(entries, _Run):
                    raise TypeError(f"unexpected entries type {type(entries).__name__}")
            if slots.packed is not None:
                parts["bitmap_objects"] += once(slots.packed)
                # compact() shrinks a bucket's shared bitmap and takes the bucket off the cold list; adds
                # put it back (or it is the add path's current bucket).
                compacted = bucket not in self._cold and bucket != self._slot_bucket
                roaring += shared_bitmap64_heap_bytes(slots.packed, shrunk=compacted)
        parts["ledgers"] += python_bytes(self._ledgers) + python_bytes(self._ordinals)
        parts["ledgers"] += python_bytes(self._free) + bitmap_heap_bytes(self._free)
        for key, record in self._ledgers.items():
            parts["ledgers"] += key_bytes(key) + once(record) + once(record.base)
            if type(record.buckets) is tuple:  # trimmed: maybe shared, ints mostly the schedule's keys
                parts["ledgers"] += once(record.buckets) + sum(map(once, record.buckets))
            else:
                parts["ledgers"] += python_bytes(record.buckets)
            if record.sizes is not None:
                parts["ledgers"] += python_bytes(record.sizes)
            parts["ledgers"] += once(record.lo) + once(record.hi)
            if record.mins:
                parts["ledgers"] += python_bytes(record.mins) + sum(once(m) for m in record.mins)
        parts["batch_members"] += python_bytes(self._members)
        for member, mask in self._members.items():
            parts["batch_members"] += once(member) + once(mask)
        parts["batch_members"] += python_bytes(self._dense)
        for slot, bits in self._dense.items():
            python, heap = bits.memory_bytes()
            parts["batch_members"] += once(slot) + python
            roaring += heap
        parts["schedule"] += python_bytes(self._cold)
        return MemoryUsage(sum(parts.values()), roaring, len(self), parts)

    # -- internals: ledgers and slots -------------------------------------------------------------

    def _ledger_record(self, key: LedgerKey) -> _Ledger:
        """The ledger's record, registering the ledger (and an ordinal) if it has nothing pending. O(1)
        (O(log ledgers) when an ordinal is reused)."""
        record = self._ledgers.get(key)
        if record is None:
            if self._free:
                ordinal = self._free.min()
                self._free.discard(ordinal)
            else:
                ordinal = len(self._ordinals)
                if ordinal >= MAX_LEDGERS:
                    raise ValueError(f"more than {MAX_LEDGERS} ledgers with pending ids")
                if ordinal > self._layout.low and self._layout.bits < _MAX_LOW_BITS:
                    self._relayout(ordinal.bit_length())  # the low ordinal bits are all taken
                self._ordinals.append(None)
            base = self._layout.base(ordinal)
            registry = self._registry
            if registry is not None:  # held there too; the key object is the registry's (one a ledger)
                key = registry.key(registry.acquire(key))
            serial, self._serial = self._serial, (self._serial + 1) & _SERIAL_MASK
            record = self._ledgers[key] = self._ordinals[ordinal] = _Ledger(key, base, serial)
        return record

    def _narrow_if_sparse(self) -> None:
        """Give the shared bitmaps fewer low ordinal bits once the ledgers with ids pending have fallen to
        a quarter of what the bits number (or to one): see ``_narrow_at``. O(1), or a :meth:`_relayout`."""
        ledgers = len(self._ledgers)
        if ledgers <= self._narrow_at:
            self._relayout(ledgers.bit_length() if ledgers > 1 else 0)

    def _relayout(self, bits: int) -> None:
        """Re-encode every shared bitmap with ``bits`` low ordinal bits; when ordinals have holes (freed
        ledgers), first renumber the ledgers 0..L-1 so that the fewer bits number them. O(ids in shared
        bitmaps) numpy/CRoaring work plus O(ledgers) Python work.

        Why it is rare (amortized): the bits grow by one when a new ledger needs the ordinal ``2**b`` —
        the ledgers with ids pending doubled since the bits last grew —, and shrink when those ledgers
        fall to a quarter of ``2**b`` (to the bits that number them with room to spare, so that a few
        new ledgers do not grow them again at once). Between two re-encodings the number of ledgers with
        ids pending changes by a factor of 2 or more, so while L ledgers come and go the shared bitmaps
        are re-encoded O(log L) times; a steady set of ledgers (a topic's ledger rolling over to the next)
        re-encodes them never, or once per roll-over at one topic (1 to 2 ledgers). Each re-encoding
        touches only the small slots (< :data:`PROMOTE_AT` ids each, in shared bitmaps); large slots
        keep bitmaps of their own, which know nothing of ordinals.
        """
        old, new = self._layout, _Layout(bits)
        records = [record for record in self._ordinals if record is not None]
        renumbered: npt.NDArray[np.uint64] | None = None
        if len(records) < len(self._ordinals):
            renumbered = np.zeros(len(self._ordinals), dtype=np.uint64)
            renumbered[[old.ordinal(record.base) for record in records]] = np.arange(
                len(records), dtype=np.uint64
            )
        # One numpy pass over every shared bitmap's codes, not one per bucket: with one id per bucket
        # (M = 1) the per-call overhead of a bucket-by-bucket re-encoding dominated add_many.
        shared = [(bucket, slots) for bucket, slots in self._schedule.items() if slots.packed]
        if shared:
            parts = [_array_of(slots.packed, np.uint64) for _, slots in shared]  # type: ignore[arg-type]
            ordinals, entries = old.decode(np.concatenate(parts))
            if renumbered is not None:
                ordinals = renumbered[ordinals]
            codes = np.frombuffer(new.encode(ordinals, entries), dtype=np.uint64)
            start = 0
            for (bucket, slots), part in zip(shared, parts, strict=True):
                end = start + len(part)
                slots.packed = BitMap64(array("Q", codes[start:end].tobytes()))
                start = end
                if bucket != self._slot_bucket:
                    self._cold[bucket] = None  # built anew: compact() shrinks it (and memory_usage knows)
        self._layout = new
        self._narrow_at = max(1, 1 << bits >> 2) if bits else -1  # ledgers at which to narrow again
        if renumbered is not None:
            self._ordinals = list(records)
            self._free = BitMap()
            for ordinal, record in enumerate(records):
                record.base = new.base(ordinal)
        else:
            for record in records:
                record.base = new.base(old.ordinal(record.base))

    def _release(self, record: _Ledger) -> None:
        """The ledger has nothing pending: forget it and free its ordinal for reuse. O(log ledgers)."""
        del self._ledgers[record.key]
        if self._registry is not None:
            self._registry.release(self._registry.ordinals[record.key])
        ordinal = self._layout.ordinal(record.base)
        self._ordinals[ordinal] = None
        self._free.add(ordinal)

    def _decode_union(self, packed: list[BitMap64]) -> dict[LedgerKey, npt.NDArray[np.uint32]]:
        """Ledger key → sorted unique entry ids in the union of shared bitmaps. One CRoaring union, then
        O(ids log ids) numpy and O(1) Python work per ledger."""
        union = packed[0] if len(packed) == 1 else BitMap64.union(*packed)
        codes = _array_of(union, np.uint64)
        if not len(codes):
            return {}
        if len(self._ledgers) == 1:  # one ledger pending (one topic, in order): no grouping to do
            (key,) = self._ledgers
            return {key: self._layout.entries(codes)}
        ordinals, entries = self._layout.decode(codes)
        ordinals_ = self._ordinals
        first = int(ordinals[0])
        if bool((ordinals == ordinals[0]).all()):  # one ledger: codes are sorted by entry id already
            record = ordinals_[first]
            assert record is not None
            return {record.key: entries}
        # Codes of one ledger are sorted by entry id; a stable sort by ordinal keeps that order.
        order = np.argsort(ordinals, kind="stable")
        ordinals, entries = ordinals[order], entries[order]
        starts = np.flatnonzero(ordinals[1:] != ordinals[:-1]) + 1
        bounds = [0, *starts.tolist(), len(ordinals)]
        out: dict[LedgerKey, npt.NDArray[np.uint32]] = {}
        for ordinal, start, end in zip(ordinals[bounds[:-1]].tolist(), bounds[:-1], bounds[1:], strict=True):
            record = ordinals_[ordinal]
            assert record is not None
            out[record.key] = entries[start:end]
        return out

    def _pop_members(self, bucket: int, slots: _Bucket, out: dict[int, dict[int, dict[int, int]]]) -> None:
        """Pop the batch members of a due bucket into ``out`` (serial → bucket → {entry id: mask}).
        O(ids in the bucket) Python work: the members are found by the bucket's ids."""
        members, ledgers = self._members, self._ledgers
        found: list[tuple[_Ledger, list[int]]] = [
            (ledgers[key], _as_array(entries).tolist()) for key, entries in slots.items()
        ]
        if slots.packed is not None:
            ordinals, entries = self._layout.decode(_array_of(slots.packed, np.uint64))
            for ordinal, entry_id in zip(ordinals.tolist(), entries.tolist(), strict=True):
                record = self._ordinals[ordinal]
                assert record is not None
                found.append((record, [entry_id]))
        prefix, dense = bucket << 32, self._dense
        for record, entry_ids in found:
            masks = out.setdefault(record.serial, {}).setdefault(bucket, {})
            bits = dense.pop(bucket << _SERIAL_BITS | record.serial, None) if dense else None
            for value in bits or ():
                entry_id = value >> MEMBER_BITS
                masks[entry_id] = masks.get(entry_id, 0) | 1 << (value & (_NARROW_INDEXES - 1))
            if members:
                for entry_id in entry_ids:
                    mask = members.pop((prefix | entry_id) << _SERIAL_BITS | record.serial, None)
                    if mask is not None:
                        masks[entry_id] = masks.get(entry_id, 0) | mask
        slots.members = 0

    def _due_members(
        self,
        record: _Ledger,
        gone: int,
        masks_at: dict[int, dict[int, int]],
        due_map: dict[int, _Bucket],
        parts: list[tuple[int, Entries | int]] | None,
    ) -> dict[int, tuple[int, ...]]:
        """The partially due entries of a ledger whose first ``gone`` slots are due, given the due slots'
        batch members (``masks_at``: bucket → {entry id: mask}, see ``_pop_members``): entry id → due
        batch indexes, for entries not due as a whole in any due slot. O(due slots + partial entries ×
        due slots)."""
        first = record.head
        slot_masks = [(bucket, masks_at.get(bucket)) for bucket in record.buckets[first : first + gone]]
        own = {bucket: _Run(e) if isinstance(e, int) else e for bucket, e in parts or ()}
        merged: dict[int, int] = {}
        for _, masks in slot_masks:
            if masks is not None:
                for entry_id, mask in masks.items():
                    merged[entry_id] = merged.get(entry_id, 0) | mask
        partial: dict[int, tuple[int, ...]] = {}
        for entry_id, mask in sorted(merged.items()):
            whole = False
            for bucket, masks in slot_masks:
                if masks is not None and entry_id in masks:
                    continue
                entries = own.get(bucket)
                if entries is not None:
                    whole = entry_id in entries
                else:
                    shared = due_map[bucket].packed
                    whole = shared is not None and (record.base | entry_id << self._layout.bits) in shared
                if whole:
                    break
            if not whole:
                partial[entry_id] = tuple(batch_indexes(mask))
        return partial

    def _unlink_first(self, record: _Ledger, count: int) -> None:
        """Forget the ledger's ``count`` earliest slots (they were popped). Amortized O(count)."""
        if count >= len(record):
            self._release(record)
        else:
            record.drop_first(count)

    def _unlink(self, record: _Ledger, i: int) -> None:
        """Forget the ledger's slot at position ``i`` (the bucket is the caller's job). O(1) for the first
        slot, else O(B_l)."""
        if len(record) == 1:
            self._release(record)
        elif i == record.head:
            record.drop_first(1)
        else:
            record.delete(i)

    def _drop_bucket_if_empty(self, bucket: int, slots: _Bucket) -> None:
        if slots.packed is not None and not slots.packed:
            slots.packed = None
        if slots.packed is None and not slots:
            del self._schedule[bucket]
            self._times.discard(bucket)
            self._cold.pop(bucket, None)

    def _discard(self, record: _Ledger, bucket: int, entry_id: int) -> None:
        """Remove every pending part of ``entry_id`` from the ledger's slot at ``bucket``. O(log B_l)."""
        key = record.key
        slots: _Bucket = self._schedule[bucket]
        if slots.members:
            self._set_mask(bucket, record, entry_id, 0)
        self._count -= 1
        i = record.position(bucket)
        sizes = record.sizes
        if sizes is None or sizes[i] == _OWN:
            entries = slots.own(key)
            if len(entries) == 1:
                del slots[key]
                if self._dense and self._dense.pop(bucket << _SERIAL_BITS | record.serial, None) is not None:
                    slots.members -= 1
                self._unlink(record, i)
                self._drop_bucket_if_empty(bucket, slots)
                return
            if isinstance(entries, _Run):
                entries = slots[key] = entries.to_bitmap()
            entries.discard(entry_id)
        else:
            assert slots.packed is not None
            slots.packed.discard(record.base | entry_id << self._layout.bits)
            size = sizes[i] - 1
            if not size:
                if self._dense and self._dense.pop(bucket << _SERIAL_BITS | record.serial, None) is not None:
                    slots.members -= 1
                self._unlink(record, i)
                self._drop_bucket_if_empty(bucket, slots)
                return
            sizes[i] = size
        record.mins = None  # the slot's smallest entry may have changed

    def _member_mask(self, bucket: int, record: _Ledger, entry_id: int) -> int | None:
        """The batch indexes of ``entry_id`` pending in the ledger's slot at ``bucket`` (which holds the
        entry), or None if the whole entry is pending there. O(1)."""
        mask = self._members.get(_member_key(bucket, record, entry_id)) if self._members else None
        bits = self._dense.get(bucket << _SERIAL_BITS | record.serial) if self._dense else None
        if bits and entry_id < _NARROW_ENTRIES:
            narrow = bits.mask(entry_id)
            if narrow:
                mask = (mask or 0) | narrow
        return mask

    def _set_mask(self, bucket: int, record: _Ledger, entry_id: int, mask: int) -> None:
        """Make ``mask`` the batch indexes of ``entry_id`` pending in the ledger's slot at ``bucket`` (0:
        none: the entry is pending whole there, or not at all). O(log members + batch indexes)."""
        slots: _Bucket = self._schedule[bucket]
        bits = self._dense.get(bucket << _SERIAL_BITS | record.serial) if self._dense else None
        if bits is not None and entry_id < _NARROW_ENTRIES:
            bits.replace(entry_id, batch_indexes(mask & _NARROW_MASK))
            mask &= ~_NARROW_MASK
        key = _member_key(bucket, record, entry_id)
        if mask:
            if key not in self._members:
                slots.members += 1
            self._members[key] = _member_mask(mask)
        elif self._members and self._members.pop(key, None) is not None:
            slots.members -= 1

    def _add_member(self, entry_id: int, batch_index: int) -> None:
        """Mark one batch message of an entry of the cached slot pending (the entry is in the slot). A
        slot with a bitmap of its own keeps its members in a bitmap too (see ``_dense``). O(1)."""
        bucket, record, slots = self._slot_bucket, self._slot_record, self._slot_slots
        assert bucket is not None and record is not None and slots is not None
        if self._slot_own is not None and entry_id < _NARROW_ENTRIES and batch_index < _NARROW_INDEXES:
            slot = bucket << _SERIAL_BITS | record.serial
            bits = self._dense.get(slot)
            if bits is None:
                bits = self._dense[slot] = _NarrowMembers()
                slots.members += 1
            bits.add(entry_id << MEMBER_BITS | batch_index)
            return
        key = _member_key(bucket, record, entry_id)
        mask = self._members.get(key)
        if mask is None:
            slots.members += 1
            self._members[key] = 1 << batch_index
        else:
            self._members[key] = _member_mask(mask | 1 << batch_index)

    def _holding(self, record: _Ledger, entry_id: int) -> list[int]:
        """Bucket times (ascending) of every slot of this ledger that holds ``entry_id``."""
        if entry_id > record.hi or entry_id < record.lo:
            return []
        if record.stale:
            record.refresh_bounds(self._schedule, self._layout)
            if entry_id > record.hi or entry_id < record.lo:
                return []
        if not 0 <= entry_id <= MAX_ENTRY_ID:
            return []
        schedule, key, buckets, sizes = self._schedule, record.key, record.buckets, record.sizes
        layout = self._layout
        code = record.base | entry_id << layout.bits
        out = []
        for i in record.candidates(schedule, layout, entry_id):
            bucket = buckets[i]
            slots = schedule[bucket]
            if sizes is None or sizes[i] == _OWN:
                if slots.holds(key, entry_id):
                    out.append(bucket)
            elif slots.packed is not None and code in slots.packed:  # None: a new slot, still empty
                out.append(bucket)
        return out

    # -- internals: the add path ------------------------------------------------------------------

    def _forget_slot(self) -> None:
        """Drop the add path's cache of the last (bucket, ledger) slot; its bucket becomes cold."""
        left: int | None = getattr(self, "_slot_bucket", None)
        if left is not None and left in self._schedule:
            self._cold[left] = None
        self._slot_bucket: int | None = None
        self._slot_ledger: int | None = None
        self._slot_topic: str | None = None
        self._slot_record: _Ledger | None = None
        self._slot_slots: _Bucket | None = None
        self._slot_pos = 0  # the slot's position in its ledger's arrays
        self._slot_own: BitMap | None = None  # the slot's own bitmap, or None: it is packed
        self._slot_is_last = False  # the slot is its ledger's latest

    def _select(self, bucket: int, ledger_id: int, topic: str) -> None:
        """Find or create the slot (bucket, ledger) and make it the cached one. O(log B + log B_l)."""
        bucket = _check_due(bucket, "due_ms")
        ledger_id = _ledger(ledger_id)
        if not isinstance(topic, str):
            raise TypeError(f"topic must be a str, got {type(topic).__name__}")
        if self._slot_bucket is not None and self._slot_bucket != bucket:
            self._cold[self._slot_bucket] = None
        record = self._ledger_record(_key(ledger_id, topic))
        key = record.key
        slots: _Bucket | None = self._schedule.get(bucket)
        if slots is None:
            slots = self._schedule[bucket] = _Bucket()
            self._times.add(bucket)
        buckets = record.buckets
        n = len(buckets)
        if n > record.head and buckets[-1] == bucket:
            i = n - 1
        else:
            i = bisect_left(buckets, bucket, record.head)
            if i == n or buckets[i] != bucket:
                record.insert(i, bucket)
                n += 1
        own: BitMap | None = None
        if record.is_own(i):
            entries = slots.own(key)
            if isinstance(entries, _Run):
                entries = slots[key] = entries.to_bitmap()  # thaw: ids arrive again
            own = entries
        self._slot_bucket = bucket
        self._slot_ledger = ledger_id
        self._slot_topic = topic
        self._slot_record = record
        self._slot_slots = slots
        self._slot_pos = i
        self._slot_own = own
        self._slot_is_last = i == n - 1

    def _slot_empty(self) -> bool:
        record = self._slot_record
        if record is None:
            return False
        if self._slot_own is not None:
            return not self._slot_own
        sizes = record.sizes
        assert sizes is not None  # a slot in the shared bitmap
        return sizes[self._slot_pos] == 0

    def _drop_if_empty(self) -> None:
        """Drop the cached slot if nothing went into it (an add that turned out to be a no-op)."""
        if self._slot_empty():
            self._drop_cached_slot()
            self._forget_slot()

    def _drop_cached_slot(self) -> None:
        record, slots, bucket = self._slot_record, self._slot_slots, self._slot_bucket
        assert record is not None and slots is not None and bucket is not None
        if self._slot_own is not None:
            del slots[record.key]
        self._unlink(record, self._slot_pos)
        self._drop_bucket_if_empty(bucket, slots)

    def _reject(self, error: Exception) -> NoReturn:
        """Raise ``error`` for bad input, first dropping the cached slot if it is a new, empty one."""
        if self._slot_empty():
            self._drop_cached_slot()
        self._forget_slot()
        raise error

    def _put(self, entry_id: int) -> bool:
        """Put a whole entry into the cached slot if it is not there; True if it was new. O(1), or O(P)
        when the slot moves to its own bitmap."""
        if not 0 <= entry_id <= MAX_ENTRY_ID:
            self._reject(_bad_entry(entry_id))
        record = self._slot_record
        assert record is not None
        own = self._slot_own
        if own is None:
            sizes = record.sizes
            assert sizes is not None  # a slot in the shared bitmap
            if sizes[self._slot_pos] + 1 >= self._promote_at:
                self._promote()
                own = self._slot_own
        if own is not None:
            if entry_id in own:
                return False
            own.add(entry_id)
        else:
            slots = self._slot_slots
            assert slots is not None
            packed = slots.packed
            if packed is None:
                packed = slots.packed = BitMap64()
            code = record.base | entry_id << self._layout.bits
            if code in packed:
                return False
            packed.add(code)
            assert sizes is not None
            sizes[self._slot_pos] += 1
        self._count += 1
        record.widen(entry_id, self._slot_is_last)
        return True

    def _promote(self) -> None:
        """Move the cached packed slot's ids into a bitmap of its own. O(P)."""
        record, slots = self._slot_record, self._slot_slots
        assert record is not None and slots is not None
        own = BitMap()
        packed = slots.packed
        sizes = record.sizes
        assert sizes is not None  # a slot in the shared bitmap
        size = sizes[self._slot_pos]
        if packed is not None and size and len(packed) == size:  # the slot is all of the bitmap
            own.update(_u32(self._layout.entries(_array_of(packed, np.uint64))))
            slots.packed = None
        elif packed is not None and size:
            codes = _array_of(packed, np.uint64)
            mine = self._layout.mine(codes, record.base)
            own.update(_u32(self._layout.entries(mine)))
            if len(mine) == len(codes):
                packed.clear()
            else:
                packed.difference_update(BitMap64(array("Q", mine.tobytes())))
            if not packed:
                slots.packed = None
        slots[record.key] = own
        sizes[self._slot_pos] = _OWN
        record.mins = None
        self._slot_own = own
        if slots.members and self._members:  # its members move to a bitmap too (see _dense)
            bucket = self._slot_bucket
            assert bucket is not None
            for entry_id in own.to_array().tolist():  # (fewer than promote_at)
                mask = self._members.get(_member_key(bucket, record, entry_id))
                if mask is not None and mask & _NARROW_MASK:
                    self._set_mask(bucket, record, entry_id, 0)
                    for index in batch_indexes(mask):
                        self._add_member(entry_id, index)

    def _add_checked(self, entry_id: int, batch_index: int) -> None:
        """The general add into the cached slot: dedupe against every bucket of the ledger."""
        bucket, record = self._slot_bucket, self._slot_record
        assert bucket is not None and record is not None
        if not 0 <= entry_id <= MAX_ENTRY_ID:
            self._reject(_bad_entry(entry_id))
        batch_index = self._checked_batch_index(batch_index)
        key = record.key
        for other in self._holding(record, entry_id):
            mask = self._member_mask(other, record, entry_id)
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
                    self._set_mask(other, record, entry_id, mask)
                    continue
            elif other < bucket:
                continue  # some messages become due earlier than the whole entry; keep them
            # The pending id at `other` is later than (or covered by) this one: move it here.
            self._discard(record, other, entry_id)
        # _discard may have emptied the cached slot, or shifted the ledger's arrays: select it again.
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
        bucket, record, slots = self._slot_bucket, self._slot_record, self._slot_slots
        assert bucket is not None and record is not None and slots is not None
        if self._put(entry_id):
            if batch_index >= 0:
                self._add_member(entry_id, batch_index)
            return
        if not slots.members or self._member_mask(bucket, record, entry_id) is None:
            return  # whole entry already here
        if batch_index < 0:
            self._set_mask(bucket, record, entry_id, 0)  # the whole entry now covers its messages
        else:
            self._add_member(entry_id, batch_index)

    def _add_run(
        self,
        bucket: int,
        ledger_id: int,
        topic: str,
        run: npt.NDArray[np.uint32],
        known: dict[LedgerKey, BitMap],
    ) -> None:
        """Add sorted unique entry ids of one (bucket, ledger) run; ids maybe pending already go the
        per-id way. ``known`` holds, per ledger, a superset of its pending ids, gathered once per
        :meth:`add_many` call when a run first overlaps the ledger's pending range (O(B_l + P) then) and
        kept up to date, so that each run costs O(len(run)) in CRoaring."""
        self._select(bucket, ledger_id, topic)
        record = self._slot_record
        assert record is not None
        lo, hi = int(run[0]), int(run[-1])
        fresh: npt.NDArray[np.uint32] = run
        repeated: BitMap | None = None
        pending = known.get(record.key)
        overlaps = record.lo <= record.hi and not (lo > record.hi or hi < record.lo)
        if pending is None and overlaps and len(record) > 1:
            pending = known[record.key] = self._ledger_ids(record)
        if pending is not None:
            incoming = BitMap(_u32(run))
            repeated = incoming & pending
            if repeated:
                fresh = _array_of(incoming - repeated, np.uint32)
            pending |= incoming
        if len(fresh):
            self._put_many(fresh)
            slots = self._slot_slots
            assert slots is not None
            if slots.members:
                for entry_id in fresh.tolist():  # the whole entry covers its messages
                    self._set_mask(bucket, record, entry_id, 0)
            record.widen(int(fresh[0]), self._slot_is_last)
            record.widen(int(fresh[-1]), self._slot_is_last)
        if repeated:
            for entry_id in repeated:  # maybe pending elsewhere (or already here)
                self._select(bucket, ledger_id, topic)
                self._add_checked(entry_id, -1)
            # (without repeated ids the slot is still the cached one, and the fresh ids are in it)
            self._select(bucket, ledger_id, topic)
            self._drop_if_empty()

    def _add_members(
        self,
        buckets: npt.NDArray[np.int64],
        ledgers: npt.NDArray[np.int64],
        entries: npt.NDArray[np.uint32],
        indexes: npt.NDArray[np.int64],
        topic: str,
    ) -> None:
        """(Lock held.) :meth:`add_many`'s batch messages, as :meth:`add` one by one, in bulk. Earliest due
        wins, so the state after the adds does not depend on their order: each message at its earliest
        bucket of the call, unless its entry is pending whole no later, or the message on its own no
        later; a copy of it pending later is taken out. Then the messages are filed slot by slot — one
        ``_put_many`` and one member update per (bucket, ledger) — where one by one each message walked
        every slot of its ledger (a restored snapshot's batch entries, whose messages spread over many
        buckets: ~35 µs a message). O(n log n) numpy, O(1) Python per slot and per entry of a slot, plus,
        per ledger with ids pending in the entries' range, O(B_l + P) to gather them once and, for each
        entry it has parts of, the walk of :meth:`parts` (O(B_l) probes: once an entry, not a message)."""
        if int(indexes.max()) > MAX_BATCH_INDEX:
            raise ValueError(f"batch_indexes values must be -1..{MAX_BATCH_INDEX}")
        # By ledger, entry, batch index, bucket: each message's first row is its earliest.
        order = np.lexsort((buckets, indexes, entries, ledgers))
        b, led, e, i = buckets[order], ledgers[order], entries[order], indexes[order]
        first = np.ones(len(e), dtype=bool)
        first[1:] = (led[1:] != led[:-1]) | (e[1:] != e[:-1]) | (i[1:] != i[:-1])
        b, led, e, i = b[first], led[first], e[first], i[first]
        keep = np.ones(len(e), dtype=bool)
        starts = np.flatnonzero(led[1:] != led[:-1]) + 1
        for start, end in zip([0, *starts.tolist()], [*starts.tolist(), len(e)], strict=True):
            ledger_id = int(led[start])
            record = self._ledgers.get(_key(ledger_id, topic))
            if record is None or int(e[end - 1]) < record.lo or int(e[start]) > record.hi:
                continue  # nothing pending in the ledger within the entries' range
            pending = np.isin(e[start:end], _array_of(self._ledger_ids(record), np.uint32))
            if pending.any():
                rows = np.flatnonzero(pending) + start
                self._settle(ledger_id, topic, rows, b, e, i, keep)
        if not keep.all():
            b, led, e, i = b[keep], led[keep], e[keep], i[keep]
            if not len(e):
                return
        # By ledger, bucket, entry, batch index: one slot a run, one entry a sub-run.
        order = np.lexsort((i, e, b, led))
        b, led, e, i = b[order], led[order], e[order], i[order]
        slot_starts = np.flatnonzero((led[1:] != led[:-1]) | (b[1:] != b[:-1])) + 1
        entry_heads = np.ones(len(e), dtype=bool)  # a slot's first row of each entry
        entry_heads[1:] = e[1:] != e[:-1]
        entry_heads[slot_starts] = True
        for start, end in zip([0, *slot_starts.tolist()], [*slot_starts.tolist(), len(e)], strict=True):
            bucket = int(b[start])
            self._select(bucket, int(led[start]), topic)
            record, slots = self._slot_record, self._slot_slots
            assert record is not None and slots is not None
            slot_entries, slot_indexes = e[start:end], i[start:end]
            unique = slot_entries[entry_heads[start:end]]
            self._put_many(unique)  # (an entry may be here already, with other messages: kept)
            record.widen(int(unique[0]), self._slot_is_last)
            record.widen(int(unique[-1]), self._slot_is_last)
            if self._slot_own is not None:
                # A slot with a bitmap of its own keeps narrow members in a bitmap (see _add_member).
                narrow = (slot_entries < _NARROW_ENTRIES) & (slot_indexes < _NARROW_INDEXES)
                if narrow.any():
                    key = bucket << _SERIAL_BITS | record.serial
                    bits = self._dense.get(key)
                    if bits is None:
                        bits = self._dense[key] = _NarrowMembers()
                        slots.members += 1
                    codes = slot_entries[narrow] << np.uint32(MEMBER_BITS)
                    bits.update(codes | slot_indexes[narrow].astype(np.uint32))
                    if narrow.all():
                        continue
                    slot_entries, slot_indexes = slot_entries[~narrow], slot_indexes[~narrow]
            members = self._members
            for entry_id, mask in zip(*_entry_masks(slot_entries, slot_indexes), strict=True):
                key = _member_key(bucket, record, entry_id)
                have = members.get(key)
                if have is None:
                    slots.members += 1
                members[key] = _member_mask(mask if have is None else have | mask)

    def _settle(
        self,
        ledger_id: int,
        topic: str,
        rows: npt.NDArray[np.intp],
        buckets: npt.NDArray[np.int64],
        entries: npt.NDArray[np.uint32],
        indexes: npt.NDArray[np.int64],
        keep: npt.NDArray[np.bool_],
    ) -> None:
        """(Lock held.) ``_add_members``' rows (one per message, by entry) of entries the ledger has parts
        of, against those parts, as :meth:`add` would: a message the whole entry or its own copy covers
        no later is dropped (``keep``), a copy of it pending later is taken out of its slot (the slot
        forgets the entry when that was its last part there). O(B_l) probes per entry (its parts)."""
        key = _key(ledger_id, topic)
        row_list = rows.tolist()
        entry_list = entries[rows].tolist()
        bucket_list = buckets[rows].tolist()
        index_list = indexes[rows].tolist()
        self._forget_slot()
        n, at = len(row_list), 0
        while at < n:
            entry_id = entry_list[at]
            upto = at
            while upto < n and entry_list[upto] == entry_id:
                upto += 1
            record = self._ledgers[key]  # (again for each entry: a discard may have released it)
            whole: int | None = None
            where: dict[int, int] = {}  # batch index → bucket of its pending copy
            masks_at: dict[int, int] = {}
            for other in self._holding(record, entry_id):
                mask = self._member_mask(other, record, entry_id)
                if mask is None:
                    whole = other if whole is None else min(whole, other)
                    continue
                masks_at[other] = mask
                while mask:  # (its set bits, lowest first: O(bits set), where batch_indexes is O(highest))
                    low = mask & -mask
                    where[low.bit_length() - 1] = other
                    mask ^= low
            out: dict[int, int] = {}  # bucket → batch indexes to take out of its slot
            for row in range(at, upto):
                bucket, index = bucket_list[row], index_list[row]
                copy = where.get(index)
                if (whole is not None and whole <= bucket) or (copy is not None and copy <= bucket):
                    keep[row_list[row]] = False  # covered, no later than asked
                elif copy is not None:
                    out[copy] = out.get(copy, 0) | 1 << index  # pending later: it moves here
            for other, bits in out.items():
                mask = masks_at[other] & ~bits
                if mask:
                    self._set_mask(other, record, entry_id, mask)
                else:
                    self._discard(record, other, entry_id)
            at = upto

    def _ledger_ids(self, record: _Ledger) -> BitMap:
        """Every entry id the ledger has pending, in any slot. O(B_l) bitmap unions plus O(P) numpy work
        per bucket of its shared slots."""
        ids = BitMap()
        shared: list[BitMap64] = []
        for i in range(record.head, len(record.buckets)):
            slots: _Bucket = self._schedule[record.buckets[i]]
            if record.is_own(i):
                ids |= _as_bitmap(slots.own(record.key))
            elif slots.packed is not None:
                shared.append(slots.packed)
        if shared:
            codes = _array_of(BitMap64.union(*shared) if len(shared) > 1 else shared[0], np.uint64)
            layout = self._layout
            ids.update(_u32(layout.entries(layout.mine(codes, record.base))))
        return ids

    def _put_many(self, fresh: npt.NDArray[np.uint32]) -> None:
        """Put sorted unique whole entries (none pending in another slot) into the cached slot."""
        record, slots = self._slot_record, self._slot_slots
        assert record is not None and slots is not None
        own = self._slot_own
        if own is None:
            sizes = record.sizes
            assert sizes is not None  # a slot in the shared bitmap
            size = sizes[self._slot_pos]
            if size + len(fresh) >= self._promote_at:
                self._promote()
                own = self._slot_own
            else:
                packed = slots.packed
                if packed is None:
                    packed = slots.packed = BitMap64()
                before = len(packed)
                if len(fresh) == 1:  # (one id per run, as at M = 1: no numpy round-trip for it)
                    packed.add(int(fresh[0]) << self._layout.bits | record.base)
                else:
                    packed.update(self._layout.codes(record.base, fresh))
                added = len(packed) - before
                sizes[self._slot_pos] = size + added
                self._count += added
                return
        assert own is not None
        before = len(own)
        own.update(_u32(fresh))
        self._count += len(own) - before


class TimeBucketIndex:
    """Pending nacks by due time: ``bucket_ms → ledger → entry ids``, as in Apache Pulsar's PIP-393.

    ``precision_bits`` (0..30) is *k*: due times are trimmed to multiples of ``2**k`` ms. ``rounding``
    ``"floor"`` (Java's behaviour) puts an id in the bucket at or before its due time, so it may fire up to
    ``2**k - 1`` ms early and never late; ``"ceil"`` uses the bucket at or after it: never early, up to
    ``2**k - 1`` ms late.

    Two tiers hold the ids, under one lock:

    * the *live* tier (``_HotIndex``): buckets still receiving ids, and dense buckets (a slot of
      :data:`PROMOTE_AT` ids or more) — Roaring bitmaps per slot, shared bitmaps per bucket;
    * the *packed* tier (:class:`~pulsar_nack.packed.PackedStore`): buckets the add path has left whose
      slots are all small, moved there by :meth:`compact` — ~8 bytes a row and a few bytes of membership
      bitmap, no object per bucket or slot (one or two ids a bucket at k = 0 or with long,
      sparse delays cost ~300 bytes an id as bucket and slot objects).

    An entry may have parts in both tiers (other buckets); a (bucket, entry) pair is in one of them. An
    add, re-nack or remove of an entry the packed tier holds first takes its packed parts back into the
    live tier (``_thaw``), where the usual dedupe (earliest due wins) applies.

    In front of both, a *staging log*: a fresh id (``add(..., fresh=True)``, the nack path) is appended
    to two flat arrays — its bucket time and its packed-tier code (ledger ordinal, entry id, batch slot)
    — and filed in the tiers later, in bulk (``_unstage``): by the timer's :meth:`compact` (~1 s after
    nacks, in the tracker), by a :meth:`pop_due` that reaches its earliest bucket, by any other read or
    non-fresh add (each reader sees staged ids: it files them first), or by the nack path itself once
    :data:`STAGE_UP_TO` rows wait. In bulk, a bucket whose every slot is small goes straight to the
    packed tier (what :meth:`compact` would do with it later), others to the live tier (``add_many``):
    a nack that opens a slot costs an append, not a slot's lookups and objects — most of a nack's cost in
    the sparse shapes, every nack its own bucket and slot (``bench/nack_path.py``). The second and later
    nacks of a burst into one slot go to the live tier at once (its cached slot takes them cheaper).

    Complexity: as ``_HotIndex`` for the live tier, plus — when the packed tier holds anything — O(1) per
    :meth:`add` for the membership test (a fresh id: O(1), an append, and its amortized share of the bulk
    filing: O(log n) numpy, plus what the live tier's ``add_many`` costs for ids of dense buckets; else
    a dict and a bitmap probe), and O(n_p) numpy (n_p = packed rows)
    for an add, :meth:`due_of`, :meth:`pending_mask` or :meth:`remove` of an entry the packed tier holds;
    :meth:`pop_due` O(log n_p + due) per packed run; :meth:`next_due_ms` O(runs);
    :attr:`bucket_count` O(n_p) numpy when the packed tier changed since the last call, else O(live
    buckets log n_p).
    """

    def __init__(
        self,
        precision_bits: int = 8,
        rounding: Rounding = "floor",
        *,
        promote_at: int = PROMOTE_AT,
        pack_below: int = PROMOTE_AT,
        ledgers: LedgerRegistry | None = None,
        stage_up_to: int = STAGE_UP_TO,
    ) -> None:
        """``promote_at`` (1..254): a slot with this many ids moves from its bucket's shared bitmap to a
        bitmap of its own; 1 gives every slot its own bitmap from its first id. ``pack_below`` (>= 0):
        :meth:`compact` moves a bucket to the packed tier when each of its slots holds fewer ids than
        this; 0 keeps every bucket in the live tier. ``ledgers``: the numbering of ledgers shared with
        others (a tracker's arrival filter): the packed tier's ordinals are its, and the live tier holds
        its ledgers there (sharing their keys); the packed tier's own if None. ``stage_up_to`` (>= 0):
        fresh ids the staging log holds before the nack path files them (see the class); 0: none staged,
        every add goes straight to the live tier. O(1)."""
        if isinstance(pack_below, bool) or not isinstance(pack_below, int) or pack_below < 0:
            raise ValueError(f"pack_below must be an int >= 0, got {pack_below!r}")
        if isinstance(stage_up_to, bool) or not isinstance(stage_up_to, int) or stage_up_to < 0:
            raise ValueError(f"stage_up_to must be an int >= 0, got {stage_up_to!r}")
        self._hot = _HotIndex(precision_bits, rounding, promote_at=promote_at, ledgers=ledgers)
        self._pack_below = pack_below
        self._mask, self._round_up = self._hot._mask, self._hot._round_up
        self._lock = threading.RLock()
        self._hot._lock = self._lock  # type: ignore[assignment]  # one lock: the live tier re-enters it
        self._packed = PackedStore(self._hot.precision_bits, ledgers)
        # The staging log (see the class): bucket times and codes of fresh ids, the ordinals it holds in
        # the registry meanwhile (a code names its ledger by ordinal), its earliest bucket.
        self._stage_up_to = stage_up_to
        self._registry = self._packed._registry
        self._ordinals = self._registry.ordinals
        self._stage_buckets: array[int] = array("q")
        self._stage_codes: array[int] = array("Q")
        self._stage_held = BitMap()
        self._staged_first = _NOT_STAGED
        self._bulk_from = _BULK_FROM
        self._last_bucket, self._last_ledger, self._last_topic = -1, -1, ""  # the slot of the last nack

    @property
    def precision_bits(self) -> int:
        """*k*: bucket times are multiples of ``2**k`` ms. O(1)."""
        return self._hot.precision_bits

    @property
    def rounding(self) -> Rounding:
        """``"floor"`` or ``"ceil"``. O(1)."""
        return self._hot.rounding

    @property
    def promote_at(self) -> int:
        """Ids at which a slot moves to a bitmap of its own. O(1)."""
        return self._hot.promote_at

    @property
    def added(self) -> int:
        """Ids accepted by :meth:`add`/:meth:`add_many` so far, repeats included. O(1)."""
        return self._hot.added

    @property
    def bucket_count(self) -> int:
        """Number of non-empty buckets. O(1) without packed ids; else see the class."""
        with self._lock:
            self._unstage()
            packed = self._packed
            live = len(self._hot._schedule)
            if not len(packed):
                return live
            count = packed.bucket_count()
            if live:
                times = np.fromiter(self._hot._schedule, np.int64, live)
                count -= int(np.isin(times, packed.bucket_times(), assume_unique=True).sum())
            return live + count

    def __len__(self) -> int:
        """Pending ids, counting an entry once per bucket (batch messages of one entry count once). O(1)
        (plus filing the staged ids, if any)."""
        with self._lock:
            self._unstage()
            return len(self._hot) + len(self._packed)

    def bucket_of(self, due_ms: int) -> int:
        """The bucket time an id due at ``due_ms`` is stored under (and popped at). O(1)."""
        return self._hot.bucket_of(due_ms)

    def next_due_ms(self) -> int | None:
        """The earliest bucket time, or None when nothing is pending. O(1) amortized, plus O(runs)."""
        with self._lock:
            live = self._hot.next_due_ms()
            staged = self._staged_first
            if staged != _NOT_STAGED and (live is None or staged < live):
                live = staged
            if not len(self._packed):
                return live
            packed = self._packed.first()
            return packed if live is None or (packed is not None and packed < live) else live

    # -- adding -------------------------------------------------------------------------------------

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
        A due time beyond :data:`MAX_DUE_MS` is filed as that one.
        Raises ``ValueError``/``TypeError`` naming the bad parameter; the index is then unchanged.
        Complexity: see the class.
        """
        lock = self._lock
        lock.acquire()  # not `with`: its __exit__ costs ~0.1 µs more (this is the nack path)
        try:
            if (
                fresh
                and self._stage_up_to
                and type(due_ms) is int
                and 0 <= due_ms <= MAX_DUE_MS
                and type(entry_id) is int
                and 0 <= entry_id <= MAX_ENTRY_ID
                and type(ledger_id) is int
                and 0 <= ledger_id <= _MAX_I64
                and type(batch_index) is int
                and -1 <= batch_index <= MAX_PACKED_INDEX
                and type(topic) is str
            ):
                # The nack path: an append to the staging log (see the class) — but for a burst into
                # one slot (a batch's messages nacked together, in-order nacks of one ledger), whose
                # second and later ids the live tier's cached slot takes at less than an append costs
                # with its share of the bulk filing.
                bucket: int = (due_ms + self._round_up) & self._mask
                last = bucket == self._last_bucket and ledger_id == self._last_ledger
                if last and topic == self._last_topic:
                    return self._add_now(due_ms, ledger_id, entry_id, batch_index, topic, True)
                self._last_bucket, self._last_ledger, self._last_topic = bucket, ledger_id, topic
                key = (topic, ledger_id) if topic else ledger_id
                ordinal = self._ordinals.get(key)
                if ordinal is None or ordinal not in self._stage_held:
                    ordinal = self._hold(key)
                if ordinal is not None:
                    self._stage_buckets.append(bucket)
                    codes = self._stage_codes
                    codes.append(
                        ordinal << _CODE_ORDINAL_SHIFT | entry_id << _CODE_SLOT_BITS | batch_index + 1
                    )
                    if bucket < self._staged_first:
                        self._staged_first = bucket
                    self._hot._added += 1
                    if len(codes) >= self._stage_up_to:
                        self._unstage()
                    return bucket
            if self._stage_codes:
                self._unstage()  # what the id may merge with is filed first (dedupe, earliest due wins)
            return self._add_now(due_ms, ledger_id, entry_id, batch_index, topic, fresh)
        finally:
            lock.release()

    def _hold(self, key: LedgerKey) -> int | None:
        """(Lock held.) Hold the ledger in the registry while the staging log names it; its ordinal, or None
        (nothing held) when it is beyond what a code can name. O(1)."""
        ordinal = self._registry.acquire(key)
        if ordinal >= MAX_ORDINALS:
            self._registry.release(ordinal)
            return None
        self._stage_held.add(ordinal)
        return ordinal

    def _add_now(
        self, due_ms: int, ledger_id: int, entry_id: int, batch_index: int, topic: str, fresh: bool
    ) -> int:
        """(Lock held.) :meth:`add` into the tiers (not staged)."""
        packed = self._packed
        if packed.newest >= 0 and len(packed):
            if type(due_ms) is not int or not 0 <= due_ms <= MAX_DUE_MS:
                due_ms = _check_due(due_ms)
            if type(entry_id) is not int or type(ledger_id) is not int:
                entry_id, ledger_id = _entry(entry_id), _ledger(ledger_id)
            # A fresh id of a bucket later than every packed one (the in-order nack) needs no look at
            # the packed tier: nothing it would merge with is pending, and its (bucket, entry) pair
            # cannot be there. Else an entry with packed parts takes them back live first.
            if (
                not (fresh and (due_ms + self._round_up) & self._mask > packed.newest)
                and type(topic) is str
                and packed.may_hold(_key(ledger_id, topic), entry_id)
            ):
                self._thaw(ledger_id, entry_id, topic)
                fresh = False  # its parts are back in the live tier: dedupe against them
        return self._hot.add(due_ms, ledger_id, entry_id, batch_index, topic, fresh)

    def flush(self) -> None:
        """File the staged ids in the tiers now (every reader does it first; the timer's :meth:`compact`
        does it ~1 s after nacks). O(staged log staged) numpy, see ``_unstage``."""
        with self._lock:
            self._unstage()

    def _unstage(self) -> None:
        """(Lock held.) File the staging log's ids in the tiers, as :meth:`add` with ``fresh`` would have
        one by one: in bulk (``_unstage_bulk``) from ``_bulk_from`` rows, else one at a time. Then the
        log's holds on ledgers go (the tiers hold what they keep). O(1) when nothing is staged."""
        codes = self._stage_codes
        if not codes:
            return
        buckets, held = self._stage_buckets, self._stage_held
        self._stage_buckets, self._stage_codes, self._stage_held = array("q"), array("Q"), BitMap()
        self._staged_first = _NOT_STAGED
        hot = self._hot
        before = hot.added  # (counted when staged)
        try:
            if len(codes) < self._bulk_from:
                key_of = self._registry.key
                for bucket, code in zip(buckets, codes, strict=True):
                    topic, ledger_id = _split_key(key_of(code >> _CODE_ORDINAL_SHIFT))
                    entry_id = code >> _CODE_SLOT_BITS & _CODE_ENTRY_MASK
                    self._add_now(bucket, ledger_id, entry_id, (code & _CODE_SLOT_MASK) - 1, topic, True)
            else:
                self._unstage_bulk(np.frombuffer(buckets, np.int64), np.frombuffer(codes, np.uint64))
        finally:
            hot._added = before
            release = self._registry.release
            for ordinal in held:
                release(ordinal)

    def _unstage_bulk(self, buckets: npt.NDArray[np.int64], codes: npt.NDArray[np.uint64]) -> None:
        """(Lock held.) File staged rows in bulk. A bucket the live tier does not have, whose every slot
        holds fewer than ``pack_below`` entries (what :meth:`compact` packs) and within the packed tier's
        span, goes to the packed tier in one run — but for the rows of entries the packed tier may hold at
        a bucket as early (they take the add path: their packed parts come back live first, a (bucket,
        entry) pair stays in one tier). The rest go to the live tier: ``add_many`` per topic, or one at a
        time when few. O(n log n) numpy plus O(1) Python per ledger, per topic and per live-bound run."""
        order = np.argsort(buckets, kind="stable")
        buckets, codes = buckets[order], codes[order]
        n = len(codes)
        packed = self._packed
        entry_codes = codes >> np.uint64(_CODE_SLOT_BITS)
        to_packed = np.zeros(n, bool)
        if self._pack_below:
            # distinct entries per (bucket, ledger) slot, the largest slot per bucket
            by_slot = np.lexsort((entry_codes, buckets))
            slot_buckets, slot_entries = buckets[by_slot], entry_codes[by_slot]
            ledgers = slot_entries >> np.uint64(32)
            bucket_change = slot_buckets[1:] != slot_buckets[:-1]
            pair = np.concatenate(([True], bucket_change | (slot_entries[1:] != slot_entries[:-1])))
            slot_starts = np.flatnonzero(
                np.concatenate(([True], bucket_change | (ledgers[1:] != ledgers[:-1])))
            )
            sizes = np.add.reduceat(pair.astype(np.int64), slot_starts)
            firsts = slot_buckets[slot_starts]
            bucket_starts = np.flatnonzero(np.concatenate(([True], firsts[1:] != firsts[:-1])))
            times = firsts[bucket_starts]  # the distinct buckets, ascending (as the rows are)
            small = np.maximum.reduceat(sizes, bucket_starts) < self._pack_below
            schedule = self._hot._schedule
            if schedule:
                small &= ~np.isin(times, np.fromiter(schedule, np.int64, len(schedule)))
            if small.any():
                small &= packed.within(times, int(times[small][0]))
            row_starts = np.flatnonzero(np.concatenate(([True], buckets[1:] != buckets[:-1])))
            to_packed = np.repeat(small, np.diff(np.append(row_starts, n)))
            if len(packed) and to_packed.any():
                early = np.flatnonzero(to_packed & (buckets <= packed.newest))
                if len(early):
                    to_packed[early[packed.may_hold_many(entry_codes[early])]] = False
            if to_packed.any():
                packed.put_rows(buckets[to_packed], codes[to_packed])
        live = ~to_packed
        count = int(live.sum())
        if not count:
            return
        buckets, codes = buckets[live], codes[live]
        key_of = self._registry.key
        if count < self._bulk_from:
            for bucket, code in zip(buckets.tolist(), codes.tolist(), strict=True):
                topic, ledger_id = _split_key(key_of(code >> _CODE_ORDINAL_SHIFT))
                entry_id = code >> _CODE_SLOT_BITS & _CODE_ENTRY_MASK
                self._add_now(bucket, ledger_id, entry_id, (code & _CODE_SLOT_MASK) - 1, topic, True)
            return
        ordinals, at = np.unique(codes >> np.uint64(_CODE_ORDINAL_SHIFT), return_inverse=True)
        keys = [_split_key(key_of(ordinal)) for ordinal in ordinals.tolist()]
        ledger_ids = np.fromiter((ledger_id for _, ledger_id in keys), np.int64, len(keys))[at]
        entry_ids = ((codes >> np.uint64(_CODE_SLOT_BITS)) & np.uint64(_CODE_ENTRY_MASK)).astype(np.uint32)
        batch_indexes = (codes & np.uint64(_CODE_SLOT_MASK)).astype(np.int64) - 1
        topics: dict[str, list[int]] = {}
        for number, (topic, _) in enumerate(keys):
            topics.setdefault(topic, []).append(number)
        for topic, numbers in topics.items():
            mine = np.isin(at, numbers) if len(topics) > 1 else slice(None)
            self._add_many_now(buckets[mine], ledger_ids[mine], entry_ids[mine], batch_indexes[mine], topic)

    def _thaw(self, ledger_id: int, entry_id: int, topic: str) -> None:
        """(Lock held.) Move an entry's packed parts back into the live tier, at their buckets. O(n_p)."""
        hot = self._hot
        before = hot.added
        for bucket, mask in self._packed.take(_key(ledger_id, topic), entry_id):
            if mask is None:
                hot.add(bucket, ledger_id, entry_id, -1, topic)
            else:
                for index in batch_indexes(mask):
                    hot.add(bucket, ledger_id, entry_id, index, topic)
        hot._added = before  # (moves, not adds)

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
        anything changes. Ids with a batch index >= 0 are filed in bulk too. Complexity: O(n) numpy
        work plus O(1) Python work per run of ids sharing bucket and ledger (batch messages: per entry of
        a run; see ``_HotIndex``), plus O(n) Python probes when the packed tier holds ids.
        """
        with self._lock:
            self._unstage()
            self._add_many_now(due_ms, ledger_ids, entry_ids, batch_indexes, topic)

    def _add_many_now(
        self, due_ms: Any, ledger_ids: Any, entry_ids: Any, batch_indexes: Any, topic: str
    ) -> None:
        """(Lock held.) :meth:`add_many` into the tiers (nothing staged in between)."""
        if len(self._packed):
            _, ledgers, entries, _ = as_id_arrays(due_ms, ledger_ids, entry_ids, batch_indexes)
            if not isinstance(topic, str):
                raise TypeError(f"topic must be a str, got {type(topic).__name__}")
            for ledger_id, entry_id in set(zip(ledgers.tolist(), entries.tolist(), strict=True)):
                if self._packed.may_hold(_key(ledger_id, topic), entry_id):
                    self._thaw(ledger_id, entry_id, topic)
        self._hot.add_many(due_ms, ledger_ids, entry_ids, batch_indexes, topic)

    # -- popping, querying, removing --------------------------------------------------------------

    def pop_due(self, now_ms: int) -> list[DueIds]:
        """Remove and return every id whose bucket time is <= ``now_ms``, one ``DueIds`` per ledger.

        Ledgers come in the order of their earliest due bucket. An entry due in several buckets comes
        once; if it is due as a whole in any of them it comes as a whole. Complexity: the live tier's
        (O(log B) plus O(due ids log due ids) numpy/CRoaring and O(1) Python per due bucket and ledger),
        plus O(log n_p + due) per packed run and O(1) Python per due packed ledger and batch member.
        """
        with self._lock:
            live, packed = self._pop_tiers(now_ms, by_bucket=False)
            if not packed:
                return [due for _, due in live]
            merged: dict[LedgerKey, tuple[int, DueIds]] = {
                _key(due.ledger_id, due.topic): (first, due) for first, due in live
            }
            for first, key, entry_ids, partial in packed:
                mine = _due_ids(key, entry_ids, partial)
                other = merged.get(key)
                merged[key] = (
                    (first, mine) if other is None else (min(first, other[0]), merge_due(other[1], mine))
                )
            return [due for _, due in sorted(merged.values(), key=_by_first)]

    def pop_due_by_bucket(self, now_ms: int) -> list[tuple[int, DueIds]]:
        """Remove every id whose bucket time is <= ``now_ms`` and return it as :meth:`pop_due` of each due
        bucket in turn would: (bucket time, one ledger's ids due in it), in bucket order. One pop of each
        tier (the timer's forward at small k covers ~68 one-ms buckets: a pop a bucket cost ~100 µs each,
        mostly fixed). Complexity: the live tier's (O(log B), plus a shared bitmap's decode and O(1) Python
        per due bucket and slot), plus the packed tier's (O(log n_p + due log due) numpy, O(1) Python per
        due (bucket, ledger) and batch member)."""
        with self._lock:
            live, packed = self._pop_tiers(now_ms, by_bucket=True)
            if not live:  # (most forwards at small k: the due buckets were packed)
                return [
                    (bucket, _due_ids(key, entry_ids, partial)) for bucket, key, entry_ids, partial in packed
                ]
            if not packed:
                return live
            groups = {(bucket, _key(due.ledger_id, due.topic)): due for bucket, due in live}
            for bucket, key, entry_ids, partial in packed:
                mine = _due_ids(key, entry_ids, partial)
                other = groups.get((bucket, key))
                groups[bucket, key] = mine if other is None else merge_due(other, mine)
            return [(bucket, due) for (bucket, _), due in sorted(groups.items(), key=_by_group_bucket)]

    def _pop_tiers(
        self, now_ms: int, by_bucket: bool
    ) -> tuple[
        list[tuple[int, DueIds]],
        list[tuple[int, LedgerKey, npt.NDArray[np.uint32], dict[int, tuple[int, ...]]]],
    ]:
        """Both tiers' pops up to ``now_ms`` (lock held; a bad ``now_ms`` raises before anything changes):
        the live tier's (first due bucket, or bucket with ``by_bucket``, and ids) and the packed tier's
        rows (:meth:`PackedStore.pop`)."""
        if type(now_ms) is not int or now_ms < 0:
            now_ms = _check_due(now_ms, "now_ms", bounded=False)
        if self._staged_first <= now_ms:
            self._unstage()
        live = self._hot.pop_due_by_bucket(now_ms) if by_bucket else self._hot.pop_due(now_ms)
        return live, self._packed.pop(now_ms, by_bucket=by_bucket) if len(self._packed) else []

    def pending_mask(self, ledger_id: int, entry_id: int, topic: str = "") -> int:
        """The batch indexes of this entry pending in any bucket, as a bitmask; -1 if the whole entry is
        pending, 0 if nothing is. Complexity as :meth:`due_of`."""
        with self._lock:
            self._unstage()
            mask = self._hot.pending_mask(ledger_id, entry_id, topic)
            if mask == -1 or not len(self._packed):
                return mask
            for _, part in self._packed.parts(_key(ledger_id, topic), entry_id):
                if part is None:
                    return -1
                mask |= part
            return mask

    def parts(self, ledger_id: int, entry_id: int, topic: str = "") -> list[tuple[int, int | None]]:
        """(bucket time, batch mask or None for the whole entry) of each bucket holding the entry, earliest
        first: what :meth:`due_of` and :meth:`pending_mask` summarize (a whole entry's messages pending
        beside it are due earlier than it). Complexity as :meth:`due_of`."""
        with self._lock:
            self._unstage()
            found = self._hot.parts(ledger_id, entry_id, topic)
            if len(self._packed):
                found = sorted(found + self._packed.parts(_key(ledger_id, topic), entry_id), key=_part_time)
            return found

    def due_of(self, ledger_id: int, entry_id: int, batch_index: int = -1, topic: str = "") -> int | None:
        """The bucket time at which this id will be popped, or None if it is not pending.

        With ``batch_index`` -1: the earliest bucket holding any part of the entry. With a batch index:
        the earliest bucket holding that message or the whole entry. Live tier: O(1) if the entry lies
        outside the ledger's pending range, O(log B_l) if the ledger's slots hold ordered ranges, else
        O(B_l) bitmap probes; packed tier: O(1), or O(n_p) numpy if the entry may be there.
        """
        with self._lock:
            self._unstage()
            due = self._hot.due_of(ledger_id, entry_id, batch_index, topic)
            if not len(self._packed):
                return due
            for bucket, mask in self._packed.parts(_key(ledger_id, topic), entry_id):  # earliest first
                if batch_index < 0 or mask is None or mask >> batch_index & 1:
                    return bucket if due is None or bucket < due else due
            return due

    def remove(self, ledger_id: int, entry_id: int, batch_index: int = -1, topic: str = "") -> bool:
        """Forget a pending id; True if something was removed. Complexity as :meth:`due_of`, plus
        O(log B_l) per live slot the id leaves.

        ``batch_index`` -1 removes every pending part of the entry. A batch index removes that message
        where it is pending on its own (a message covered by a pending whole entry stays).
        """
        with self._lock:
            self._unstage()
            removed = self._hot.remove(ledger_id, entry_id, batch_index, topic)
            if len(self._packed) and self._packed.remove(_key(ledger_id, topic), entry_id, batch_index):
                removed = True
            return removed

    def take(
        self, ledger_id: int, entry_id: int, batch_index: int = -1, topic: str = ""
    ) -> tuple[int | None, bool]:
        """:meth:`due_of` then :meth:`remove`, both answers (the due time before the removal; whether
        anything was removed), walking the entry's live buckets once where the two calls walked them
        twice. Complexity as :meth:`remove`."""
        with self._lock:
            self._unstage()
            due, removed = self._hot.take(ledger_id, entry_id, batch_index, topic)
            if not len(self._packed):
                return due, removed
            key = _key(ledger_id, topic)
            for bucket, mask in self._packed.parts(key, entry_id):  # earliest first
                if batch_index < 0 or mask is None or mask >> batch_index & 1:
                    due = bucket if due is None or bucket < due else due
                    break
            if self._packed.remove(key, entry_id, batch_index):
                removed = True
            return due, removed

    def clear(self) -> None:
        """Forget everything. O(B + ledgers) (the structures are dropped)."""
        with self._lock:
            release = self._registry.release
            for ordinal in self._stage_held:
                release(ordinal)
            self._stage_buckets, self._stage_codes, self._stage_held = array("q"), array("Q"), BitMap()
            self._staged_first = _NOT_STAGED
            self._hot.clear()
            self._packed.clear()

    @property
    def upkeep_interval_ms(self) -> None:
        """None: this index needs no periodic work but :meth:`compact`."""
        return None

    def upkeep(self, now_ms: int) -> bool:
        """Nothing to do (see :attr:`upkeep_interval_ms`); False. O(1)."""
        return False

    def close(self, now_ms: int) -> None:
        """:meth:`clear`: nothing outlives the consumer. O(B + ledgers)."""
        self.clear()

    def compact(self, max_buckets: int | None = None) -> int:
        """Compact buckets the add path has moved away from; returns how many were compacted.

        A bucket whose slots are all small (fewer than :data:`PROMOTE_AT` ids) moves to the packed tier;
        in others a bitmap of its own holding one run of consecutive ids becomes a packed int
        (``_Run``), other bitmaps are ``run_optimize``-d and ``shrink_to_fit``-ed. Adding to a compacted
        bucket later is fine. O(ids in the compacted buckets) numpy and CRoaring, plus the packed tier's
        merge (O(log n_p) amortized per row moved). Call it off the nack path, e.g. from the timer
        thread; never needed for correctness.
        """
        with self._lock:
            self._unstage()
            store = self._packed if self._pack_below else None
            done = self._hot.compact(max_buckets, store, self._pack_below)
            self._packed.flush()
            return done

    def __iter__(self) -> Iterator[tuple[int, str, int, npt.NDArray[np.uint32]]]:
        """Yield ``(bucket_ms, topic, ledger_id, entry_ids)`` per slot in bucket order (a snapshot).
        O(n + B log B)."""
        with self._lock:
            self._unstage()
            slots: dict[tuple[int, LedgerKey], npt.NDArray[np.uint32]] = {}
            for bucket, topic, ledger_id, entry_ids in self._hot:
                slots[bucket, _key(ledger_id, topic)] = entry_ids
            for bucket, key, entry_ids in self._packed.slots():
                other = slots.get((bucket, key))
                slots[bucket, key] = entry_ids if other is None else np.union1d(other, entry_ids)
            snapshot = sorted(slots.items(), key=_slot_time)
        for (bucket, key), entry_ids in snapshot:
            topic, ledger_id = _split_key(key)
            yield bucket, topic, ledger_id, entry_ids

    def structure(self) -> dict[str, int]:
        """The live tier's shape (see ``_HotIndex.structure``: ``buckets`` and ``slots`` there are the
        live tier's) and the packed tier's (``packed_ids``, ``packed_rows``, ``packed_runs``,
        ``packed_ledgers``). O(live slots + containers + packed runs)."""
        with self._lock:
            self._unstage()
            return self._hot.structure() | self._packed.structure()

    def memory_usage(self) -> MemoryUsage:
        """Bytes held by the index: Python objects at the sizes the allocator hands out
        (:func:`~pulsar_nack.memory.python_bytes`) and CRoaring's C heap, by part (``packed``: the packed
        tier). O(objects in the live tier + Roaring containers + packed runs and ledgers).

        Shared objects (a bucket's int key stored in several places, a topic string) count once; small
        ints that CPython caches count nothing.
        """
        with self._lock:
            self._unstage()
            live = self._hot._walk_memory()
            python, roaring = self._packed.memory_bytes()
            python += python_bytes(self) + python_bytes(self.__dict__)
            python += python_bytes(self._stage_buckets) + python_bytes(self._stage_codes)
            roaring += bitmap_heap_bytes(self._stage_held)
            parts = dict(live.breakdown, packed=python)
            return MemoryUsage(live.python_bytes + python, live.roaring_bytes + roaring, len(self), parts)


def merge_due(a: DueIds, b: DueIds) -> DueIds:
    """One ledger's due ids from two places (the index's tiers, a segment store's indexes): an entry is
    due whole if it is due whole in either. O(n)."""
    entry_ids = np.union1d(a.entry_ids, b.entry_ids).astype(np.uint32)
    if not a.batch_indexes and not b.batch_indexes:
        return DueIds(a.topic, a.ledger_id, entry_ids)
    partial: dict[int, tuple[int, ...]] = {}
    for entry_id in sorted(a.batch_indexes.keys() | b.batch_indexes.keys()):
        indexes: set[int] = set()
        whole = False
        for due in (a, b):
            got = due.batch_indexes.get(entry_id)
            if got is not None:
                indexes.update(got)
            elif bool(np.isin(entry_id, due.entry_ids)):
                whole = True
        if not whole:
            partial[entry_id] = tuple(sorted(indexes))
    return (
        DueIds(a.topic, a.ledger_id, entry_ids, partial)
        if partial
        else DueIds(a.topic, a.ledger_id, entry_ids)
    )


def pop_by_bucket(index: NackIndex, now_ms: int) -> list[tuple[int, DueIds]]:
    """:meth:`NackIndex.pop_due_by_bucket` by a :meth:`~NackIndex.pop_due` at each of the index's next
    due times in turn, for an index whose next due time need not be the bucket of what it pops next (a
    re-dispatch holds due ids back, and names when it may release them): where a pop at it finds
    nothing, or it does not move on, what is due up to ``now_ms`` comes in one last pop labelled
    ``now_ms``. O(due times) pops."""
    out: list[tuple[int, DueIds]] = []
    until = -1
    while (following := index.next_due_ms()) is not None and following <= now_ms:
        popped = index.pop_due(following) if following > until else []
        if not popped:
            out.extend((now_ms, ids) for ids in index.pop_due(now_ms))
            break
        out.extend((following, ids) for ids in popped)
        until = following
    return out


def _part_time(part: tuple[int, int | None]) -> int:
    return part[0]


def _due_ids(
    key: LedgerKey, entry_ids: npt.NDArray[np.uint32], partial: dict[int, tuple[int, ...]]
) -> DueIds:
    """A ledger's due ids from its key (the shared empty mapping when no entry is partial)."""
    topic, ledger_id = _split_key(key)
    return DueIds(topic, ledger_id, entry_ids, partial) if partial else DueIds(topic, ledger_id, entry_ids)


def _by_group_bucket(item: tuple[tuple[int, LedgerKey], DueIds]) -> int:
    return item[0][0]


def _by_first(item: tuple[int, DueIds]) -> int:
    return item[0]


def _slot_time(item: tuple[tuple[int, LedgerKey], npt.NDArray[np.uint32]]) -> int:
    return item[0][0]


def _member_key(bucket: int, record: _Ledger, entry_id: int) -> int:
    """The key of a slot's entry in ``TimeBucketIndex._members``. O(1)."""
    return (bucket << 32 | entry_id) << _SERIAL_BITS | record.serial


def _key(ledger_id: int, topic: str) -> LedgerKey:
    return (topic, ledger_id) if topic else ledger_id


def _split_key(key: LedgerKey) -> tuple[str, int]:
    return key if isinstance(key, tuple) else ("", key)


def _check_due(value: Any, name: str = "due_ms", bounded: bool = True) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int (milliseconds), got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    if bounded and value > MAX_DUE_MS:
        return MAX_DUE_MS  # ~292 million years: filed at the last bucket the arrays can hold
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


def _entry_masks(
    entry_ids: npt.NDArray[np.uint32], indexes: npt.NDArray[np.int64]
) -> tuple[list[int], list[int]]:
    """Batch messages sorted by entry id → each entry's id and the bitmask of its batch indexes. O(n)
    numpy when every index is below 64, else O(n) Python (numpy for wider masks measured no faster on a
    slot's ~100 messages)."""
    if int(indexes.max()) < 64:
        heads = np.flatnonzero(np.concatenate(([True], entry_ids[1:] != entry_ids[:-1])))
        bits = np.left_shift(np.uint64(1), indexes.astype(np.uint64))
        return entry_ids[heads].tolist(), np.bitwise_or.reduceat(bits, heads).tolist()
    masks: dict[int, int] = {}
    for entry_id, index in zip(entry_ids.tolist(), indexes.tolist(), strict=True):
        masks[entry_id] = masks.get(entry_id, 0) | 1 << index
    return list(masks), list(masks.values())


def _member_mask(mask: int) -> int:
    """``mask`` as ``_HotIndex._members`` keeps it: the one shared int of its value when it is a whole
    batch's (``2**size - 1``, see :data:`_WHOLE_BATCHES`). O(1)."""
    return _WHOLE_BATCHES.setdefault(mask, mask) if not mask & mask + 1 else mask


_K = TypeVar("_K")
_V = TypeVar("_V")


def _fitted(table: dict[_K, _V]) -> dict[_K, _V]:
    """``table``, or a copy of it if its hash table is oversized for what it holds (a dict keeps its
    grown table as entries leave). O(1), O(entries) when copied."""
    return dict(table) if sys.getsizeof(table) > _OVERSIZED * (len(table) + 8) else table


def _shrink(bitmap: BitMap64) -> None:
    """``shrink_to_fit``: in-use heap never grows by it (measured in processes set up for heap
    measurement, 196 containers of 1 to 200 values each: 25.4 -> 20.0 KB at 1, 46.2 -> 28.2 KB at 35, 105
    -> 93 KB at 200). It once ran only at 64+ values a container (glibc cannot split a small array's
    spare bytes off), yet measured whole it frees memory at every size; and memory_usage() counts every
    compacted bitmap as shrunk."""
    bitmap.shrink_to_fit()


_U32 = np.dtype(np.uint32)  # (np.array with a dtype object skips parsing ``dtype=np.uint32``: ~9 µs cold)


def _merge_own(
    shared: npt.NDArray[np.uint32] | None, parts: list[tuple[int, Entries | int]]
) -> tuple[npt.NDArray[np.uint32], int]:
    """One ledger's due entry ids: ``shared`` (from the shared bitmaps, or None) merged with its due
    entries of their own — bitmaps, ``_Run``-s, or runs as plain ints (``_Bucket``'s inline runs, read
    by ``pop_due`` without making a ``_Run``); and how many (bucket, entry) pairs those held. O(parts)
    Python steps plus one CRoaring union.

    Runs of one id each (one id per bucket at small k: 68 of them per forward at k = 0) are gathered in
    a plain loop and sorted once: the timer calls this every 68 ms with its caches cold, where each of
    the ten numpy calls it took before cost ~15 us (measured in the timer thread: 2.6 us per id, against
    0.2 us per id back to back).
    """
    if shared is None and len(parts) == 1:
        only = parts[0][1]
        entries = _Run(only) if isinstance(only, int) else only
        return _as_array(entries), len(entries)
    singles: list[int] = []
    wider: list[Entries] = []
    last, ordered = -1, True  # singles strictly ascending so far (in-order nacks): no set, no sort
    for _, part in parts:
        if isinstance(part, int):  # a run (a _Run or a plain int)
            lo = part >> 32
            if lo == part & MAX_ENTRY_ID:
                singles.append(lo)
                if lo <= last:
                    ordered = False
                last = lo
            else:
                wider.append(_Run(part))
        else:
            wider.append(part)
    count = len(singles)
    if shared is None and not wider:
        return np.array(singles if ordered else sorted(set(singles)), _U32), count
    union = BitMap(singles)
    if shared is not None:
        union.update(_u32(shared))
    for entries in wider:
        if isinstance(entries, _Run):
            union.add_range(entries.lo, entries.hi + 1)
        else:
            union |= entries
        count += len(entries)
    return _array_of(union, np.uint32), count


def _item_time(item: tuple[int, _Bucket]) -> int:
    return item[0]
