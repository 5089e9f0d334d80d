"""What ``nack_stats()`` returns: :class:`NackStats`, one frozen record of a consumer's nack state and
history.

Its own module so that whoever reads stats (the consumers, the held-message store, the metrics exporters)
imports a record, not the tracker that fills it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (a record: the tracker that fills it must not import snapshot/, which imports it)
    from pulsar_nack.snapshot.segments import SnapshotStats

__all__ = ["NackStats"]


@dataclass(frozen=True)
class NackStats:
    """A snapshot of a tracker's state and history — the one type ``nack_stats()`` returns, on every consumer.
    ``memory_bytes`` is None unless it was asked for (``stats(with_memory=True)``,
    ``nack_stats(with_memory=True)``): measuring walks the index.

    Fields, by group: the index and its traffic (``pending`` … ``abandoned``, ``timer_failures``); lateness
    as the application sees it (``lateness_*``); memory (``memory_bytes``, ``memory_parts``); snapshots
    (``snapshots``: None unless ``snapshot_dir`` is set); chunked messages and early copies held in memory
    (``chunked_*``: 0 on a bare tracker, see :mod:`pulsar_nack.chunks`); what the consumer received and
    acked (``received``, ``received_bytes``, ``acked``: 0 on a bare tracker)."""

    pending: int  # ids waiting in the index (batch messages of one entry and bucket count once)
    buckets: int
    nacked: int  # ids scheduled
    forwarded: int  # entries handed to the native client for redelivery
    redelivered: int  # messages handed to the application again: after a forward, or kept in memory
    held_back: int  # arrivals not handed out because their nack is still pending
    dropped: int  # arrivals not handed out because the application acked them or holds another copy
    reforwarded: int  # forwards repeated because their copy came early or never came
    abandoned: int  # forwards given up after repeating (logged; the broker still holds the messages)
    # arrival − the due time the application asked for (nack time + delay), over a sample of the recent
    # redeliveries (pulsar_nack.lateness): what the application sees, not the bucket's or the forward's
    lateness_p50_ms: float | None
    lateness_p99_ms: float | None
    timer_failures: int = 0  # times the timer thread failed and was restarted (each logged)
    memory_bytes: int | None = None  # index + arrival filter (Python objects + CRoaring heap), if measured
    #: what ``memory_bytes`` is made of, (part, bytes) pairs that sum to it; None when not measured
    memory_parts: tuple[tuple[str, int], ...] | None = None
    snapshots: SnapshotStats | None = None  # the segment store's metrics, when snapshots are kept
    lateness_early_share: float | None = None  # share of those redeliveries handed out early (0 with ceil)
    lateness_samples: int = 0  # redeliveries the percentiles are over (halved as more come)
    # held in memory by the consumer (pulsar_nack.chunks): nacked chunked messages, early broker copies
    chunked_held: int = 0  # messages kept in memory now
    chunked_held_bytes: int = 0  # their payload bytes (bounded by max_held_chunked_bytes)
    chunked_redelivered: int = 0  # handed out again from memory
    chunked_dead_lettered: int = 0  # sent to the dead-letter topic by the wrapper
    chunked_over_bound: int = 0  # nacks not held because max_held_chunked_bytes was reached
    chunked_native: int = 0  # nacks sent to the broker as a nack of every chunk entry (over the bound too)
    chunked_copies_dropped: int = 0  # broker copies of a held message (a reconnect) not handed out
    # counted by the consumer (0 on a bare tracker), Java's PIP-342 received.count/.size and ack:
    received: int = 0  # messages handed to the application (first deliveries and redeliveries)
    received_bytes: int = 0  # their payload bytes, counted while a NackMeter observes the consumer
    acked: int = 0  # acknowledge and acknowledge_cumulative calls
