"""Chunked messages: a nacked large message comes back whole, exactly once, at its time.

A message above the broker's ``maxMessageSize`` sent with ``create_producer(chunking_enabled=True)`` is
stored as several chunk entries; the consumer reassembles them and the message's id names the last chunk
(its serialized id also carries the first, :func:`pulsar_nack.native.chunk_first_entry`). pulsar-client
3.13 (C++ core 4.2.0) nacks only that assembled id: the broker re-sends the last chunk, the consumer drops
it as an "uncached chunk", and the message is never handed out again while the consumer lives
(apache/pulsar-client-cpp #604, fixed after 4.2.0). Measured on both brokers (docs/parameters.md):

* a native nack of *every* chunk entry, first to last, brings the message back whole — but the Python
  client names only the first and last chunk, and chunks of two producers interleave on a topic (seen on
  Apache: entries 6..11 held one message, 8..10 another), so "every entry in between" may name another
  message the application holds: the broker would re-send it and it would be handed out twice;
* ``redeliver_unacknowledged_messages()`` brings it back whole, with every other unacked message.

So a nacked chunked message is **kept in this process** (:class:`ChunkHold`: the received message object,
whose payload the native client already holds) and handed out again from memory when due, as a
:class:`HeldMessage` whose ``redelivery_count()`` counts the nack. The broker is not asked for anything:
the message stays unacked there (so a consumer that closes or dies leaves it to the broker, which
redelivers it whole), and the application's ack of the held message acks every chunk. The bytes held are
bounded (``max_held_chunked_bytes``); past the bound — and wherever nothing can hold the message (a bare
``MessageId``, a ``message_listener`` or asyncio consumer) — the nack goes to the broker as a native nack
of every chunk entry, counted in ``nack_stats().chunked_native``. With ``dead_letter_policy``, a held
message due for the ``max_redeliver_count + 1``-th time is sent to the dead-letter topic by
:class:`DeadLetters` (the broker never counted these redeliveries, so the native client would not).
"""

from __future__ import annotations

import heapq
import itertools
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Literal

import pulsar

from pulsar_nack.checks import check_int
from pulsar_nack.memory import python_bytes
from pulsar_nack.tracker import NackStats

__all__ = [
    "DEFAULT_MAX_HELD_CHUNKED_BYTES",
    "ChunkHold",
    "ChunkedNackStats",
    "DeadLetters",
    "HeldMessage",
]

#: The default of ``max_held_chunked_bytes``: payload bytes of nacked chunked messages kept in memory.
DEFAULT_MAX_HELD_CHUNKED_BYTES = 64 * 2**20

Key = tuple[str, int, int]  # (topic, ledger id, entry id of the last chunk)
Counter = Literal["redelivered", "dead_lettered", "native", "copies_dropped"]  # over_bound: by hold()

#: Properties the official consumers set on a dead-lettered message (pulsar-client-cpp, Java).
REAL_TOPIC, ORIGIN_MESSAGE_ID = "REAL_TOPIC", "ORIGIN_MESSAGE_ID"


class HeldMessage(pulsar.Message):  # type: ignore[misc]  # pulsar is untyped
    """A chunked message handed out again from memory: the same native message (same bytes, properties,
    id, publish time), with ``redelivery_count()`` raised by one per nack that held it. Everything else is
    ``pulsar.Message``'s; ack and nack it like any message."""

    def __init__(self, original: pulsar.Message, redelivery_count: int) -> None:
        super().__init__()
        self._message = original._message
        self._schema = original._schema
        self._redelivery_count = redelivery_count

    def redelivery_count(self) -> int:
        """The broker's count when the message was first received, plus the nacks held since."""
        return self._redelivery_count


