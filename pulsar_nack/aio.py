"""The asyncio wrapper: ``pulsar_nack.aio.Client`` and ``NackConsumer``, a ``pulsar.asyncio.Consumer`` whose
nacks go through the PIP-393 tracker.

Same behaviour as :mod:`pulsar_nack.consumer`, in ``pulsar.asyncio``'s call style::

    client = pulsar_nack.aio.Client("pulsar://127.0.0.1:6650")
    consumer = await client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared,
                                      negative_ack_redelivery_delay_ms=1000)
    message = await consumer.receive()
    await consumer.negative_acknowledge(message, delay_ms=250)

The logic is the sync consumer's :class:`~pulsar_nack.bridge.NackBridge`; this module adds only the
``await`` surface. Forwarding due ids happens on the tracker's timer thread, through the C++ consumer's own
(thread-safe, non-blocking) ``negative_acknowledge``: never on the event loop, and never blocking it.
``on_redelivery`` hooks run on that thread too.

One difference from ``pulsar.asyncio.Consumer``: a ``receive()`` cancelled while it waits (by
``asyncio.wait_for``, ``asyncio.timeout`` or a cancelled task) loses no message. The C++ client cannot
take back a pending receive, so the official asyncio consumer drops the message that later fulfils it; here
the next ``receive()`` gets it instead.

Nacked chunked messages are held in memory and handed out whole by ``receive()`` at their due time
(:mod:`pulsar_nack.chunks`): a timer on the event loop wakes a ``receive()`` waiting on the broker then
(its native receive is kept, as a cancelled one's is, for the next ``receive()``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import inspect
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import pulsar
import pulsar.asyncio

from pulsar_nack.bridge import NackBridge, refuse_wrapped
from pulsar_nack.chunks import AsyncDeadLetters, HeldMessage
from pulsar_nack.native.client import OK, message_of
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

if TYPE_CHECKING:
    import _pulsar

__all__ = ["Client", "NackConsumer", "wrap"]

_Receive = tuple[int, "asyncio.Future[Any]"]  # (request number, the native receive's future)
#: An async ``message_listener``: awaited with the consumer and each message, one message at a time.
AsyncListener = Callable[["NackConsumer", pulsar.Message], Awaitable[object]]
_log = logging.getLogger(__name__)


class NackConsumer(pulsar.asyncio.Consumer):  # type: ignore[misc]  # pulsar is untyped
    """A ``pulsar.asyncio.Consumer`` with PIP-393 nacks: per-call delays, backoff, limits, batch-safe
    redelivery. Create it with :meth:`Client.subscribe`.

    Everything but receiving, nacking, acking and closing is ``pulsar.asyncio.Consumer``'s.
    """

    def __init__(
        self,
        native: pulsar.asyncio.Consumer,
        options: NackOptions,
        snapshots: SubscriptionStorage | None = None,
        *,
        ack_timeout_ms: float | None = None,
        marks_all: bool = True,
    ) -> None:
        """Take over ``native``'s C++ consumer and start the tracker (restoring ``snapshots``); the
        keywords are :class:`~pulsar_nack.bridge.NackBridge`'s."""
        super().__init__(native._consumer, native._schema)
        # Held chunked messages (pulsar_nack.chunks): handed out by receive(); a loop timer per hold wakes
        # the receives waiting on the broker (`_waiting`: their shielded waits; `_woken`: those woken).
        self._loop = asyncio.get_running_loop()
        self._waiting: set[asyncio.Future[Any]] = set()
        self._woken: set[asyncio.Future[Any]] = set()
        self._nacks = NackBridge(
            self._consumer,
            self._consumer.topic(),
            options,
            snapshots,
            ack_timeout_ms=ack_timeout_ms,
            marks_all=marks_all,
            on_hold=self._on_hold,
        )
        self._requests = itertools.count()
        self._orphans: list[_Receive] = []  # native receives whose caller was cancelled
        self._listener_task: asyncio.Task[None] | None = None  # runs an async message_listener
        self._dead_letters: AsyncDeadLetters | None = None

    @property
    def nack_options(self) -> NackOptions:
        return self._nacks.options

    # -- receiving ----------------------------------------------------------------------------------

    async def receive(self) -> pulsar.Message:
        """Like ``pulsar.asyncio.Consumer.receive``, skipping messages that must not reach the application.

        Use ``asyncio.wait_for``/``asyncio.timeout`` for a timeout: cancelling loses no message.
        Raises ``pulsar.asyncio.PulsarException`` (e.g. ``AlreadyClosed``).
        """
        nacks = self._nacks
        while True:
            if nacks.held and (held := await self._due_held()) is not None:
                return held
            message = await self._receive_native()
            if message is not None and nacks.check_deaths is not None:
                nacks.check_deaths()  # (as NackBridge.admit does, before it reads `adopting`)
            if message is not None and (adopting := nacks.adopting) is not None:
                await asyncio.to_thread(adopting.wait)  # a dead member's nacks first (not on the loop)
            if message is not None and nacks.admit(message):
                return message

    async def _receive_native(self) -> pulsar.Message | None:
        """The next message from the C++ consumer, oldest orphaned native receive first; None if a held
        chunked message fell due meanwhile (:meth:`_wake`)."""
        loop = asyncio.get_running_loop()
        request = self._claim_orphan(loop)
        if request is None:
            future: asyncio.Future[Any] = loop.create_future()
            self._consumer.receive_async(functools.partial(_settle, future))
            request = (next(self._requests), future)
        waiting = asyncio.shield(request[1])
        self._waiting.add(waiting)
        try:
            raw = await waiting
        except asyncio.CancelledError:
            # The native receive stays outstanding and will be fulfilled by the next message: keep it.
            self._orphans.append(request)
            if waiting in self._woken:
                self._woken.discard(waiting)
                task = asyncio.current_task()
                if task is None or not task.cancelling():  # woken, and not cancelled by its caller too
                    return None
            raise
        finally:
            self._waiting.discard(waiting)
        return message_of(raw, self._schema)

    def __aiter__(self) -> NackConsumer:
        """``async for message in consumer``: every message the application gets, until it is closed."""
        return self

    async def __anext__(self) -> pulsar.Message:
        try:
            return await self.receive()
        except pulsar.asyncio.PulsarException as error:
            if error.error() == pulsar.Result.AlreadyClosed:
                raise StopAsyncIteration from None
            raise

    async def _listen(self, listener: AsyncListener) -> None:
        """The task behind an async ``message_listener``: one message at a time, in order, as the official
        listener thread calls its listener. A listener's exception is logged and the next message follows
        (the official client does the same); the message stays unacked."""
        async for message in self:
            try:
                await listener(self, message)
            except Exception:
                _log.exception("message_listener raised on %s", self.topic())

    async def _due_held(self) -> pulsar.Message | None:
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
                await dead_letters.send(due.message)
            await self.acknowledge(due.message)
        return None

    def _on_hold(self, due_ms: float) -> None:
        """(Any thread: the nacking one.) A chunked message is held until ``due_ms``: wake the waiting
        receives then."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody receives any more
            self._loop.call_soon_threadsafe(self._wake_at, due_ms)

    def _wake_at(self, due_ms: float) -> None:
        self._loop.call_later(max(0.0, due_ms - self._nacks.tracker.now()) / 1000.0, self._wake)

    def _wake(self) -> None:
        """(Event loop.) If a held message is due, wake every receive waiting on the broker (each keeps its
        native receive for later) so that one hands it out; if it is not due yet (a timer may fire a
        little early), try again when it is."""
        wait = self._nacks.hold.wait_ms(self._nacks.tracker.now())
        if wait is None:
            return
        if wait > 0:
            self._loop.call_later(wait / 1000.0, self._wake)
            return
        for waiting in list(self._waiting):
            if not waiting.done():
                self._woken.add(waiting)
                waiting.cancel()

    def _claim_orphan(self, loop: asyncio.AbstractEventLoop) -> _Receive | None:
        """The earliest orphaned receive of this event loop (the C++ client fulfils receives in order).

        Orphans are rare (one per cancelled receive): O(orphans). Those of closed loops are forgotten.
        """
        self._orphans = [r for r in self._orphans if not r[1].get_loop().is_closed()]
        mine = [r for r in self._orphans if r[1].get_loop() is loop]
        if not mine:
            return None
        request = min(mine, key=lambda r: r[0])
        self._orphans.remove(request)
        return request

    # -- nacking and acking -------------------------------------------------------------------------

    async def negative_acknowledge(
        self, message: Any, delay_ms: float | datetime.timedelta | None = None
    ) -> None:
        """Redeliver ``message`` after ``delay_ms``, else the backoff's delay for its redelivery count, else
        the default delay. Accepts ``pulsar.Message``, ``pulsar.MessageId`` and ``_pulsar.MessageId``.

        Never blocks (O(1) typically; no thread hop). Raises ``TypeError`` for anything else,
        ``ValueError`` for a negative delay, and :class:`~pulsar_nack.DelayLimitExceeded` above
        ``max_redelivery_delay_ms`` (unless clamping).
        """
        self._nacks.nack(message, delay_ms)

    async def acknowledge(
        self, message: pulsar.Message | pulsar.MessageId | _pulsar.Message | _pulsar.MessageId
    ) -> None:
        """``pulsar.asyncio.Consumer.acknowledge``; an acked batch message is not handed out again when
        its batch comes back for a sibling's nack."""
        self._nacks.acked += 1
        self._nacks.note_ack(message)
        await super().acknowledge(message)

    async def acknowledge_cumulative(
        self, message: pulsar.Message | pulsar.MessageId | _pulsar.Message | _pulsar.MessageId
    ) -> None:
        """``pulsar.asyncio.Consumer.acknowledge_cumulative``; then pending nacks, forwards and batch records
        of the topic up to that message are settled, as the sync consumer's."""
        await super().acknowledge_cumulative(message)
        self._nacks.acked += 1
        self._nacks.note_cumulative_ack(message)

    async def seek(self, messageid: Any) -> None:
        """Like ``pulsar.asyncio.Consumer.seek``; pending nacks and the filter's state are dropped."""
        await super().seek(messageid)
        self._nacks.reset()

    def redeliver_unacknowledged_messages(self) -> None:
        """Like the official call: unacked messages are handed out again; pending nacks stay held."""
        self._nacks.forget_holdings()
        super().redeliver_unacknowledged_messages()

    # -- lifecycle and stats ------------------------------------------------------------------------

    async def unsubscribe(self) -> None:
        """Like ``pulsar.asyncio.Consumer.unsubscribe``; the subscription's snapshot is deleted (its pending
        nacks are void) and the tracker stopped, as the sync consumer does. The storage work runs on a worker
        thread: the event loop never waits for a disk."""
        await super().unsubscribe()
        await asyncio.to_thread(self._nacks.discard_snapshots)
        await self._stop_tracking()

    async def close(self) -> None:
        """Stop the tracker (dropping or flushing pending nacks, per ``on_close``), then close the consumer.

        The tracker is stopped on a worker thread: a flush hook in progress never blocks the event loop.
        """
        await self._stop_tracking()
        if self._dead_letters is not None:
            await self._dead_letters.close()
        await super().close()
        await self._stop_listening()
        self._forget_orphans()

    async def _stop_listening(self) -> None:
        """End the listener task once the consumer is closed: its receive fails with ``AlreadyClosed``
        and the loop ends; a listener still busy after a second is cancelled. Never raises."""
        task, self._listener_task = self._listener_task, None
        if task is None or task is asyncio.current_task():
            return  # none, or the listener closes its own consumer: its loop ends on the next receive
        with contextlib.suppress(asyncio.CancelledError, TimeoutError, Exception):
            await asyncio.wait_for(asyncio.shield(task), 1.0)
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _stop_tracking(self) -> None:
        if self._nacks.tracker.closed:
            return
        await asyncio.to_thread(self._nacks.close)  # (its wait after a flush: on a worker thread)

    def _forget_orphans(self) -> None:
        """Closing fails outstanding native receives; nobody awaits the orphaned ones any more."""
        for _, future in self._orphans:
            future.add_done_callback(_retrieve)
        self._orphans.clear()

    def nack_stats(self, *, with_memory: bool = False) -> NackStats:
        """Pending ids, buckets, redelivery counters and lateness p50/p99 (ms); cheap: no walk of the index.

        ``memory_bytes`` is None unless ``with_memory=True``: O(index objects), on the event loop (keep it
        out of hot paths).
        """
        return self._nacks.stats(with_memory=with_memory)


