"""Chunked messages: a nacked large message comes back whole, exactly once, at its time.

A message above the broker's ``maxMessageSize`` sent with ``create_producer(chunking_enabled=True)`` is
stored as several chunk entries; the consumer reassembles them and the message's id names the last chunk
(its serialized id also carries the first, :func:`pulsar_nack.native.client.chunk_first_entry`). pulsar-client
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
``MessageId``) — the nack goes to the broker as a native nack of every chunk entry, counted in
``nack_stats().chunked_native``. With ``dead_letter_policy``, a held message due for the
``max_redeliver_count + 1``-th time is sent to the dead-letter topic by :class:`DeadLetters` /
:class:`AsyncDeadLetters` (the broker never counted these redeliveries, so the native client would not).

Who hands a held message out: ``receive``/``batch_receive`` of the synchronous consumer when called; for
a ``message_listener``, :class:`HeldDelivery`, woken by the tracker's timer when the next one is due; for
the asyncio consumer, a timer on its event loop that wakes a waiting ``receive()`` (:attr:`ChunkHold.on_hold`
tells both of each new hold).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import math
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal

import pulsar

from pulsar_nack.checks import check_int
from pulsar_nack.memory import python_bytes
from pulsar_nack.native.client import payload_size, share_message
from pulsar_nack.stats import NackStats
from pulsar_nack.timer import Timeout, TimerWheel, weak_callback

__all__ = [
    "DEFAULT_MAX_HELD_CHUNKED_BYTES",
    "AsyncDeadLetters",
    "ChunkHold",
    "DeadLetters",
    "HeldDelivery",
    "HeldMessage",
]

_log = logging.getLogger(__name__)

#: The default of ``max_held_chunked_bytes``: payload bytes of nacked chunked messages kept in memory.
DEFAULT_MAX_HELD_CHUNKED_BYTES = 64 * 2**20

#: (topic, ledger id, entry id of the last chunk); a held batch sibling's adds its batch index
Key = tuple[str, int, int] | tuple[str, int, int, int]
Counter = Literal["redelivered", "dead_lettered", "native", "copies_dropped"]  # over_bound: by hold()

#: Properties the official consumers set on a dead-lettered message (pulsar-client-cpp, Java).
REAL_TOPIC, ORIGIN_MESSAGE_ID = "REAL_TOPIC", "ORIGIN_MESSAGE_ID"


class HeldMessage(pulsar.Message):  # type: ignore[misc]  # pulsar is untyped
    """A chunked message handed out again from memory: the same native message (same bytes, properties,
    id, publish time), with ``redelivery_count()`` raised by one per nack that held it. Everything else is
    ``pulsar.Message``'s; ack and nack it like any message."""

    def __init__(self, original: pulsar.Message, redelivery_count: int) -> None:
        super().__init__()
        share_message(self, original)
        self._redelivery_count = redelivery_count

    def redelivery_count(self) -> int:
        """The broker's count when the message was first received, plus the nacks held since."""
        return self._redelivery_count


@dataclass(frozen=True)
class DeadLetter:
    """A held message past the dead-letter policy's ``max_redeliver_count``: send it, then ack it."""

    message: pulsar.Message
    count: int
    key: Key


@dataclass
class _Held:
    due_ms: float
    message: pulsar.Message
    redelivery_count: int
    size: int
    # a broker copy kept for a pending nack (not a nacked chunked message): the nack's due time, exact or
    # estimated (ArrivalFilter.take_due), for the lateness of its hand-out, and whether it is such a copy
    lateness_due: float | None = None
    copy: bool = False


