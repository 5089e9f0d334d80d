"""The drop-in wrapper: ``pulsar_nack.Client`` and ``NackConsumer``, a ``pulsar.Consumer`` whose nacks go
through the PIP-393 tracker.

``NackConsumer`` *is* a ``pulsar.Consumer`` (a subclass): everything but nacks, receiving and acking is the
official client's, unchanged. Nacks are filed in a :class:`~pulsar_nack.tracker.NackTracker`; when due, the
tracker hands the ids back to the native ``negative_acknowledge`` (set to its 100 ms minimum delay), the
only per-id redelivery the official Python client offers. Every message the broker delivers passes
:meth:`NackTracker.on_arrival` first, so batch siblings and early redeliveries are held back.

What does not depend on the call style lives in :class:`NackBridge` (nacks → tracker, due ids → native
nacks, arrivals and acks → tracker); the asyncio consumer of :mod:`pulsar_nack.aio` shares it.
"""

from __future__ import annotations

import datetime
import inspect
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pulsar

from pulsar_nack.arrivals import Verdict
from pulsar_nack.backoff import RedeliveryBackoff, backoff_delay, check_backoff
from pulsar_nack.checks import check_int, check_ms
from pulsar_nack.delay_limit import (
    DelayLimitedProducer,
    OnDelayLimit,
    check_limit_options,
    limit_delay,
)
from pulsar_nack.index import DueIds, Rounding, TimeBucketIndex
from pulsar_nack.native import batch_size, entry_message_id, forward, message_id_of
from pulsar_nack.tracker import NATIVE_DELAY_MS, NackStats, NackTracker, NativeTiming

__all__ = ["Client", "NackBridge", "NackConsumer", "NackOptions", "wrap"]

_log = logging.getLogger(__name__)
_MAX_LEDGER_TOPICS = 65_536
#: Attribute of a ``pulsar.Message`` the wrapper handed out: its (ledger, entry, batch index, topic), or
#: :data:`_UNTRACKED` for a non-batched message admitted while nothing was tracked (ids not read).
_ADMITTED_IDS = "_pulsar_nack_ids"
_UNTRACKED = ()
_DELIVER = Verdict.DELIVER  # a module constant: an enum member lookup costs 65 ns on the per-message path

OnClose = Literal["drop", "flush"]