@dataclass(frozen=True)
class ChunkedNackStats(NackStats):
    """:class:`~pulsar_nack.tracker.NackStats` plus the chunked messages (see :mod:`pulsar_nack.chunks`).
    ``memory_bytes``, when measured, includes the held payloads."""

    chunked_held: int = 0  # nacked chunked messages kept in memory now
    chunked_held_bytes: int = 0  # their payload bytes (bounded by max_held_chunked_bytes)
    chunked_redelivered: int = 0  # handed out again from memory
    chunked_dead_lettered: int = 0  # sent to the dead-letter topic by the wrapper
    chunked_over_bound: int = 0  # nacks not held because max_held_chunked_bytes was reached
    chunked_native: int = 0  # nacks sent to the broker as a nack of every chunk entry (over the bound too)
    chunked_copies_dropped: int = 0  # broker copies of a held message (a reconnect) not handed out


@dataclass
class _Held:
    due_ms: float
    message: pulsar.Message
    redelivery_count: int
    size: int


class ChunkHold:
    """Nacked chunked messages kept until due, by key ``(topic, ledger, last chunk's entry)``.

    :meth:`hold` and :meth:`pop_due` are O(log held) (a heap; a message nacked again replaces its entry
    lazily), every other method O(1). The number held is small by construction: each is larger than the
    broker's ``maxMessageSize`` and their bytes are bounded by ``max_bytes``. Thread-safe.
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_HELD_CHUNKED_BYTES) -> None:
        self.max_bytes = check_int(max_bytes, "max_held_chunked_bytes")
        self._lock = threading.Lock()
        # key → held message. Public so that the per-message paths can test it as a plain dict (``if
        # held``: no method call); never replaced, only mutated under the lock.
        self.held: dict[Key, _Held] = {}
        self._heap: list[tuple[float, int, Key, _Held]] = []
        self._sequence = itertools.count()
        self._bytes = 0
        self.redelivered = self.dead_lettered = self.over_bound = self.native = self.copies_dropped = 0

    def __len__(self) -> int:
        return len(self.held)

    def hold(
        self, key: Key, message: pulsar.Message, due_ms: float, redelivery_count: int, size: int
    ) -> bool:
        """Keep ``message`` (``size`` payload bytes) until ``due_ms``, to be handed out with
        ``redelivery_count``. False, counted in ``chunked_over_bound``, if that would pass ``max_bytes``
        (nothing is kept then: the caller nacks it at the broker). A message held already is replaced."""
        with self._lock:
            previous = self.held.get(key)
            freed = previous.size if previous is not None else 0
            if self._bytes - freed + size > self.max_bytes:
                self.over_bound += 1
                return False
            held = _Held(due_ms, message, redelivery_count, size)
            self.held[key] = held
            self._bytes += size - freed
            heapq.heappush(self._heap, (due_ms, next(self._sequence), key, held))
            return True

    def count(self, counter: Counter) -> None:
        """Add one to ``counter`` (under the lock: nacks and receives run on any thread). O(1)."""
        with self._lock:
            setattr(self, counter, getattr(self, counter) + 1)

    def holds(self, key: Key) -> bool:
        """Whether the message of ``key`` is held (a copy of it from the broker is not handed out)."""
        return key in self.held

    def discard(self, key: Key) -> bool:
        """Forget a held message (the application acked it); whether it was held."""
        with self._lock:
            held = self.held.pop(key, None)
            if held is None:
                return False
            self._bytes -= held.size
            return True

    def wait_ms(self, now_ms: float) -> float | None:
        """Milliseconds until the next held message is due (0 if one is), None if nothing is held."""
        with self._lock:
            self._drop_stale()
            return max(0.0, self._heap[0][0] - now_ms) if self._heap else None

    def pop_due(self, now_ms: float) -> tuple[pulsar.Message, int, Key] | None:
        """The earliest held message due by ``now_ms`` — (message, its redelivery count, key) — no longer
        held; None if none is due."""
        with self._lock:
            self._drop_stale()
            if not self._heap or self._heap[0][0] > now_ms:
                return None
            _, _, key, held = heapq.heappop(self._heap)
            del self.held[key]
            self._bytes -= held.size
            return held.message, held.redelivery_count, key

    def _drop_stale(self) -> None:
        """(Lock held.) Pop heap entries whose message was acked, handed out or held again since."""
        heap = self._heap
        while heap and self.held.get(heap[0][2]) is not heap[0][3]:
            heapq.heappop(heap)

    def clear(self) -> int:
        """Forget every held message (seek, redeliver_unacknowledged_messages, close: the broker still has
        them unacked and sends them again); returns how many."""
        with self._lock:
            count = len(self.held)
            self.held.clear()
            self._heap.clear()
            self._bytes = 0
            return count

    def memory_bytes(self) -> int:
        """The payloads held plus this object's containers. O(held)."""
        with self._lock:
            total = self._bytes + python_bytes(self.held) + python_bytes(self._heap)
            per_entry = python_bytes(_Held(0.0, None, 0, 0)) + sys.getsizeof((0.0, 0, None, None))
            return total + len(self.held) * per_entry

    def stats(self, base: NackStats, *, with_memory: bool = False) -> ChunkedNackStats:
        """``base`` with this hold's counters (and its memory added to ``base.memory_bytes``). O(1)."""
        values = {f.name: getattr(base, f.name) for f in fields(NackStats)}
        if with_memory and base.memory_bytes is not None:
            values["memory_bytes"] = base.memory_bytes + self.memory_bytes()
        return ChunkedNackStats(
            **values,
            chunked_held=len(self.held),
            chunked_held_bytes=self._bytes,
            chunked_redelivered=self.redelivered,
            chunked_dead_lettered=self.dead_lettered,
            chunked_over_bound=self.over_bound,
            chunked_native=self.native,
            chunked_copies_dropped=self.copies_dropped,
        )