class ChunkHold:
    """Nacked chunked messages kept until due, by key ``(topic, ledger, last chunk's entry)``.

    :meth:`hold` and :meth:`pop_due` are O(log held) (a heap; a message nacked again replaces its entry
    lazily), every other method O(1). The number held is small by construction: each is larger than the
    broker's ``maxMessageSize`` and their bytes are bounded by ``max_bytes``. Thread-safe.
    """

    def __init__(
        self,
        max_bytes: int = DEFAULT_MAX_HELD_CHUNKED_BYTES,
        *,
        on_hold: Callable[[float], object] | None = None,
        on_handout: Callable[[float | None, Key], object] | None = None,
    ) -> None:
        self.max_bytes = check_int(max_bytes, "max_held_chunked_bytes")
        self._lock = threading.Lock()
        # key → held message. Public so that the per-message paths can test it as a plain dict (``if
        # held``: no method call); never replaced, only mutated under the lock.
        self.held: dict[Key, _Held] = {}
        self._heap: list[tuple[float, int, Key, _Held]] = []
        self._sequence = itertools.count()
        self._bytes = 0
        self.redelivered = self.dead_lettered = self.over_bound = self.native = self.copies_dropped = 0
        #: Called with the due time (ms) after each successful :meth:`hold`, outside the lock, on the
        #: nacking thread: how a listener's delivery thread or an asyncio consumer learns of a new hold.
        self.on_hold = on_hold
        #: Called by :meth:`pop_due` for each kept copy it hands out, with its nack's due time, exact or
        #: estimated (``ArrivalFilter.take_due``; None: not known) and its key, outside the
        #: lock: it counts in ``nack_stats()`` as redelivered, with its lateness, as the forwarded
        #: redeliveries do, and later copies of it are not first deliveries.
        self.on_handout = on_handout

    def __len__(self) -> int:
        return len(self.held)

    @property
    def held_bytes(self) -> int:
        """Payload bytes held now (``nack_stats().chunked_held_bytes``)."""
        return self._bytes

    def hold(
        self,
        key: Key,
        message: pulsar.Message,
        due_ms: float,
        redelivery_count: int,
        size: int,
        *,
        copy: bool = False,
        lateness_due: float | None = None,
    ) -> bool:
        """Keep ``message`` (``size`` payload bytes) until ``due_ms``, to be handed out with
        ``redelivery_count``. False, counted in ``chunked_over_bound``, if that would pass ``max_bytes``
        (nothing is kept then: the caller nacks it at the broker). A message held already is replaced.
        ``copy``: a broker copy kept for a pending nack (its ``lateness_due``: see :attr:`on_handout`), which
        :meth:`drain_copies` gives back. Calls :attr:`on_hold` with ``due_ms`` once it is held."""
        with self._lock:
            previous = self.held.get(key)
            freed = previous.size if previous is not None else 0
            if self._bytes - freed + size > self.max_bytes:
                self.over_bound += 1
                return False
            held = _Held(due_ms, message, redelivery_count, size, lateness_due, copy)
            self.held[key] = held
            self._bytes += size - freed
            heapq.heappush(self._heap, (due_ms, next(self._sequence), key, held))
        if self.on_hold is not None:
            self.on_hold(due_ms)
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
        held; None if none is due. Calls :attr:`on_handout` for a kept copy."""
        with self._lock:
            self._drop_stale()
            if not self._heap or self._heap[0][0] > now_ms:
                return None
            _, _, key, held = heapq.heappop(self._heap)
            del self.held[key]
            self._bytes -= held.size
        if held.copy and self.on_handout is not None:
            self.on_handout(held.lateness_due, key)
        return held.message, held.redelivery_count, key

    def drain_copies(self) -> list[tuple[Key, float]]:
        """Forget every kept copy (not the nacked chunked messages); returns their keys and due times, so
        that their nacks can be filed again (``redeliver_unacknowledged_messages``: the broker sends them
        again, and they must not be handed out before due). O(held)."""
        with self._lock:
            copies = [(key, held) for key, held in self.held.items() if held.copy]
            for key, held in copies:
                del self.held[key]
                self._bytes -= held.size
            return [(key, held.due_ms) for key, held in copies]

    def next_due(
        self, now_ms: float, dead_letters: _DeadLetterTopic | None
    ) -> HeldMessage | DeadLetter | None:
        """The earliest held message due by ``now_ms``, no longer held: a :class:`HeldMessage` to hand out
        (counted as redelivered), or a :class:`DeadLetter` when it is past ``dead_letters``' threshold —
        the consumer sends that one inside :meth:`dead_lettering` and acks it. None if none is due."""
        due = self.pop_due(now_ms)
        if due is None:
            return None
        message, count, key = due
        if dead_letters is None or not dead_letters.due(count):
            self.count("redelivered")
            return HeldMessage(message, count)
        return DeadLetter(message, count, key)

    @contextlib.contextmanager
    def dead_lettering(self, letter: DeadLetter, now_ms: float) -> Iterator[None]:
        """Around sending ``letter`` to the dead-letter topic: counted as dead-lettered once sent; if the
        send raises, the message is held again for a retry in a second and the error goes on."""
        try:
            yield
        except BaseException:
            message = letter.message
            self.hold(letter.key, message, now_ms + 1000.0, letter.count, payload_size(message))
            raise
        self.count("dead_lettered")

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

    def stats(self, base: NackStats, *, with_memory: bool = False) -> NackStats:
        """``base`` with this hold's ``chunked_*`` counters (and its memory added to ``base.memory_bytes``,
        when measured). O(1), or O(held) with ``with_memory``."""
        if with_memory and base.memory_bytes is not None:
            held = self.memory_bytes()
            base = replace(
                base,
                memory_bytes=base.memory_bytes + held,
                memory_parts=(*(base.memory_parts or ()), ("held chunked", held)),
            )
        return replace(
            base,
            chunked_held=len(self.held),
            chunked_held_bytes=self._bytes,
            chunked_redelivered=self.redelivered,
            chunked_dead_lettered=self.dead_lettered,
            chunked_over_bound=self.over_bound,
            chunked_native=self.native,
            chunked_copies_dropped=self.copies_dropped,
        )


class _DeadLetterTopic:
    """What both dead-letter senders share: the policy's threshold and topic, and the outgoing message."""

    def __init__(self, create_producer: Callable[..., Any], policy: Any, subscription: str) -> None:
        self.max_redeliver_count: int = policy.max_redeliver_count
        self._topic: str = policy.dead_letter_topic
        self._subscription = subscription
        self._create_producer = create_producer
        self._producers: dict[str, Any] = {}

    def due(self, redelivery_count: int) -> bool:
        """Whether a message handed out with ``redelivery_count`` goes to the dead-letter topic instead."""
        return redelivery_count > self.max_redeliver_count

    def topic_for(self, message: pulsar.Message) -> str:
        return self._topic or f"{message.topic_name()}-{self._subscription}-DLQ"

    @staticmethod
    def outgoing(message: pulsar.Message) -> tuple[bytes, dict[str, str], str | None]:
        """The payload, properties (plus ``REAL_TOPIC``, ``ORIGIN_MESSAGE_ID``) and partition key to send."""
        properties = dict(message.properties())
        properties.setdefault(REAL_TOPIC, message.topic_name())
        properties.setdefault(ORIGIN_MESSAGE_ID, str(message.message_id()))
        return message.data(), properties, message.partition_key() or None


