"""The consumers a metrics exporter reads (:mod:`pulsar_nack.metrics`, :mod:`pulsar_nack.otel`), and their
memory figure, walked at most every ``memory_ttl_s`` seconds (a walk holds the index's lock)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from pulsar_nack.stats import NackStats

__all__ = ["NackSource", "ObservedConsumers"]


@runtime_checkable
class NackSource(Protocol):
    """What the exporters read: :class:`pulsar_nack.NackConsumer` and :class:`pulsar_nack.aio.NackConsumer`
    qualify, as does anything else with these methods."""

    def nack_stats(self, *, with_memory: bool = False) -> NackStats: ...

    def topic(self) -> str: ...

    def subscription_name(self) -> str: ...


class ObservedConsumers:
    """A thread-safe set of consumers (by identity) and the last memory walk of each.

    ``exporter`` names the owner in errors; ``memory_ttl_s``: seconds a memory figure is reused (None: never
    walked); ``ValueError`` naming it for anything but a number >= 0 or None.
    """

    def __init__(
        self, exporter: str, memory_ttl_s: float | None, clock: Callable[[], float] = time.monotonic
    ):
        if memory_ttl_s is not None and (
            isinstance(memory_ttl_s, bool)
            or not isinstance(memory_ttl_s, int | float)
            or not memory_ttl_s >= 0
        ):
            raise ValueError(f"memory_ttl_s must be a number of seconds >= 0 or None, got {memory_ttl_s!r}")
        self.exporter = exporter
        self.memory_ttl_s = None if memory_ttl_s is None else float(memory_ttl_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._consumers: list[NackSource] = []
        self._memory: dict[
            int, tuple[float, int | None]
        ] = {}  # id(consumer) → (when, bytes) of its last walk

    def add(self, consumer: NackSource) -> None:
        """Observe ``consumer`` (a duplicate is ignored); ``TypeError`` for anything that is no
        :class:`NackSource`. O(consumers)."""
        if not isinstance(consumer, NackSource):
            raise TypeError(
                f"{self.exporter} takes consumers with nack_stats(), topic() and subscription_name() "
                f"(pulsar_nack.NackConsumer or pulsar_nack.aio.NackConsumer), got {type(consumer).__name__}"
            )
        with self._lock:
            if not any(c is consumer for c in self._consumers):
                self._consumers.append(consumer)

    def remove(self, consumer: NackSource) -> None:
        """Stop observing ``consumer``; its memory figure goes too. O(consumers)."""
        with self._lock:
            self._consumers = [c for c in self._consumers if c is not consumer]
            self._memory.pop(id(consumer), None)

    def consumers(self) -> tuple[NackSource, ...]:
        """The consumers observed now. O(consumers)."""
        with self._lock:
            return tuple(self._consumers)

    def memory_bytes(self, consumer: NackSource) -> int | None:
        """``consumer``'s memory, walked at most every ``memory_ttl_s`` (the last walk's figure between);
        None when it cannot measure it or ``memory_ttl_s`` is None. O(1), or O(index objects) for a walk."""
        if self.memory_ttl_s is None:
            return None
        now = self._clock()
        with self._lock:
            cached = self._memory.get(id(consumer))
        if cached is not None and now - cached[0] < self.memory_ttl_s:
            return cached[1]
        measured = consumer.nack_stats(with_memory=True).memory_bytes
        with self._lock:
            if any(c is consumer for c in self._consumers):  # not removed meanwhile
                self._memory[id(consumer)] = (now, measured)
        return measured
