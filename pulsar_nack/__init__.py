"""pulsar-nack: PIP-393 negative-acknowledgement tracking for the Apache Pulsar Python client.

``pulsar_nack.Client`` is a ``pulsar.Client`` whose ``subscribe`` returns a :class:`NackConsumer`;
:func:`wrap` turns an existing consumer into one. Underneath: :class:`TimeBucketIndex` (the PIP-393
structure), :class:`TimerWheel`, and :class:`~pulsar_nack.tracker.NackTracker`, which joins them.

Submodules imported on demand: :mod:`pulsar_nack.aio` (the same wrapper for ``pulsar.asyncio``) and
:mod:`pulsar_nack.metrics` (a Prometheus collector; needs the ``prometheus`` extra).
"""

from pulsar_nack.backoff import MultiplierRedeliveryBackoff, RedeliveryBackoff
from pulsar_nack.consumer import Client, NackConsumer, NackOptions, wrap
from pulsar_nack.delay_limit import DelayLimitedProducer, DelayLimitExceeded
from pulsar_nack.index import DueIds, TimeBucketIndex
from pulsar_nack.memory import MemoryUsage
from pulsar_nack.timer import TimerWheel
from pulsar_nack.tracker import NATIVE_DELAY_MS, NackStats, NackTracker, NativeTiming

__all__ = [
    "NATIVE_DELAY_MS",
    "Client",
    "DelayLimitExceeded",
    "DelayLimitedProducer",
    "DueIds",
    "MemoryUsage",
    "MultiplierRedeliveryBackoff",
    "NackConsumer",
    "NackOptions",
    "NackStats",
    "NackTracker",
    "NativeTiming",
    "RedeliveryBackoff",
    "TimeBucketIndex",
    "TimerWheel",
    "wrap",
]
__version__ = "0.1.0"
