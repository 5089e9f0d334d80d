"""The packed store: pending ids of sparse buckets as rows of two numpy arrays, no object per id or bucket.

:class:`~pulsar_nack.index.TimeBucketIndex` moves a bucket here when its add path has left it and every
(bucket, ledger) slot in it is small (fewer than :data:`~pulsar_nack.index.PROMOTE_AT` ids): there a
bucket object, its map entry and key, and a bitmap per slot cost ~300 bytes for the one or two ids such a
bucket holds at k = 0 or with long, sparse delays. Here an id costs one *row*: a *code*
``ordinal << 42 | entry_id << 10 | slot`` — 6 bytes while it fits a uint16 ordinal and a uint32 rest (see
:class:`_Run`), else 8 — (``ordinal``: the ledger's number in the tracker's
:class:`~pulsar_nack.ledgers.LedgerRegistry`, shared with the arrival filter; ``slot``
0 for a whole entry, ``1 + batch index`` for one batch message) filed under its bucket time, an offset
``(bucket - origin) >> k`` kept once per bucket of a run with the position of the bucket's first row (8
bytes a bucket, where an offset per row cost 4 bytes a row), plus a few bytes in a Roaring bitmap of the
*entries* that may have rows (the membership test on the nack path), keyed ``ordinal << 32 | entry_id``
with the low ``L`` bits of the ordinal moved below the entry id (``L``: enough bits to number the ledgers
here, as the index's shared bitmaps do), so that the ledgers' entries share Roaring containers — one
container a ledger cost ~4 bytes a row at 1,000 ledgers of ~100 rows.

Rows live in a few *runs*, each sorted by bucket time (LSM-like): the buckets one ``put`` moves become a
run, and the newest run is merged into the one before it while that one is at most twice its size, so
there are O(log n) runs and each row is merged O(log n) times. Popping what is due takes the due prefix
of each run (a bisect and a slice: O(log n + due)); a run whose popped prefix is half of it is copied
down. Looking an entry up (``parts``, ``take``, ``remove``) scans the runs (O(n) in numpy) — but only when
the membership bitmap says the entry may have rows, which for a sparse, in-order workload is rare: those
entries' buckets are the ones the add path left behind.

Ledgers: the store holds each ledger it has rows of in the registry (a bit in a bitmap of ordinals here,
~2 B a ledger; a numbering of its own cost ~150 B) and releases it in a *sweep* — when the runs merge into
one and fewer than half the ledgers held have rows (O(rows) numpy, amortized O(1) a row), and when the
store empties — so a store that drains holds none.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator
from itertools import pairwise
from typing import Any

import numpy as np
import numpy.ma  # (np.unique imports it on first use: ~0.5 MB landing in one index's memory)
import numpy.typing as npt
from pyroaring import BitMap, BitMap64

from pulsar_nack.ledgers import LedgerRegistry
from pulsar_nack.memory import (
    bitmap64_heap_bytes,
    bitmap_heap_bytes,
    python_bytes,
    shared_bitmap64_heap_bytes,
)

__all__ = ["MAX_PACKED_INDEX", "PackedSlot", "PackedStore"]

_SLOT_BITS = 10
_ENTRY_BITS = 32
_ORDINAL_SHIFT = _SLOT_BITS + _ENTRY_BITS
#: Batch indexes a row can name (``1 + index`` must fit the slot bits): members beyond stay in the index.
MAX_PACKED_INDEX = (1 << _SLOT_BITS) - 2
#: Ordinals a row can name (they fit the 22 bits above the entry id): a bucket of a ledger numbered
#: beyond stays in the index.
MAX_ORDINALS = 1 << (64 - _ORDINAL_SHIFT)
_SPAN = 1 << 32  # bucket offsets are uint32
#: pop() handles at most this many due rows in plain Python (see ``_pop_small``), more with numpy.
_SMALL_POP = 256
_U32 = np.dtype(np.uint32)
_U_SLOT = np.uint64((1 << _SLOT_BITS) - 1)
_U_SLOT_BITS = np.uint64(_SLOT_BITS)
_U_ENTRY = np.uint64((1 << _ENTRY_BITS) - 1)
_U_ORDINAL_SHIFT = np.uint64(_ORDINAL_SHIFT)
_U_LOW = np.uint64((1 << _ORDINAL_SHIFT) - 1)
_U32_SLOT_BITS = np.uint32(_SLOT_BITS)
#: Ordinals a run's split codes can name (uint16).
_NARROW_ORDINALS = 1 << 16
#: A run keeps its row positions as uint16 below this; its offsets' high bits once a page of this span.
_NARROW_SPAN = 1 << 16
_Positions = npt.NDArray[Any]  # uint16 or uint32
_U_ENTRY_SHIFT = np.uint64(_ENTRY_BITS)
_ENTRY_MASK = (1 << _ENTRY_BITS) - 1
#: At most this many low ordinal bits go below the entry id in membership keys (4,096 ledgers share a
#: container of 16 entry ids).
_MAX_LOW_BITS = 12

LedgerKey = int | tuple[str, int]
#: One slot's rows as the index hands them over: ledger key, unique entry ids, and the batch indexes (as
#: a bitmask) of the entries pending for some messages only.
PackedSlot = tuple[LedgerKey, list[int], dict[int, int]]
#: What :meth:`PackedStore.pop` returns per group: (bucket time, ledger key, entry ids, partial entries).
_Popped = tuple[int, LedgerKey, npt.NDArray[np.uint32], dict[int, tuple[int, ...]]]


class _SortedOffsets:
    """A sorted sequence of bucket offsets (uint32 values) in 2 bytes each: relative to the first
    (``base``), the low 16 bits as uint16 (``low``) and, for a sequence spanning 65,536 buckets or more,
    the high bits once per *page* — the position where they change (``page_starts``) and their value
    (``page_highs``): a page spans 65,536 buckets (at k = 0: 65 s of due times), so at most span / 65,536
    of them. Reads return uint32 arrays. O(log pages) a value more than a plain array."""

    __slots__ = ("base", "low", "page_highs", "page_starts")

    def __init__(self, values: npt.NDArray[np.uint32]) -> None:
        """``values``: sorted. O(len) numpy."""
        self.base = int(values[0]) if len(values) else 0
        relative = values.astype(np.uint32) - np.uint32(self.base)
        self.low: npt.NDArray[np.uint16] = (relative & np.uint32(0xFFFF)).astype(np.uint16)
        self.page_starts: npt.NDArray[np.intp] | None = None
        self.page_highs: npt.NDArray[np.uint32] | None = None
        if len(values) and int(relative[-1]) >= _NARROW_SPAN:
            highs = relative >> np.uint32(16)
            self.page_starts = np.concatenate(([0], np.flatnonzero(highs[1:] != highs[:-1]) + 1))
            self.page_highs = (highs[self.page_starts] << np.uint32(16)).astype(np.uint32)

    def __len__(self) -> int:
        return len(self.low)

    def at(self, indexes: npt.NDArray[np.intp]) -> npt.NDArray[np.uint32]:
        """The values at ``indexes``. O(len(indexes) log pages) numpy."""
        values = self.low[indexes].astype(np.uint32) + np.uint32(self.base)
        if self.page_starts is not None and self.page_highs is not None:
            values += self.page_highs[np.searchsorted(self.page_starts, indexes, "right") - 1]
        return values

    def one(self, index: int) -> int:
        """The value at ``index``. O(log pages)."""
        value = self.base + int(self.low[index])
        if self.page_starts is not None and self.page_highs is not None:
            value += int(self.page_highs[int(np.searchsorted(self.page_starts, index, "right")) - 1])
        return value

    def slice(self, start: int, end: int) -> npt.NDArray[np.uint32]:
        """The values ``start:end``. O(end - start) numpy."""
        if self.page_starts is None:
            return self.low[start:end].astype(np.uint32) + np.uint32(self.base)
        return self.at(np.arange(start, max(start, end), dtype=np.intp))

    def count_at_most(self, limit: int) -> int:
        """How many values are <= ``limit`` (a bisect). O(log len)."""
        relative = limit - self.base
        if relative < 0:
            return 0
        if self.page_starts is None or self.page_highs is None:
            return int(np.searchsorted(self.low, min(relative, 0xFFFF), "right"))
        page = int(np.searchsorted(self.page_highs, relative & ~0xFFFF, "right")) - 1
        start = int(self.page_starts[page])
        end = int(self.page_starts[page + 1]) if page + 1 < len(self.page_starts) else len(self.low)
        if int(self.page_highs[page]) < relative & ~0xFFFF:  # past this page's values: all of it
            return end
        return start + int(np.searchsorted(self.low[start:end], relative & 0xFFFF, "right"))

    def memory_bytes(self) -> int:
        """The object and its arrays. O(1)."""
        pages = (
            0 if self.page_starts is None else python_bytes(self.page_starts) + python_bytes(self.page_highs)
        )
        return python_bytes(self) + python_bytes(self.low) + pages


class _Run:
    """Rows sorted by bucket offset; positions below ``head`` are popped.

    The offsets are kept run-length encoded when a run holds two rows a bucket or more — the distinct
    offsets (``offsets``) and the position of each one's first row (``starts``), 8 bytes a bucket or less,
    where an offset per row cost 4 bytes a row, a third of a row — else one per row (``offsets``,
    ``starts`` None: at k = 0 and long delays a bucket holds one row or none). The offsets take 2 bytes
    each (:class:`_SortedOffsets`) and ``starts`` is uint16 when the run has fewer than 65,536 rows: 2
    bytes a row or bucket less than uint32, a sixth of a sparse row. The codes, one per row, are
    kept split when they fit — the ordinal as uint16 (``high``) and ``entry_id << 10 | slot`` as uint32
    (``low``): 6 bytes a row, where a uint64 code cost 8, a quarter of what a row costs at 1,000 sparse
    ledgers — else whole as uint64 in ``low`` (``high`` None: over 65,536 ledgers or an entry id of 2^22
    or more). :attr:`codes` puts them together.
    """

    __slots__ = ("first", "head", "high", "low", "offsets", "starts")

    def __init__(self, times: npt.NDArray[np.uint32], codes: npt.NDArray[np.uint64]) -> None:
        """``times``: each row's offset, sorted. O(rows) numpy."""
        self._set(times, codes)

    def _set(self, times: npt.NDArray[np.uint32], codes: npt.NDArray[np.uint64]) -> None:
        change = np.flatnonzero(times[1:] != times[:-1]) + 1
        self.starts: _Positions | None = None
        if 2 * (len(change) + 1) <= len(times):
            self.starts = np.concatenate(([0], change)).astype(
                np.uint16 if len(times) < _NARROW_SPAN else np.uint32
            )
            self.offsets = _SortedOffsets(times[self.starts])
        else:
            self.offsets = _SortedOffsets(times)
        self.high: npt.NDArray[np.uint16] | None = None
        self.low: npt.NDArray[np.uint64] | npt.NDArray[np.uint32] = codes
        if len(codes) and int(codes.max()) >> _ORDINAL_SHIFT < _NARROW_ORDINALS:
            low = codes & _U_LOW
            if int(low.max()) < 1 << 32:
                self.high = (codes >> _U_ORDINAL_SHIFT).astype(np.uint16)
                self.low = low.astype(np.uint32)
        self.head = 0
        #: the offset of the first live row (the timer asks for it at every tick: no search then)
        self.first = self.offsets.one(0) if len(codes) else 0

    def __len__(self) -> int:
        return len(self.low) - self.head

    @property
    def rows(self) -> int:
        """Rows, popped ones included. O(1)."""
        return len(self.low)

    @property
    def codes(self) -> npt.NDArray[np.uint64]:
        """Every row's code (popped ones included; a new array unless kept whole). O(rows) numpy."""
        return self.code_slice(0, len(self.low))

    def code_slice(self, start: int, end: int) -> npt.NDArray[np.uint64]:
        """The codes of rows ``start:end``. O(end - start) numpy."""
        if self.high is None:
            return self.low[start:end]  # type: ignore[return-value]
        high = self.high[start:end].astype(np.uint64) << _U_ORDINAL_SHIFT
        return high | self.low[start:end].astype(np.uint64)

    def codes_at(self, positions: npt.NDArray[np.intp]) -> npt.NDArray[np.uint64]:
        """The codes of rows at these (absolute) positions. O(positions) numpy."""
        if self.high is None:
            return self.low[positions]  # type: ignore[return-value]
        high = self.high[positions].astype(np.uint64) << _U_ORDINAL_SHIFT
        return high | self.low[positions].astype(np.uint64)

    def find(self, ordinal: int, entry_id: int) -> npt.NDArray[np.intp]:
        """The absolute positions of the live rows of an entry. O(rows) numpy."""
        head = self.head
        if self.high is None:
            target = np.uint64(ordinal << 32 | entry_id)
            return np.flatnonzero(self.low[head:] >> _U_SLOT_BITS == target) + head
        if ordinal >= _NARROW_ORDINALS or entry_id >= 1 << (32 - _SLOT_BITS):
            return np.zeros(0, np.intp)
        match = (self.high[head:] == ordinal) & (self.low[head:] >> _U32_SLOT_BITS == entry_id)
        return np.flatnonzero(match) + head

    def _group(self, position: int) -> int:
        """The index in ``offsets`` of the row at ``position``. O(log buckets)."""
        if self.starts is None:
            return position
        return int(np.searchsorted(self.starts, position, "right")) - 1

    def times_at(self, positions: npt.NDArray[np.intp]) -> npt.NDArray[np.uint32]:
        """The offsets of rows at these (absolute) positions. O(k log buckets)."""
        if self.starts is None:
            return self.offsets.at(positions)
        return self.offsets.at(np.searchsorted(self.starts, positions, "right") - 1)

    def advance(self, head: int) -> None:
        """Pop the rows before ``head`` (< the run's length). O(log buckets)."""
        self.head = head
        self.first = self.offsets.one(self._group(head))

    def end_of(self, limit: int) -> int:
        """The position after the last row whose offset is <= ``limit``. O(log buckets)."""
        group = self.offsets.count_at_most(limit)
        if self.starts is None:
            return group
        return int(self.starts[group]) if group < len(self.starts) else self.rows

    def times(self, start: int, end: int) -> npt.NDArray[np.uint32]:
        """The offsets of rows ``start:end``, one per row. O(end - start + log buckets) numpy."""
        if self.starts is None:
            return self.offsets.slice(start, end)
        if start >= end:
            return np.zeros(0, np.uint32)
        first = self._group(start)
        last = int(np.searchsorted(self.starts, end - 1, "right"))
        bounds = self.starts[first:last].astype(np.intp)
        bounds[0] = start
        counts = np.diff(np.append(bounds, end))
        return np.repeat(self.offsets.slice(first, last), counts)

    def distinct(self) -> npt.NDArray[np.uint32]:
        """The distinct offsets of the live rows. O(log buckets), or O(rows) numpy one per row."""
        if not len(self):
            return np.zeros(0, np.uint32)
        if self.starts is None:
            times = self.offsets.slice(self.head, len(self.offsets))
            return times[np.concatenate(([True], times[1:] != times[:-1]))]
        return self.offsets.slice(self._group(self.head), len(self.offsets))

    def live(self) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint64]]:
        return self.times(self.head, self.rows), self.code_slice(self.head, self.rows)

    def keep(self, keep: npt.NDArray[np.bool_]) -> None:
        """Keep only the rows where ``keep`` is True (popped rows must be False); head becomes 0. O(rows)."""
        times = self.times(0, self.rows)[keep]
        self._set(times, self.codes[keep])

    def memory_bytes(self) -> int:
        """The run's object and arrays. O(1)."""
        total = python_bytes(self) + python_bytes(self.low) + self.offsets.memory_bytes()
        total += python_bytes(self.high) if self.high is not None else 0
        return total + (python_bytes(self.starts) if self.starts is not None else 0)