@dataclass(frozen=True)
class NackOptions:
    """How a :class:`NackConsumer` treats nacks (the ``negative_ack_*`` arguments of ``subscribe``).

    ``redelivery_delay_ms``: the default delay (the official client's ``negative_ack_redelivery_delay_ms``);
    ``precision_bits``/``rounding``: the index's buckets (see :class:`~pulsar_nack.index.TimeBucketIndex`);
    ``backoff``: delay by ``redelivery_count()`` when no per-call delay is given; ``max_redelivery_delay_ms``
    and ``on_delay_limit``: PIP-315's limit applied to every nack delay (0 = none); ``on_close``: ``"drop"``
    pending nacks at close (Java's behaviour: the broker redelivers unacked messages when the consumer
    goes) or ``"flush"`` them to the broker first; ``native_delay_ms``: the wrapped native consumer's own
    ``negative_ack_redelivery_delay_ms``; ``on_redelivery``: called on the timer thread with the ids of each
    flush (Java's ``onNegativeAcksSend`` interceptor).
    """

    redelivery_delay_ms: int = 60_000
    precision_bits: int = 8
    rounding: Rounding = "floor"
    backoff: RedeliveryBackoff | None = None
    max_redelivery_delay_ms: int = 0
    on_delay_limit: OnDelayLimit = "error"
    on_close: OnClose = "drop"
    native_delay_ms: int = NATIVE_DELAY_MS
    on_redelivery: Callable[[Sequence[DueIds]], object] | None = None

    def __post_init__(self) -> None:
        """Check every option (docs/parameters.md), before anything is subscribed or wrapped; numpy
        integers become ``int``. ``negative_ack_redelivery_delay_ms`` of the wrong type raises
        ``ValueError``, as ``pulsar.Client.subscribe`` does for it; other options ``TypeError`` for a wrong
        type and ``ValueError`` for a wrong value, naming the option."""
        fix = object.__setattr__  # frozen: normalize numpy integers once, here
        delay = _check_delay(self.redelivery_delay_ms, "negative_ack_redelivery_delay_ms", official=True)
        fix(self, "redelivery_delay_ms", delay)
        limit = check_limit_options(self.max_redelivery_delay_ms, self.on_delay_limit)
        fix(self, "max_redelivery_delay_ms", limit)
        check_backoff(self.backoff, "negative_ack_backoff")
        if not isinstance(self.on_close, str) or self.on_close not in ("drop", "flush"):
            raise ValueError(f"on_close must be 'drop' or 'flush', got {self.on_close!r}")
        fix(self, "native_delay_ms", check_int(self.native_delay_ms, "native_delay_ms"))
        if self.on_redelivery is not None and not callable(self.on_redelivery):
            raise TypeError(f"on_redelivery must be callable or None, got {self.on_redelivery!r}")
        try:  # the index checks them: now, before subscribe; its messages start with their name
            index = TimeBucketIndex(self.precision_bits, self.rounding)
        except (TypeError, ValueError) as error:
            raise type(error)(f"negative_ack_{error}") from None
        fix(self, "precision_bits", index.precision_bits)
        if self.on_delay_limit == "error" and self.backoff is None:
            limit_delay(self.redelivery_delay_ms, self.max_redelivery_delay_ms, "error")

    @property
    def native(self) -> NativeTiming:
        return NativeTiming(self.native_delay_ms)

    def delay_for(self, delay_ms: float | datetime.timedelta | None, redelivery_count: int) -> float:
        """The delay of one nack (ms): ``delay_ms`` if given, else the backoff's for ``redelivery_count``,
        else ``redelivery_delay_ms``; then ``max_redelivery_delay_ms`` applies. O(1).

        Raises ``TypeError``/``ValueError`` naming ``delay_ms`` for a bad one (not a number or timedelta;
        negative, infinite or NaN), naming the backoff for a bad result of ``backoff.next`` (see
        :func:`~pulsar_nack.backoff.backoff_delay`), and :class:`~pulsar_nack.DelayLimitExceeded` above the
        limit (unless ``on_delay_limit="clamp"``).
        """
        if delay_ms is not None:
            delay = _check_delay(delay_ms, "delay_ms")
        elif self.backoff is not None:
            delay = backoff_delay(self.backoff, redelivery_count, "negative_ack_backoff")
        else:
            delay = float(self.redelivery_delay_ms)
        if self.max_redelivery_delay_ms:
            delay = limit_delay(delay, self.max_redelivery_delay_ms, self.on_delay_limit)
        return delay


