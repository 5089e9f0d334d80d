"""The bridge: one native consumer joined to its :class:`~pulsar_nack.tracker.NackTracker`, whatever the
call style.

:class:`NackBridge` is what the sync :class:`~pulsar_nack.consumer.NackConsumer` and the asyncio
:class:`~pulsar_nack.aio.NackConsumer` share: nacks → tracker, due ids → native nacks
(:mod:`pulsar_nack.native.client`), every arrival through the arrival filter
(:meth:`NackBridge.admit`, :mod:`pulsar_nack.arrivals`), acks → tracker, and the messages it keeps in
memory (nacked chunked messages, early copies of pending nacks: :mod:`pulsar_nack.chunks`).
"""

from __future__ import annotations

import datetime
import itertools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import pulsar

from pulsar_nack.arrivals import Verdict
from pulsar_nack.chunks import ChunkHold, HeldDelivery, Key
from pulsar_nack.index import DueIds
from pulsar_nack.native.client import batch_size, chunk_of, entry_message_id, forward, message_id_of
from pulsar_nack.options import NackOptions
from pulsar_nack.snapshot.redispatch import RedispatchStore
from pulsar_nack.snapshot.takeover import Adoption
from pulsar_nack.snapshot.wiring import (
    SubscriptionStorage,
    snapshot_keeper,
    start_takeover,
    tracker_snapshot_arguments,
)
from pulsar_nack.stats import NackStats
from pulsar_nack.timer import monotonic_ms
from pulsar_nack.tracker import NackTracker

__all__ = ["HOLD_SIBLINGS_WITHIN_MS", "KEPT_COPY_BYTES", "MAX_FAST_HELD", "NackBridge", "refuse_wrapped"]

_log = logging.getLogger(__name__)
#: Every C++ consumer a tracker has taken over (held weakly): wrap() refuses one of them — a second tracker
#: on one consumer would forward its nacks twice and hold back the other's copies.
_TAKEN_OVER: weakref.WeakSet[Any] = weakref.WeakSet()
_MAX_LEDGER_TOPICS = 65_536
_MAX_CHUNK_FIRSTS = 65_536  # chunked messages nacked at the broker whose first chunk is remembered
#: A copy of a batch sibling whose nack is pending, come with a forward of its entry, is kept in memory
#: (the hold, under ``max_held_chunked_bytes``) when it is due within this many ms; a later one is left to a
#: forward of its own, which fetches the whole entry from the broker again.
HOLD_SIBLINGS_WITHIN_MS = 30_000
#: What a kept batch message costs beside its batch's payload, in bytes: the native message, its Python
#: objects and the hold's record. A kept batch message pins its whole batch's buffer in the native client,
#: so a kept copy counts against ``max_held_chunked_bytes`` as batch size × its payload + this (measured
#: with glibc mallinfo2 on 2,000 kept messages of batches of 10: 1,150-1,160 B + 10 × payload, for
#: payloads of 4, 100 and 1,000 B; siblings kept from one copy share the buffer: counted once each, an
#: upper bound).
KEPT_COPY_BYTES = 1_160
#: A per-call ``delay_ms`` of type int or float up to this needs no more checks than a range test.
_FAST_DELAY_MS = float(2**53)
#: Attribute of a ``pulsar.Message`` the wrapper handed out: its (ledger, entry, batch index, topic), or
#: :data:`_UNTRACKED` for a non-batched message admitted while nothing was tracked (ids not read). Set as
#: an attribute, never through ``message.__dict__``: CPython 3.11 keeps an instance's attributes inline
#: and builds the ``__dict__`` object on its first use, which cost 0.13 µs a message (0.014 µs as an
#: attribute, measured on the admission path).
_ADMITTED_IDS = "_pulsar_nack_ids"  # (written as ``message._pulsar_nack_ids = ...``)
#: Attribute of a ``pulsar.Message`` the wrapper handed out: the bridge of the consumer that did (written as
#: ``message._pulsar_nack_by = self``: +5–11 ns a message, timeit), so that a nack of another consumer's
#: message is told apart.
_ADMITTED_BY = "_pulsar_nack_by"
_UNTRACKED = ()
_monotonic = time.monotonic  # the nack path reads the default clock without a Python frame
_DELIVER = Verdict.DELIVER  # a module constant: an enum member lookup costs 65 ns on the per-message path
_ACKED, _DUPLICATE, _HOLD = Verdict.ACKED, Verdict.DUPLICATE, Verdict.HOLD
_COVERED = Verdict.COVERED
#: Unacked messages a consumer in fast mode (:meth:`NackBridge.admit`) remembers at most: past this it reads
#: their ids and follows them as before (an application that acks seldom or never would otherwise pin every
#: message it was handed). Checked every :data:`_FAST_CHECK_EVERY` admissions.
MAX_FAST_HELD = 65_536
#: How often (admissions) a consumer checks whether it can admit without reading ids again, and whether it
#: remembers too many unacked messages to go on doing so.
_FAST_CHECK_EVERY = 1024
#: The last messages handed out in fast mode that a take-over reads (a ring indexed by number): the receiver
#: queue is one FIFO, so only the entry those came from can still have messages queued, above the highest
#: batch index handed out. The bound: the last message taken from the queue is among the last
#: ``_FAST_RECENT`` numbered unless that many messages were taken from the queue before it and numbered
#: after it — each held by another thread between the native receive and the numbering in ``admit`` (one
#: message per ``receive()`` or listener thread; a whole list per ``batch_receive()`` thread). So up to 256
#: threads receiving at once are safe with ``receive()`` or a listener, and ``batch_receive()`` from one
#: thread (tests/test_fast_mode_faults.py: 32 threads, which a ring of 16 did not survive). The cost: a
#: list store per message whatever the size, and 256 id reads once, at the take-over.
_FAST_RECENT = 256
_MESSAGE = pulsar.Message  # (a global and an attribute lookup less per ack and nack)