class Client(pulsar.asyncio.Client):  # type: ignore[misc]  # pulsar is untyped
    """A ``pulsar.asyncio.Client`` whose consumers track nacks with PIP-393's TimeBucket index.

    ``await subscribe(...)`` takes every argument of ``pulsar.asyncio.Client.subscribe`` plus the nack options
    of :class:`~pulsar_nack.NackOptions` (as :meth:`pulsar_nack.Client.subscribe` does) and an async
    ``message_listener``, and returns a :class:`NackConsumer`. ``close()`` also stops the
    trackers of consumers that were not closed.
    """

    def __init__(self, service_url: str, **kwargs: Any) -> None:
        super().__init__(service_url, **kwargs)
        self._nack_consumers: list[NackConsumer] = []

    async def subscribe(
        self, *args: Any, message_listener: AsyncListener | None = None, **kwargs: Any
    ) -> NackConsumer:
        """``pulsar.asyncio.Client.subscribe(*args, **kwargs)`` with the nack options (keyword-only; see
        ``inspect.signature(pulsar_nack.aio.Client.subscribe)``) and an async ``message_listener``. Every
        option is checked before anything is subscribed."""
        if message_listener is not None and not inspect.iscoroutinefunction(message_listener):
            raise TypeError(
                "message_listener must be an async function (consumer, message) -> None, "
                f"got {message_listener!r}"
            )
        arguments, options = subscribe_arguments(_SUBSCRIBE, self, args, kwargs)
        snapshots = arguments_snapshots(options, arguments)  # before subscribing: it may fail
        try:
            native = await super().subscribe(**arguments)
        except BaseException:
            if snapshots is not None:
                snapshots.unlock()
            raise
        timeout_ms = arguments.get("unacked_messages_timeout_ms")
        consumer = NackConsumer(native, options, snapshots, ack_timeout_ms=timeout_ms)
        policy = arguments.get("dead_letter_policy")
        if policy is not None:
            create = functools.partial(pulsar.asyncio.Client.create_producer, self)
            consumer._dead_letters = AsyncDeadLetters(create, policy, arguments["subscription_name"])
        self._nack_consumers = [c for c in self._nack_consumers if not c._nacks.tracker.closed]
        self._nack_consumers.append(consumer)
        if message_listener is not None:
            consumer._listener_task = asyncio.create_task(consumer._listen(message_listener))
        return consumer

    async def close(self) -> None:
        """Stop every consumer's tracker, then close the client (and with it producers and consumers)."""
        consumers, self._nack_consumers = self._nack_consumers, []
        for consumer in consumers:
            await consumer._stop_tracking()
        await super().close()
        for consumer in consumers:
            await consumer._stop_listening()
            consumer._forget_orphans()


