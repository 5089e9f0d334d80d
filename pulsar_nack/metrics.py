"""Prometheus metrics for nack consumers: :class:`NackCollector` (OpenTelemetry: :mod:`pulsar_nack.otel`).

Optional: needs ``prometheus_client`` (``pip install 'pulsar-nack[prometheus]'``), imported only when a
collector is created::

    from pulsar_nack.metrics import NackCollector

    collector = NackCollector(consumer).register()   # the default registry
    prometheus_client.start_http_server(9464, addr="127.0.0.1")

Exposed per ``topic``/``subscription`` (``pulsar_nack`` is the default namespace):

==============================================  =======  ===============================================
``pulsar_nack_pending_ids``                     gauge    ids waiting in the index
``pulsar_nack_buckets``                         gauge    time buckets in the index
``pulsar_nack_memory_bytes``                    gauge    the index's memory, measured every ``memory_ttl_s``
``pulsar_nack_redelivery_lateness_seconds``     gauge    arrival − due time; ``quantile`` 0.5 and 0.99
``pulsar_nack_nacked_total``                    counter  ids nacked
``pulsar_nack_forwarded_total``                 counter  entries handed to the native client
``pulsar_nack_redelivered_total``               counter  messages handed to the application again
``pulsar_nack_held_back_total``                 counter  arrivals held back: their nack is still pending
``pulsar_nack_dropped_total``                   counter  arrivals dropped: acked or not redelivered
``pulsar_nack_reforwarded_total``               counter  forwards repeated: copy came early or never
``pulsar_nack_abandoned_total``                 counter  forwards given up after repeating
``pulsar_nack_timer_failures_total``            counter  timer thread failures (logged; restarted)
``pulsar_nack_snapshot_ids_not_durable``        gauge    pending ids not on snapshot storage (at risk)
``pulsar_nack_snapshot_storage_failing``        gauge    1 while snapshot writes fail, else 0
``pulsar_nack_snapshot_write_failures_total``   counter  failed snapshot writes and deletes
==============================================  =======  ===============================================

The three ``snapshot`` metrics have samples only for consumers that keep snapshots (``snapshot_dir`` or
``snapshot_storage``).

Consumers sharing a topic and subscription (a Shared subscription consumed in parallel) are one series:
counts are summed, lateness quantiles are the largest of theirs (a conservative bound, not a true
quantile of the union).

Memory is the one figure that costs: ``nack_stats()`` does not measure it (``memory_bytes`` is None), and
``nack_stats(with_memory=True)`` walks the index under its lock. So the collector measures each consumer's
memory on a scrape at most every ``memory_ttl_s`` seconds (default 10) and exports that measurement —
up to ``memory_ttl_s`` old — in between; every other figure is read fresh on every scrape.
``memory_ttl_s=None`` never measures and exports no ``memory_bytes`` metric at all (never a made-up 0). A
series gets a memory sample only when every consumer in it has been measured.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

from pulsar_nack.observed import NackSource, ObservedConsumers
from pulsar_nack.stats import NackStats

__all__ = ["NackCollector", "NackSource"]

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABELS = ["topic", "subscription"]
_QUANTILES = (("0.5", "lateness_p50_ms"), ("0.99", "lateness_p99_ms"))
_GAUGES = (  # (metric suffix, NackStats field, help)
    ("pending_ids", "pending", "Nacked ids waiting for redelivery in the PIP-393 index."),
    ("buckets", "buckets", "Time buckets in the PIP-393 index."),
)
_MEMORY = ("memory_bytes", "Memory held by the PIP-393 index (Python objects and CRoaring heap).")
_COUNTERS = (
    ("nacked", "nacked", "Ids negatively acknowledged."),
    ("forwarded", "forwarded", "Entries handed to the native client for redelivery."),
    ("redelivered", "redelivered", "Redelivered messages handed to the application."),
    ("held_back", "held_back", "Arrivals held back because their nack is still pending."),
    ("dropped", "dropped", "Arrivals dropped: acked already, or not part of the redelivery."),
    ("reforwarded", "reforwarded", "Forwards repeated because their copy came early or never came."),
    ("abandoned", "abandoned", "Forwards given up after repeating (the broker still holds the messages)."),
    ("timer_failures", "timer_failures", "Failures of the redelivery timer thread (each logged; restarted)."),
)
_LATENESS = ("redelivery_lateness_seconds", "Redelivery arrival minus due time, recent redeliveries.")
_SNAPSHOT_GAUGES = (  # (metric suffix, value of a SnapshotStats, help)
    (
        "snapshot_ids_not_durable",
        lambda s: s.ids_not_durable,
        "Pending nacks not on snapshot storage: lost if the process dies now.",
    ),
    ("snapshot_storage_failing", lambda s: int(s.storage_failing), "1 while snapshot writes fail, else 0."),
)
_SNAPSHOT_COUNTERS = (
    (
        "snapshot_write_failures",
        lambda s: s.create.failed + s.merge.failed + s.delete.failed,
        "Snapshot writes (segment puts, merges, deletes) that failed.",
    ),
)


class NackCollector:
    """A Prometheus collector of the nack statistics of some consumers (see the module for the metrics).

    A scrape is O(consumers), plus an O(index objects) walk of each index whose memory figure is older than
    ``memory_ttl_s`` seconds (the walk holds the index's lock, so it is not done on every scrape);
    ``memory_ttl_s=None``: no walks and no memory metric. Thread-safe: consumers may be added and removed
    while scrapes run.
    """

    def __init__(
        self,
        *consumers: NackSource,
        namespace: str = "pulsar_nack",
        memory_ttl_s: float | None = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._prometheus = _import_prometheus()
        if not isinstance(namespace, str) or not _NAME.fullmatch(namespace):
            raise ValueError(
                f"namespace must be a Prometheus metric name prefix ([a-zA-Z_:][a-zA-Z0-9_:]*), "
                f"got {namespace!r}"
            )
        self._observed = ObservedConsumers("NackCollector", memory_ttl_s, clock)
        self.namespace = namespace
        self.memory_ttl_s = self._observed.memory_ttl_s
        for consumer in consumers:
            self.add(consumer)

    # -- the set of consumers -----------------------------------------------------------------------

    def add(self, consumer: NackSource) -> None:
        """Report ``consumer`` from the next scrape on. O(consumers)."""
        self._observed.add(consumer)

    def remove(self, consumer: NackSource) -> None:
        """Stop reporting ``consumer`` (its counters leave the sums: Prometheus sees a counter reset)."""
        self._observed.remove(consumer)

    @property
    def consumers(self) -> tuple[NackSource, ...]:
        return self._observed.consumers()

    # -- the collector protocol ---------------------------------------------------------------------

    def register(self, registry: Any = None) -> NackCollector:
        """Register with ``registry`` (default: ``prometheus_client.REGISTRY``); returns the collector."""
        (registry if registry is not None else self._prometheus.REGISTRY).register(self)
        return self

    def describe(self) -> list[Any]:
        """The metric families without samples: lets a registry check names without walking indexes."""
        return list(self._families().values())

    def collect(self) -> Iterator[Any]:
        """One sample per (topic, subscription) in each family."""
        families = self._families()
        for (topic, subscription), stats in self._stats_by_series().items():
            labels = [topic, subscription]
            for suffix, field, _ in (*_GAUGES, *_COUNTERS):
                families[suffix].add_metric(labels, float(sum(getattr(s, field) for s in stats)))
            memory = [s.memory_bytes for s in stats]
            if _MEMORY[0] in families and None not in memory:
                families[_MEMORY[0]].add_metric(labels, float(sum(m for m in memory if m is not None)))
            kept = [s.snapshots for s in stats if s.snapshots is not None]
            if kept:
                for suffix, value, _ in (*_SNAPSHOT_GAUGES, *_SNAPSHOT_COUNTERS):
                    families[suffix].add_metric(labels, float(sum(value(k) for k in kept)))
            lateness = families[_LATENESS[0]]
            for quantile, field in _QUANTILES:
                values = [getattr(s, field) for s in stats if getattr(s, field) is not None]
                if values:
                    lateness.add_metric([*labels, quantile], max(values) / 1000.0)
        yield from families.values()

    # -- internals ----------------------------------------------------------------------------------

    def _families(self) -> dict[str, Any]:
        prometheus = self._prometheus
        families: dict[str, Any] = {}
        for suffix, _, help_text in _GAUGES:
            families[suffix] = prometheus.GaugeMetricFamily(self._name(suffix), help_text, labels=_LABELS)
        if self.memory_ttl_s is not None:
            families[_MEMORY[0]] = prometheus.GaugeMetricFamily(
                self._name(_MEMORY[0]), _MEMORY[1], labels=_LABELS
            )
        families[_LATENESS[0]] = prometheus.GaugeMetricFamily(
            self._name(_LATENESS[0]), _LATENESS[1], labels=[*_LABELS, "quantile"]
        )
        for suffix, _, help_text in _COUNTERS:
            families[suffix] = prometheus.CounterMetricFamily(self._name(suffix), help_text, labels=_LABELS)
        for suffix, _, help_text in _SNAPSHOT_GAUGES:
            families[suffix] = prometheus.GaugeMetricFamily(self._name(suffix), help_text, labels=_LABELS)
        for suffix, _, help_text in _SNAPSHOT_COUNTERS:
            families[suffix] = prometheus.CounterMetricFamily(self._name(suffix), help_text, labels=_LABELS)
        return families

    def _name(self, suffix: str) -> str:
        return f"{self.namespace}_{suffix}"

    def _stats_by_series(self) -> dict[tuple[str, str], list[NackStats]]:
        series: dict[tuple[str, str], list[NackStats]] = {}
        for consumer in self._observed.consumers():
            key = (str(consumer.topic()), str(consumer.subscription_name()))
            series.setdefault(key, []).append(self._stats(consumer))
        return series

    def _stats(self, consumer: NackSource) -> NackStats:
        """The consumer's stats, with a memory figure at most ``memory_ttl_s`` old (none if None)."""
        stats = consumer.nack_stats()
        if self.memory_ttl_s is None:
            return stats
        return dataclasses.replace(stats, memory_bytes=self._observed.memory_bytes(consumer))


def _import_prometheus() -> Any:
    """``prometheus_client.core``, or an ImportError that says which extra provides it."""
    try:
        import prometheus_client.core
    except ImportError as error:
        raise ImportError(
            "pulsar_nack.metrics needs prometheus_client: pip install 'pulsar-nack[prometheus]'"
        ) from error
    return prometheus_client.core
