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
``pulsar.client.consumer.message.ack``     counter     acknowledge and acknowledge_cumulative calls
``….message.received.count``               counter     messages handed to the application
``….message.received.size``                counter, By  their payload bytes
``pulsar_nack.consumer.nack.pending``      up-down     nacked ids waiting in the index
``pulsar_nack.consumer.nack.buckets``      up-down     time buckets in the index
``pulsar_nack.consumer.nack.memory``       gauge, By   the index's memory, walked every ``memory_ttl_s``
``pulsar_nack.consumer.nack.lateness``     gauge, s    arrival − due time, ``quantile`` 0.5 and 0.99
``pulsar_nack.consumer.nack.redelivered``  counter     redeliveries handed to the application
``pulsar_nack.consumer.nack.held``         up-down     messages held in memory (chunked, early copies)
=========================================  ==========  =================================================

Attributes as Java's: ``pulsar.tenant``, ``pulsar.namespace``, ``pulsar.subscription``; ``pulsar.topic`` and
``pulsar.partition`` only with ``topic_attributes=True`` (cardinality). Consumers with the same attributes are
one series: counts summed, lateness the largest. The ``received`` and ``ack`` counters are the
consumer's (``nack_stats().received``, ``received_bytes``, ``acked``): like Java's, they count what the
application receives (after the wrapper's filter, held messages handed out again included) and each ack
call; sizes from when a meter first observes the consumer. Java's ``.message.dlq`` and
``.message.ack.timeout`` are not exported: the official client dead-letters and redelivers after an ack
timeout inside its C++ consumer, without a callback or a counter the wrapper could read, so any figure
would be a guess.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from typing import Any

from pulsar_nack import __version__
from pulsar_nack.observed import NackSource, ObservedConsumers

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
    """Observable OpenTelemetry instruments over the ``nack_stats()`` of the consumers added. Thread-safe:
    consumers may be added and removed while the SDK collects.

    ``meter_provider``: an SDK ``MeterProvider`` (default: the global one). ``memory_ttl_s``: as
    :class:`~pulsar_nack.metrics.NackCollector`'s — a consumer's memory (``nack_stats(with_memory=True)``
    walks its index under the index's lock) is measured at most every ``memory_ttl_s`` seconds and the last
    measurement exported in between; None: never measured, no memory instrument. ``topic_attributes``: add
    ``pulsar.topic``/``pulsar.partition`` (one series per partition). A collection is O(consumers) per
    instrument, plus the memory walks that are due."""

    def __init__(
        self,
        *consumers: NackSource,
        meter_provider: Any = None,
        memory_ttl_s: float | None = 10.0,
        topic_attributes: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        try:
            from opentelemetry import metrics
        except ImportError:
            message = "pulsar_nack.otel needs opentelemetry-api: pip install 'pulsar-nack[otel]'"
            raise ImportError(message) from None
        self._observed = ObservedConsumers("NackMeter", memory_ttl_s, clock)
        if not isinstance(topic_attributes, bool):
            raise TypeError(f"topic_attributes must be a bool, got {topic_attributes!r}")
        self.memory_ttl_s = self._observed.memory_ttl_s
        self._topic_attributes = topic_attributes
        for consumer in consumers:
            self.add(consumer)
        meter = metrics.get_meter("pulsar_nack", __version__, meter_provider=meter_provider)
        observation = metrics.Observation

        def summed(value: Callable[[NackSource], int | None]) -> Callable[[Any], Iterable[Any]]:
            def observe(_options: Any) -> Iterable[Any]:
                return [observation(total, dict(key)) for key, total in self._sum(value)]

            return observe

        def field(name: str) -> Callable[[NackSource], int | None]:
            return lambda consumer: int(getattr(consumer.nack_stats(), name))

        meter.create_observable_counter(
            "pulsar.client.consumer.message.nack",
            [summed(field("nacked"))],
            "{message}",
            "Messages negatively acknowledged.",
        )
        meter.create_observable_counter(
            "pulsar.client.consumer.message.ack",
            [summed(field("acked"))],
            "{message}",
            "The number of acknowledged messages.",
        )
        meter.create_observable_counter(
            "pulsar.client.consumer.message.received.count",
            [summed(field("received"))],
            "{message}",
            "The number of messages explicitly received by the consumer application.",
        )
        meter.create_observable_counter(
            "pulsar.client.consumer.message.received.size",
            [summed(field("received_bytes"))],
            "By",
            "The number of bytes explicitly received by the consumer application.",
        )
        meter.create_observable_up_down_counter(
            "pulsar_nack.consumer.nack.pending",
            [summed(field("pending"))],
            "{message}",
            "Nacked ids waiting in the index.",
        )
        meter.create_observable_up_down_counter(
            "pulsar_nack.consumer.nack.buckets",
            [summed(field("buckets"))],
            "{bucket}",
            "Time buckets in the index.",
        )
        meter.create_observable_counter(
            "pulsar_nack.consumer.nack.redelivered",
            [summed(field("redelivered"))],
            "{message}",
            "Redelivered messages handed to the application.",
        )
        meter.create_observable_up_down_counter(
            "pulsar_nack.consumer.nack.held",
            [summed(field("chunked_held"))],
            "{message}",
            "Nacked messages held in memory (chunked messages, early broker copies).",
        )
        meter.create_observable_gauge(
            "pulsar_nack.consumer.nack.lateness", [self._lateness], "s", "Redelivery arrival minus due time."
        )
        if self.memory_ttl_s is not None:
            meter.create_observable_gauge(
                "pulsar_nack.consumer.nack.memory",
                [summed(self._observed.memory_bytes)],
                "By",
                "Memory held by the index (Python objects and CRoaring heap), measured every memory_ttl_s.",
            )

    def add(self, consumer: NackSource) -> None:
        """Observe ``consumer`` too (a duplicate is ignored); ``TypeError`` for anything without
        ``nack_stats()``, ``topic()`` and ``subscription_name()``. From now on the consumer also counts
        the payload bytes it hands out (``….message.received.size``: reading a message's size costs more
        than counting it, so consumers nobody observes do not). O(consumers)."""
        self._observed.add(consumer)
        bridge = getattr(consumer, "_nacks", None)
        if bridge is not None:
            bridge.count_sizes = True

    def remove(self, consumer: NackSource) -> None:
        """Stop observing ``consumer`` (before closing it). O(consumers)."""
        self._observed.remove(consumer)

    def _keyed(self) -> list[tuple[tuple[tuple[str, Any], ...], NackSource]]:
        consumers = self._observed.consumers()
        topic_attributes = self._topic_attributes
        return [
            (
                tuple(
                    sorted(
                        attributes_of(
                            c.topic(), c.subscription_name(), topic_attributes=topic_attributes
                        ).items()
                    )
                ),
                c,
            )
            for c in consumers
        ]

    def _sum(
        self, value: Callable[[NackSource], int | None]
    ) -> list[tuple[tuple[tuple[str, Any], ...], int]]:
        """Per attribute set, the sum of ``value`` over its consumers; a set where one consumer has no
        figure (memory not measured) gets no sample rather than a made-up one."""
        totals: dict[tuple[tuple[str, Any], ...], int] = {}
        missing: set[tuple[tuple[str, Any], ...]] = set()
        for key, consumer in self._keyed():
            figure = value(consumer)
            if figure is None:
                missing.add(key)
            else:
                totals[key] = totals.get(key, 0) + figure
        return [(key, total) for key, total in totals.items() if key not in missing]

    def _lateness(self, _options: Any) -> Iterable[Any]:
        from opentelemetry.metrics import Observation

        largest: dict[tuple[tuple[str, Any], ...], float] = {}
        for key, consumer in self._keyed():
            stats = consumer.nack_stats()
            for quantile, figure in (("0.5", stats.lateness_p50_ms), ("0.99", stats.lateness_p99_ms)):
                if figure is not None:
                    series = (*key, ("quantile", quantile))
                    largest[series] = max(largest.get(series, float("-inf")), figure / 1000.0)
        return [Observation(value, dict(series)) for series, value in largest.items()]