def refuse_wrapped(consumer: Any, caller: str) -> None:
    """``TypeError`` if a bridge has taken ``consumer``'s C++ consumer over already: a second one would
    forward its nacks twice and hold back the other's copies. O(1)."""
    if getattr(consumer, "_consumer", None) in _TAKEN_OVER:
        raise TypeError(
            f"{caller}(): this consumer is already wrapped: use the NackConsumer that {caller}() returned"
        )


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

    def __init__(
        self,
        native: Any,
        topic: str,
        options: NackOptions,
        snapshots: SubscriptionStorage | None = None,
        *,
        ack_timeout_ms: float | None = None,
        marks_all: bool = True,
        keep_copies: bool = True,
        on_hold: Callable[[float], object] | None = None,
    ) -> None:
        """``native``: the ``_pulsar.Consumer``; ``topic``: what its ``topic()`` returns; ``snapshots``:
        where this subscription's pending nacks are kept (:meth:`NackOptions.snapshots_for`) — they are
        restored now, before the application can receive anything.

        ``ack_timeout_ms``: the consumer's ``unacked_messages_timeout_ms`` (its copies of held messages are
        handed out again, as the official consumer's: :meth:`ArrivalFilter.expect_ack_timeout
        <pulsar_nack.arrivals.ArrivalFilter.expect_ack_timeout>`). ``marks_all``: every message this
        consumer hands out is marked (admit), so an unmarked ``pulsar.Message`` is another consumer's —
        False for a wrapped consumer, whose messages received before ``wrap()`` carry no mark.
        ``keep_copies``: the consumer hands kept copies out (receive, a listener's
        :class:`~pulsar_nack.chunks.HeldDelivery`, the asyncio receive): hold chunked messages and batch
        siblings in memory, and let a batch message due while its entry's forward is under way wait for
        that forward's copy (:attr:`ArrivalFilter.coalesce <pulsar_nack.arrivals.ArrivalFilter.coalesce>`);
        False: every such copy is dropped and fetched again by a forward of its own. ``on_hold``: called
        with the due time (ms) of each message held in memory, on the nacking thread (the asyncio
        consumer's wake-up of its waiting receives; a listener's is :meth:`deliver_held`)."""
        self.options = options
        self.marks_all = marks_all
        self._native = native
        _TAKEN_OVER.add(native)
        self._topic = topic
        self._ledger_topics: dict[int, str] = {}
        self._fixed_topic: str | None = None  # the topic of every message, once known to be one
        self._snapshots = snapshots
        self.tracker = NackTracker(
            self._forward,
            precision_bits=options.precision_bits,
            rounding=options.rounding,
            native=options.native,
            batch_size=batch_size,
            **tracker_snapshot_arguments(snapshots, options.precision_bits, options.rounding),
        )
        self.keeper = snapshot_keeper(self.tracker)  # None without snapshots
        self._arrivals = self.tracker.arrivals
        self._arrivals.expect_ack_timeout(ack_timeout_ms)  # before anything arrives (and before a restore)
        self._arrivals.coalesce = keep_copies
        # The nack path's constants (the options are frozen): the delay of a nack without one while no
        # backoff or limit applies (else None), whether a per-call delay needs no limit, and the clock.
        plain = options.backoff is None and not options.max_redelivery_delay_ms
        self._default_delay = float(options.redelivery_delay_ms) if plain else None
        self._unlimited = not options.max_redelivery_delay_ms
        self._now = self.tracker.clock
        self._monotonic_ms = self._now is monotonic_ms
        # Nacked chunked messages kept in memory (pulsar_nack.chunks); a consumer that hands them out again
        # (receive, a listener's HeldDelivery, the asyncio receive) sets `holding`. Else, and past the
        # bound, they go to the broker as a nack of every chunk entry: last chunk's key → first chunk's entry.
        self.hold = ChunkHold(
            options.max_held_chunked_bytes,
            on_hold=on_hold,
            on_handout=self._arrivals.held_out,  # a kept copy's lateness counts in nack_stats()
        )
        self.held = self.hold.held  # the dict itself: `if held` costs no call on the per-message paths
        self.holding = keep_copies
        # The synchronous receive() calls waiting in the native receive now (a token each: added before the
        # wait, removed after). A thread blocked there cannot see the hold, so a nack from another thread
        # keeps nothing in memory while one waits: it is filed, and the broker's redelivery wakes the wait
        # (:meth:`_held_unseen`). A dict of tokens, not a counter: `+=` from two threads may lose a step.
        self.waiting: dict[object, None] = {}
        self.delivery: HeldDelivery | None = None  # a message_listener's: stopped by close()
        self._chunk_firsts: dict[tuple[str, int, int], int] = {}
        # A dead member's snapshot being adopted (pulsar_nack.snapshot.takeover): arrivals wait for it.
        self.adopting: Adoption | None = None
        self.check_deaths: Callable[[], None] | None = None  # the takeover's, called before admitting
        # Java's PIP-342 consumer counters (nack_stats().received/received_bytes/acked): plain increments on
        # the message paths, no lock — an increment may be lost only when two threads receive or ack on
        # one consumer at the same instant (the GIL switches between the read and the write). Sizes only
        # while a NackMeter observes the consumer (count_sizes): the binding's length() costs ~0.5 µs a
        # message, ten times the count.
        self.received = 0
        self.received_bytes = 0
        self.acked = 0
        self.count_sizes = False
        # Fast mode (fast_receive): while nothing is nacked, in flight or held, and the consumer has one
        # topic, no ack timeout and no snapshots, arrivals are handed out without reading their ids (4 native
        # calls a message) — no copy can be withheld then. Each message handed out is numbered
        # (message._pulsar_nack_ids = its number) and remembered here, number → _pulsar.Message, until the
        # application acks it: when a nack ends fast mode (_take_over), the messages still unacked are
        # all this consumer must know about (the filter infers every other message of their entries to be
        # acked or not received yet: ArrivalFilter.infer).
        self.fast = False
        self._fast_held: dict[int, Any] = {}
        self._number = itertools.count().__next__
        self._fast_recent: list[Any] = [None] * _FAST_RECENT  # number % _FAST_RECENT → _pulsar.Message
        self._fast_check = 0  # admissions until the next check (_check_fast)
        self._taking_over = threading.Lock()
        self.fast_takeovers = 0  # times fast mode ended (a metric: the cost of a take-over is its reads)
        if self.keeper is not None:
            self.keeper.restore()
            # dead members' nacks; the takeover sets check_deaths while it watches a member (else None)
            start_takeover(
                self.keeper, snapshots, self._hold_arrivals, lambda c: setattr(self, "check_deaths", c)
            )

    def nack(self, message: Any, delay_ms: float | datetime.timedelta | None = None) -> None:
        """File ``message`` (a message or id) for redelivery after its delay (:meth:`NackOptions.delay_for`).

        Raises ``TypeError`` for anything but a message or id, ``ValueError``/``TypeError`` for a bad
        ``delay_ms``, :class:`~pulsar_nack.DelayLimitExceeded` above the limit; nothing is filed then. Once
        the consumer is closed a nack does nothing, as the official consumer's does (the broker redelivers
        every unacked message of a closed consumer).
        """
        # The ids the admission remembered on the message (no call into the client), else read them.
        ids = getattr(message, _ADMITTED_IDS, None) if type(message) is _MESSAGE else None
        by = getattr(message, _ADMITTED_BY, None) if type(message) is _MESSAGE else self
        if by is not self and (by is not None or self.marks_all):
            # Another consumer's message (another subscription's, wrapped or not): as the official consumer
            # does, ask this one's broker session to redeliver that id (after the native delay). Filing it
            # would hold back this consumer's own first copy of the message until due.
            if not self.tracker.closed:
                self._native.negative_acknowledge(message._message)
            return
        if self.fast:
            self._take_over()  # a nack ends fast mode: what the application holds is followed from now on
        if ids is None or ids is _UNTRACKED or type(ids) is int:
            ids = self._ids(message)
        if ids is None:
            raise TypeError(
                "negative_acknowledge takes a pulsar.Message, pulsar.MessageId or _pulsar.MessageId, "
                f"got {type(message).__name__}"
            )
        ledger_id, entry_id, batch_index, topic = ids
        if delay_ms is None and self._default_delay is not None:
            delay = self._default_delay  # the common cases, without the general path
        elif (
            (type(delay_ms) is int or type(delay_ms) is float)
            and 0 <= delay_ms <= _FAST_DELAY_MS  # (NaN fails this too)
            and self._unlimited
        ):
            delay = delay_ms  # (an int adds to the float clock as well: no conversion)
        else:
            options = self.options
            counts = delay_ms is None and options.backoff is not None
            delay = options.delay_for(delay_ms, _redelivery_count(message) if counts else 0)
        if batch_index < 0 and self._nack_chunked(message, ids, delay):
            return
        if batch_index >= 0 and self._arrivals.has_parked and self._keep_spare(message, ids, delay):
            return
        tracker = self.tracker
        try:
            now = _monotonic() * 1000.0 if self._monotonic_ms else self._now()  # (monotonic_ms, inlined)
            tracker.schedule(now + delay, ledger_id, entry_id, batch_index, topic)
        except RuntimeError:
            if not tracker.closed:  # closed (before or during the call): nothing to do, as above
                raise
        if self.fast:  # fast mode began while this nack was filed (_check_fast): end it again
            self._take_over()

    def _nack_chunked(self, message: Any, ids: tuple[int, int, int, str], delay: float) -> bool:
        """If ``message`` is chunked: hold it (True: done), or else prepare its nack at the broker as a nack
        of every chunk entry (False: the caller schedules it). False for any other message. O(1): one native
        call (the payload's length) per non-batched nack, three for a large one (:func:`chunk_of`)."""
        chunk = chunk_of(message)
        if chunk is None:
            return False
        _, inner, first = chunk
        ledger_id, entry_id, _, topic = ids
        key = (topic, ledger_id, entry_id)
        holdable = inner is not None and isinstance(message, pulsar.Message) and not self.tracker.closed
        if self.holding and holdable and not self.waiting:
            due = self.tracker.now() + delay
            held = self.hold.hold(key, message, due, message.redelivery_count() + 1, inner.length())
            if held and not self._held_unseen(key):  # (else filed at the broker: a receive waits)
                return True
        self.hold.count("native")
        if first[0] != ledger_id:  # chunks across a ledger roll-over: the entries in between are unknown
            _log.warning(
                "chunked message %s spans ledgers %d..%d: only its last chunk can be nacked at the broker",
                key,
                first[0],
                ledger_id,
            )
            return False
        firsts = self._chunk_firsts
        if len(firsts) >= _MAX_CHUNK_FIRSTS and key not in firsts:
            firsts.pop(next(iter(firsts)), None)  # the oldest: long forwarded or acked
        firsts[key] = first[1]
        return False

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
        forward(self._native, due, self._chunk_firsts)
        if self.options.on_redelivery is not None:
            self.options.on_redelivery(due)

    def _hold_arrivals(self, adoption: Adoption | None) -> None:
        """The takeover's: a dead member's snapshot is being adopted (None: done)."""
        self.adopting = adoption

    def admit(self, message: pulsar.Message) -> bool:
        """Whether the application gets this arrival; copies it does not get are acked now (it acked the
        message) or parked to be acked with its own copy. Remembers the message's ids on it. While a dead
        member's snapshot is being adopted, waits for that first (bounded): the arrival may be a copy
        of one of its pending nacks.

        The per-message path of every consumer, so it makes as few native calls as it can: two for a
        non-batched message while nothing is pending or in flight, four for a batched one (five on a
        multi-topic or partitioned consumer).
        """
        if self.fast:
            # nothing can be withheld: hand it out, numbered and remembered until acked (no native call)
            number = self._number()
            message._pulsar_nack_by = self
            message._pulsar_nack_ids = number
            inner = message._message
            self._fast_held[number] = inner
            self._fast_recent[number % _FAST_RECENT] = inner
            if not self.fast or not number % _FAST_CHECK_EVERY:
                self._fast_admitted((number,))
            self.received += 1  # (Java: received.count/.size, what the application gets)
            if self.count_sizes:
                self.received_bytes += inner.length()
            return True
        check_deaths = self.check_deaths  # (None without snapshots)
        if check_deaths is not None:
            check_deaths()  # a peer that died: hold(adoption) now, before this copy of its message goes
        adopting = self.adopting  # the one read on this path while no takeover is in progress
        if adopting is not None:
            adopting.wait()
        self._fast_check -= 1
        if self._fast_check <= 0 and self._check_fast():
            return self.admit(message)  # (fast mode from this message on)
        message._pulsar_nack_by = self
        inner = message._message
        message_id = inner.message_id()
        batch_index = message_id.batch_index()
        arrivals = self._arrivals
        topic = self._fixed_topic
        if batch_index >= 0 and topic is not None:
            # a batch message of a single-topic consumer: the common batched case, in as few frames and
            # lookups as it takes (no chunked message is batched: the held ones are not its concern)
            ledger_id = message_id.ledger_id()
            entry_id = message_id.entry_id()
            message._pulsar_nack_ids = (ledger_id, entry_id, batch_index, topic)
            key = (topic, ledger_id, entry_id)
            verdict = arrivals.admit_message(key, batch_index, message_id)
            if verdict is _DELIVER or self._withheld(
                message, verdict, ledger_id, entry_id, batch_index, topic
            ):
                self.received += 1  # (Java: received.count/.size, what the application gets)
                if self.count_sizes:
                    self.received_bytes += inner.length()
                return True
            return False
        if batch_index < 0 and topic is not None and not self.held:
            # a non-batched message of a single-topic consumer, no chunked message held: the common case
            if arrivals.idle:
                message._pulsar_nack_ids = _UNTRACKED  # nothing can be a copy of it yet
                self.received += 1  # (Java: received.count/.size, what the application gets)
                if self.count_sizes:
                    self.received_bytes += inner.length()
                return True
            ledger_id = message_id.ledger_id()
            entry_id = message_id.entry_id()
            message._pulsar_nack_ids = (ledger_id, entry_id, -1, topic)
            verdict = arrivals.admit_entry(ledger_id, entry_id, topic)
            if verdict is _DELIVER:
                self.received += 1  # (Java: received.count/.size, what the application gets)
                if self.count_sizes:
                    self.received_bytes += inner.length()
                return True
            return self._withheld(message, verdict, ledger_id, entry_id, -1, topic)
        ledger_id = message_id.ledger_id()
        if topic is None:
            topic = self._learn_topic(ledger_id, inner.topic_name())
        entry_id = message_id.entry_id()
        # Remembered on the message, so nacking or acking it later needs no calls into the client.
        message._pulsar_nack_ids = (ledger_id, entry_id, batch_index, topic)
        if batch_index < 0 and self.held and (topic, ledger_id, entry_id) in self.held:
            # A broker copy of a chunked message held in memory (a reconnect): the held one comes at its
            # time; the application's ack of it acks every chunk, this copy included.
            self.hold.count("copies_dropped")
            return False
        if batch_index < 0 and arrivals.idle:
            self.received += 1  # (Java: received.count/.size, what the application gets)
            if self.count_sizes:
                self.received_bytes += inner.length()
            return True
        verdict = arrivals.admit(ledger_id, entry_id, batch_index, topic, message_id)
        if verdict is _DELIVER or self._withheld(message, verdict, ledger_id, entry_id, batch_index, topic):
            self.received += 1  # (Java: received.count/.size, what the application gets)
            if self.count_sizes:
                self.received_bytes += inner.length()
            return True
        return False

    def _withheld(
        self,
        message: pulsar.Message,
        verdict: Verdict,
        ledger_id: int,
        entry_id: int,
        batch_index: int,
        topic: str,
    ) -> bool:
        """The one rule for an arrival the filter did not deliver, for every admission path: True if the
        application gets it after all, else what becomes of the copy. O(1).

        * a batch message the filter could only infer about (fast mode's messages, whose ids were not read)
          is handed out when it is the first copy of it after all (:meth:`_first_copy`);
        * HOLD (its nack is pending): kept in memory to be handed out when due, if copies are kept
          (:meth:`_keep`, :meth:`_keep_sibling`), else dropped: the nack's forward fetches it again;
        * ACKED (the application acked it): acked now, so that the broker completes its entry;
        * DUPLICATE (the application holds another copy): a batch message's is parked and acked with the
          application's own copy (or now, when it cannot be parked); a non-batched one needs no ack of its
          own: the application's ack of its id covers it;
        * COVERED: nothing (its entry's ack covers it).
        """
        arrivals = self._arrivals
        inner = message._message
        if batch_index < 0:
            if verdict is _ACKED:
                self._native.acknowledge(inner)
            elif verdict is _HOLD and self.holding:
                self._keep(message, ledger_id, entry_id, topic)
            return False
        if (
            arrivals.inferred
            and (verdict is _ACKED or verdict is _COVERED)
            and self._first_copy(inner, (topic, ledger_id, entry_id), batch_index)
        ):
            return True
        if verdict is _HOLD:
            if self.holding:
                self._keep_sibling(message, ledger_id, entry_id, batch_index, topic)
        elif verdict is _ACKED or (
            verdict is _DUPLICATE and not arrivals.park(ledger_id, entry_id, batch_index, topic, inner)
        ):
            self._native.acknowledge(inner)
        return False

    def count_received(self, messages: Sequence[Any]) -> None:
        """Count messages handed to the application other than by :meth:`admit` (which counts its own):
        a ``batch_receive``'s, held messages handed out again. O(messages)."""
        self.received += len(messages)
        if self.count_sizes:
            self.received_bytes += sum(m._message.length() for m in messages)

    def admit_all(self, messages: Sequence[pulsar.Message]) -> list[pulsar.Message]:
        """:meth:`admit` for a ``batch_receive``'s messages: those the application gets, in order. The
        verdicts are those :meth:`admit` gives one message after the other; the batch messages are
        classified together (:meth:`ArrivalFilter.admit_batched
        <pulsar_nack.arrivals.ArrivalFilter.admit_batched>`: one lock round-trip, each entry looked up once
        per run of its messages). O(messages)."""
        if self.fast:
            # nothing can be withheld (as in admit): every message handed out, numbered and remembered
            held, number, recent = self._fast_held, self._number, self._fast_recent
            for message in messages:
                message._pulsar_nack_by = self
                message._pulsar_nack_ids = numbered = number()
                held[numbered] = recent[numbered % _FAST_RECENT] = message._message
            if not self.fast or len(held) > MAX_FAST_HELD:
                self._fast_admitted([m._pulsar_nack_ids for m in messages])
            self.count_received(messages)
            return list(messages)
        self._fast_check -= len(messages)
        if self._fast_check <= 0 and self._check_fast():
            return self.admit_all(messages)
        topic = self._fixed_topic
        if self.check_deaths is not None:
            self.check_deaths()  # (as admit does)
        if topic is None or self.held or self.adopting is not None:
            admit = self.admit  # the general path, message by message
            return [m for m in messages if admit(m)]
        arrivals = self._arrivals
        idle = arrivals.idle  # (a nack filed while this runs is filed after these arrivals)
        admitted: list[pulsar.Message | None] = []
        batched: list[tuple[int, int, int, str]] = []  # the ids of the batch messages (as remembered)
        positions: list[int] = []  # where the batch messages are in `admitted`
        for message in messages:
            message._pulsar_nack_by = self
            inner = message._message
            message_id = inner.message_id()
            batch_index = message_id.batch_index()
            if batch_index < 0 and idle:
                message._pulsar_nack_ids = _UNTRACKED  # nothing can be a copy of it yet
                admitted.append(message)
                continue
            ledger_id = message_id.ledger_id()
            entry_id = message_id.entry_id()
            ids = message._pulsar_nack_ids = (ledger_id, entry_id, batch_index, topic)
            if batch_index >= 0:
                positions.append(len(admitted))
                admitted.append(message)
                batched.append(ids)  # (one tuple for both: the filter reads the id of a new entry only)
                continue
            verdict = arrivals.admit_entry(ledger_id, entry_id, topic)
            if verdict is _DELIVER or self._withheld(message, verdict, ledger_id, entry_id, -1, topic):
                admitted.append(message)
        if not batched:
            self.count_received(admitted)
            return admitted  # (no None in it without batch messages)

        def token(index: int) -> Any:  # the id of the index-th batch message: its batch size is in it
            message = admitted[positions[index]]
            assert message is not None  # (none is withheld yet)
            return message._message.message_id()

        withheld = arrivals.admit_batched(batched, token)
        if not withheld:
            self.count_received(admitted)
            return admitted  # every batch message is handed out: the common case
        for index, verdict in withheld:
            ledger_id, entry_id, batch_index, _ = batched[index]
            position = positions[index]
            message = admitted[position]
            assert message is not None
            if not self._withheld(message, verdict, ledger_id, entry_id, batch_index, topic):
                admitted[position] = None
        handed = [m for m in admitted if m is not None]
        self.count_received(handed)
        return handed

    def _check_fast(self) -> bool:
        """Begin fast mode if nothing can make a copy withheld: one topic, no ack timeout, no snapshots,
        nothing held, and the filter :meth:`nack_free <pulsar_nack.arrivals.ArrivalFilter.nack_free>`
        (the messages of the entries it follows that were not handed out yet are marked acked:
        :meth:`unwatch_arrivals <pulsar_nack.arrivals.ArrivalFilter.unwatch_arrivals>`). Returns whether
        the consumer is in fast mode. O(followed entries), every :data:`_FAST_CHECK_EVERY` admissions."""
        self._fast_check = _FAST_CHECK_EVERY
        if (
            not self.options.fast_receive
            or self._fixed_topic is None
            or self._snapshots is not None
            or self.held
            or self.tracker.closed
            or self._arrivals.expects_ack_timeout
        ):
            return False
        with self._taking_over:
            if self.fast or not self._arrivals.unwatch_arrivals():
                return self.fast
            self.fast = True
        if not self._arrivals.nack_free():  # a nack filed meanwhile (it saw fast mode off): end it again
            self._take_over()
        return self.fast

    def _take_over(self) -> None:
        """End fast mode (a nack, a cumulative ack, too many unacked messages): read the ids of the
        messages the application holds and of the last ones handed out, and tell the filter that it holds
        them (:meth:`ArrivalFilter.infer <pulsar_nack.arrivals.ArrivalFilter.infer>`: the messages of the
        last ones' entries above them are still queued; every other message of their entries was acked or
        has not come yet). O(messages held), native calls for each."""
        with self._taking_over:
            if not self.fast:
                return
            self.fast = False  # (first: an admission or ack that reads it after this sees it off)
            self.fast_takeovers += 1
            held = self._fast_held
            taken = list(held.items())
            for number, _ in taken:
                del held[number]
            recent = [inner for inner in self._fast_recent if inner is not None]
            self._fast_recent = [None] * _FAST_RECENT
            self._follow([inner for _, inner in taken], recent)

    def _fast_admitted(self, numbers: Sequence[int]) -> None:
        """After messages were admitted in fast mode: if it ended meanwhile (the take-over may not have
        seen them), follow them; else end it if too many messages are unacked (:data:`MAX_FAST_HELD`)."""
        if self.fast:
            if len(self._fast_held) > MAX_FAST_HELD:
                self._take_over()
            return
        with self._taking_over:
            held = self._fast_held
            inners = [held.pop(number) for number in numbers if number in held]
            self._follow(inners, inners)  # (numbered before the take-over, admitted after it)

    def _follow(self, inners: Sequence[Any], recent: Sequence[Any]) -> None:
        """Tell the filter the application holds these batch messages (taken over from fast mode; lock
        held), and which messages of the entries of the ``recent`` ones (the last handed out) are still in
        the receiver queue: those above the highest batch index handed out. The receiver queue is one FIFO
        and a batch enters it whole, in batch-index order, so no other entry has messages queued; a
        message wrongly taken as queued is handed out again if a copy comes (a duplicate), one wrongly
        taken as acked would be dropped after a reconnect (whose copies come with a redelivery count
        above 0, the receiver queue dropped: see docs/receive_cost.md). O(messages): their ids, and each
        entry's batch size once."""
        topic = self._fixed_topic
        assert topic is not None  # (fast mode needs one)
        held: dict[tuple[str, int, int], int] = {}
        sizes: dict[tuple[str, int, int], int] = {}
        top: dict[tuple[str, int, int], int] = {}  # entry → the highest batch index handed out lately
        for inner in inners:
            message_id = inner.message_id()
            batch_index = message_id.batch_index()
            if batch_index < 0:
                continue  # a non-batched message: nothing to infer (its copies come only if nacked)
            key = (topic, message_id.ledger_id(), message_id.entry_id())
            mask = held.get(key)
            if mask is None:
                mask, sizes[key] = 0, batch_size(message_id)
            held[key] = mask | 1 << batch_index
        for inner in recent:
            message_id = inner.message_id()
            batch_index = message_id.batch_index()
            if batch_index < 0:
                continue
            key = (topic, message_id.ledger_id(), message_id.entry_id())
            if key not in sizes:
                sizes[key] = batch_size(message_id)
            if batch_index > top.get(key, -1):
                top[key] = batch_index
        for key, size in sizes.items():
            if size <= 0:
                continue
            mask = held.get(key, 0)
            highest = top.get(key)
            queued = seen = 0
            if highest is not None:
                highest = max(highest, mask.bit_length() - 1)
                seen = (2 << highest) - 1  # (FIFO: every message below the highest was taken)
                queued = ((1 << size) - 1) & ~seen
            self._arrivals.infer(key, size, mask, queued, seen)

    def _first_copy(self, inner: Any, key: tuple[str, int, int], batch_index: int) -> bool:
        """A copy dropped as acked whose ack was inferred (:meth:`_follow`): the first delivery of the
        message if its redelivery count is 0 (it was in the receiver queue at the take-over) — then it is
        handed out. One native call, for such copies only."""
        return bool(inner.redelivery_count() == 0 and self._arrivals.first_copy(key, batch_index))

    def _keep(self, message: pulsar.Message, ledger_id: int, entry_id: int, topic: str) -> None:
        """A broker copy of a non-batched message whose nack is pending (a reconnect or an ack timeout
        re-sent it early): this copy is the message. Keep it in the hold and hand it out at the nack's due
        time (:mod:`pulsar_nack.chunks`: ``receive``, the listener's delivery thread or the asyncio
        consumer), instead of asking the broker for it again then — a broker may ignore that request
        (pulsar-lite on partitioned topics) and the message would never come back while this consumer
        lives. Past ``max_held_chunked_bytes`` the nack stays pending, as before. O(log held)."""
        due = self.tracker.index.due_of(ledger_id, entry_id, -1, topic)
        if due is None or not self._arrivals.take_pending(ledger_id, entry_id, topic):
            return  # (forwarded meanwhile: its copy comes)
        lateness_due = self._arrivals.take_due(ledger_id, entry_id, -1, topic, due)
        inner = message._message
        key = (topic, ledger_id, entry_id)
        count, size = inner.redelivery_count(), inner.length() + KEPT_COPY_BYTES  # what it pins
        if not self.hold.hold(key, message, due, count, size, copy=True, lateness_due=lateness_due):
            # over the bound: pending again
            self._arrivals.untake_due(due, lateness_due, entry_id)
            self.tracker.schedule(due, ledger_id, entry_id, -1, topic, refiled=True)

    def _keep_spare(self, message: Any, ids: tuple[int, int, int, str], delay: float) -> bool:
        """A nack of a batch message of which a later copy is parked (it came with a redelivery of its
        entry while the application held the message): keep that copy and hand it out when the nack is due
        (True), instead of filing the nack for a forward that makes the broker dispatch the whole entry
        again. False (the caller files the nack) for a bare id, a delay beyond
        :data:`HOLD_SIBLINGS_WITHIN_MS`, no room in the hold, or no parked copy. O(log held)."""
        if not self.holding or delay > HOLD_SIBLINGS_WITHIN_MS or not isinstance(message, pulsar.Message):
            return False
        hold = self.hold
        inner = message._message  # (the parked copy is the same message: its size, what it pins)
        size = inner.length() * batch_size(inner.message_id()) + KEPT_COPY_BYTES
        if hold.held_bytes + size > hold.max_bytes or self.tracker.closed:
            return False
        ledger_id, entry_id, batch_index, topic = ids
        if self.waiting:  # a receive() waits in the native receive: it would not see the copy
            return False
        arrivals = self._arrivals
        copy = arrivals.take_parked(ledger_id, entry_id, batch_index, topic)
        if copy is None:
            return False
        kept = _MESSAGE()
        kept._message = copy
        kept._schema = message._schema
        due = self.tracker.now() + delay
        key = (topic, ledger_id, entry_id, batch_index)
        # its exact due time is known: its lateness counts as it is
        if not hold.hold(key, kept, due, copy.redelivery_count(), size, copy=True, lateness_due=due):
            return False
        if not self._held_unseen(key):
            return True
        if not arrivals.put_back(ledger_id, entry_id, batch_index, topic, copy):
            self._native.acknowledge(copy)  # acked meanwhile: the copy goes with it (as admit's park)
        return False

    def _held_unseen(self, key: Key) -> bool:
        """After the nack path put ``key`` in the hold: whether a ``receive()`` waits in the native receive
        (it would not see the message until the broker sends another, maybe never); then the message leaves
        the hold again (True: the caller files the nack instead). False if none waits, or if the message
        was handed out or acked meanwhile.

        Publish then check, on both sides: the nack puts the message in the hold, then reads
        :attr:`waiting`; ``receive()`` adds its token to :attr:`waiting`, then reads the hold, then waits.
        Each step is one dict operation, which the GIL runs whole and in order, so whichever thread runs its
        second step later sees the other's first: either the receive sees the message (and hands it out
        when due) or the nack sees the receive (and files the nack, whose redelivery wakes it). O(1)."""
        return bool(self.waiting) and self.hold.discard(key)

    def _keep_sibling(
        self, message: pulsar.Message, ledger_id: int, entry_id: int, batch_index: int, topic: str
    ) -> None:
        """A copy of a batch message whose nack is pending came early: with a forward of its entry (a
        sibling's redelivery), or unasked (a restart's or reconnect's re-dispatch).
        If the hold has room — and, for a copy that came with a forward, the nack is due within
        :data:`HOLD_SIBLINGS_WITHIN_MS` — keep this copy and hand it out at the nack's due time (as
        :meth:`_keep` does), and its nack leaves the index: no forward of its own makes the broker dispatch
        the whole entry again. An unasked copy is kept whatever its due time, as a non-batched one is: a
        broker may ignore the forward that would fetch it again (pulsar-lite on partitioned topics), and the
        message would not come back while this consumer lives. Else, or with an ack timeout (the native
        client would redeliver a kept copy at its timeout), the nack stays pending. The copy's memory counts
        in ``nack_stats()``: what it pins (:data:`KEPT_COPY_BYTES`) in ``chunked_held_bytes``, bounded by
        ``max_held_chunked_bytes``. O(log held) plus the index's lookup and removal."""
        tracker = self.tracker
        arrivals = self._arrivals
        inner = message._message
        size = inner.length() * batch_size(inner.message_id()) + KEPT_COPY_BYTES  # what it pins
        hold = self.hold
        keeper = self.keeper
        if keeper is not None and not arrivals.forwarded_lately(ledger_id, entry_id, topic):
            # A restart's (or takeover's) re-dispatch: a copy of every restored message, kept whatever its
            # due time. One store call looks the due time up and takes the nack: due_of then remove walked
            # the entry's buckets twice (118 us a copy, 90 % of a 10,000-message re-dispatch at load 1.6).
            if hold.held_bytes + size > hold.max_bytes:
                return  # no room: its own forward fetches it
            taken = arrivals.take_pending_due(ledger_id, entry_id, batch_index, topic, keeper.store.take)
            if taken is None:
                return  # not pending (popped: its forward's copy decides), or an ack timeout is set
            due = float(taken)
        else:
            due_or_none = self._sibling_due(message, ledger_id, entry_id, batch_index, topic, size)
            if due_or_none is None:
                return
            due = due_or_none
        lateness_due = arrivals.take_due(ledger_id, entry_id, batch_index, topic, due)
        key = (topic, ledger_id, entry_id, batch_index)
        count = inner.redelivery_count()
        if not hold.hold(key, message, due, count, size, copy=True, lateness_due=lateness_due):
            # over the bound: pending again
            arrivals.untake_due(due, lateness_due, entry_id)
            tracker.schedule(due, ledger_id, entry_id, batch_index, topic, refiled=True)

    def _sibling_due(
        self, message: pulsar.Message, ledger_id: int, entry_id: int, batch_index: int, topic: str, size: int
    ) -> float | None:
        """:meth:`_keep_sibling` with the index's ``due_of`` and ``remove`` (no snapshots, or a copy that may
        answer a forward): when to hand the copy out, its nack taken; None to leave it (nothing changed)."""
        tracker = self.tracker
        bucket = tracker.index.due_of(ledger_id, entry_id, batch_index, topic)
        arrivals = self._arrivals
        later = bucket is not None and bucket - tracker.now() > HOLD_SIBLINGS_WITHIN_MS
        if later and arrivals.forwarded_lately(ledger_id, entry_id, topic):
            return None  # the broker answered a forward of the entry: it answers this message's own
        hold = self.hold
        if hold.held_bytes + size > hold.max_bytes:
            return None  # no room: its own forward fetches it
        if bucket is None:
            # Popped by a flush under way (without snapshots nothing else pending is outside the index):
            # its bucket is at most the flush's limit, so handing it out one native latency from now is
            # never early; else that flush's forward would fetch the whole entry again for it.
            if self.keeper is not None:
                return None
            if not arrivals.take_popped_message(ledger_id, entry_id, batch_index, topic):
                return None
            return tracker.now() + tracker.lead_ms
        if arrivals.take_pending_message(ledger_id, entry_id, batch_index, topic):
            return float(bucket)
        return None  # forwarded meanwhile (its copy decides), or an ack timeout is set

    def _learn_topic(self, ledger_id: int, topic: str) -> str:
        """Remember a ledger's topic (for nacks of bare ids); on a single-topic consumer, fix it."""
        if self._fixed_topic is None and topic == self._topic:
            self._fixed_topic = topic  # a single non-partitioned topic: no need to ask again
            self._fast_check = 0  # fast mode may begin with the next message
        ledger_topics = self._ledger_topics
        if ledger_id not in ledger_topics:
            if len(ledger_topics) >= _MAX_LEDGER_TOPICS:  # a cache: the oldest ledgers are done with
                ledger_topics.pop(next(iter(ledger_topics)), None)
            ledger_topics[ledger_id] = topic
        return topic

    def _ids(self, message: Any) -> tuple[int, int, int, str] | None:
        """(ledger, entry, batch index, topic) of a message or id the application passes; None if it is
        neither (the official client reports that)."""
        known = getattr(message, _ADMITTED_IDS, None) if type(message) is _MESSAGE else None
        if known is not None and known is not _UNTRACKED and type(known) is not int:
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
        if self.held:  # an ack of a message held for redelivery (chunked, or a kept copy): it is done
            held = self._ids(message)
            if held is not None:
                ledger_id, entry_id, batch_index, topic = held
                if batch_index < 0:
                    self.hold.discard((topic, ledger_id, entry_id))
                else:
                    self.hold.discard((topic, ledger_id, entry_id, batch_index))
        ids = getattr(message, _ADMITTED_IDS, None) if type(message) is _MESSAGE else None
        if type(ids) is int:  # handed out in fast mode
            self._fast_held.pop(ids, None)
            if self.fast:
                return  # (still: nothing to record)
            with self._taking_over:  # a take-over under way follows this message: record the ack after it
                ids = None
        if ids is _UNTRACKED:
            if arrivals.idle:
                return  # a non-batched message while nothing is tracked
            ids = None
        if ids is None:
            ids = self._ids(message)
            if ids is None:
                return
        ledger_id, entry_id, batch_index, topic = ids
        if batch_index < 0:  # no copies to ack along, no entry to complete: only a nack to drop
            if not arrivals.idle:
                arrivals.acked_entry(ledger_id, entry_id, topic)
            return
        if arrivals.acked_plain((topic, ledger_id, entry_id), batch_index):
            return  # the common batched case: nothing to ack along, no entry to complete
        self._acked_batched(ledger_id, entry_id, batch_index, topic)

    def _acked_batched(self, ledger_id: int, entry_id: int, batch_index: int, topic: str) -> None:
        """:meth:`note_ack` of a batch message that :meth:`ArrivalFilter.acked_plain
        <pulsar_nack.arrivals.ArrivalFilter.acked_plain>` did not settle: record it, ack the copies parked
        with it, and the whole entry if it was its last unacked message after a redelivery. O(1)."""
        arrivals = self._arrivals
        # (a pending nack of it is removed from the index by the filter, under its lock)
        copies, _, ack_entry = arrivals.acked(ledger_id, entry_id, batch_index, topic)
        for copy in copies:
            self._native.acknowledge(copy)
        if ack_entry:  # every message of a redelivered batch acked: ack the entry itself at the broker
            self._native.acknowledge(entry_message_id(topic, ledger_id, entry_id))

    def acknowledge(self, message: pulsar.Message) -> None:
        """:meth:`note_ack` then the native ack of a ``pulsar.Message`` the application acks, in one frame:
        the per-message ack path, for the ids the admission remembered on the message. A batch message of
        a followed entry with nothing to ack along (the common case) takes one lock round-trip and one
        native call; a non-batched one two lookups without the lock, as in :meth:`note_ack`. O(1)."""
        ids = getattr(message, _ADMITTED_IDS, None)
        if type(ids) is int:  # handed out in fast mode: forgotten (no native call), then acked
            self._fast_held.pop(ids, None)
            if self.fast:  # (read after the pop: a take-over that begins now did not see the message)
                self._native.acknowledge(message._message)
                return
        elif ids is not None and not self.held:
            arrivals = self._arrivals
            if ids is not _UNTRACKED:
                ledger_id, entry_id, batch_index, topic = ids
                if batch_index < 0:
                    arrivals.acked_entry(ledger_id, entry_id, topic)  # (returns at once if untracked)
                elif not arrivals.acked_plain((topic, ledger_id, entry_id), batch_index):
                    self._acked_batched(ledger_id, entry_id, batch_index, topic)
                self._native.acknowledge(message._message)
                return
            if arrivals.idle:  # a non-batched message admitted while nothing was tracked, and still none
                self._native.acknowledge(message._message)
                return
        self.note_ack(message)
        self._native.acknowledge(message._message)

    def note_cumulative_ack(self, message: Any) -> None:
        """After the native ``acknowledge_cumulative`` of ``message`` (a message or id) succeeded: every
        pending nack, forward and batch record of its topic up to it is settled, and held chunked
        messages up to it are dropped (:meth:`ArrivalFilter.acked_cumulative
        <pulsar_nack.arrivals.ArrivalFilter.acked_cumulative>`)."""
        if self.fast:
            self._take_over()  # (the filter settles what it follows up to the message)
        ids = self._ids(message)
        if ids is None:
            return  # (the official call has rejected it already)
        ledger_id, entry_id, batch_index, topic = ids
        if self.held:
            # held up to the acked message: (ledger, entry, batch index or -1) up to its own
            position = (ledger_id, entry_id, batch_index if batch_index >= 0 else 2**31)
            for key in list(self.held):
                if key[0] == topic and (key[1], key[2], key[3] if len(key) > 3 else -1) <= position:
                    self.hold.discard(key)
        self._arrivals.acked_cumulative(ledger_id, entry_id, batch_index, topic)

    def reset(self) -> None:
        """After a seek: pending nacks, held chunked messages and what the filter knows are void (the
        broker starts over)."""
        self.tracker.clear()
        self.hold.clear()
        self._fast_held.clear()
        self._fast_recent = [None] * _FAST_RECENT

    def deliver_held(self, deliver: Callable[[], object], name: str) -> None:
        """Hand held messages out as they fall due: the tracker's timer wakes a
        :class:`~pulsar_nack.chunks.HeldDelivery`, whose thread (``name``) calls ``deliver`` — for a
        ``message_listener``'s consumer, which no ``receive`` call serves. Stopped by :meth:`close`. O(1)."""
        self.delivery = HeldDelivery(self.hold, self.tracker.wheel, self.tracker.now, deliver, name)
        self.hold.on_hold = self.delivery.wake

    def forget_holdings(self) -> None:
        """Before ``redeliver_unacknowledged_messages``: the application's unacked copies come again, and
        so do held chunked messages (the broker still has them unacked: they come back whole). Copies kept
        for pending nacks are pending again: their new copies are held until due."""
        self._fast_held.clear()  # (the application's copies come again, numbered again)
        self._fast_recent = [None] * _FAST_RECENT  # (the last handed out come again: no longer the last)
        copies = self.hold.drain_copies()
        self.hold.clear()
        for key, due in copies:  # kept copies of pending nacks: pending again, held when they come again
            self.tracker.schedule(due, key[1], key[2], key[3] if len(key) > 3 else -1, key[0], refiled=True)
        self.tracker.arrivals.forget_holdings()

    def close(self, *, wait: bool = True) -> None:
        """Stop the tracker, dropping or flushing pending nacks (``on_close``). Idempotent.

        After a flush it waits (``wait``) until the native tracker has sent the flushed ids — one native
        latency, ~0.15 s — so that the native consumer may be closed next. Otherwise returns at once: a
        flush hook in progress on the timer thread is not waited for.
        """
        self.hold.clear()  # unacked at the broker: it redelivers them when the consumer goes
        self.fast = False
        self._fast_held.clear()
        self._fast_recent = [None] * _FAST_RECENT
        if self.delivery is not None:
            self.delivery.stop()
        if self.tracker.closed:
            return
        flushing = self.options.on_close == "flush"
        self.tracker.close(flush=flushing)
        if self._snapshots is not None:
            self._snapshots.unlock()
        if flushing and wait:  # the native tracker sends forwarded ids after its own delay: that, not longer
            time.sleep(self.options.native.latency_ms / 1000.0 + 0.05)

    @property
    def redispatching(self) -> bool:
        """True while the broker re-dispatches a dead consumer's messages that restored nacks wait for (after
        a restart or a takeover: :class:`~pulsar_nack.snapshot.redispatch.RedispatchStore`). O(1)."""
        store = self.tracker.index
        return isinstance(store, RedispatchStore) and store.waiting

    def discard_snapshots(self) -> None:
        """Delete the subscription's snapshot on storage, and every pending nack with it (an unsubscribe).
        Nothing without snapshots. O(segments)."""
        if self.keeper is not None:
            self.keeper.discard()

    def stats(self, *, with_memory: bool = False) -> NackStats:
        """The tracker's stats with the held messages' ``chunked_*`` counters (one
        :class:`~pulsar_nack.stats.NackStats`)."""
        stats = self.hold.stats(self.tracker.stats(with_memory=with_memory), with_memory=with_memory)
        return replace(
            stats,
            received=self.received,
            received_bytes=self.received_bytes,
            acked=self.acked,
            snapshots=self.keeper.stats() if self.keeper is not None else None,
        )


def _redelivery_count(message: Any) -> int:
    """The redelivery count of a message (0 for a bare id: the backoff starts over)."""
    if isinstance(message, pulsar.Message):  # a HeldMessage counts the nacks held in memory
        return int(message.redelivery_count())
    target = message_id_of(message)
    return target[1].redelivery_count() if target is not None and target[1] is not None else 0
