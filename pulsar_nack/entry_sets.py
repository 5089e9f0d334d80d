"""Sets of entries of many ledgers in shared 64-bit Roaring bitmaps: no object per ledger and set.

The arrival filter keeps a few sets of entries — ``(topic, ledger id)`` with an entry id — one value per
pending non-batched nack, per batched entry kept as one bit, per watched entry. A Roaring bitmap per ledger
and set costs ~400 bytes besides its values (the Python object, CRoaring's bitmap, container array and
container: 5 B a value at 1,000 ledgers of 100 values, 25 B at 10). Here every set is one
:class:`~pyroaring.BitMap64` of *codes*: the ledger's *ordinal* (its number here, shared by the sets) with
its low ``low`` bits moved below the entry id — ``(ordinal >> low) << (32 + low) | entry_id << low |
ordinal & (2**low - 1)`` — so that the entries of up to 2**low ledgers share a Roaring container (as the
index's shared bitmaps do; ``low`` is the bits that number the ledgers, at most :data:`MAX_LOW_BITS`):
~2 B a value at 1,000 ledgers of 100 values, ~3.5 B at 10, plus ~150 B a ledger for its ordinal.

Ordinals of ledgers none of the sets holds an entry of are collected and reused when a new ledger needs
one and twice as many ledgers are numbered as held at the last collection (a pass over the values,
O(values) numpy, amortized over the ledgers numbered since; no count per value, which cost the nack path
~0.2 µs): ordinals stay below about twice the most ledgers held at once (+16), and nothing grows with run
time. ``low`` grows with them (the bitmaps are then re-coded: O(values), at most :data:`MAX_LOW_BITS`
times between two :meth:`EntrySets.clear`).

Lookups without a lock: :attr:`EntrySets.layout` (the numbering, its ``low`` and the bitmaps) is replaced
as a whole when re-coded, never changed in place but for the bitmaps' values: read it once, then look up
(:meth:`Layout.code`). Changes need the caller's lock. Entry ids must be below 2**32 (as in a 32-bit
bitmap). All operations O(1) but :meth:`EntrySets.ids` and :meth:`EntrySets.ledgers` (O(values)).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator

import numpy as np
from pyroaring import BitMap, BitMap64

from pulsar_nack.memory import python_bytes, shared_bitmap64_heap_bytes

__all__ = ["MAX_LOW_BITS", "EntrySets", "Layout", "LedgerKey"]

LedgerKey = tuple[str, int]  # (topic, ledger id)

#: At most this many low ordinal bits go below the entry id (4,096 ledgers share a container of 16 entry
#: ids); more ledgers than that share containers 4,096 at a time.
MAX_LOW_BITS = 12
_ENTRY_BITS = 32
_ENTRY_MASK = (1 << _ENTRY_BITS) - 1
#: Ledgers numbered before the first collection of unheld ordinals (then twice those held after one).
_COLLECT_MIN = 16


class Layout:
    """One numbering of the ledgers: ``bases`` (ledger → its code with entry id 0), ``low``, and the
    sets' bitmaps. Replaced whole when re-coded (see the module)."""

    __slots__ = ("bases", "bitmaps", "low", "mask", "shift")

    def __init__(self, low: int, count: int) -> None:
        self.low = low
        self.shift = _ENTRY_BITS + low  # a code's bits above the entry id: the ordinal's high bits
        self.mask = (1 << low) - 1  # a code's bits below the entry id: the ordinal's low bits
        self.bases: dict[LedgerKey, int] = {}
        self.bitmaps: tuple[BitMap64, ...] = tuple(BitMap64() for _ in range(count))

    def base(self, ordinal: int) -> int:
        low = self.low
        return (ordinal >> low) << (_ENTRY_BITS + low) | ordinal & ((1 << low) - 1)

    def ordinal(self, base: int) -> int:
        return (base >> self.shift) << self.low | base & self.mask

    def code(self, ledger: LedgerKey, entry_id: int) -> int | None:
        """The code of an entry, or None if no set holds an entry of its ledger (or the id is out of
        range). O(1)."""
        base = self.bases.get(ledger)
        if base is None or entry_id >> _ENTRY_BITS or entry_id < 0:
            return None
        return base | entry_id << self.low