_SUBSCRIBE = inspect.signature(pulsar.asyncio.Client.subscribe)
_LISTENER = inspect.Parameter(
    "message_listener", inspect.Parameter.KEYWORD_ONLY, default=None, annotation="AsyncListener | None"
)
with_signature(subscribe_signature(_SUBSCRIBE, _LISTENER, returns="NackConsumer"))(Client.subscribe)


def wrap(consumer: pulsar.asyncio.Consumer, *, native_delay_ms: int, **options: Any) -> NackConsumer:
    """Wrap an existing ``pulsar.asyncio.Consumer``: :func:`pulsar_nack.wrap` for asyncio — its nacks go
    through the PIP-393 tracker from now on.

    ``native_delay_ms`` (required) is the ``negative_ack_redelivery_delay_ms`` the consumer was subscribed
    with, and redelivery is as late as :func:`pulsar_nack.wrap` says for it: subscribe with
    ``pulsar_nack.NATIVE_DELAY_MS`` (102) for ~70 ms, or use :meth:`Client.subscribe`. Raises ``TypeError``
    for anything but an unwrapped ``pulsar.asyncio.Consumer`` (also the same consumer wrapped twice), and as
    :meth:`NackOptions.from_arguments` does for bad options; nothing is taken over then. The options are
    those of :meth:`Client.subscribe`: see ``inspect.signature(pulsar_nack.aio.wrap)``.
    """
    if not isinstance(consumer, pulsar.asyncio.Consumer):
        raise TypeError(f"aio.wrap() takes a pulsar.asyncio.Consumer, got {type(consumer).__name__}")
    if isinstance(consumer, NackConsumer):
        raise TypeError("this consumer is already wrapped")
    refuse_wrapped(consumer, "aio.wrap")
    nack, snapshots = wrap_options(consumer, native_delay_ms, options, caller="aio.wrap")
    return NackConsumer(consumer, nack, snapshots, marks_all=False)  # (earlier messages carry no mark)


with_signature(
    inspect.Signature(
        [
            inspect.Parameter(
                "consumer", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="pulsar.asyncio.Consumer"
            ),
            inspect.Parameter("native_delay_ms", inspect.Parameter.KEYWORD_ONLY, annotation="int"),
            *nack_parameters(),
        ],
        return_annotation="NackConsumer",
    )
)(wrap)


def _settle(future: asyncio.Future[Any], result: Any, value: Any) -> None:
    """C++ callback thread: complete ``future`` on its loop (``pulsar.asyncio``'s convention)."""

    def complete() -> None:
        if future.done():
            return
        if result == OK:
            future.set_result(value)
        else:
            future.set_exception(pulsar.asyncio.PulsarException(result))

    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
        future.get_loop().call_soon_threadsafe(complete)


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark an orphan's outcome as seen, so asyncio does not log 'exception was never retrieved'."""
    if not future.cancelled():
        future.exception()
