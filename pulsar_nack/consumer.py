"""The drop-in wrapper: ``pulsar_nack.Client`` and ``NackConsumer``, a ``pulsar.Consumer`` whose nacks go
through the PIP-393 tracker.

``NackConsumer`` *is* a ``pulsar.Consumer`` (a subclass): everything but nacks, receiving and acking is the
official client's, unchanged. Nacks are filed in a :class:`~pulsar_nack.tracker.NackTracker`; when due, the
tracker hands the ids back to the native ``negative_acknowledge`` (set to its 100 ms minimum delay), the
only per-id redelivery the official Python client offers. Every message the broker delivers passes
the arrival filter (:meth:`~pulsar_nack.bridge.NackBridge.admit`, :mod:`pulsar_nack.arrivals`) first, so
batch siblings and early redeliveries are held back.

What does not depend on the call style lives in :class:`~pulsar_nack.bridge.NackBridge` (nacks → tracker,
due ids → native nacks, arrivals and acks → tracker); the asyncio consumer of :mod:`pulsar_nack.aio`
shares it. This module adds the sync calls (``receive``, listeners) and the factories.
"""

from __future__ import annotations

import datetime
import functools
import inspect
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import pulsar

from pulsar_nack.bridge import NackBridge, refuse_wrapped
from pulsar_nack.chunks import DeadLetters, HeldMessage
from pulsar_nack.delay_limit import DelayLimitedProducer, check_limit_options
from pulsar_nack.native.client import list_in_client
from pulsar_nack.options import (
    NackOptions,
    nack_parameters,
    subscribe_arguments,
    subscribe_signature,
    with_signature,
    wrap_options,
)
from pulsar_nack.snapshot.wiring import SubscriptionStorage, arguments_snapshots
from pulsar_nack.stats import NackStats

__all__ = ["Client", "NackConsumer", "wrap"]

_log = logging.getLogger(__name__)
_MESSAGE = pulsar.Message  # (a global and an attribute lookup less per receive and ack)

_OFFICIAL_ACKNOWLEDGE = pulsar.Consumer.acknowledge


