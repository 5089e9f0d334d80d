"""The building blocks under the consumer, for tools, experiments and your own trackers (trio's
``trio.lowlevel`` precedent): an application using :class:`pulsar_nack.Client` or :func:`pulsar_nack.wrap`
needs none of them.

* :class:`TimeBucketIndex` and :class:`DueIds` — PIP-393's nack index and what its ``pop_due`` hands out;
  :class:`NackIndex` — the calls a tracker makes on an index, which the index and the snapshot's
  segment store both answer;
* :class:`TimerWheel` — the hierarchical timing wheel that fires the index's buckets;
* :class:`NackTracker` — index, arrival filter and wheel joined, forwarding due ids to the native client,
  whose redelivery timing :class:`NativeTiming` models;
* :class:`MemoryUsage` — a structure's memory as :meth:`TimeBucketIndex.memory_usage` measures it.

Importing this module never imports the Pulsar client.
"""

from __future__ import annotations

from pulsar_nack.index import DueIds, NackIndex, TimeBucketIndex
from pulsar_nack.memory import MemoryUsage
from pulsar_nack.native import NativeTiming
from pulsar_nack.timer import TimerWheel
from pulsar_nack.tracker import NackTracker

__all__ = [
    "DueIds",
    "MemoryUsage",
    "NackIndex",
    "NackTracker",
    "NativeTiming",
    "TimeBucketIndex",
    "TimerWheel",
]