class EntrySets:
    """``count`` sets of ``(ledger, entry id)`` sharing one numbering of ledgers; see the module.
    Not thread-safe for changes (the caller's lock); lookups through :attr:`layout` need none."""

    __slots__ = ("_collect_at", "_count", "_free", "_keys", "layout")

    def __init__(self, count: int) -> None:
        self._count = count
        self.layout = Layout(0, count)
        self._keys: list[LedgerKey | None] = []  # ordinal → ledger (None: free)
        self._free: list[int] = []
        self._collect_at = _COLLECT_MIN  # numbered ledgers at which the next new one collects the unheld

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
        base = layout.bases.get(ledger)
        if base is None:
            return BitMap()
        codes = np.frombuffer(layout.bitmaps[which].to_array(), np.uint64)
        low = np.uint64(layout.low)
        mine = codes[(codes & ~(np.uint64(_ENTRY_MASK) << low)) == np.uint64(base)]
        return BitMap(((mine >> low) & np.uint64(_ENTRY_MASK)).astype(np.uint32))

    def ledgers(self, which: int) -> Iterator[tuple[LedgerKey, BitMap]]:
        """Each ledger of set ``which`` with its entry ids (a snapshot). O(values log values) numpy."""
        return self.decode(self.layout.bitmaps[which])

    def decode(self, codes: BitMap64) -> Iterator[tuple[LedgerKey, BitMap]]:
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
        keys = self._keys
        for start, end in zip(starts.tolist(), ends, strict=True):
            key = keys[int(ordinals[start])]
            assert key is not None  # (a held value's ordinal is not free)
            yield key, BitMap(entries[start:end])

    # -- changes (caller's lock held) -------------------------------------------------------------------

    def add(self, which: int, ledger: LedgerKey, entry_id: int) -> None:
        """Add an entry. Raises ValueError for an entry id out of [0, 2**32) (nothing changed). O(1);
        O(values) when a new ledger collects ordinals or needs another ordinal bit (amortized O(1))."""
        if entry_id >> _ENTRY_BITS or entry_id < 0:
            raise ValueError(f"entry_id must be in [0, 2**32), got {entry_id!r}")
        layout = self.layout
        base = layout.bases.get(ledger)
        if base is None:
            base = self._number(ledger)
            layout = self.layout
        layout.bitmaps[which].add(base | entry_id << layout.low)

    def discard(self, which: int, ledger: LedgerKey, entry_id: int) -> bool:
        """Remove an entry; True if it was in the set. O(1)."""
        layout = self.layout
        base = layout.bases.get(ledger)
        if base is None or entry_id >> _ENTRY_BITS or entry_id < 0:
            return False
        code = base | entry_id << layout.low
        bitmap = layout.bitmaps[which]
        if code not in bitmap:
            return False
        bitmap.discard(code)
        return True

    def update(self, which: int, ledger: LedgerKey, entry_ids: BitMap) -> None:
        """Add many entries of one ledger (a restored snapshot's). O(entries) numpy."""
        if not entry_ids:
            return
        if entry_ids.max() >> _ENTRY_BITS:
            raise ValueError(f"entry ids must be below 2**32, got {entry_ids.max()!r}")
        layout = self.layout
        base = layout.bases.get(ledger)
        if base is None:
            base = self._number(ledger)
            layout = self.layout
        bitmap = layout.bitmaps[which]
        ids = np.frombuffer(entry_ids.to_array(), np.uint32).astype(np.uint64)
        bitmap.update(array("Q", (ids << np.uint64(layout.low) | np.uint64(base)).tobytes()))

    def clear(self) -> None:
        self.layout = Layout(0, self._count)
        self._keys = []
        self._free = []
        self._collect_at = _COLLECT_MIN

    def _number(self, ledger: LedgerKey) -> int:
        """Give ``ledger`` an ordinal (a free one first; re-coding the bitmaps when ordinals need
        another low bit) and return its base in the (new) layout. O(1), or O(values) when it collects
        or re-codes."""
        if not self._free and len(self.layout.bases) >= self._collect_at:
            self._collect()
        if self._free:
            ordinal = self._free.pop()
            self._keys[ordinal] = ledger
        else:
            ordinal = len(self._keys)
            self._keys.append(ledger)
            if ordinal >> self.layout.low and self.layout.low < MAX_LOW_BITS:
                self._recode(min(MAX_LOW_BITS, ordinal.bit_length()))
        layout = self.layout
        base = layout.bases[ledger] = layout.base(ordinal)
        return base

    def _collect(self) -> None:
        """Free the ordinals of ledgers none of the sets holds an entry of (their numbering goes; a lookup
        without the lock that read it finds nothing, as it would have). O(values) numpy."""
        layout = self.layout
        held: set[int] = set()
        for bitmap in layout.bitmaps:
            codes = np.frombuffer(bitmap.to_array(), np.uint64)
            if len(codes):
                ordinals = (codes >> np.uint64(layout.shift)) << np.uint64(layout.low) | codes & np.uint64(
                    layout.mask
                )
                held.update(np.unique(ordinals).tolist())
        for ordinal, key in enumerate(self._keys):
            if key is not None and ordinal not in held:
                del layout.bases[key]
                self._keys[ordinal] = None
                self._free.append(ordinal)
        self._collect_at = max(_COLLECT_MIN, 2 * len(layout.bases))

    def _recode(self, low: int) -> None:
        """A new layout with ``low`` low ordinal bits: the bitmaps coded anew, swapped in whole (readers
        without the lock see the old layout or the new one). O(values) numpy."""
        old = self.layout
        new = Layout(low, self._count)
        new.bases = {key: new.base(old.ordinal(base)) for key, base in old.bases.items()}
        shift_old, shift_new = np.uint64(_ENTRY_BITS + old.low), np.uint64(_ENTRY_BITS + low)
        old_low, new_low = np.uint64(old.low), np.uint64(low)
        for source, target in zip(old.bitmaps, new.bitmaps, strict=True):
            codes = np.frombuffer(source.to_array(), np.uint64)
            if not len(codes):
                continue
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
        :func:`~pulsar_nack.memory.shared_bitmap64_heap_bytes`), the numbering (a dict entry, key tuple
        and base a ledger) and the counts. O(ledgers)."""
        layout = self.layout
        total = python_bytes(self) + python_bytes(layout) + python_bytes(layout.bases)
        total += python_bytes(layout.bitmaps) + python_bytes(self._keys) + python_bytes(self._free)
        for bitmap in layout.bitmaps:
            total += python_bytes(bitmap) + shared_bitmap64_heap_bytes(bitmap, shrunk=False)
        # The key tuple is this numbering's own; its ledger id (and topic) are the caller's objects — the
        # ids of a message, shared with the index's keys, which count them.
        for key, base in layout.bases.items():
            total += python_bytes(key) + _int_bytes(base)
        return total


def _int_bytes(value: int) -> int:
    return 0 if -5 <= value <= 256 else python_bytes(value)  # small ints are shared by CPython
