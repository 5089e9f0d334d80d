"""One numbering of a tracker's ledgers: ledger key ↔ small *ordinal*, shared by the structures that code
entries by ledger number (the index's packed store, the arrival filter's entry sets), so that each ledger
is paid for once.

Each of those structures once kept a numbering of its own — a dict entry, a key tuple, an int and a list
slot a ledger: ~150 bytes each, ~3 B per pending nack at 1,000 sparse topics of 100 nacks a ledger. Here
one :class:`LedgerRegistry` per tracker keeps, per ledger: its entry in one dict (key → ordinal, ~40-100
B with the dict's spare room), the key itself (the first caller's tuple, ~56 B; an int key for a topic-less
ledger), its slot in the ordinal → key list (8 B) and its holder count (1 B): **~110-170 B a ledger in
all**, whatever number of structures share it, against ~150 B *per structure* before.

Release: **reference counting**. A structure *acquires* a ledger (:meth:`LedgerRegistry.acquire`) once,
when it first keeps something of it, and *releases* it (:meth:`LedgerRegistry.release`) once, when it
keeps nothing of it any more — each structure decides when (the packed store and the entry sets sweep
their ledgers in passes they already make; see there). A ledger no structure holds is forgotten at once
and its ordinal goes back to a free list; a new ledger takes the smallest free ordinal, so ordinals stay
below the most ledgers held at one time and nothing grows with run time.

Ordinals never change while a ledger is held, so a structure may keep them inside its codes. Lookups
(:meth:`ordinal`, :meth:`key`, :attr:`ordinals`) take no lock — one dict or list read, atomic under the
GIL; :meth:`acquire` and :meth:`release` take the registry's own lock (a leaf lock: nothing is called
with it held), as the structures sharing the registry change it under different locks of their own.
All operations O(1) but acquiring a reused ordinal (O(log free ordinals): a heap).
"""

from __future__ import annotations

import heapq
import threading
from typing import TypeAlias

from pulsar_nack.memory import python_bytes

__all__ = ["LedgerKey", "LedgerRegistry", "ledger_key"]

#: A ledger's key: its id, or ``(topic, ledger_id)`` when the id carries a topic (multi-topic consumers).
LedgerKey: TypeAlias = "int | tuple[str, int]"

#: Holders a ledger may have at once (a holder count is one byte; a tracker has three structures).
MAX_HOLDERS = 255


def ledger_key(topic: str, ledger_id: int) -> LedgerKey:
    """The registry's key of a ledger: the id alone without a topic (no tuple to keep). O(1)."""
    return (topic, ledger_id) if topic else ledger_id


class LedgerRegistry:
    """Ledger key ↔ ordinal with a holder count per ledger; see the module. Thread-safe."""

    __slots__ = ("_counts", "_free", "_keys", "_lock", "ordinals")

    def __init__(self) -> None:
        #: key → ordinal of every held ledger. Read it without a lock (never replaced, only changed).
        self.ordinals: dict[LedgerKey, int] = {}
        self._keys: list[LedgerKey | None] = []  # ordinal → key (None: free)
        self._counts = bytearray()  # ordinal → holders
        self._free: list[int] = []  # free ordinals, a heap (smallest first)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Ledgers held. O(1)."""
        return len(self.ordinals)

    @property
    def span(self) -> int:
        """One more than the largest ordinal handed out (every ordinal is below it). O(1)."""
        return len(self._keys)

    def ordinal(self, key: LedgerKey) -> int | None:
        """The ledger's ordinal, or None if no structure holds it. O(1), no lock."""
        return self.ordinals.get(key)

    def key(self, ordinal: int) -> LedgerKey:
        """The key of a held ledger's ordinal. Raises KeyError for a free one. O(1), no lock."""
        key = self._keys[ordinal] if 0 <= ordinal < len(self._keys) else None
        if key is None:
            raise KeyError(ordinal)
        return key

    def holders(self, key: LedgerKey) -> int:
        """How many structures hold the ledger (0: unknown). O(1)."""
        ordinal = self.ordinals.get(key)
        return 0 if ordinal is None else self._counts[ordinal]

    def acquire(self, key: LedgerKey) -> int:
        """One more holder of the ledger (numbered if new: the smallest free ordinal); its ordinal. A
        holder acquires a ledger once, before keeping anything of it. O(1), O(log free) reusing one."""
        with self._lock:
            ordinal = self.ordinals.get(key)
            if ordinal is None:
                if self._free:
                    ordinal = heapq.heappop(self._free)
                    self._keys[ordinal] = key
                else:
                    ordinal = len(self._keys)
                    self._keys.append(key)
                    self._counts.append(0)
                self.ordinals[key] = ordinal
            count = self._counts[ordinal]
            if count >= MAX_HOLDERS:
                raise RuntimeError(f"ledger {key!r} has {MAX_HOLDERS} holders already")
            self._counts[ordinal] = count + 1
            return ordinal

    def release(self, ordinal: int) -> None:
        """One holder fewer; a ledger with none left is forgotten and its ordinal freed. Raises
        ValueError for an ordinal nobody holds (nothing changed). O(log free)."""
        with self._lock:
            if not 0 <= ordinal < len(self._counts) or not self._counts[ordinal]:
                raise ValueError(f"ordinal {ordinal!r} is not held")
            count = self._counts[ordinal] = self._counts[ordinal] - 1
            if count:
                return
            key = self._keys[ordinal]
            assert key is not None
            del self.ordinals[key]
            self._keys[ordinal] = None
            if self.ordinals:
                heapq.heappush(self._free, ordinal)
            else:  # nothing held: start again from ordinal 0, and give the tables' room back
                self._keys, self._counts, self._free = [], bytearray(), []
                self.ordinals.clear()

    def memory_bytes(self) -> int:
        """Bytes held: the tables, and each key tuple with its topic (the ledger id ints and topic strings
        are shared with the messages' ids, but a key is kept as long as its ledger is). O(ledgers)."""
        total = python_bytes(self) + python_bytes(self.ordinals) + python_bytes(self._keys)
        total += python_bytes(self._counts) + python_bytes(self._free)
        for key, ordinal in self.ordinals.items():
            total += python_bytes(key) + (python_bytes(ordinal) if ordinal > 256 else 0)
            if isinstance(key, tuple):
                total += python_bytes(key[1])
        return total
