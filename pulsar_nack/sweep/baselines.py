"""The designs PIP-393 replaced, with the index's ``add``/``add_many``/``pop_due`` surface, for comparison.

* :class:`HashMapTracker` — the pre-PIP-393 nack tracker: one map entry per id, ``(topic, ledger, entry)
  → due_ms``, a re-nack overwrites; finding what is due scans every entry (O(n) per timer run).
* :class:`TripleLongHeap` — the old delayed-delivery tracker's ``TripleLongPriorityQueue``: a binary
  min-heap of ``(due, ledger, entry)`` triples of 8-byte longs in flat arrays (here numpy), 24 bytes per
  id plus spare capacity.

Both are exact to the millisecond (no buckets), so they fire due ids no earlier than asked. They are
plain Python where the originals are Java, so compare their *memory* with the index; their speed is
Python's.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

import numpy as np
import numpy.typing as npt

from pulsar_nack.index import DueIds, as_id_arrays

__all__ = ["HashMapTracker", "TripleLongHeap"]


def _group(rows: list[tuple[str, int, int]]) -> list[DueIds]:
    """Group (topic, ledger, entry) rows into one DueIds per ledger, in order of first appearance."""
    by_ledger: dict[tuple[str, int], list[int]] = defaultdict(list)
    for topic, ledger_id, entry_id in rows:
        by_ledger[(topic, ledger_id)].append(entry_id)
    return [
        DueIds(topic, ledger_id, np.unique(np.array(entries, dtype=np.uint32)))
        for (topic, ledger_id), entries in by_ledger.items()
    ]


class HashMapTracker:
    """``(topic, ledger_id, entry_id) → due_ms`` in a dict; ``pop_due`` scans everything. Thread-safe."""

    def __init__(self) -> None:
        self._due: dict[tuple[str, int, int], int] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._due)

    def add(self, due_ms: int, ledger_id: int, entry_id: int, batch_index: int = -1, topic: str = "") -> None:
        """O(1). ``batch_index`` is ignored: the old tracker kept one time per entry."""
        with self._lock:
            self._due[(topic, ledger_id, entry_id)] = due_ms

    def add_many(
        self, due_ms: Any, ledger_ids: Any, entry_ids: Any, batch_indexes: Any = None, topic: str = ""
    ) -> None:
        due, ledgers, entries, _ = as_id_arrays(due_ms, ledger_ids, entry_ids, batch_indexes)
        with self._lock:
            self._due.update(
                zip(
                    zip([topic] * len(entries), ledgers.tolist(), entries.tolist(), strict=True),
                    due.tolist(),
                    strict=True,
                )
            )

    def next_due_ms(self) -> int | None:
        """O(n): the old design has no order."""
        with self._lock:
            return min(self._due.values(), default=None)

    def pop_due(self, now_ms: int) -> list[DueIds]:
        """O(n) scan of every pending id, as the pre-PIP-393 timer did on every run."""
        with self._lock:
            due = [key for key, at in self._due.items() if at <= now_ms]
            for key in due:
                del self._due[key]
        return _group(due)


class TripleLongHeap:
    """A binary min-heap of ``(due_ms, ledger_id, entry_id)`` int64 triples in one numpy array.

    Capacity doubles up to ``segment`` triples, then grows by whole segments (like Pulsar's
    ``SegmentedLongArray`` behind ``TripleLongPriorityQueue``). ``topic`` is not stored (the broker's
    tracker is per topic). Thread-safe.
    """

    def __init__(self, initial_capacity: int = 16, segment: int = 1 << 20) -> None:
        self._data = np.empty((initial_capacity, 3), dtype=np.int64)
        self._size = 0
        self._upper: tuple[int, int, int] | None = None  # >= every triple in the heap
        self._segment = segment
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._size

    def add(self, due_ms: int, ledger_id: int, entry_id: int, batch_index: int = -1, topic: str = "") -> None:
        """O(log n) sift-up (one comparison when ids arrive in due order)."""
        with self._lock:
            self._reserve(self._size + 1)
            data = self._data
            item = (due_ms, ledger_id, entry_id)
            i = self._size
            while i > 0:
                parent = (i - 1) >> 1
                if tuple(data[parent].tolist()) <= item:
                    break
                data[i] = data[parent]
                i = parent
            data[i] = item
            self._size += 1
            self._upper = item if self._upper is None else max(self._upper, item)

    def add_many(
        self, due_ms: Any, ledger_ids: Any, entry_ids: Any, batch_indexes: Any = None, topic: str = ""
    ) -> None:
        """Append in bulk; if the new triples are not all >= the heap's and sorted, re-heapify by sorting."""
        due, ledgers, entries, _ = as_id_arrays(due_ms, ledger_ids, entry_ids, batch_indexes)
        block = np.stack([due, ledgers, entries.astype(np.int64)], axis=1)
        with self._lock:
            n = self._size
            self._reserve(n + len(block))
            self._data[n : n + len(block)] = block
            self._size = n + len(block)
            ordered = len(block) < 2 or bool(np.all(_lex_le(block[:-1], block[1:])))
            first, last = tuple(block[0].tolist()), tuple(block[-1].tolist())
            if not ordered or (self._upper is not None and first < self._upper):
                self._sort()
                last = tuple(self._data[self._size - 1].tolist())
            self._upper = last if self._upper is None else max(self._upper, last)

    def next_due_ms(self) -> int | None:
        with self._lock:
            return int(self._data[0, 0]) if self._size else None

    def pop_due(self, now_ms: int) -> list[DueIds]:
        """Pops due triples; many due at once are taken out in one vectorized pass."""
        with self._lock:
            if not self._size or self._data[0, 0] > now_ms:
                return []
            live = self._data[: self._size]
            due_mask = live[:, 0] <= now_ms
            due = live[due_mask]
            rest = live[~due_mask]
            self._size = len(rest)
            self._data[: self._size] = rest
            if self._size:
                self._sort()
            due = due[np.lexsort((due[:, 2], due[:, 1], due[:, 0]))]
        return _group([("", int(ledger), int(entry)) for _, ledger, entry in due.tolist()])

    def _reserve(self, size: int) -> None:
        capacity = len(self._data)
        if size <= capacity:
            return
        while capacity < size:
            capacity = capacity * 2 if capacity < self._segment else capacity + self._segment
        grown = np.empty((capacity, 3), dtype=np.int64)
        grown[: self._size] = self._data[: self._size]
        self._data = grown

    def _sort(self) -> None:
        """A sorted array is a valid binary min-heap."""
        live = self._data[: self._size]
        self._data[: self._size] = live[np.lexsort((live[:, 2], live[:, 1], live[:, 0]))]


def _lex_le(a: npt.NDArray[np.int64], b: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Row-wise lexicographic a <= b for (n, 3) arrays."""
    lt0, eq0 = a[:, 0] < b[:, 0], a[:, 0] == b[:, 0]
    lt1, eq1 = a[:, 1] < b[:, 1], a[:, 1] == b[:, 1]
    result: npt.NDArray[np.bool_] = lt0 | (eq0 & (lt1 | (eq1 & (a[:, 2] <= b[:, 2]))))
    return result
