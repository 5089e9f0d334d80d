"""OpenTelemetry metrics for nack consumers: :class:`NackMeter`, beside the Prometheus collector
(:mod:`pulsar_nack.metrics`).

Optional: needs ``opentelemetry-api`` (``pip install 'pulsar-nack[otel]'``), imported only when a meter is
created; the application brings its SDK and exporter::

    from pulsar_nack.otel import NackMeter

    meter = NackMeter(consumer)                       # the global MeterProvider, or meter_provider=...

Every instrument is observable: read from ``nack_stats()`` when the SDK collects, nothing on the message
path. Where the Java client (PIP-342) has the concept, its name; ours are ``pulsar_nack.*``:

=========================================  ==========  =================================================
``pulsar.client.consumer.message.nack``    counter     messages negatively acknowledged
``pulsar_nack.consumer.nack.pending``      up-down     nacked ids waiting in the index
``pulsar_nack.consumer.nack.buckets``      up-down     time buckets in the index
``pulsar_nack.consumer.nack.memory``       gauge, By   the index's memory (only with ``memory=True``)
``pulsar_nack.consumer.nack.lateness``     gauge, s    arrival − due time, ``quantile`` 0.5 and 0.99
``pulsar_nack.consumer.nack.redelivered``  counter     redeliveries handed to the application
``pulsar_nack.consumer.nack.held``         up-down     messages held in memory (chunked, early copies)
=========================================  ==========  =================================================

Attributes as Java's: ``pulsar.tenant``, ``pulsar.namespace``, ``pulsar.subscription``; ``pulsar.topic`` and
``pulsar.partition`` only with ``topic_attributes=True`` (cardinality). Consumers with the same attributes are
one series: counts summed, lateness the largest. Java's ``.message.ack``, ``.message.dlq``,
``.message.ack.timeout`` and ``.message.received.count``/``.size`` are not exported: the wrapper does not
count acks or receipts (the official client does that in C++, without exposing it).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable
from typing import Any

from pulsar_nack import __version__
from pulsar_nack.metrics import NackSource
from pulsar_nack.tracker import NackStats

__all__ = ["NackMeter", "attributes_of"]

_TOPIC = re.compile(
    r"^(?P<base>(?:[a-z-]+://)?(?P<tenant>[^/]+)/(?P<namespace>[^/]+)/.+?)(?:-partition-(?P<p>\d+))?$"
)


def attributes_of(topic: str, subscription: str, *, topic_attributes: bool = False) -> dict[str, Any]:
    """Java's PIP-342 attributes for a consumer of ``topic`` (``persistent://tenant/ns/name[-partition-N]``
    or ``tenant/ns/name``; a short name, ``my-topic``, is ``public/default``'s), as the Java client sets them
    (``MetricsUtil.getTopicAttributes``): ``pulsar.namespace`` is ``tenant/ns``, ``pulsar.topic`` the
    partitioned topic's name (without ``-partition-N``), ``pulsar.partition`` its index. O(len(topic))."""
    found = _TOPIC.match(topic)
    tenant, namespace = (found["tenant"], found["namespace"]) if found else ("public", "default")
    attributes: dict[str, Any] = {
        "pulsar.tenant": tenant,
        "pulsar.namespace": f"{tenant}/{namespace}",
        "pulsar.subscription": subscription,
    }
    if topic_attributes:
        attributes["pulsar.topic"] = found["base"] if found else topic
        if found and found["p"] is not None:
            attributes["pulsar.partition"] = int(found["p"])
    return attributes


