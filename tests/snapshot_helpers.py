"""Deterministic segment content for the snapshot tests (also imported by the kill -9 writer process)."""

from __future__ import annotations

import functools

import numpy as np
from pyroaring import BitMap

from pulsar_nack.snapshot.format import Group, Segment, encode_segment


@functools.lru_cache(maxsize=8)
def _groups(ledgers: int, per_ledger: int, seed: int) -> tuple[Group, ...]:
    rng = np.random.default_rng(seed)
    groups = []
    for ledger in range(ledgers):
        entries = BitMap(rng.choice(2**24, size=per_ledger, replace=False).astype(np.uint32))
        groups.append(
            Group(1 << 20 | (ledger % 4) << 8, f"persistent://t/ns/topic-{ledger % 7}", ledger, entries)
        )
    return tuple(groups)


def big_segment_bytes(seq: int) -> bytes:
    """A ~2 MB segment whose content depends on ``seq`` only through its sequence number and seed."""
    return encode_segment(Segment(seq, _groups(40, 12_000, seq % 3)))
