"""Sets of entries of many ledgers in shared 64-bit Roaring bitmaps: no object per ledger and set.

The arrival filter keeps a few sets of entries — ``(topic, ledger id)`` with an entry id — one value per
pending non-batched nack, per batched entry kept as one bit, per watched entry. A Roaring bitmap per ledger
and set costs ~400 bytes besides its values (the Python object, CRoaring's bitmap, container array and
container: 5 B a value at 1,000 ledgers of 100 values, 25 B at 10). Here every set is one
:class:`~pyroaring.BitMap64` of *codes*: the ledger's *ordinal* (its number here, shared by the sets) with
its low ``low`` bits moved below the entry id — ``(ordinal >> low) << (32 + low) | entry_id << low |
ordinal & (2**low - 1)`` — so that the entries of up to 2**low ledgers share a Roaring container (as the
index's shared bitmaps do; ``low`` is the bits that number the ledgers, at most :data:`MAX_LOW_BITS`):
~2 B a value at 1,000 ledgers of 100 values, ~3.5 B at 10. The ordinals are the tracker's
:class:`~pulsar_nack.ledgers.LedgerRegistry`'s, shared with the index's packed store: the sets add ~2 B a
ledger of their own (a bit in a bitmap of the ordinals they hold), where a numbering of their own cost
~150 B a ledger.

The sets hold a ledger in the registry from the first value of it until a *sweep* finds none: when a new
ledger comes and twice as many ledgers are held as at the last sweep (a pass over the values, O(values)
numpy, amortized over the ledgers held since; no count per value, which cost the nack path ~0.2 µs), and
whenever every set is empty (O(1) to see, checked on each removal) — so a drained consumer holds none,
and nothing grows with run time. ``low`` follows the registry's ordinals (the bitmaps are then re-coded:
O(values), at most :data:`MAX_LOW_BITS` times until the sets empty).

A set holds no bitmap of its own until its first value (a shared frozen empty one: an empty BitMap64 costs
~265 bytes, and a consumer's filter has nine sets, most of them unused by a workload); once made, a set's
bitmap stays until a removal leaves every set empty (:meth:`EntrySets.tidy`).

Lookups without a lock: :attr:`EntrySets.layout` (``low`` and the bitmaps; the registry's key → ordinal
dict, itself read without a lock) is replaced as a whole when re-coded, never changed in place but for
the bitmaps' values: read it once, then look up (:meth:`Layout.code`). Changes need the caller's lock.
Entry ids must be below 2**32 (as in a 32-bit bitmap). All operations O(1) but :meth:`EntrySets.ids` and
:meth:`EntrySets.ledgers` (O(values)).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Mapping

import numpy as np
from pyroaring import AbstractBitMap64, BitMap, BitMap64, FrozenBitMap64

from pulsar_nack.ledgers import LedgerRegistry
from pulsar_nack.memory import bitmap_heap_bytes, python_bytes, shared_bitmap64_heap_bytes

__all__ = ["MAX_LOW_BITS", "EntrySets", "Layout", "LedgerKey"]

LedgerKey = tuple[str, int]  # (topic, ledger id)

#: At most this many low ordinal bits go below the entry id (4,096 ledgers share a container of 16 entry
#: ids); more ledgers than that share containers 4,096 at a time.
MAX_LOW_BITS = 12
_ENTRY_BITS = 32
_ENTRY_MASK = (1 << _ENTRY_BITS) - 1
#: Ledgers held before the first sweep of unheld ones (then twice those held after one).
_COLLECT_MIN = 16
#: What a set holds until its first value (an empty BitMap64 costs ~265 bytes, ~380 once used: 2.4-3.4 KB
#: of a consumer's fixed memory for the filter's nine sets, most of them never used by a workload).
_EMPTY = FrozenBitMap64()


class Layout:
    """One coding of the sets: ``low``, the registry's ``ordinals`` (key → ordinal, see
    :func:`~pulsar_nack.ledgers.ledger_key`), and the sets' bitmaps — a shared frozen empty one for a set
    until its first value (:meth:`EntrySets.writable`). Replaced whole when re-coded."""

    __slots__ = ("bitmaps", "low", "mask", "ordinals", "shift")

    def __init__(self, low: int, count: int, ordinals: dict[int | tuple[str, int], int]) -> None:
        self.low = low
        self.shift = _ENTRY_BITS + low  # a code's bits above the entry id: the ordinal's high bits
        self.mask = (1 << low) - 1  # a code's bits below the entry id: the ordinal's low bits
        self.ordinals = ordinals
        self.bitmaps: list[AbstractBitMap64] = [_EMPTY] * count

    def base(self, ordinal: int) -> int:
        """The code of the ledger's entry 0. O(1)."""
        return (ordinal >> self.low) << self.shift | ordinal & self.mask

    def ordinal(self, base: int) -> int:
        return (base >> self.shift) << self.low | base & self.mask

    def code(self, ledger: LedgerKey, entry_id: int) -> int | None:
        """The code of an entry, or None if no structure holds its ledger (or the id is out of range).
        O(1)."""
        ordinal = self.ordinals.get(ledger if ledger[0] else ledger[1])
        if ordinal is None or entry_id >> _ENTRY_BITS or entry_id < 0:
            return None
        return (ordinal >> self.low) << self.shift | entry_id << self.low | ordinal & self.mask


