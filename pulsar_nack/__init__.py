"""pulsar-nack: PIP-393 negative-acknowledgement tracking for the Apache Pulsar Python client.

``pulsar_nack.Client`` is a ``pulsar.Client`` whose ``subscribe`` returns a :class:`NackConsumer`;
:func:`wrap` turns an existing consumer into one. The building blocks underneath — the PIP-393 index,
the timer wheel, the tracker that joins them — are in :mod:`pulsar_nack.lowlevel`.

The names below are imported on first use (PEP 562), so that importing a module that does not need
the Pulsar client — :mod:`pulsar_nack.lowlevel`, :mod:`pulsar_nack.index`, the sweep in
:mod:`pulsar_nack.sweep` — does not import it either. Further submodules: :mod:`pulsar_nack.aio` (the
same wrapper for ``pulsar.asyncio``), :mod:`pulsar_nack.metrics` (a Prometheus collector; needs the
``prometheus`` extra), :mod:`pulsar_nack.otel` (OpenTelemetry metrics; the ``otel`` extra) and
:mod:`pulsar_nack.testing` (an embedded broker; needs the ``broker`` extra).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:  # what type checkers see of _EXPORTS (tests/test_public_api.py checks they agree)
    from pulsar_nack.backoff import MultiplierRedeliveryBackoff as MultiplierRedeliveryBackoff
    from pulsar_nack.backoff import RedeliveryBackoff as RedeliveryBackoff
    from pulsar_nack.consumer import Client as Client
    from pulsar_nack.consumer import NackConsumer as NackConsumer
    from pulsar_nack.consumer import wrap as wrap
    from pulsar_nack.delay_limit import DelayLimitedProducer as DelayLimitedProducer
    from pulsar_nack.delay_limit import DelayLimitExceeded as DelayLimitExceeded
    from pulsar_nack.native import NATIVE_DELAY_MS as NATIVE_DELAY_MS
    from pulsar_nack.options import NackOptions as NackOptions
    from pulsar_nack.stats import NackStats as NackStats

#: The public names, each with the module that defines it: ``__all__`` and the lazy import read this.
_EXPORTS: Final[dict[str, str]] = {
    "Client": "pulsar_nack.consumer",
    "NackConsumer": "pulsar_nack.consumer",
    "NackOptions": "pulsar_nack.options",
    "wrap": "pulsar_nack.consumer",
    "NackStats": "pulsar_nack.stats",
    "NATIVE_DELAY_MS": "pulsar_nack.native",
    "MultiplierRedeliveryBackoff": "pulsar_nack.backoff",
    "RedeliveryBackoff": "pulsar_nack.backoff",
    "DelayLimitedProducer": "pulsar_nack.delay_limit",
    "DelayLimitExceeded": "pulsar_nack.delay_limit",
}

__all__ = list(_EXPORTS)
__version__ = "0.1.0"


if not TYPE_CHECKING:  # type checkers see the imports above, so they reject a name that is not exported

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