class NackBridge:
    """Joins one native consumer (the C++ ``_pulsar.Consumer`` behind either client) to its
    :class:`~pulsar_nack.tracker.NackTracker`: the part of a wrapped consumer that does not depend on
    whether it is called synchronously or with ``await``.

    * :meth:`nack`: a message or id and a delay → ``tracker.schedule`` (O(1) typically);
    * :meth:`admit`: each arrival → the tracker's arrival filter → whether the application gets it (O(1));
      copies it must not get are acked now or along with the application's own copy;
    * :meth:`note_ack`: acks, so that copies of acked messages are not handed out again (O(1));
    * forwarding (timer thread): due entries → one native ``negative_acknowledge`` each (O(due entries)).

    Thread-safe: the native consumer's ``negative_acknowledge`` is, and the tracker is.
    """

    def __init__(self, native: Any, topic: str, options: NackOptions) -> None:
        """``native``: the ``_pulsar.Consumer``; ``topic``: what its ``topic()`` returns."""
        self.options = options
        self._native = native
        self._topic = topic
        self._ledger_topics: dict[int, str] = {}
        self._fixed_topic: str | None = None  # the topic of every message, once known to be one
        self.tracker = NackTracker(
            self._forward,
            precision_bits=options.precision_bits,
            rounding=options.rounding,
            native=options.native,
            batch_size=batch_size,
        )
        self._arrivals = self.tracker.arrivals

    def nack(self, message: Any, delay_ms: float | datetime.timedelta | None = None) -> None:
        """File ``message`` (a message or id) for redelivery after its delay (:meth:`NackOptions.delay_for`).

        Raises ``TypeError`` for anything but a message or id, ``ValueError``/``TypeError`` for a bad
        ``delay_ms``, :class:`~pulsar_nack.DelayLimitExceeded` above the limit; nothing is filed then. Once
        the consumer is closed a nack does nothing, as the official consumer's does (the broker redelivers
        every unacked message of a closed consumer).
        """
        ids = self._ids(message)
        if ids is None:
            raise TypeError(
                "negative_acknowledge takes a pulsar.Message, pulsar.MessageId or _pulsar.MessageId, "
                f"got {type(message).__name__}"
            )
        ledger_id, entry_id, batch_index, topic = ids
        options = self.options
        if delay_ms is None and options.backoff is None and not options.max_redelivery_delay_ms:
            delay = float(options.redelivery_delay_ms)  # the common case, without the general path
        else:
            counts = delay_ms is None and options.backoff is not None
            delay = options.delay_for(delay_ms, _redelivery_count(message) if counts else 0)
        tracker = self.tracker
        if tracker.closed:
            return
        try:
            tracker.schedule(tracker._clock() + delay, ledger_id, entry_id, batch_index, topic)
        except RuntimeError:
            if not tracker.closed:  # closed meanwhile: as above
                raise

    def _topic_of(self, ledger_id: int) -> str:
        """The topic of a bare id: ledger ids are unique in a cluster, and we saw the ledger's messages."""
        topic = self._ledger_topics.get(ledger_id)
        if topic is not None:
            return topic
        if "," in self._topic or self._topic.startswith("MultiTopics"):
            raise ValueError(
                f"cannot tell the topic of a MessageId in ledger {ledger_id} on a multi-topic consumer: "
                "nack the Message, or an id of a message this consumer delivered"
            )
        return self._topic

    def _forward(self, due: Sequence[DueIds]) -> None:
        """Timer thread: hand due entries to the native tracker, then call the redelivery hook."""
        forward(self._native, due)
        if self.options.on_redelivery is not None:
            self.options.on_redelivery(due)

    def admit(self, message: pulsar.Message) -> bool:
        """Whether the application gets this arrival; copies it does not get are acked now (it acked the
        message) or parked to be acked with its own copy. Remembers the message's ids on it.

        The per-message path of every consumer, so it makes as few native calls as it can: two for a
        non-batched message while nothing is pending or in flight, four for a batched one (five on a
        multi-topic or partitioned consumer).
        """
        inner = message._message
        message_id = inner.message_id()
        batch_index = message_id.batch_index()
        arrivals = self._arrivals
        topic = self._fixed_topic
        if batch_index < 0 and topic is not None and arrivals.idle:
            message.__dict__[_ADMITTED_IDS] = _UNTRACKED  # nothing can be a copy of it yet
            return True
        ledger_id = message_id.ledger_id()
        if topic is None:
            topic = self._learn_topic(ledger_id, inner.topic_name())
        entry_id = message_id.entry_id()
        # Remembered on the message, so nacking or acking it later needs no calls into the client.
        message.__dict__[_ADMITTED_IDS] = (ledger_id, entry_id, batch_index, topic)
        if batch_index < 0 and arrivals.idle:
            return True
        verdict = arrivals.admit(ledger_id, entry_id, batch_index, topic, message_id)
        if verdict is _DELIVER:
            return True
        if verdict is Verdict.ACKED or (
            # a non-batched copy needs no ack of its own: the application's ack of its id covers it
            verdict is Verdict.DUPLICATE
            and batch_index >= 0
            and not arrivals.park(ledger_id, entry_id, batch_index, topic, inner)
        ):
            self._native.acknowledge(inner)
        return False

    def _learn_topic(self, ledger_id: int, topic: str) -> str:
        """Remember a ledger's topic (for nacks of bare ids); on a single-topic consumer, fix it."""
        if self._fixed_topic is None and topic == self._topic:
            self._fixed_topic = topic  # a single non-partitioned topic: no need to ask again
        ledger_topics = self._ledger_topics
        if ledger_id not in ledger_topics:
            if len(ledger_topics) >= _MAX_LEDGER_TOPICS:  # a cache: the oldest ledgers are done with
                ledger_topics.pop(next(iter(ledger_topics)), None)
            ledger_topics[ledger_id] = topic
        return topic

    def _ids(self, message: Any) -> tuple[int, int, int, str] | None:
        """(ledger, entry, batch index, topic) of a message or id the application passes; None if it is
        neither (the official client reports that)."""
        known = message.__dict__.get(_ADMITTED_IDS) if type(message) is pulsar.Message else None
        if known is not None and known is not _UNTRACKED:
            return known  # type: ignore[no-any-return]
        target = message_id_of(message)
        if target is None:
            return None
        message_id, inner = target
        ledger_id = message_id.ledger_id()
        topic = self._fixed_topic or self._ledger_topics.get(ledger_id)
        if topic is None:
            topic = inner.topic_name() if inner is not None else self._topic_of(ledger_id)
        return ledger_id, message_id.entry_id(), message_id.batch_index(), topic

    def note_ack(self, message: Any) -> None:
        """Tell the tracker about an ack (before it goes to the native client); ack parked copies with it."""
        arrivals = self._arrivals
        ids = message.__dict__.get(_ADMITTED_IDS) if type(message) is pulsar.Message else None
        if ids is _UNTRACKED:
            if arrivals.idle:
                return  # a non-batched message while nothing is tracked
            ids = None
        if ids is None:
            ids = self._ids(message)
            if ids is None:
                return
        if ids[2] < 0 and arrivals.idle:
            return
        copies, ack_entry = self.tracker.acked(*ids)
        for copy in copies:
            self._native.acknowledge(copy)
        if ack_entry:  # every message of a redelivered batch acked: ack the entry itself at the broker
            ledger_id, entry_id, _, topic = ids
            self._native.acknowledge(entry_message_id(topic, ledger_id, entry_id))

    def reset(self) -> None:
        """After a seek: pending nacks and what the filter knows are void (the broker starts over)."""
        self.tracker.clear()

    def forget_holdings(self) -> None:
        """Before ``redeliver_unacknowledged_messages``: the application's unacked copies come again."""
        self.tracker.arrivals.forget_holdings()

    def close(self) -> float:
        """Stop the tracker, dropping or flushing pending nacks (``on_close``). Idempotent.

        Returns how long (seconds) the caller should wait before closing the native consumer, so that
        flushed ids reach the broker (0 when nothing was flushed). Returns at once otherwise: a flush hook
        in progress on the timer thread is not waited for.
        """
        if self.tracker.closed:
            return 0.0
        flushing = self.options.on_close == "flush"
        self.tracker.close(flush=flushing)
        # The native tracker sends forwarded ids after its own delay; wait for that, not longer.
        return self.options.native.latency_ms / 1000.0 + 0.05 if flushing else 0.0

    def stats(self, with_memory: bool = True) -> NackStats:
        return self.tracker.stats(with_memory)