class NackMeter:
    """Observable OpenTelemetry instruments over the ``nack_stats()`` of the consumers added. Thread-safe.

    ``meter_provider``: an SDK ``MeterProvider`` (default: the global one). ``memory``: also export the
    index's memory (``nack_stats(with_memory=True)`` walks the index under its lock on every collection:
    keep the export interval long). ``topic_attributes``: add ``pulsar.topic``/``pulsar.partition``."""

    def __init__(
        self,
        *consumers: NackSource,
        meter_provider: Any = None,
        memory: bool = False,
        topic_attributes: bool = False,
    ) -> None:
        try:
            from opentelemetry import metrics
        except ImportError:
            message = "pulsar_nack.otel needs opentelemetry-api: pip install 'pulsar-nack[otel]'"
            raise ImportError(message) from None
        self._lock = threading.Lock()
        self._consumers: list[NackSource] = []
        self._memory = memory
        self._topic_attributes = topic_attributes
        for consumer in consumers:
            self.add(consumer)
        meter = metrics.get_meter("pulsar_nack", __version__, meter_provider=meter_provider)
        Observation = metrics.Observation

        def summed(field: str) -> Callable[[Any], Iterable[Any]]:
            def observe(_options: Any) -> Iterable[Any]:
                return [
                    Observation(value, dict(key)) for key, value in self._sum(lambda s: getattr(s, field))
                ]

            return observe

        meter.create_observable_counter(
            "pulsar.client.consumer.message.nack",
            [summed("nacked")],
            "{message}",
            "Messages negatively acknowledged.",
        )
        meter.create_observable_up_down_counter(
            "pulsar_nack.consumer.nack.pending",
            [summed("pending")],
            "{message}",
            "Nacked ids waiting in the index.",
        )
        meter.create_observable_up_down_counter(
            "pulsar_nack.consumer.nack.buckets", [summed("buckets")], "{bucket}", "Time buckets in the index."
        )
        meter.create_observable_counter(
            "pulsar_nack.consumer.nack.redelivered",
            [summed("redelivered")],
            "{message}",
            "Redelivered messages handed to the application.",
        )
        meter.create_observable_up_down_counter(
            "pulsar_nack.consumer.nack.held",
            [summed("chunked_held")],
            "{message}",
            "Nacked messages held in memory (chunked messages, early broker copies).",
        )
        meter.create_observable_gauge(
            "pulsar_nack.consumer.nack.lateness", [self._lateness], "s", "Redelivery arrival minus due time."
        )
        if memory:
            meter.create_observable_gauge(
                "pulsar_nack.consumer.nack.memory",
                [summed("memory_bytes")],
                "By",
                "Memory held by the index (Python objects and CRoaring heap).",
            )

    def add(self, consumer: NackSource) -> None:
        """Observe ``consumer`` too (a duplicate is ignored). O(consumers)."""
        with self._lock:
            if consumer not in self._consumers:
                self._consumers.append(consumer)

    def remove(self, consumer: NackSource) -> None:
        """Stop observing ``consumer`` (before closing it). O(consumers)."""
        with self._lock:
            if consumer in self._consumers:
                self._consumers.remove(consumer)

    def _stats(self) -> list[tuple[tuple[tuple[str, Any], ...], NackStats]]:
        with self._lock:
            consumers = list(self._consumers)
        rows = []
        for consumer in consumers:
            key = attributes_of(
                consumer.topic(), consumer.subscription_name(), topic_attributes=self._topic_attributes
            )
            rows.append((tuple(sorted(key.items())), consumer.nack_stats(with_memory=self._memory)))
        return rows

    def _sum(self, value: Callable[[NackStats], Any]) -> list[tuple[tuple[tuple[str, Any], ...], int]]:
        totals: dict[tuple[tuple[str, Any], ...], int] = {}
        missing: set[tuple[tuple[str, Any], ...]] = set()
        for key, stats in self._stats():
            figure = value(stats)
            if figure is None:
                missing.add(key)  # (memory not measured: no sample rather than a made-up 0)
                continue
            totals[key] = totals.get(key, 0) + int(figure)
        return [(key, total) for key, total in totals.items() if key not in missing]

    def _lateness(self, _options: Any) -> Iterable[Any]:
        from opentelemetry.metrics import Observation

        largest: dict[tuple[tuple[str, Any], ...], float] = {}
        for key, stats in self._stats():
            for quantile, figure in (("0.5", stats.lateness_p50_ms), ("0.99", stats.lateness_p99_ms)):
                if figure is not None:
                    series = (*key, ("quantile", quantile))
                    largest[series] = max(largest.get(series, float("-inf")), figure / 1000.0)
        return [Observation(value, dict(series)) for series, value in largest.items()]