class NackConsumer(pulsar.Consumer):  # type: ignore[misc]  # pulsar is untyped
    """A ``pulsar.Consumer`` with PIP-393 nacks: per-call delays, backoff, limits, batch-safe redelivery.

    Create it with :meth:`Client.subscribe` or :func:`wrap`. Thread-safe like the official consumer.
    """

    _nacks: NackBridge
    _dead_letters: DeadLetters | None = None  # dead-letters held chunked messages (dead_letter_policy)
    _held_turn = True  # receive: a due held message goes next, before the native queue's (they take turns)
    # A message_listener's: called with this consumer and each message, one at a time — the native listener
    # thread and the HeldDelivery thread (held chunked messages) take turns with `_listener_lock`.
    _listener: Callable[[Any, Any], object] | None = None
    _listener_lock: threading.Lock

    def _attach(
        self,
        native: pulsar.Consumer,
        options: NackOptions,
        snapshots: SubscriptionStorage | None = None,
        *,
        ack_timeout_ms: float | None = None,
        marks_all: bool = True,
    ) -> None:
        """Take over ``native``'s C++ consumer; start the tracker (restoring ``snapshots``). The consumer
        is created before ``native`` (a ``message_listener`` is given it when subscribing), hence this second
        step."""
        self._nacks = NackBridge(
            native._consumer,
            native.topic(),
            options,
            snapshots,
            ack_timeout_ms=ack_timeout_ms,
            marks_all=marks_all,
        )
        self._consumer = native._consumer
        self._client = native._client
        self._schema = native._schema
        list_in_client(self._client, native, self)

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

        A copy that an arrival leaves in the hold (a batch sibling kept until its nack is due) is handed
        out by this call when due: once an arrival is not admitted and something is held, the call goes on
        waiting no longer than until the next held message is due (:meth:`_receive_holding`): the native
        receive alone, without a timeout, waits for the broker's next message — after the last one, for
        ever.

        While it waits in the native receive, the call is listed in ``waiting``: a nack from another
        thread then files the nack instead of keeping a copy in memory that this wait would not see
        (:meth:`NackBridge._held_unseen`).
        """
        nacks = self._nacks
        held = nacks.held  # the dict itself: `if held` costs no call per message
        waiting = nacks.waiting
        admit = nacks.admit
        if timeout_millis is None:
            # The official receive's own work, inlined (its frame costs ~0.1 µs a message): the native
            # receive, wrapped in a pulsar.Message with the consumer's schema.
            receive, schema = self._consumer.receive, self._schema
            while True:
                message = _MESSAGE()
                waiting[message] = None  # listed first, then the hold read (NackBridge._held_unseen)
                if held:  # kept (by an arrival or a nack) before this wait: hand it out when due
                    del waiting[message]
                    return self._receive_holding(None)
                try:
                    message._message = receive()
                finally:
                    del waiting[message]
                message._schema = schema
                if admit(message):
                    return message
        token = object()
        waiting[token] = None  # (as above)
        try:
            if held:
                return self._receive_holding(timeout_millis)
            deadline = time.monotonic() + timeout_millis / 1000.0
            message = super().receive(timeout_millis)  # checks the argument as the official call does
            while not admit(message):
                # What is left of the timeout, rounded up: a message already queued is still returned.
                left_ms = max(0, math.ceil((deadline - time.monotonic()) * 1000.0))
                if held:  # the arrival was kept (or another was meanwhile): hand it out when due
                    return self._receive_holding(left_ms)
                message = super().receive(left_ms)
            return message
        finally:
            del waiting[token]

    def _receive_holding(self, timeout_millis: int | None) -> pulsar.Message:
        """``receive`` while messages are held (nacked chunked ones, kept copies): a held one that is due
        and the native queue's messages in turn, else the broker's next message; waits on the native
        ``receive`` no longer than until the next held one is due."""
        nacks = self._nacks
        deadline = None if timeout_millis is None else time.monotonic() + timeout_millis / 1000.0
        # Listed before it reads the hold (see receive): a nack meanwhile files rather than keep a copy
        # due before a wait here would end.
        token = object()
        nacks.waiting[token] = None
        try:
            while True:
                # A held message that is due and the native queue's messages take turns: the native queue
                # alone first starved a due copy for as long as the broker kept the queue filled (the
                # demo's 20,000 messages on Apache: kept copies 800 ms past their bucket time). While a
                # broker re-dispatches a dead consumer's messages (a restart, a takeover), what the native
                # queue has goes first: it sends the rest as these are read, and pulsar-lite stalled that
                # re-dispatch once the application acked kept copies meanwhile (3,128 of 10,000 back in
                # 60 s when kept copies went first).
                if self._held_turn and not nacks.redispatching:
                    self._held_turn = False
                    held = self._due_held()
                    if held is not None:
                        return held
                try:
                    message = super().receive(0)
                except pulsar.Timeout:
                    pass
                else:
                    if nacks.admit(message):
                        self._held_turn = True
                        return message
                    continue
                held = self._due_held()
                if held is not None:
                    return held
                wait = nacks.hold.wait_ms(nacks.tracker.now())
                left_s = None if deadline is None else deadline - time.monotonic()
                remaining = None if left_s is None else max(0, math.ceil(left_s * 1000.0))
                if wait is None:  # nothing held any more: a plain receive for what is left of the timeout
                    return self.receive(remaining)
                wait_ms = math.ceil(wait) if remaining is None else min(math.ceil(wait), remaining)
                try:
                    message = super().receive(wait_ms)
                except pulsar.Timeout:
                    if remaining is not None and wait_ms >= remaining:
                        raise
                    continue
                if nacks.admit(message):
                    return message
        finally:
            del nacks.waiting[token]

    def _due_held(self) -> pulsar.Message | None:
        """The next held chunked message that is due, as a :class:`~pulsar_nack.chunks.HeldMessage`; one
        past the dead-letter policy's ``max_redeliver_count`` is sent to the dead-letter topic and acked
        instead. None if none is due."""
        hold, clock, dead_letters = self._nacks.hold, self._nacks.tracker.now, self._dead_letters
        while (due := hold.next_due(clock(), dead_letters)) is not None:
            if isinstance(due, HeldMessage):
                self._nacks.count_received((due,))
                return due
            assert dead_letters is not None
            with hold.dead_lettering(due, clock()):
                dead_letters.send(due.message)
            self.acknowledge(due.message)
        return None

    def _deliver_held(self) -> None:
        """HeldDelivery thread of a ``message_listener`` consumer: hand every due held chunked message to
        the listener (one at a time with the native listener thread), dead-letter those past the policy."""
        listener, nacks = self._listener, self._nacks
        assert listener is not None
        while not nacks.tracker.closed and (held := self._due_held()) is not None:
            with self._listener_lock:
                if nacks.tracker.closed:  # closed while waiting for the listener: the broker has it
                    return
                try:
                    listener(self, held)
                except Exception:  # as the official listener thread does: logged, message left unacked
                    _log.exception("message_listener raised on a held chunked message of %s", self.topic())

    def batch_receive(self) -> list[pulsar.Message]:
        """Like ``pulsar.Consumer.batch_receive``, without messages that must not reach the application;
        held chunked messages that are due come first, alone. One held while this call waits in the native
        ``batch_receive`` (a nack from another thread) comes with the next call: up to one
        ``batch_receive_policy`` timeout late, as the native call returns by then."""
        if self._nacks.held:
            due: list[pulsar.Message] = []
            while (held := self._due_held()) is not None:
                due.append(held)
            if due:
                return due
        admit_all = self._nacks.admit_all
        while True:
            messages = super().batch_receive()
            admitted = admit_all(messages)
            if admitted or not messages:
                return admitted

    def acknowledge(self, message: Any) -> None:
        self._nacks.acked += 1  # (Java's message.ack: every ack call, as its consumer counts them)
        if type(message) is _MESSAGE:
            self._nacks.acknowledge(message)  # the note and the native ack in one frame
            return
        self._nacks.note_ack(message)
        _OFFICIAL_ACKNOWLEDGE(self, message)

    def acknowledge_cumulative(self, message: Any) -> None:
        """Like ``pulsar.Consumer.acknowledge_cumulative`` (a message or id); then pending nacks, forwards
        and batch records of the topic up to that message are settled: none of them is redelivered or
        asked for again. Raises as the official call does (nothing settled then)."""
        super().acknowledge_cumulative(message)
        self._nacks.acked += 1
        self._nacks.note_cumulative_ack(message)

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
        """Like the official call; the subscription's snapshot is deleted (its pending nacks are void)."""
        super().unsubscribe()
        self._nacks.discard_snapshots()
        self._nacks.close(wait=False)  # (the subscription is gone: nothing to wait for)

    def close(self) -> None:
        """Stop the tracker (dropping or flushing pending nacks, per ``on_close``), then close the consumer.

        Never hangs on a flush in progress: the timer is given a bounded time to finish it.
        """
        self._nacks.close()
        if self._dead_letters is not None:
            self._dead_letters.close()
        super().close()

    def nack_stats(self, *, with_memory: bool = False) -> NackStats:
        """Pending ids, buckets, redelivery counters and lateness p50/p99 (ms); cheap: no walk of the index
        (see :meth:`NackTracker.stats <pulsar_nack.tracker.NackTracker.stats>`). ``memory_bytes`` is None
        unless ``with_memory=True``, which walks the index and the arrival filter (O(index objects), under
        the index's lock)."""
        return self._nacks.stats(with_memory=with_memory)


