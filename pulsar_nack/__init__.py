"""pulsar-nack: PIP-393 negative-acknowledgement tracking for the Apache Pulsar Python client.

``pulsar_nack.Client`` is a ``pulsar.Client`` whose ``subscribe`` returns a :class:`NackConsumer`;
:func:`wrap` turns an existing consumer into one. Underneath: :class:`TimeBucketIndex` (the PIP-393
structure), :class:`TimerWheel`, and :class:`~pulsar_nack.tracker.NackTracker`, which joins them.

The names below are imported on first use (PEP 562), so that importing a module that does not need
the Pulsar client — :mod:`pulsar_nack.index`, :mod:`pulsar_nack.timer`, the sweep in
:mod:`pulsar_nack.sweep` — does not import it either. Further submodules: :mod:`pulsar_nack.aio` (the
same wrapper for ``pulsar.asyncio``), :mod:`pulsar_nack.metrics` (a Prometheus collector; needs the
``prometheus`` extra) and :mod:`pulsar_nack.testing` (an embedded broker; needs the ``broker`` extra).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pulsar_nack.backoff import MultiplierRedeliveryBackoff, RedeliveryBackoff
    from pulsar_nack.consumer import Client, NackConsumer, NackOptions, wrap
    from pulsar_nack.delay_limit import DelayLimitedProducer, DelayLimitExceeded
    from pulsar_nack.index import DueIds, TimeBucketIndex
    from pulsar_nack.memory import MemoryUsage
    from pulsar_nack.timer import TimerWheel
    from pulsar_nack.tracker import NATIVE_DELAY_MS, NackStats, NackTracker, NativeTiming

#: Public name → the module that defines it.
_EXPORTS: dict[str, str] = {
    "MultiplierRedeliveryBackoff": "pulsar_nack.backoff",
    "RedeliveryBackoff": "pulsar_nack.backoff",
    "Client": "pulsar_nack.consumer",
    "NackConsumer": "pulsar_nack.consumer",
    "NackOptions": "pulsar_nack.consumer",
    "wrap": "pulsar_nack.consumer",
    "DelayLimitedProducer": "pulsar_nack.delay_limit",
    "DelayLimitExceeded": "pulsar_nack.delay_limit",
    "DueIds": "pulsar_nack.index",
    "TimeBucketIndex": "pulsar_nack.index",
    "MemoryUsage": "pulsar_nack.memory",
    "TimerWheel": "pulsar_nack.timer",
    "NATIVE_DELAY_MS": "pulsar_nack.tracker",
    "NackStats": "pulsar_nack.tracker",
    "NackTracker": "pulsar_nack.tracker",
    "NativeTiming": "pulsar_nack.tracker",
}

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


def __getattr__(name: str) -> Any:
    """Import a public name's module on first access (PEP 562) and cache the name here. O(1) after."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