class DeadLetters(_DeadLetterTopic):
    """Sends held chunked messages past ``max_redeliver_count`` to the dead-letter topic, as the official
    consumer would had the broker redelivered them: the same payload, properties and partition key, plus
    ``REAL_TOPIC`` and ``ORIGIN_MESSAGE_ID``; the producer chunks (``chunking_enabled=True``), so the
    message reaches the topic whole. The topic is the policy's, else ``<message's topic>-<subscription>-DLQ``
    (the official default). Producers are created on first use (one per dead-letter topic) and closed by
    :meth:`close`. Thread-safe."""

    def __init__(
        self, create_producer: Callable[..., Any], policy: pulsar.ConsumerDeadLetterPolicy, subscription: str
    ) -> None:
        super().__init__(create_producer, policy, subscription)
        self._lock = threading.Lock()

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
        data, properties, key = self.outgoing(message)
        producer.send(data, properties=properties, partition_key=key)

    def close(self) -> None:
        with self._lock:
            producers, self._producers = list(self._producers.values()), {}
        for producer in producers:
            producer.close()


class AsyncDeadLetters(_DeadLetterTopic):
    """:class:`DeadLetters` for the asyncio consumer: ``create_producer`` is ``pulsar.asyncio.Client``'s
    (a coroutine), and :meth:`send` and :meth:`close` are awaited. One event loop uses it."""

    async def send(self, message: pulsar.Message) -> None:
        """Produce ``message`` to the dead-letter topic (returns once the broker stored it)."""
        topic = self.topic_for(message)
        producer = self._producers.get(topic)
        if producer is None:
            created = await self._create_producer(topic, chunking_enabled=True, batching_enabled=False)
            producer = self._producers.setdefault(topic, created)
            if producer is not created:  # another task created one meanwhile
                await created.close()
        data, properties, key = self.outgoing(message)
        await producer.send(data, properties=properties, partition_key=key)

    async def close(self) -> None:
        producers, self._producers = list(self._producers.values()), {}
        for producer in producers:
            await producer.close()