class Client(pulsar.Client):  # type: ignore[misc]  # pulsar is untyped
    """A ``pulsar.Client`` whose consumers track nacks with PIP-393's TimeBucket index.

    ``subscribe`` takes every argument of ``pulsar.Client.subscribe`` plus the nack options of
    :class:`NackOptions` and returns a :class:`NackConsumer`; ``create_producer`` also takes
    ``max_delivery_delay_ms`` (PIP-315).
    """

    def subscribe(self, *args: Any, **kwargs: Any) -> NackConsumer:
        """``pulsar.Client.subscribe(*args, **kwargs)`` with the nack options of :class:`NackOptions`
        (keyword-only; see ``inspect.signature(pulsar_nack.Client.subscribe)``); returns a
        :class:`NackConsumer`. Every option is checked before anything is subscribed."""
        arguments, options = subscribe_arguments(_SUBSCRIBE, self, args, kwargs)
        snapshots = arguments_snapshots(options, arguments)  # before subscribing: it may fail
        consumer = NackConsumer()
        listener = arguments.get("message_listener")
        if listener is not None:
            arguments["message_listener"] = _admitting_listener(consumer, listener)
        try:
            native = super().subscribe(**arguments)
        except BaseException:
            if snapshots is not None:
                snapshots.unlock()
            raise
        timeout_ms = arguments.get("unacked_messages_timeout_ms")
        consumer._attach(native, options, snapshots, ack_timeout_ms=timeout_ms)
        policy = arguments.get("dead_letter_policy")
        if policy is not None:
            create = functools.partial(pulsar.Client.create_producer, self)
            consumer._dead_letters = DeadLetters(create, policy, arguments["subscription_name"])
        if listener is not None:
            name = f"pulsar-nack-held-{arguments['subscription_name']}"
            consumer._nacks.deliver_held(consumer._deliver_held, name)
            consumer._ready.set()
        return consumer

    def close(self) -> None:
        """Stop the trackers of consumers not closed yet (their timer threads would outlive the client),
        then close the client and with it its producers and consumers."""
        for consumer in list(self._consumers):
            if isinstance(consumer, NackConsumer):
                consumer._nacks.close()
        super().close()

    def create_producer(
        self, *args: Any, max_delivery_delay_ms: int = 0, **kwargs: Any
    ) -> pulsar.Producer | DelayLimitedProducer:
        """``pulsar.Client.create_producer``; with ``max_delivery_delay_ms`` > 0 the producer rejects
        ``deliver_after``/``deliver_at`` beyond it before sending (PIP-315, client side)."""
        limit = check_limit_options(max_delivery_delay_ms, "error", "max_delivery_delay_ms")
        producer = super().create_producer(*args, **kwargs)
        return DelayLimitedProducer(producer, limit) if limit else producer