class EntrySets:
    """``count`` sets of ``(ledger, entry id)`` coded with the ordinals of one
    :class:`~pulsar_nack.ledgers.LedgerRegistry` (a registry of their own if none is given); see the
    module. Not thread-safe for changes (the caller's lock); lookups through :attr:`layout` need none."""

    __slots__ = ("_collect_at", "_count", "_registry", "_shrunk", "held_ordinals", "layout")

    def __init__(self, count: int, registry: LedgerRegistry | None = None) -> None:
        self._count = count
        self._registry = registry if registry is not None else LedgerRegistry()
        self.layout = Layout(0, count, self._registry.ordinals)
        #: The ordinals these sets hold in the registry (read it under the caller's lock).
        self.held_ordinals = BitMap()
        self._collect_at = _COLLECT_MIN  # ledgers held at which the next new one sweeps the unheld
        self._shrunk = False  # shrink() has run: the containers are mostly exact (see memory_bytes)

    # -- lookups ----------------------------------------------------------------------------------------

    def contains(self, which: int, ledger: LedgerKey, entry_id: int) -> bool:
        layout = self.layout
        code = layout.code(ledger, entry_id)
        return code is not None and code in layout.bitmaps[which]

    def any(self, which: int) -> bool:
        """Whether set ``which`` holds anything. O(1)."""
        return bool(self.layout.bitmaps[which])

    def size(self, which: int) -> int:
        """Values in set ``which``. O(containers)."""
        return len(self.layout.bitmaps[which])

    def ids(self, which: int, ledger: LedgerKey) -> BitMap:
        """The entry ids set ``which`` holds of ``ledger``. O(values of the set) numpy."""
        layout = self.layout
        ordinal = layout.ordinals.get(ledger if ledger[0] else ledger[1])
        if ordinal is None or ordinal not in self.held_ordinals:
            return BitMap()
        codes = np.frombuffer(layout.bitmaps[which].to_array(), np.uint64)
        low = np.uint64(layout.low)
        mine = codes[(codes & ~(np.uint64(_ENTRY_MASK) << low)) == np.uint64(layout.base(ordinal))]
        return BitMap(((mine >> low) & np.uint64(_ENTRY_MASK)).astype(np.uint32))

    def ledgers(self, which: int) -> Iterator[tuple[LedgerKey, BitMap]]:
        """Each ledger of set ``which`` with its entry ids (a snapshot). O(values log values) numpy."""
        return self.decode(self.layout.bitmaps[which])

    def decode(self, codes: AbstractBitMap64) -> Iterator[tuple[LedgerKey, BitMap]]:
        """Each ledger of ``codes`` (codes of the current layout, e.g. the difference of two sets) with
        its entry ids. O(values log values) numpy."""
        layout = self.layout
        values = np.frombuffer(codes.to_array(), np.uint64)
        if not len(values):
            return
        low = np.uint64(layout.low)
        ordinals = (values >> np.uint64(_ENTRY_BITS + layout.low)) << low | values & np.uint64(
            (1 << layout.low) - 1
        )
        entries = ((values >> low) & np.uint64(_ENTRY_MASK)).astype(np.uint32)
        order = np.argsort(ordinals, kind="stable")
        ordinals, entries = ordinals[order], entries[order]
        starts = np.flatnonzero(np.concatenate(([True], ordinals[1:] != ordinals[:-1])))
        ends = [*starts[1:].tolist(), len(ordinals)]
        key_of = self._registry.key  # (a held value's ordinal is held)
        # The keys are read before the first is yielded: the caller may empty the sets (and so release
        # the ledgers) as it goes.
        keys = [key_of(ordinal) for ordinal in ordinals[starts].tolist()]
        for key, start, end in zip(keys, starts.tolist(), ends, strict=True):
            yield (key if isinstance(key, tuple) else ("", key)), BitMap(entries[start:end])

    # -- changes (caller's lock held) -------------------------------------------------------------------

    def add(self, which: int, ledger: LedgerKey, entry_id: int) -> None:
        """Add an entry. Raises ValueError for an entry id out of [0, 2**32) (nothing changed). O(1);
        O(values) when a new ledger sweeps or needs another ordinal bit (amortized O(1))."""
        if entry_id >> _ENTRY_BITS or entry_id < 0:
            raise ValueError(f"entry_id must be in [0, 2**32), got {entry_id!r}")
        layout = self.layout
        ordinal = layout.ordinals.get(ledger if ledger[0] else ledger[1])
        if ordinal is None or ordinal not in self.held_ordinals:
            ordinal = self._hold(ledger)
            layout = self.layout
        bitmap = layout.bitmaps[which]
        if type(bitmap) is not BitMap64:
            bitmap = self.writable(which)
        bitmap.add(layout.base(ordinal) | entry_id << layout.low)

    def writable(self, which: int) -> BitMap64:
        """Set ``which``'s bitmap, made on its first use (caller's lock held; a reader without it that read
        the empty one before finds nothing, as before the value came). O(1)."""
        bitmaps = self.layout.bitmaps
        bitmap = bitmaps[which]
        if not isinstance(bitmap, BitMap64):
            bitmap = bitmaps[which] = BitMap64()
        return bitmap

    def empty(self, which: int) -> None:
        """Empty set ``which`` in place (readers see it emptied, as after removals). O(values)."""
        bitmap = self.layout.bitmaps[which]
        if isinstance(bitmap, BitMap64):
            bitmap.clear()

    def discard(self, which: int, ledger: LedgerKey, entry_id: int) -> bool:
        """Remove an entry; True if it was in the set. O(1) (the sets emptied: O(ledgers held), once)."""
        layout = self.layout
        code = layout.code(ledger, entry_id)
        if code is None:
            return False
        bitmap = layout.bitmaps[which]
        if code not in bitmap or not isinstance(bitmap, BitMap64):
            return False
        bitmap.discard(code)
        if not bitmap:
            self.tidy()
        return True

    def update(self, which: int, entries: Mapping[LedgerKey, BitMap]) -> None:
        """Add the entries of many ledgers (a restored snapshot's): the ledgers not held yet are held
        together first (:meth:`_hold_many`: one sweep and one re-code at most — held one by one as they
        came, each new ordinal bit re-coded every value added so far, 8 passes at 200 ledgers: the restore
        regression bench/snapshot_cost.py --restore saw), then each ledger's ids are added in one bitmap
        update. Raises ValueError for an entry id of 2**32 or more (nothing changed). O(entries) numpy,
        plus O(values held) for a sweep or re-code."""
        entries = {ledger: ids for ledger, ids in entries.items() if ids}
        for ids in entries.values():
            if ids.max() >> _ENTRY_BITS:
                raise ValueError(f"entry ids must be below 2**32, got {ids.max()!r}")
        ordinals, held = self.layout.ordinals, self.held_ordinals
        new = [
            ledger
            for ledger in entries
            if (ordinal := ordinals.get(ledger if ledger[0] else ledger[1])) is None or ordinal not in held
        ]
        if new:
            self._hold_many(new)
        layout = self.layout
        bitmap, low = self.writable(which), np.uint64(layout.low)
        for ledger, ids in entries.items():
            base = layout.base(layout.ordinals[ledger if ledger[0] else ledger[1]])
            codes = np.frombuffer(ids.to_array(), np.uint32).astype(np.uint64) << low
            bitmap.update(array("Q", (codes | np.uint64(base)).tobytes()))

    def shrink(self) -> None:
        """Give each set's containers back the room they grew beyond their values (``shrink_to_fit``):
        an array container grows by steps of 1.25-2x as values come one by one, and a set of pending
        nacks drains as they fall due, its containers keeping the room of their fullest (at 100 topics,
        1 % nacked, 10 s delays: 129 KB of the sets' 370 KB, 1.3 B a pending nack; half drained at random,
        tests/test_entry_sets.py: 447 -> 204 KB). Call it off the nack path, as the tracker's compaction
        does (~1 s after nacks move on from a bucket): then only the containers filled since hold room to
        grow. O(containers)."""
        for bitmap in self.layout.bitmaps:
            if bitmap and isinstance(bitmap, BitMap64):
                bitmap.shrink_to_fit()
        self._shrunk = True

    def tidy(self) -> None:
        """If every set is empty, release every ledger held (a caller that empties bitmaps in place calls
        this after). O(sets), O(ledgers held) when releasing."""
        if self.held_ordinals and not any(self.layout.bitmaps):
            self.clear()

    def clear(self) -> None:
        release = self._registry.release
        for ordinal in self.held_ordinals:
            release(ordinal)
        self.held_ordinals = BitMap()
        self.layout = Layout(0, self._count, self._registry.ordinals)
        self._collect_at = _COLLECT_MIN
        self._shrunk = False  # (new bitmaps grow as values come)

    def _hold(self, ledger: LedgerKey) -> int:
        """Hold ``ledger`` in the registry (sweeping unheld ledgers first, re-coding the bitmaps when its
        ordinal needs another low bit); its ordinal. O(1), or O(values) when it sweeps or re-codes."""
        if len(self.held_ordinals) >= self._collect_at:
            self._collect()
        ordinal = self._registry.acquire(ledger if ledger[0] else ledger[1])
        self.held_ordinals.add(ordinal)
        layout = self.layout
        if ordinal >> layout.low and layout.low < MAX_LOW_BITS:
            self._recode(min(MAX_LOW_BITS, ordinal.bit_length()))
        return ordinal

    def _hold_many(self, ledgers: list[LedgerKey]) -> None:
        """:meth:`_hold` for several ledgers none is held yet, each about to get an entry: a sweep first if
        holding them one by one would have made one, then one re-code to the low bits the largest ordinal
        needs (while the sets hold only what they held before). O(ledgers), plus O(values held) when it
        sweeps or re-codes."""
        swept = len(self.held_ordinals) + len(ledgers) > self._collect_at
        if swept:
            self._collect()
        acquire, held = self._registry.acquire, self.held_ordinals
        top = 0
        for ledger in ledgers:
            ordinal = acquire(ledger if ledger[0] else ledger[1])
            held.add(ordinal)
            top = max(top, ordinal)
        layout = self.layout
        if top >> layout.low and layout.low < MAX_LOW_BITS:
            self._recode(min(MAX_LOW_BITS, top.bit_length()))
        if swept:  # every ledger held now has entries (these are about to): as after a sweep
            self._collect_at = max(_COLLECT_MIN, 2 * len(held))

    def _collect(self) -> None:
        """Release the ledgers none of the sets holds an entry of (a lookup without the lock that read one
        finds nothing, as it would have). O(values) numpy."""
        layout = self.layout
        held = BitMap()
        for bitmap in layout.bitmaps:
            codes = np.frombuffer(bitmap.to_array(), np.uint64)
            if len(codes):
                ordinals = (codes >> np.uint64(layout.shift)) << np.uint64(layout.low) | codes & np.uint64(
                    layout.mask
                )
                held.update(np.unique(ordinals).astype(np.uint32))
        release = self._registry.release
        for ordinal in self.held_ordinals - held:
            release(ordinal)
        self.held_ordinals = held
        self._collect_at = max(_COLLECT_MIN, 2 * len(held))

    def _recode(self, low: int) -> None:
        """A new layout with ``low`` low ordinal bits: the bitmaps coded anew, swapped in whole (readers
        without the lock see the old layout or the new one). O(values) numpy."""
        old = self.layout
        new = Layout(low, self._count, self._registry.ordinals)
        shift_old, shift_new = np.uint64(_ENTRY_BITS + old.low), np.uint64(_ENTRY_BITS + low)
        old_low, new_low = np.uint64(old.low), np.uint64(low)
        for which, source in enumerate(old.bitmaps):
            codes = np.frombuffer(source.to_array(), np.uint64)
            if not len(codes):
                continue
            target = new.bitmaps[which] = BitMap64()
            ordinals = (codes >> shift_old) << old_low | codes & np.uint64((1 << old.low) - 1)
            entries = (codes >> old_low) & np.uint64(_ENTRY_MASK)
            recoded = (
                (ordinals >> new_low) << shift_new | entries << new_low | ordinals & np.uint64((1 << low) - 1)
            )
            target.update(array("Q", recoded.tobytes()))
        self.layout = new

    # -- memory -----------------------------------------------------------------------------------------

    def memory_bytes(self) -> int:
        """Bytes held: the bitmaps (CRoaring's heap estimated, see
        :func:`~pulsar_nack.memory.shared_bitmap64_heap_bytes`: as shrunk once :meth:`shrink` runs, as
        grown until then) and the bitmap of ordinals held (its heap measured); the registry is its
        owner's to count. O(sets)."""
        layout = self.layout
        total = python_bytes(self) + python_bytes(layout) + python_bytes(layout.bitmaps)
        total += python_bytes(self.held_ordinals) + bitmap_heap_bytes(self.held_ordinals)
        for bitmap in layout.bitmaps:
            if bitmap is not _EMPTY:  # (the shared empty one is no consumer's)
                total += python_bytes(bitmap) + shared_bitmap64_heap_bytes(bitmap, shrunk=self._shrunk)
        return total