class HeldDelivery:
    """Hands held chunked messages out at their due time when nobody calls ``receive``: the
    ``message_listener`` consumer's. The tracker's timer wheel wakes it when the earliest held message is
    due (:meth:`wake`, the hold's :attr:`ChunkHold.on_hold`, arms one timeout; no thread sleeps meanwhile);
    then a thread of its own calls ``deliver()`` (which pops the due ones and hands them to the listener)
    and ends. Not on the wheel's thread: the listener is the application's and may take as long as
    processing a message takes, which there would hold back this consumer's forwards. One hand-out thread
    at a time; when it ends it arms the wheel for the next held message. :meth:`stop` ends it without
    waiting (it may be called from the listener, which the thread may be waiting for).

    Each wake is O(1) plus a ``wait_ms`` (O(1) amortized); nothing runs while nothing held is due.
    """

    def __init__(
        self,
        hold: ChunkHold,
        wheel: TimerWheel,
        clock: Callable[[], float],
        deliver: Callable[[], object],
        name: str,
    ) -> None:
        self._hold = hold
        self._wheel = wheel
        self._clock = clock
        self._deliver = deliver
        self._name = name
        self._lock = threading.Lock()
        self._timeout: Timeout | None = None
        self._armed_at = math.inf
        self._running = False  # a hand-out thread is under way: it arms the wheel again when it ends
        self.stopped = False

    def wake(self, due_ms: float = 0.0) -> None:
        """A message was held until ``due_ms``: arm the wheel for it unless an earlier wake-up is armed or
        a hand-out is under way (it looks again when it ends). O(1)."""
        with self._lock:
            if not self.stopped and not self._running and due_ms < self._armed_at:
                self._arm(due_ms)

    def stop(self) -> None:
        with self._lock:
            self.stopped = True
            if self._timeout is not None:
                self._timeout.cancel()
                self._timeout, self._armed_at = None, math.inf

    def _arm(self, at_ms: float) -> None:
        """(Lock held.) The one wake-up, at ``at_ms``."""
        if self._timeout is not None:
            self._timeout.cancel()
        try:
            self._timeout = self._wheel.schedule(at_ms, weak_callback(self._due))
        except RuntimeError:  # the wheel is closed: so is the consumer
            self._timeout, self._armed_at = None, math.inf
            return
        self._armed_at = at_ms

    def _due(self) -> None:
        """Timer thread: a held message is due: start the hand-out thread."""
        with self._lock:
            self._timeout, self._armed_at = None, math.inf
            if self.stopped or self._running:
                return
            self._running = True
        threading.Thread(target=self._run, name=self._name, daemon=True).start()

    def _run(self) -> None:
        try:
            self._deliver()
        except Exception:  # a dead-letter send that failed (the message is held again) or a bug
            _log.exception("handing out held chunked messages failed (%s)", self._name)
        with self._lock:
            self._running = False
            wait = self._hold.wait_ms(self._clock())
            if not self.stopped and wait is not None:
                self._arm(self._clock() + wait)