_SUBSCRIBE = inspect.signature(pulsar.Client.subscribe)
with_signature(subscribe_signature(_SUBSCRIBE))(Client.subscribe)


def _admitting_listener(
    consumer: NackConsumer, listener: Callable[[Any, Any], object]
) -> Callable[[Any, Any], None]:
    """The user's listener gets the NackConsumer, and only messages the tracker admits; one message at a
    time, whether from the native listener thread or held chunked messages from their HeldDelivery thread
    (both take ``_listener_lock``)."""
    consumer._ready = threading.Event()
    consumer._listener = listener
    lock = consumer._listener_lock = threading.Lock()
    admit: Callable[[pulsar.Message], bool] | None = None  # the bridge's, once the consumer is ready

    def admit_then_call(_native: Any, message: pulsar.Message) -> None:
        nonlocal admit
        if admit is None:  # messages may arrive before subscribe() has returned: wait for it, once
            if not consumer._ready.wait(30):
                _log.error("message listener called before the consumer was ready; message left unacked")
                return
            admit = consumer._nacks.admit
        if admit(message):
            # one call at a time, with the HeldDelivery thread's (not `with`: its __exit__ costs ~90 ns more)
            lock.acquire()
            try:
                listener(consumer, message)
            finally:
                lock.release()

    return admit_then_call


def wrap(consumer: pulsar.Consumer, *, native_delay_ms: int, **options: Any) -> NackConsumer:
    """Wrap an existing ``pulsar.Consumer``: its nacks go through the PIP-393 tracker from now on.

    ``native_delay_ms`` (required: the official consumer does not expose it) must be the
    ``negative_ack_redelivery_delay_ms`` the consumer was subscribed with — the official default is 60000 if
    it was not given. Due ids are handed to the native tracker that long before they are due; the native
    tracker then redelivers them on its own check grid (every ``native_delay_ms / 3``), and a forward waits
    for a moment that does not disturb the previous one (:class:`~pulsar_nack.native.NativeTiming`). So with a
    native delay *D*, a nack comes back up to about ``2·D/3`` ms after it is due, and never sooner than *D*
    after the nack: a delay shorter than *D* comes back up to ``D - delay + 2·D/3`` late (about ``5·D/3`` for
    a delay near 0). Measured on pulsar-lite: D = 3000 → up to 2.0 s late for delays of 4-8 s, 3.0-4.9 s late
    for delays under 0.1 s; D = 102 → up to 69 ms. A wrong ``native_delay_ms`` makes every redelivery early or
    late by the difference. Subscribe with ``negative_ack_redelivery_delay_ms=pulsar_nack.NATIVE_DELAY_MS``
    (102) for redelivery within ~70 ms of the due time, or use :meth:`Client.subscribe`, which does that
    itself.

    Logs a warning when the native timing is coarser than the index's buckets (``2·D/3`` >
    ``2**negative_ack_precision_bit_cnt``). A ``message_listener`` set on the wrapped consumer keeps receiving
    the plain consumer and every message: use :meth:`Client.subscribe` for listeners. Raises ``TypeError``
    for anything but an unwrapped ``pulsar.Consumer``, and as :meth:`NackOptions.from_arguments` does for bad
    options (nothing is taken over then). The nack options are those of :meth:`Client.subscribe`, plus
    ``negative_ack_redelivery_delay_ms`` (default 60000): see ``inspect.signature(pulsar_nack.wrap)``.
    """
    if not isinstance(consumer, pulsar.Consumer):
        raise TypeError(f"wrap() takes a pulsar.Consumer, got {type(consumer).__name__}")
    if isinstance(consumer, NackConsumer):
        raise TypeError("this consumer is already wrapped")
    refuse_wrapped(consumer, "wrap")
    nack, snapshots = wrap_options(consumer, native_delay_ms, options, caller="wrap")
    wrapped = NackConsumer()
    # (its dead_letter_policy is unknown here: held messages are not dead-lettered); messages received
    # before wrap() carry no mark
    wrapped._attach(consumer, nack, snapshots, marks_all=False)
    return wrapped


with_signature(
    inspect.Signature(
        [
            inspect.Parameter(
                "consumer", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="pulsar.Consumer"
            ),
            inspect.Parameter("native_delay_ms", inspect.Parameter.KEYWORD_ONLY, annotation="int"),
            *nack_parameters(),
        ],
        return_annotation="NackConsumer",
    )
)(wrap)
