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


def assert_each_once_on_time(
    due: dict[str, float],
    handouts: dict[str, list[float]],
    since_ms: float,
    early_ms: float,
    late_ms: float,
    missing_text: str,
) -> None:
    """Every key of ``due`` (its due time, ms) was handed out exactly once (``handouts``: key → hand-out
    times, ms) and nothing else was; none earlier than its due time − ``early_ms``, none later than
    ``late_ms`` after its due time or ``since_ms`` (the restart or the kill), whichever is later.
    ``missing_text`` says what the missing messages are, in the failure message."""
    missing = sorted(set(due) - set(handouts))
    twice = {k: len(v) for k, v in handouts.items() if len(v) > 1}
    unexpected = sorted(set(handouts) - set(due))
    early = {k: round(due[k] - v[0]) for k, v in handouts.items() if k in due and v[0] < due[k] - early_ms}
    late = {
        k: round(v[0] - max(due[k], since_ms))
        for k, v in handouts.items()
        if k in due and v[0] > max(due[k], since_ms) + late_ms
    }
    assert not missing, f"{len(missing)} {missing_text}: {missing[:10]}"
    assert not twice, f"handed out more than once: {dict(list(twice.items())[:10])}"
    assert not unexpected, f"handed out but never nacked: {unexpected[:10]}"
    assert not early, f"{len(early)} handed out early (ms): {dict(list(early.items())[:10])}"
    assert not late, f"{len(late)} handed out late (ms): {dict(list(late.items())[:10])}"