class NackConsumer(pulsar.Consumer):  # type: ignore[misc]  # pulsar is untyped
    """A ``pulsar.Consumer`` with PIP-393 nacks: per-call delays, backoff, limits, batch-safe redelivery.

    Create it with :meth:`Client.subscribe` or :func:`wrap`. Thread-safe like the official consumer.
    """

    _nacks: NackBridge

    def _attach(self, native: pulsar.Consumer, options: NackOptions) -> None:
        """Take over ``native``'s C++ consumer; start the tracker."""
        self._nacks = NackBridge(native._consumer, native.topic(), options)
        self._consumer = native._consumer
        self._client = native._client
        self._schema = native._schema
        consumers = self._client._consumers  # pulsar.Client closes what it lists; list us instead
        consumers[:] = [self if c is native else c for c in consumers]

    @property
    def nack_options(self) -> NackOptions:
        return self._nacks.options

    def negative_acknowledge(self, message: Any, delay_ms: float | datetime.timedelta | None = None) -> None:
        """Redeliver ``message`` after ``delay_ms``, else the backoff's delay for its redelivery count, else
        the default delay. Accepts ``pulsar.Message``, ``pulsar.MessageId`` and ``_pulsar.MessageId``.

        Raises ``TypeError`` for anything else, ``ValueError`` for a negative delay, and
        :class:`~pulsar_nack.DelayLimitExceeded` above ``max_redelivery_delay_ms`` (unless clamping).
        """
        self._nacks.nack(message, delay_ms)

    def receive(self, timeout_millis: int | None = None) -> pulsar.Message:
        """Like ``pulsar.Consumer.receive``, skipping messages that must not reach the application.

        ``timeout_millis`` bounds the whole call, as the official one's does; 0 returns a message already
        queued (or raises ``pulsar.Timeout``), as the official call does.
        """
        admit = self._nacks.admit
        if timeout_millis is None:
            message = super().receive()
            while not admit(message):
                message = super().receive()
            return message
        deadline = time.monotonic() + timeout_millis / 1000.0
        message = super().receive(timeout_millis)  # checks the argument as the official call does
        while not admit(message):
            # What is left of the timeout, rounded up: a message already queued is still returned.
            message = super().receive(max(0, math.ceil((deadline - time.monotonic()) * 1000.0)))
        return message

    def batch_receive(self) -> list[pulsar.Message]:
        """Like ``pulsar.Consumer.batch_receive``, without messages that must not reach the application."""
        while True:
            messages = super().batch_receive()
            admitted = [m for m in messages if self._nacks.admit(m)]
            if admitted or not messages:
                return admitted

    def acknowledge(self, message: Any) -> None:
        self._nacks.note_ack(message)
        super().acknowledge(message)

    def seek(self, messageid: Any) -> None:
        """Like ``pulsar.Consumer.seek``; pending nacks and the filter's state are dropped (the broker
        delivers from the new position, and the application receives those messages again)."""
        super().seek(messageid)
        self._nacks.reset()

    def redeliver_unacknowledged_messages(self) -> None:
        """Like the official call: unacked messages are delivered (and handed out) again. Messages with a
        pending nack stay held until due."""
        self._nacks.forget_holdings()
        super().redeliver_unacknowledged_messages()

    def unsubscribe(self) -> None:
        super().unsubscribe()
        self._nacks.close()

    def close(self) -> None:
        """Stop the tracker (dropping or flushing pending nacks, per ``on_close``), then close the consumer.

        Never hangs on a flush in progress: the timer is given a bounded time to finish it.
        """
        time.sleep(self._nacks.close())
        super().close()

    def nack_stats(self, with_memory: bool = True) -> NackStats:
        """Pending ids, buckets, memory, redelivery counters and lateness p50/p99 (ms)."""
        return self._nacks.stats(with_memory)