class PackedStore:
    """Rows (bucket time, ledger, entry id, batch slot) of sparse buckets; see the module docstring.

    ``len`` counts (bucket, entry) pairs, as the index does. Not thread-safe: the index's lock guards it.
    """

    def __init__(self, precision_bits: int, ledgers: LedgerRegistry | None = None) -> None:
        """``ledgers``: the numbering of ledgers to share (the store's own if None). O(1)."""
        self._k = precision_bits
        self._origin = 0
        self._runs: list[_Run] = []
        self._registry = ledgers if ledgers is not None else LedgerRegistry()
        self._held = BitMap()  # the ordinals this store holds in the registry
        # Entry codes that may have rows (a superset: see pop), and those that had rows in more than one
        # bucket when they came in — pop keeps their bits, as other buckets may still hold them.
        self._entries = BitMap64()
        self._multi = BitMap64()
        self._low = 0  # low ordinal bits below the entry id in the membership keys (see the module)
        self._count = 0
        self._staged: list[tuple[int, int]] = []  # (bucket offset, rows) of what stage() took
        self._staged_codes: list[int] = []
        self._buckets: int | None = None  # distinct bucket times, cached until the rows change
        #: The latest bucket time ever put here (-1: none since the last clear): an id of a later bucket
        #: cannot share a (bucket, entry) pair with a row.
        self.newest = -1

    def __len__(self) -> int:
        return self._count

    # -- putting rows in ----------------------------------------------------------------------------

    def accepts(self, bucket: int, keys: Iterable[LedgerKey]) -> bool:
        """Whether a bucket of these ledgers fits: its offset within 2**32 bucket widths of the origin,
        and ordinals left for new ledgers. O(ledgers)."""
        if not self._count and not self._staged:
            self._origin = max(0, bucket - ((_SPAN >> 1) << self._k))
        if not 0 <= (bucket - self._origin) >> self._k < _SPAN:
            return False
        ordinals = self._registry.ordinals
        new = sum(1 for key in keys if key not in ordinals)
        return self._registry.span + new <= MAX_ORDINALS

    def within(self, buckets: npt.NDArray[np.int64], first: int) -> npt.NDArray[np.bool_]:
        """Which of these bucket times :meth:`accepts` would take as to their span (the origin set from
        ``first`` when the store is empty, as :meth:`accepts` does). O(n) numpy."""
        if not self._count and not self._staged:
            self._origin = max(0, first - ((_SPAN >> 1) << self._k))
        offsets = (buckets - self._origin) >> self._k
        fits: npt.NDArray[np.bool_] = (buckets >= self._origin) & (offsets < _SPAN)
        return fits

    def may_hold_many(self, entry_codes: npt.NDArray[np.uint64]) -> npt.NDArray[np.bool_]:
        """:meth:`may_hold` of many entries given as codes ``ordinal << 32 | entry_id`` (ordinals of the
        registry). O(n) numpy and CRoaring."""
        keys = self._keys_of(entry_codes)
        present = np.frombuffer((_bitmap(keys) & self._entries).to_array(), np.uint64)
        held: npt.NDArray[np.bool_] = np.isin(keys, present)
        return held

    def stage(self, bucket: int, slots: list[PackedSlot]) -> None:
        """Take one bucket's slots (``accepts`` said yes; no entry here is already held at this bucket).
        They become rows at the next :meth:`flush`. O(ids + members) plain Python: a bucket holds a few
        ids here, where a numpy call per bucket cost more than the ids (~100 µs a bucket at k = 0)."""
        codes = self._staged_codes
        before = len(codes)
        ordinals, held = self._registry.ordinals, self._held
        for key, entry_ids, masks in slots:
            ordinal = ordinals.get(key)
            if ordinal is None or ordinal not in held:
                ordinal = self._registry.acquire(key)
                held.add(ordinal)
            base = ordinal << _ORDINAL_SHIFT
            if masks:
                for entry_id in entry_ids:
                    mask = masks.get(entry_id)
                    code = base | entry_id << _SLOT_BITS
                    if mask is None:
                        codes.append(code)
                    else:
                        codes.extend(code + 1 + index for index in _bits(mask))
            else:
                codes.extend(base | entry_id << _SLOT_BITS for entry_id in entry_ids)
            self._count += len(entry_ids)
        if len(codes) > before:
            self._staged.append(((bucket - self._origin) >> self._k, len(codes) - before))
            self.newest = max(self.newest, bucket)

    def flush(self) -> None:
        """Turn the staged buckets into a run (and merge runs, see the module). O(rows log rows)."""
        if not self._staged:
            return
        staged, self._staged = self._staged, []
        codes = np.array(self._staged_codes, np.uint64)
        self._staged_codes = []
        times = np.repeat(
            np.fromiter((offset for offset, _ in staged), np.uint32, len(staged)),
            np.fromiter((count for _, count in staged), np.intp, len(staged)),
        )
        order = np.argsort(times, kind="stable")
        self._add_run(times[order], codes[order])

    def put_rows(self, buckets: npt.NDArray[np.int64], codes: npt.NDArray[np.uint64]) -> None:
        """Take rows in bulk: ``codes`` (``ordinal << 42 | entry_id << 10 | slot``, ordinals of the store's
        registry, held by the caller meanwhile) filed under ``buckets`` (bucket times, sorted; each within
        :meth:`accepts`' span: call it with the first one). No (bucket, entry) pair may be here already,
        and no row repeated. The rows become one run at once. O(n log n) numpy, plus O(1) Python per ledger
        the store does not hold yet."""
        if not len(codes):
            return
        self.flush()  # (stage()'s buckets first: one run each)
        registry, held = self._registry, self._held
        for ordinal in np.unique(codes >> _U_ORDINAL_SHIFT).tolist():
            if ordinal not in held:
                registry.acquire(registry.key(ordinal))
                held.add(ordinal)
        times = ((buckets - self._origin) >> self._k).astype(np.uint32)
        self._count += len(_distinct_pairs(codes >> _U_SLOT_BITS, times))
        self.newest = max(self.newest, int(buckets[-1]))
        self._add_run(times, codes)

    def _add_run(self, times: npt.NDArray[np.uint32], codes: npt.NDArray[np.uint64]) -> None:
        """Rows sorted by time become a run (membership updated; runs merged, see the module). O(n log n)
        numpy."""
        entry_codes = codes >> _U_SLOT_BITS
        low = min(_MAX_LOW_BITS, self._held.max().bit_length())
        if low > self._low:
            self._relayout(low)
        fresh = _bitmap(self._keys_of(entry_codes))
        repeated = self._entries & fresh  # entries with rows in another bucket already
        self._multi |= repeated
        if len(times) > 1 and times[0] != times[-1]:  # an entry in two buckets of this run (sorted)
            # (sorts, not np.unique: its hashing cost ~20x a sort here, ~0.7 µs a row)
            entries = _distinct_pairs(entry_codes, times)
            repeat = entries[1:] == entries[:-1]
            if repeat.any():
                self._multi |= _bitmap(self._keys_of(entries[1:][repeat]))
        self._entries |= fresh
        # Array containers grow by up to 2x their values as values come in: give the spare back (~1 B
        # an id at 1000 ledgers of ~100 ids). O(containers the flush touched) reallocations.
        self._entries.shrink_to_fit()
        self._runs.append(_Run(times, codes))
        self._buckets = None
        runs = self._runs
        while len(runs) > 1 and len(runs[-2]) <= 2 * len(runs[-1]):
            newer, older = runs.pop(), runs.pop()
            runs.append(_merge(older, newer))
        if len(runs) == 1:
            self._renumber()

    def _renumber(self) -> None:
        """Release the ledgers with nothing here, once there are more of them than of the others
        (amortized O(1) a row: it runs on a full merge), and re-key the membership bitmaps for the
        ordinals left. O(rows) numpy."""
        (run,) = self._runs
        times, codes = run.live()
        live = np.unique(codes >> _U_ORDINAL_SHIFT)
        if 2 * len(live) >= len(self._held):
            return
        held = BitMap(live.astype(np.uint32))
        release = self._registry.release
        for ordinal in self._held - held:
            release(ordinal)
        self._held = held
        entry_codes = codes >> _U_SLOT_BITS
        self._low = min(_MAX_LOW_BITS, held.max().bit_length()) if held else 0
        self._entries = _bitmap(self._keys_of(entry_codes))
        pairs = np.unique(np.stack((entry_codes, times.astype(np.uint64))), axis=1)
        counts = np.unique(pairs[0], return_counts=True)
        self._multi = _bitmap(self._keys_of(counts[0][counts[1] > 1]))

    def _keys_of(self, entry_codes: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        """The membership keys of entry codes ``ordinal << 32 | entry_id`` (see the module). O(n) numpy."""
        low = self._low
        if not low:
            return entry_codes
        ordinals = entry_codes >> _U_ENTRY_SHIFT
        high = (ordinals >> np.uint64(low)) << np.uint64(_ENTRY_BITS + low)
        keys: npt.NDArray[np.uint64] = (
            high | (entry_codes & _U_ENTRY) << np.uint64(low) | ordinals & np.uint64((1 << low) - 1)
        )
        return keys

    def _key(self, ordinal: int, entry_id: int) -> int:
        """One membership key (see :meth:`_keys_of`). O(1)."""
        low = self._low
        return (ordinal >> low) << (_ENTRY_BITS + low) | entry_id << low | ordinal & ((1 << low) - 1)

    def _relayout(self, low: int) -> None:
        """Re-key the membership bitmaps with ``low`` low ordinal bits (more ledgers than the current
        keys number; they double each time, so O(1) amortized a row). O(entries) numpy."""
        old = self._low
        for name in ("_entries", "_multi"):
            keys = np.frombuffer(getattr(self, name).to_array(), np.uint64)
            ordinals = (keys >> np.uint64(_ENTRY_BITS + old)) << np.uint64(old) | keys & np.uint64(
                (1 << old) - 1
            )
            entry_codes = ordinals << _U_ENTRY_SHIFT | (keys >> np.uint64(old)) & _U_ENTRY
            self._low = low
            setattr(self, name, _bitmap(self._keys_of(entry_codes)))
            self._low = old
        self._low = low

    # -- reading and taking rows out ------------------------------------------------------------------

    def may_hold(self, key: LedgerKey, entry_id: int) -> bool:
        """Whether the entry may have rows here (False: it has none). O(1)."""
        ordinal = self._registry.ordinals.get(key)
        return (
            ordinal is not None
            and 0 <= entry_id < 1 << _ENTRY_BITS
            and self._key(ordinal, entry_id) in self._entries
        )

    def _find(self, key: LedgerKey, entry_id: int) -> list[tuple[_Run, npt.NDArray[np.intp]]]:
        """Each run's absolute positions of the entry's rows (runs without any left out). O(n) numpy."""
        ordinal = self._registry.ordinals.get(key)
        if ordinal is None or not 0 <= entry_id < 1 << _ENTRY_BITS:
            return []
        out = []
        for run in self._runs:
            at = run.find(ordinal, entry_id)
            if len(at):
                out.append((run, at))
        return out

    def parts(self, key: LedgerKey, entry_id: int) -> list[tuple[int, int | None]]:
        """(bucket time, batch mask or None for the whole entry) of each bucket holding the entry,
        earliest first. O(n) numpy when the entry may be here, else O(1)."""
        if not self.may_hold(key, entry_id):
            return []
        masks: dict[int, int | None] = {}
        for run, at in self._find(key, entry_id):
            offsets, slots = run.times_at(at).tolist(), (run.codes_at(at) & _U_SLOT).tolist()
            for offset, slot in zip(offsets, slots, strict=True):
                bucket = self._origin + (offset << self._k)
                if slot == 0:
                    masks[bucket] = None
                elif bucket not in masks or masks[bucket] is not None:
                    masks[bucket] = (masks.get(bucket) or 0) | 1 << (slot - 1)
        return sorted(masks.items())

    def remove(self, key: LedgerKey, entry_id: int, batch_index: int = -1) -> bool:
        """Delete the entry's rows (with a batch index, only that message's rows). True if any went.
        O(n) numpy when the entry may be here, else O(1)."""
        if not self.may_hold(key, entry_id):
            return False
        found = self._find(key, entry_id)
        before = {t for run, at in found for t in run.times_at(at).tolist()}
        removed = False
        after: set[int] = set()
        for run, at in found:
            if batch_index >= 0:
                slots = run.codes_at(at) & _U_SLOT
                going = at[slots == np.uint64(batch_index + 1)]
                after.update(run.times_at(at[slots != np.uint64(batch_index + 1)]).tolist())
            else:
                going = at
            if len(going):
                removed = True
                keep = np.ones(run.rows, bool)
                keep[going] = False
                keep[: run.head] = False
                run.keep(keep)
        if not removed:
            return False
        self._count -= len(before) - len(after)
        if not after:
            code = self._key(self._registry.ordinals[key], entry_id)
            self._entries.discard(code)
            self._multi.discard(code)
        self._tidy()
        return True

    def take(self, key: LedgerKey, entry_id: int) -> list[tuple[int, int | None]]:
        """:meth:`parts`, and delete them. O(n) numpy when the entry may be here, else O(1)."""
        parts = self.parts(key, entry_id)
        if parts:
            self.remove(key, entry_id)
        return parts

    def first(self) -> int | None:
        """The earliest bucket time, or None. O(runs)."""
        firsts = [run.first for run in self._runs]
        return self._origin + (min(firsts) << self._k) if firsts else None

    def bucket_times(self) -> npt.NDArray[np.int64]:
        """The distinct bucket times, sorted. O(n) numpy: each run's distinct times come from one pass
        over its sorted offsets; only those of several runs are sorted together."""
        distinct = []
        for run in self._runs:
            if len(run):
                distinct.append(run.distinct())
        if not distinct:
            self._buckets = 0
            return np.zeros(0, np.int64)
        offsets = distinct[0] if len(distinct) == 1 else np.unique(np.concatenate(distinct))
        self._buckets = len(offsets)
        return self._origin + (offsets.astype(np.int64) << self._k)

    def bucket_count(self) -> int:
        """Distinct bucket times. O(1) cached, else O(n) numpy."""
        if self._buckets is None:
            self.bucket_times()
        assert self._buckets is not None
        return self._buckets

    def pop(self, now: int, *, by_bucket: bool = False) -> list[_Popped]:
        """Remove the rows of buckets <= ``now``: per ledger (first due bucket, key, sorted unique entry
        ids, {entry id: due batch indexes} of the entries not due whole), earliest first. With
        ``by_bucket``, per (bucket, ledger) instead — (bucket time, key, its entries, those not due whole
        in it) — in bucket order: what a pop of each due bucket in turn would return.
        O(runs log n + due log due) numpy, plus O(1) Python per due ledger (per due bucket and ledger
        with ``by_bucket``) and per due batch member."""
        if not self._runs or now < self._origin:
            return []
        limit = min((now - self._origin) >> self._k, _SPAN - 1)
        times_parts, code_parts = [], []
        rows = 0
        for run in self._runs:
            if len(run) and run.first <= limit:  # (one read: most runs skip)
                end = run.end_of(limit)
                times_parts.append(run.times(run.head, end))
                code_parts.append(run.code_slice(run.head, end))
                rows += end - run.head
                if end < run.rows:
                    run.advance(end)
                else:
                    run.head = end  # emptied: dropped by _after_pop
        if not code_parts:
            return []
        if rows <= _SMALL_POP:
            return self._pop_small(
                [t for part in times_parts for t in part.tolist()],
                [c for part in code_parts for c in part.tolist()],
                by_bucket,
            )
        times = np.concatenate(times_parts) if len(times_parts) > 1 else times_parts[0].copy()
        codes = np.concatenate(code_parts) if len(code_parts) > 1 else code_parts[0].copy()
        self._after_pop()
        entry_codes = codes >> _U_SLOT_BITS
        pairs = np.unique(np.stack((entry_codes, times.astype(np.uint64))), axis=1)
        self._count -= pairs.shape[1]
        emptied = not self._runs  # (then cleared at the end: the ledgers' keys are read first)
        if not emptied:
            gone = _bitmap(self._keys_of(entry_codes))
            if self._multi:
                gone -= self._multi
            self._entries -= gone
        out = self._by_bucket(times, codes) if by_bucket else self._by_ledger(times, codes, entry_codes)
        if emptied:
            self.clear()
        return out

    def _by_ledger(
        self, times: npt.NDArray[Any], codes: npt.NDArray[np.uint64], entry_codes: npt.NDArray[np.uint64]
    ) -> list[_Popped]:
        """:meth:`pop`'s groups per ledger of popped rows: its first due bucket, its entries, the members
        of entries not due whole; earliest first. O(rows log rows) numpy, plus O(1) Python per ledger."""
        codes.sort()
        ordinals = codes >> _U_ORDINAL_SHIFT
        starts = np.flatnonzero(np.concatenate(([True], ordinals[1:] != ordinals[:-1])))
        firsts = {}
        by_ordinal = entry_codes >> _U_ENTRY_SHIFT
        order = np.argsort(by_ordinal, kind="stable")
        sorted_ordinals = by_ordinal[order]
        group = np.flatnonzero(np.concatenate(([True], sorted_ordinals[1:] != sorted_ordinals[:-1])))
        for ordinal, first in zip(
            sorted_ordinals[group].tolist(), np.minimum.reduceat(times[order], group).tolist(), strict=True
        ):
            firsts[ordinal] = self._origin + (first << self._k)
        out = []
        key_of = self._registry.key
        bounds = [*starts.tolist(), len(codes)]
        for start, end in pairwise(bounds):
            mine = codes[start:end]
            ordinal = int(mine[0] >> _U_ORDINAL_SHIFT)
            out.append((firsts[ordinal], key_of(ordinal), *_entries_of(mine)))
        out.sort(key=_first)
        return out

    def _by_bucket(self, times: npt.NDArray[Any], codes: npt.NDArray[np.uint64]) -> list[_Popped]:
        """:meth:`pop`'s groups per (bucket, ledger) of popped rows, in bucket order. O(rows log rows)
        numpy, plus O(1) Python per group."""
        order = np.lexsort((codes, times))
        times, codes = times[order], codes[order]
        ordinals = codes >> _U_ORDINAL_SHIFT
        change = (times[1:] != times[:-1]) | (ordinals[1:] != ordinals[:-1])
        bounds = [*np.flatnonzero(np.concatenate(([True], change))).tolist(), len(codes)]
        key_of, origin, k = self._registry.key, self._origin, self._k
        return [
            (origin + (int(times[start]) << k), key_of(int(ordinals[start])), *_entries_of(codes[start:end]))
            for start, end in pairwise(bounds)
        ]

    def _after_pop(self) -> None:
        """Drop emptied runs; copy down a run whose popped prefix is half of it. O(runs + copied)."""
        self._runs = [run if 2 * run.head < run.rows else _copy(run) for run in self._runs if len(run)]
        self._buckets = None

    def _pop_small(self, times: list[int], codes: list[int], by_bucket: bool) -> list[_Popped]:
        """:meth:`pop`'s work for few due rows, in plain Python: the timer pops a few ids every few ms,
        where the numpy path's dozen calls cost ~100 µs a pop. O(rows log rows)."""
        self._after_pop()
        self._count -= len({(code >> _SLOT_BITS, time) for code, time in zip(codes, times, strict=True)})
        emptied = not self._runs  # (then cleared at the end: the ledgers' keys are read first)
        if not emptied:
            present, multi, key_of = self._entries, self._multi, self._key
            for entry_code in {code >> _SLOT_BITS for code in codes}:
                member = key_of(entry_code >> _ENTRY_BITS, entry_code & _ENTRY_MASK)
                if member not in multi:
                    present.discard(member)
        out = self._small_by_bucket(times, codes) if by_bucket else self._small_by_ledger(times, codes)
        if emptied:
            self.clear()
        return out

    def _small_by_ledger(self, times: list[int], codes: list[int]) -> list[_Popped]:
        """:meth:`_pop_small`'s groups per ledger, earliest first (as :meth:`_by_ledger`). O(rows log
        rows)."""
        entry_mask, slot_mask = (1 << _ENTRY_BITS) - 1, (1 << _SLOT_BITS) - 1
        # per ledger: [its first time], whole entries, members
        groups: dict[int, tuple[list[int], set[int], dict[int, set[int]]]] = {}
        for code, time in zip(codes, times, strict=True):
            ordinal = code >> _ORDINAL_SHIFT
            group = groups.get(ordinal)
            if group is None:
                group = groups[ordinal] = ([time], set(), {})
            elif time < group[0][0]:
                group[0][0] = time
            entry_id, slot = code >> _SLOT_BITS & entry_mask, code & slot_mask
            if slot:
                group[2].setdefault(entry_id, set()).add(slot - 1)
            else:
                group[1].add(entry_id)
        out = []
        ledger_key = self._registry.key
        for ordinal, (first, whole, members) in groups.items():
            key = ledger_key(ordinal)
            partial = {e: tuple(sorted(ix)) for e, ix in sorted(members.items()) if e not in whole}
            entries = np.array(sorted(whole | members.keys()), _U32)
            out.append((self._origin + (first[0] << self._k), key, entries, partial))
        out.sort(key=_first)
        return out

    def _small_by_bucket(self, times: list[int], codes: list[int]) -> list[_Popped]:
        """:meth:`_pop_small`'s groups per (bucket, ledger), in bucket order: one pass over the rows
        sorted by (time, code), where a group's rows are adjacent and an entry's whole row (slot 0) comes
        before its members'. O(rows log rows)."""
        entry_mask, slot_mask = (1 << _ENTRY_BITS) - 1, (1 << _SLOT_BITS) - 1
        key_of, origin, k = self._registry.key, self._origin, self._k
        out: list[_Popped] = []
        group: tuple[int, int] | None = None
        entries: list[int] = []
        members: dict[int, list[int]] = {}
        whole = False
        for time, code in sorted(zip(times, codes, strict=True)):
            here = (time, code >> _ORDINAL_SHIFT)
            if here != group:
                if group is not None:
                    out.append(_group(origin + (group[0] << k), key_of(group[1]), entries, members))
                group, entries, members = here, [], {}
            entry_id, slot = code >> _SLOT_BITS & entry_mask, code & slot_mask
            if not entries or entries[-1] != entry_id:
                entries.append(entry_id)
                whole = not slot
            if slot and not whole:
                indexes = members.setdefault(entry_id, [])
                if not indexes or indexes[-1] != slot - 1:
                    indexes.append(slot - 1)
        if group is not None:
            out.append(_group(origin + (group[0] << k), key_of(group[1]), entries, members))
        return out

    def slots(self) -> Iterator[tuple[int, LedgerKey, npt.NDArray[np.uint32]]]:
        """(bucket time, ledger key, sorted unique entry ids) per slot. O(n log n) numpy."""
        live = [run.live() for run in self._runs]
        if not live:
            return
        times = np.concatenate([t for t, _ in live]).astype(np.uint64)
        entry_codes = np.concatenate([c for _, c in live]) >> _U_SLOT_BITS
        order = np.lexsort((entry_codes, times))
        times, entry_codes = times[order], entry_codes[order]
        ordinals = entry_codes >> _U_ENTRY_SHIFT
        change = np.concatenate(([True], (times[1:] != times[:-1]) | (ordinals[1:] != ordinals[:-1])))
        bounds = [*np.flatnonzero(change).tolist(), len(times)]
        for start, end in pairwise(bounds):
            key = self._registry.key(int(ordinals[start]))
            entries = np.unique((entry_codes[start:end] & _U_ENTRY).astype(np.uint32))
            yield self._origin + (int(times[start]) << self._k), key, entries

    def clear(self) -> None:
        release = self._registry.release
        for ordinal in self._held:
            release(ordinal)
        self._held = BitMap()
        self._runs = []
        self._entries = BitMap64()
        self._multi = BitMap64()
        self._low = 0
        self._count = 0
        self._staged = []
        self._staged_codes = []
        self._buckets = None
        self.newest = -1

    def _tidy(self) -> None:
        self._runs = [run for run in self._runs if len(run)]
        self._buckets = None
        if not self._runs:
            self.clear()

    # -- accounting ---------------------------------------------------------------------------------

    def structure(self) -> dict[str, int]:
        """``packed_ids`` ((bucket, entry) pairs), ``packed_rows``, ``packed_runs``, ``packed_ledgers``.
        O(runs)."""
        return {
            "tier_ids": self._count,
            "tier_rows": sum(len(run) for run in self._runs),
            "tier_runs": len(self._runs),
            "tier_ledgers": len(self._held),
        }

    def memory_bytes(self) -> tuple[int, int]:
        """(Python bytes, CRoaring heap bytes): the runs' arrays (their whole buffers, popped prefixes
        included), the ordinals held, the membership bitmaps. O(runs)."""
        total = python_bytes(self) + python_bytes(self._runs) + python_bytes(self._staged)
        for run in self._runs:
            total += run.memory_bytes()
        # The ledgers' numbering is the registry's (its owner counts it): here a bitmap of the ordinals.
        total += python_bytes(self._held) + bitmap_heap_bytes(self._held)
        for bitmap in (self._entries, self._multi):
            total += python_bytes(bitmap)
        # The entry codes have the index's shared-bitmap shape (ledger number above the entry id); they
        # are shrunk at every flush (pops only take values out).
        roaring = shared_bitmap64_heap_bytes(self._entries, True) + bitmap64_heap_bytes(self._multi)
        return total, roaring


def _merge(older: _Run, newer: _Run) -> _Run:
    """One run of two (sorted by time; stable, so rows keep their order within a time). O(n): timsort
    finds the two sorted halves."""
    a_times, a_codes = older.live()
    b_times, b_codes = newer.live()
    times = np.concatenate((a_times, b_times))
    order = np.argsort(times, kind="stable")
    return _Run(times[order], np.concatenate((a_codes, b_codes))[order])


def _copy(run: _Run) -> _Run:
    """The live rows of a run in arrays of their own (the popped prefix's memory goes). O(rows)."""
    times, codes = run.live()
    return _Run(times.copy(), codes.copy())


def _distinct_pairs(
    entry_codes: npt.NDArray[np.uint64], times: npt.NDArray[np.uint32]
) -> npt.NDArray[np.uint64]:
    """The entry code of each distinct (entry code, time) pair, sorted. O(n log n) numpy (one lexsort)."""
    order = np.lexsort((times, entry_codes))
    entries, at = entry_codes[order], times[order]
    change = np.concatenate(([True], (entries[1:] != entries[:-1]) | (at[1:] != at[:-1])))
    distinct: npt.NDArray[np.uint64] = entries[change]
    return distinct


def _bitmap(codes: npt.NDArray[np.uint64]) -> BitMap64:
    """A 64-bit bitmap of codes (built from an ``array('Q')``: ~10x faster than from numpy)."""
    return BitMap64(array("Q", np.ascontiguousarray(codes, np.uint64).tobytes()))


def _bits(mask: int) -> Iterator[int]:
    """The set bits of ``mask``, lowest first. O(set bits) (a batch index of 99 is one step, not 100)."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def _entries_of(codes: npt.NDArray[np.uint64]) -> tuple[npt.NDArray[np.uint32], dict[int, tuple[int, ...]]]:
    """One ledger's popped rows (``codes``, sorted): its sorted unique entry ids, and {entry id: due batch
    indexes} of those not due whole. O(rows) numpy, plus O(1) Python per batch member."""
    entries = ((codes >> _U_SLOT_BITS) & _U_ENTRY).astype(np.uint32)
    slots = codes & _U_SLOT
    partial: dict[int, tuple[int, ...]] = {}
    if slots.any():
        whole = set(entries[slots == 0].tolist())
        members: dict[int, list[int]] = {}
        for entry_id, slot in zip(entries[slots != 0].tolist(), slots[slots != 0].tolist(), strict=True):
            if entry_id not in whole:
                members.setdefault(entry_id, []).append(slot - 1)
        partial = {e: tuple(sorted(set(indexes))) for e, indexes in members.items()}
        entries = np.unique(entries)
    elif len(entries) > 1 and not bool((entries[1:] > entries[:-1]).all()):
        entries = np.unique(entries)
    return entries, partial


def _group(bucket: int, key: LedgerKey, entries: list[int], members: dict[int, list[int]]) -> _Popped:
    return bucket, key, np.array(entries, _U32), {e: tuple(indexes) for e, indexes in members.items()}


def _first(item: _Popped) -> int:
    return item[0]