class DeadLetters:
    """Sends held chunked messages past ``max_redeliver_count`` to the dead-letter topic, as the official
    consumer would had the broker redelivered them: the same payload, properties and partition key, plus
    ``REAL_TOPIC`` and ``ORIGIN_MESSAGE_ID``; the producer chunks (``chunking_enabled=True``), so the
    message reaches the topic whole. The topic is the policy's, else ``<message's topic>-<subscription>-DLQ``
    (the official default). Producers are created on first use (one per dead-letter topic) and closed by
    :meth:`close`. Thread-safe."""

    def __init__(
        self, create_producer: Callable[..., Any], policy: pulsar.ConsumerDeadLetterPolicy, subscription: str
    ) -> None:
        self.max_redeliver_count: int = policy.max_redeliver_count
        self._topic: str = policy.dead_letter_topic
        self._subscription = subscription
        self._create_producer = create_producer
        self._producers: dict[str, Any] = {}
        self._lock = threading.Lock()

    def due(self, redelivery_count: int) -> bool:
        """Whether a message handed out with ``redelivery_count`` goes to the dead-letter topic instead."""
        return redelivery_count > self.max_redeliver_count

    def topic_for(self, message: pulsar.Message) -> str:
        return self._topic or f"{message.topic_name()}-{self._subscription}-DLQ"

    def send(self, message: pulsar.Message) -> None:
        """Produce ``message`` to the dead-letter topic (blocks until the broker stored it; raises as
        ``Producer.send`` does)."""
        topic = self.topic_for(message)
        with self._lock:
            producer = self._producers.get(topic)
            if producer is None:
                producer = self._producers[topic] = self._create_producer(
                    topic, chunking_enabled=True, batching_enabled=False
                )
        properties = dict(message.properties())
        properties.setdefault(REAL_TOPIC, message.topic_name())
        properties.setdefault(ORIGIN_MESSAGE_ID, str(message.message_id()))
        key = message.partition_key()
        producer.send(message.data(), properties=properties, partition_key=key or None)

    def close(self) -> None:
        with self._lock:
            producers, self._producers = list(self._producers.values()), {}
        for producer in producers:
            producer.close()