def native_subscribe_arguments(
    signature: inspect.Signature, client: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[dict[str, Any], int]:
    """Bind ``subscribe(*args, **kwargs)`` to the official ``signature`` (a ``TypeError`` names an unknown
    argument); returns the arguments for the native subscribe, whose nack delay is :data:`NATIVE_DELAY_MS`,
    and the caller's ``negative_ack_redelivery_delay_ms`` (default 60000)."""
    arguments = signature.bind(client, *args, **kwargs).arguments
    arguments.pop("self")
    delay = arguments.get("negative_ack_redelivery_delay_ms", 60_000)
    arguments["negative_ack_redelivery_delay_ms"] = NATIVE_DELAY_MS
    return arguments, delay


class Client(pulsar.Client):  # type: ignore[misc]  # pulsar is untyped
    """A ``pulsar.Client`` whose consumers track nacks with PIP-393's TimeBucket index.

    ``subscribe`` takes every argument of ``pulsar.Client.subscribe`` plus the nack options below and
    returns a :class:`NackConsumer`; ``create_producer`` also takes ``max_delivery_delay_ms`` (PIP-315).
    """

    def subscribe(
        self,
        *args: Any,
        negative_ack_precision_bits: int = 8,
        negative_ack_rounding: Rounding = "floor",
        negative_ack_backoff: RedeliveryBackoff | None = None,
        max_redelivery_delay_ms: int = 0,
        on_delay_limit: OnDelayLimit = "error",
        on_close: OnClose = "drop",
        on_redelivery: Callable[[Sequence[DueIds]], object] | None = None,
        **kwargs: Any,
    ) -> NackConsumer:
        arguments, delay_ms = native_subscribe_arguments(_SUBSCRIBE, self, args, kwargs)
        options = NackOptions(
            redelivery_delay_ms=delay_ms,
            precision_bits=negative_ack_precision_bits,
            rounding=negative_ack_rounding,
            backoff=negative_ack_backoff,
            max_redelivery_delay_ms=max_redelivery_delay_ms,
            on_delay_limit=on_delay_limit,
            on_close=on_close,
            on_redelivery=on_redelivery,
        )
        consumer = NackConsumer()
        listener = arguments.get("message_listener")
        if listener is not None:
            arguments["message_listener"] = _admitting_listener(consumer, listener)
        native = super().subscribe(**arguments)
        consumer._attach(native, options)
        if listener is not None:
            consumer._ready.set()
        return consumer

    def close(self) -> None:
        """Stop the trackers of consumers not closed yet (their timer threads would outlive the client),
        then close the client and with it its producers and consumers."""
        for consumer in list(self._consumers):
            if isinstance(consumer, NackConsumer):
                time.sleep(consumer._nacks.close())
        super().close()

    def create_producer(self, *args: Any, max_delivery_delay_ms: int = 0, **kwargs: Any) -> pulsar.Producer:
        """``pulsar.Client.create_producer``; with ``max_delivery_delay_ms`` > 0 the producer rejects
        ``deliver_after``/``deliver_at`` beyond it before sending (PIP-315, client side)."""
        check_limit_options(max_delivery_delay_ms, "error", "max_delivery_delay_ms")
        producer = super().create_producer(*args, **kwargs)
        if not max_delivery_delay_ms:
            return producer
        limited = DelayLimitedProducer()
        limited.__dict__.update(producer.__dict__)
        limited.max_delivery_delay_ms = max_delivery_delay_ms
        return limited


_SUBSCRIBE = inspect.signature(pulsar.Client.subscribe)


def _admitting_listener(
    consumer: NackConsumer, listener: Callable[[Any, Any], object]
) -> Callable[[Any, Any], None]:
    """The user's listener gets the NackConsumer, and only messages the tracker admits."""
    consumer._ready = threading.Event()

    def admit_then_call(_native: Any, message: pulsar.Message) -> None:
        # Messages may arrive before subscribe() has returned (is_set: no wait on every call).
        if not consumer._ready.is_set() and not consumer._ready.wait(30):
            _log.error("message listener called before the consumer was ready; message left unacked")
            return
        if consumer._nacks.admit(message):
            listener(consumer, message)

    return admit_then_call


def wrap(
    consumer: pulsar.Consumer,
    *,
    native_delay_ms: int,
    negative_ack_redelivery_delay_ms: int = 60_000,
    negative_ack_precision_bits: int = 8,
    negative_ack_rounding: Rounding = "floor",
    negative_ack_backoff: RedeliveryBackoff | None = None,
    max_redelivery_delay_ms: int = 0,
    on_delay_limit: OnDelayLimit = "error",
    on_close: OnClose = "drop",
    on_redelivery: Callable[[Sequence[DueIds]], object] | None = None,
) -> NackConsumer:
    """Wrap an existing ``pulsar.Consumer``: its nacks go through the PIP-393 tracker from now on.

    ``native_delay_ms`` (required: the official consumer does not expose it) must be the
    ``negative_ack_redelivery_delay_ms`` the consumer was subscribed with — the official default is 60000
    if it was not given. Due ids are handed to the native tracker that long before they are due; the
    native tracker then redelivers them on its own check grid (every ``native_delay_ms / 3``), and a
    forward waits for a moment that does not disturb the previous one (:class:`NativeTiming`). So with a
    native delay *D*, a nack comes back up to about ``2·D/3`` ms after it is due, and never sooner than
    *D* after the nack: a delay shorter than *D* comes back up to ``D - delay + 2·D/3`` late (about
    ``5·D/3`` for a delay near 0). Measured on pulsar-lite: D = 3000 → up to 2.0 s late for delays of
    4-8 s, 3.0-4.9 s late for delays under 0.1 s; D = 102 → up to 69 ms. A wrong ``native_delay_ms``
    makes every redelivery early or late by the difference. Subscribe with
    ``negative_ack_redelivery_delay_ms=pulsar_nack.NATIVE_DELAY_MS`` (102) for redelivery within
    ~70 ms of the due time, or use :meth:`Client.subscribe`, which does that itself.

    Logs a warning when the native timing is coarser than the index's buckets (``2·D/3`` >
    ``2**negative_ack_precision_bits``). A ``message_listener`` set on the wrapped consumer keeps receiving
    the plain consumer and every message: use :meth:`Client.subscribe` for listeners. Raises ``TypeError``
    for anything but an unwrapped ``pulsar.Consumer``, and as :class:`NackOptions` does for bad options.
    """
    if not isinstance(consumer, pulsar.Consumer):
        raise TypeError(f"wrap() takes a pulsar.Consumer, got {type(consumer).__name__}")
    if isinstance(consumer, NackConsumer):
        raise TypeError("this consumer is already wrapped")
    options = NackOptions(
        redelivery_delay_ms=negative_ack_redelivery_delay_ms,
        precision_bits=negative_ack_precision_bits,
        rounding=negative_ack_rounding,
        backoff=negative_ack_backoff,
        max_redelivery_delay_ms=max_redelivery_delay_ms,
        on_delay_limit=on_delay_limit,
        on_close=on_close,
        on_redelivery=on_redelivery,
        native_delay_ms=native_delay_ms,
    )
    late_ms, short_late_ms = _wrap_lateness_ms(options.native_delay_ms)
    if options.native_delay_ms > NATIVE_DELAY_MS and late_ms > 2**options.precision_bits:
        _log.warning(
            "wrapped consumer has a %d ms native nack delay: nacks come back up to ~%d ms after they are due "
            "(up to ~%d ms for delays near 0; never sooner than %d ms after the nack); subscribe with "
            "negative_ack_redelivery_delay_ms=%d for ~%d ms",
            options.native_delay_ms,
            late_ms,
            short_late_ms,
            options.native_delay_ms,
            NATIVE_DELAY_MS,
            _wrap_lateness_ms(NATIVE_DELAY_MS)[0],
        )
    wrapped = NackConsumer()
    wrapped._attach(consumer, options)
    return wrapped


def _wrap_lateness_ms(native_delay_ms: int) -> tuple[int, int]:
    """How late a wrapped consumer with this native delay redelivers, at most (ms, give or take the timer's
    few ms): for delays of at least ``native_delay_ms``, and for a delay near 0. From :class:`NativeTiming`:
    a forward may wait two native check intervals for its slot, and the native tracker needs its latency."""
    timing = NativeTiming(native_delay_ms)
    slot_ms = 2 * timing.interval_ms
    return slot_ms, timing.latency_ms + slot_ms


def _redelivery_count(message: Any) -> int:
    """The redelivery count of a message (0 for a bare id: the backoff starts over)."""
    target = message_id_of(message)
    return target[1].redelivery_count() if target is not None and target[1] is not None else 0


def _check_delay(value: Any, name: str, *, official: bool = False) -> float:
    """A delay in ms: finite and >= 0; else ``TypeError``/``ValueError`` naming ``name``.

    A per-call delay (``official=False``) may be an int, float, numpy number or ``datetime.timedelta``;
    returned as float ms. The official client's ``negative_ack_redelivery_delay_ms`` (``official=True``)
    must be an int (numpy ints too), returned as an int: a wrong type raises ``ValueError`` (as
    ``pulsar.Client.subscribe``'s ``_check_type``), an int beyond 64 bits ``TypeError`` (as its C++
    binding), a negative one ``ValueError`` (the official client has no check for that).
    """
    if official:
        delay = check_int(value, name, type_error=ValueError)
        if delay > 2**63 - 1:
            raise TypeError(f"{name} must fit in a 64-bit int, got {delay}")
        return delay
    return check_ms(value, name, timedelta=True)
