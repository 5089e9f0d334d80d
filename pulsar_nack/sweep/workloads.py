"""Synthetic nack workloads: the TimeBucket blog's experiment, reproducible bit for bit.

The TimeBucket memory analysis ("Delayed message tracker memory with TimeBucket", §3.2) feeds a tracker with
``n`` ids: ledger ids start at 10000 and switch every ``entries_per_ledger`` entries, entry ids count up from
0 inside a ledger, and the timestamp advances by 1 ms every ``x`` ids (``x`` = messages per ms). The *sparse*
variant nacks only a pseudo-random share of a consecutive entry stream; which entries are chosen is decided by
SplitMix64 so that the Java reference (``bench/java``) picks exactly the same ones.

Every generator returns numpy arrays ``(due_ms, ledger_ids, entry_ids)``; cost O(n) time and memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

#: Fixed start time (2025-01-01T00:00:00Z) so bucket counts are the same on every run and language.
T0_MS = 1_735_689_600_000
FIRST_LEDGER = 10_000

_U64 = np.uint64
_GOLDEN = _U64(0x9E3779B97F4A7C15)
_MIX1 = _U64(0xBF58476D1CE4E5B9)
_MIX2 = _U64(0x94D049BB133111EB)


def splitmix64(values: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """SplitMix64's output function of ``values * golden + golden`` (the i-th output of seed 0)."""
    with np.errstate(over="ignore"):
        z = (values + _U64(1)) * _GOLDEN
        z = (z ^ (z >> _U64(30))) * _MIX1
        z = (z ^ (z >> _U64(27))) * _MIX2
        return z ^ (z >> _U64(31))


@dataclass(frozen=True)
class Workload:
    """One grid point of the blog's experiment.

    ``x``: ids per millisecond; ``n``: ids in total; ``entries_per_ledger``: managedLedgerMaxEntriesPerLedger;
    ``nack_share``: 1.0 = every entry of the stream is nacked (dense), 0.1 = one in ten (sparse).
    """

    x: int = 1
    n: int = 10_000_000
    entries_per_ledger: int = 50_000
    nack_share: float = 1.0

    def __post_init__(self) -> None:
        if self.x < 1:
            raise ValueError(f"x must be >= 1 id per ms, got {self.x}")
        if self.n < 0:
            raise ValueError(f"n must be >= 0, got {self.n}")
        if self.entries_per_ledger < 1:
            raise ValueError(f"entries_per_ledger must be >= 1, got {self.entries_per_ledger}")
        if not 0.0 < self.nack_share <= 1.0:
            raise ValueError(f"nack_share must be in (0, 1], got {self.nack_share}")

    def generate(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.uint32]]:
        """Return ``(due_ms, ledger_ids, entry_ids)`` for the ``n`` nacked ids, in nack order."""
        positions = self.stream_positions()
        ledger_ids = (positions // self.entries_per_ledger + FIRST_LEDGER).astype(np.int64)
        entry_ids = (positions % self.entries_per_ledger).astype(np.uint32)
        # The blog increments the timestamp *before* adding id i when i % x == 0.
        due_ms = T0_MS + 1 + np.arange(self.n, dtype=np.int64) // self.x
        return due_ms, ledger_ids, entry_ids

    def stream_positions(self) -> npt.NDArray[np.int64]:
        """Positions (0-based) in the consecutive entry stream of the ids that get nacked."""
        if self.nack_share >= 1.0:
            return np.arange(self.n, dtype=np.int64)
        # Entry j of the stream is nacked iff splitmix64(j) < share * 2^64; draw chunks until n are found.
        threshold = _U64(min(int(self.nack_share * 2.0**64), 2**64 - 1))
        found: list[npt.NDArray[np.int64]] = []
        have, start = 0, 0
        chunk = max(1 << 16, int(self.n / self.nack_share * 1.05))
        while have < self.n:
            candidates = np.arange(start, start + chunk, dtype=np.uint64)
            chosen = candidates[splitmix64(candidates) < threshold].astype(np.int64)
            found.append(chosen)
            have += len(chosen)
            start += chunk
        return np.concatenate(found)[: self.n]
