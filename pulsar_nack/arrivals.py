"""The arrival filter: which copies of a message the application is handed.

The broker may deliver a message several times: the copy the application got first, the copy a
forwarded nack asked for, the whole batch again when one of its messages is redelivered, and copies
after a reconnect or an ack timeout. :class:`ArrivalFilter` decides for each arrival, from state that
does not depend on arrival order or on which thread received the message:

* a message **in flight** (its nack was forwarded) is handed out once, by the first copy that arrives
  no earlier than its bucket time *and* at least :data:`~pulsar_nack.native.NATIVE_MIN_DELAY_MS` after
  the forward (the native client never asks the broker sooner, so an earlier copy was requested for
  something else);
  a copy of our own forward that still comes early schedules the message again;
* a message whose nack is **pending** is held back: it comes back when due;
* a batch message the application **acked** is not handed out; the copy is acked — unless its batch was
  forwarded and has messages still unacked: the whole entry is acked once its last message is, which
  covers the copy;
* a batch message the application **holds** (another copy was handed out) is parked and acked when the
  application acks its own copy: without batch-index acks the broker acks an entry only when every
  message of one delivered copy is acked, so every copy we do not hand out must be completed for it —
  unless the consumer has an ack timeout (:meth:`ArrivalFilter.expect_ack_timeout`) and the application
  has held it that long: then the copy is the timeout's redelivery, and handed out, as the official
  consumer hands out every message the application has not acked at each timeout;
* anything else is a first delivery.

Batched entries are followed while the application has any unacked message of them, plus
``linger_ms`` after their last forward (copies may still be on their way). A batch's size is read from
the message id (:func:`pulsar_nack.native.client.batch_size`), never inferred from arrival order.

All methods are O(1) in the number of pending nacks and buckets (dict and Roaring-bitmap lookups) and
thread-safe (one lock; no calls into the native client while it is held). The per-message paths are
cut to the bone, since every message the broker delivers takes them: a non-batched message that is not
pending, in flight or recently redelivered is told apart without the lock (:meth:`ArrivalFilter.admit_entry`,
:meth:`ArrivalFilter.acked_entry`), a batch message received alone is classified in one frame and one
lock round-trip (:meth:`ArrivalFilter.admit_message`), and a ``batch_receive``'s batch messages are
classified together (:meth:`ArrivalFilter.admit_batched`).
"""

from __future__ import annotations

import enum
import itertools
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from pyroaring import AbstractBitMap64, BitMap, BitMap64

from pulsar_nack.entry_sets import EntrySets
from pulsar_nack.index import DueIds, NackIndex, batch_mask
from pulsar_nack.index import batch_indexes as batch_index_bits
from pulsar_nack.lateness import DueSample, LatenessHistogram, offered
from pulsar_nack.ledgers import LedgerRegistry
from pulsar_nack.memory import python_bytes
from pulsar_nack.native import NATIVE_MIN_DELAY_MS

__all__ = [
    "ACK_TIMEOUT_SLACK_MS",
    "COALESCE_WITHIN_MS",
    "ArrivalFilter",
    "FilterCounts",
    "Verdict",
]

#: How much sooner than the ack timeout a copy of a held message may come and still be taken for the
#: timeout's. The native tracker starts a message's timeout when the client's receive returns it, a moment
#: before the filter sees it; a copy of another cause (a sibling's nack, a reconnect) taken for the
#: timeout's this much early is handed out as the official consumer would hand it out anyway.
ACK_TIMEOUT_SLACK_MS = 1_000
#: A batch message that falls due while a forward of its entry made less than this many ms ago has not
#: brought its copy yet waits for that copy (:attr:`ArrivalFilter.coalesce`) instead of a forward of its
#: own: each forward makes the broker dispatch the whole entry again. The copy arrives ~100–300
#: ms after a forward (up to ~1 s seen on a loaded machine); should it never come, the message is
#: forwarded at most this much later.
COALESCE_WITHIN_MS = 2_000

Key = tuple[str, int, int]  # (topic, ledger id, entry id)
EntryIds = Sequence[int] | npt.NDArray[np.uint32]
#: The entry ids a forward record keeps of one ledger: one int (the sparse case, the very int object of
#: the entry's key), uint32 ids as bytes (one object, 33 B + 4 B an id, where a numpy array cost ~160 B),
#: or the ids as given.
KeptIds = int | bytes | EntryIds


class Verdict(enum.Enum):
    """What to do with a message that just arrived from the broker."""

    DELIVER = "deliver"  # hand it to the application
    HOLD = "hold"  # its nack is pending (or this copy is early): it comes back when due
    ACKED = "acked"  # the application acked this message: ack this copy too, don't hand it out
    # the application acked this message and its whole entry is acked at the broker when the last message
    # of a forwarded batch is (see :meth:`ArrivalFilter.acked`): don't hand it out, no ack of its own
    COVERED = "covered"
    DUPLICATE = "duplicate"  # the application holds another copy: ack this one when it acks that


# an enum member lookup costs 65 ns on the per-message path
_DELIVER, _HOLD, _ACKED, _COVERED = Verdict.DELIVER, Verdict.HOLD, Verdict.ACKED, Verdict.COVERED
_DUPLICATE = Verdict.DUPLICATE
_NONE: tuple[Any, ...] = ()  # no copies to ack (shared: the ack path allocates nothing)
_NEVER = float("inf")
_NEVER_FORWARDED = -float("inf")
#: The acked masks of an entry with one message unacked (batches of up to 128), as shared ints: a forwarded
#: quiet entry's record holds one (a new int of its own cost 32 B, ~0.3 B per pending nack at 1,000 topics)
_ALL_BUT_ONE = {~(1 << index): ~(1 << index) for index in range(128)}
# The filter's sets of entries (one EntrySets, see __init__)
_PENDING, _QUIET, _WATCH = 0, 1, 2
# _Recent's: two generations (the current one at offset _Recent.current) of each of three sets
_RECENT = 3
_SENT, _UNACKED, _SETTLED = _RECENT, _RECENT + 2, _RECENT + 4  # (sent: delivered; unacked: not acked yet)
_SETS = _RECENT + 6
# An emptied dict keeps its hash table (590 KB for `_flights` after one forward at 1,000 topics): a table
# emptied above this size is released at once, not at the next sweep (smaller ones are kept: no churn)
_KEPT_TABLE_BYTES = 4_096


def _release(emptied: dict[Any, Any]) -> None:
    """Free an emptied dict's hash table if it is larger than :data:`_KEPT_TABLE_BYTES` (the callers
    check ``not table`` first: no call while it holds anything). O(1)."""
    if sys.getsizeof(emptied) > _KEPT_TABLE_BYTES:
        emptied.clear()


class _Flight:
    """One forwarded message (or non-batched entry) until a copy of it has been handed out. Five slots:
    its batch index costs no more than the ``acked`` flag it shares a slot with (``state``)."""

    __slots__ = ("at", "due", "index", "state", "target")

    def __init__(self, at: float, target: int, previous: _Flight | None, index: int = -1) -> None:
        self.index = index  # its batch index (-1: a non-batched message)
        self.at = at  # when it was forwarded (clock ms); _NEVER while a new forward is awaited
        self.target = target  # no earlier than its bucket time: never hand it out earlier
        # forwards repeated so far: counted on from a flight this one replaces after it came to nothing
        again = previous is not None and previous.at == _NEVER
        # reforwards << 1 | acked (acked by the application while in flight: a late copy is acked, not
        # handed out)
        self.state = (previous.reforwards + 1) << 1 if again else 0  # type: ignore[union-attr]
        # the due time the application asked for, if sampled (DueSample); a repeat keeps the first's
        self.due: float | None = previous.due if again else None  # type: ignore[union-attr]

    @property
    def reforwards(self) -> int:
        """Forwards repeated so far. O(1)."""
        return self.state >> 1

    @property
    def acked(self) -> bool:
        """Acked by the application while in flight. O(1)."""
        return bool(self.state & 1)

    @acked.setter
    def acked(self, value: bool) -> None:
        self.state = self.state | 1 if value else self.state & ~1


class _Entry:
    """A batched entry: what the application holds, acked, and has pending or in flight."""

    __slots__ = ("acked", "flights", "last_forward", "out", "parked", "pending", "since", "size")

    def __init__(self, size: int | None, since: float = 0.0) -> None:
        self.size = size  # messages in the batch; None until a message of it has been seen
        # With an ack timeout: when the messages in `out` were handed out (clock ms; the first of them —
        # the native tracker times an entry from its first receive, and redelivers it whole)
        self.since = since
        self.out = 0  # bitmask: batch indexes handed to the application (-1: all)
        self.acked = 0  # bitmask: acked by the application (negative: all but the clear bits)
        self.pending = 0  # bitmask: nack pending in the index
        # its forwards: None (never forwarded), the one flight, or batch index → flight (a dict of one
        # flight cost ~210 B, a fifth of what a forwarded sparse batch entry kept)
        self.flights: _Flight | dict[int, _Flight] | None = None
        self.parked: dict[int, list[Any]] | None = None  # batch index → copies to ack with the app's
        self.last_forward = _NEVER_FORWARDED

    @property
    def all_acked(self) -> bool:
        """Every message of the batch acked by the application."""
        if self.size is None and self.acked >= 0:
            return False
        full = -1 if self.size is None else (1 << self.size) - 1  # -1: an expanded quiet entry
        return self.acked & full == full

    @property
    def settled(self) -> bool:
        """Every message acked, nothing pending or in flight."""
        return not self.pending and not self.flights and self.all_acked

    @property
    def quiet(self) -> bool:
        """Every message acked or pending in the index, none in flight or parked: the entry can be kept
        as one bit (see :attr:`ArrivalFilter._quiet`)."""
        if not self.pending or self.flights or self.parked or (self.size is None and self.acked >= 0):
            return False
        full = -1 if self.size is None else (1 << self.size) - 1  # -1: an expanded quiet entry
        return (self.acked | self.pending) & full == full


def _flight_of(entry: _Entry, index: int) -> _Flight | None:
    """The flight of batch message ``index`` of ``entry``, if any. O(1)."""
    flights = entry.flights
    if flights is None:
        return None
    if type(flights) is _Flight:
        return flights if flights.index == index else None
    return flights.get(index)  # type: ignore[union-attr]


def _flight_list(entry: _Entry) -> list[_Flight]:
    """Every flight of ``entry`` (a new list). O(flights)."""
    flights = entry.flights
    if not flights:
        return []
    return [flights] if type(flights) is _Flight else list(flights.values())  # type: ignore[union-attr]


def _put_flight(entry: _Entry, flight: _Flight) -> None:
    """File ``flight`` (of batch index ``flight.index``) in ``entry``, replacing one of the same index.
    A dict only from the second flight on. O(1)."""
    flights = entry.flights
    if not flights or (type(flights) is _Flight and flights.index == flight.index):
        entry.flights = flight
    elif type(flights) is _Flight:
        entry.flights = {flights.index: flights, flight.index: flight}
    else:
        flights[flight.index] = flight  # type: ignore[index]


def _drop_flight(entry: _Entry, index: int) -> None:
    """Forget the flight of batch index ``index`` (there is one). ``flights`` stays not None: the entry
    was forwarded (see :meth:`ArrivalFilter.forwarded_lately`). O(1)."""
    flights = entry.flights
    if type(flights) is _Flight:
        entry.flights = {}
    else:
        del flights[index]  # type: ignore[union-attr]


class _Recent:
    """Non-batched messages handed out for a forward in the last ``linger_ms`` (and which of them the
    application acked since): a later copy of one — the broker re-dispatching after a reconnect, or a
    second redelivery request — is not handed out again. Two generations, each lasting half of
    ``linger_ms``, of three sets — delivered, those of them not acked yet, and batched entries whose
    messages were all acked after a recent forward (``settled``: a late copy of one is acked, not handed
    out) — kept in the
    filter's :class:`~pulsar_nack.entry_sets.EntrySets` (sets :data:`_RECENT` on): a few bytes a message,
    no object per ledger (a bitmap per ledger and set cost ~300 B a ledger: 608 KB at 1,000 topics after
    one forward). Kept as *not acked yet*, not as acked: an application acks what it is handed, so
    "acked" held nearly every delivered message twice (46 KB of 862 KB at 100 topics, 1 % nacked, 10 s:
    the profile's), where "not acked yet" holds those the application is working on. O(1) per lookup;
    the caller's lock held throughout."""

    __slots__ = ("current", "sets", "started", "times")

    def __init__(self, sets: EntrySets, now: float) -> None:
        self.sets = sets
        self.started = now
        self.current = 0  # the current generation's offset; the previous one's is 1 - current
        # with an ack timeout: when each delivered one was handed out (clock ms), by generation
        self.times: list[dict[Key, float]] = [{}, {}]

    def __bool__(self) -> bool:
        bitmaps = self.sets.layout.bitmaps
        return any(bitmaps[which] for which in range(_RECENT, _SETS))

    def _holds(self, kind: int, ledger: tuple[str, int], entry_id: int) -> bool:
        sets = self.sets
        return sets.contains(kind, ledger, entry_id) or sets.contains(kind + 1, ledger, entry_id)

    def settle(self, ledger: tuple[str, int], entry_id: int) -> None:
        self.sets.add(_SETTLED + self.current, ledger, entry_id)

    def is_settled(self, ledger: tuple[str, int], entry_id: int) -> bool:
        return self._holds(_SETTLED, ledger, entry_id)

    def deliver(self, ledger: tuple[str, int], entry_id: int, now: float | None = None) -> None:
        """Handed out (``now``: when, kept with an ack timeout)."""
        self.sets.add(_SENT + self.current, ledger, entry_id)
        self.sets.add(_UNACKED + self.current, ledger, entry_id)
        if now is not None:
            self.times[0][(ledger[0], ledger[1], entry_id)] = now

    def delivered(self) -> AbstractBitMap64:
        """The codes of every delivered message (both generations; a new bitmap). O(values)."""
        bitmaps = self.sets.layout.bitmaps
        return bitmaps[_SENT] | bitmaps[_SENT + 1]

    def handed_at(self, key: Key) -> float | None:
        """When a delivered one was last handed out, if kept. O(1)."""
        for times in self.times:
            at = times.get(key)
            if at is not None:
                return at
        return None

    def ack(self, ledger: tuple[str, int], entry_id: int) -> None:
        sets = self.sets
        bitmaps = sets.layout.bitmaps
        for unacked in (_UNACKED, _UNACKED + 1):
            if bitmaps[unacked]:  # (most acks find both empty: no code made)
                sets.discard(unacked, ledger, entry_id)

    def verdict(self, ledger: tuple[str, int], entry_id: int) -> Verdict | None:
        """ACKED or DUPLICATE for a copy of a recently handed-out message, else None: ACKED if a
        generation that delivered it has seen its ack."""
        sets = self.sets
        sent = False
        for generation in (0, 1):
            if sets.contains(_SENT + generation, ledger, entry_id):
                if not sets.contains(_UNACKED + generation, ledger, entry_id):
                    return _ACKED
                sent = True
        return _DUPLICATE if sent else None

    def rotate(self, now: float, half_linger_ms: float) -> AbstractBitMap64 | None:
        """Start a new generation once the current one is ``half_linger_ms`` old; returns the codes of
        the delivered generation dropped then (None if not rotated). O(values dropped)."""
        if now - self.started < half_linger_ms:
            return None
        previous = 1 - self.current
        bitmaps = self.sets.layout.bitmaps
        dropped = bitmaps[_SENT + previous].copy()
        for kind in (_SENT, _UNACKED, _SETTLED):
            self.sets.empty(kind + previous)  # (in place: the layout's bitmaps are never swapped alone)
        self.current = previous
        self.times = [{}, self.times[0]]
        self.started = now
        return dropped

    def forget_unacked(self) -> BitMap64:
        """The application's copies are void: only acked ones stay known. Returns the codes of the
        delivered messages forgotten. O(values)."""
        sets = self.sets
        bitmaps = sets.layout.bitmaps
        forgotten = BitMap64()
        for generation in (0, 1):
            unacked = bitmaps[_UNACKED + generation]
            if unacked:
                forgotten |= unacked
                sets.writable(_SENT + generation).difference_update(unacked)  # (in place, as in rotate)
                sets.empty(_UNACKED + generation)
        return forgotten

    def reset(self, now: float) -> None:
        """Forget everything (the sets are the caller's to clear)."""
        self.started = now
        self.current = 0
        self.times = [{}, {}]


def _dropped_copy(entry: _Entry, acked: int) -> Verdict:
    """The verdict on a copy of an acked message of a batched entry of known size (``acked``: its acked
    bits). COVERED — no ack of its own — while the batch was forwarded and has messages unacked: the
    entry is acked as a whole once its last message is. Else ACKED: never forwarded, or that entry ack
    has gone and a copy means the broker may not have it. One frame, no properties: the per-copy path of
    a redelivered batch, whose acked siblings come again with the message it was redelivered for (90 of
    every 100 copies in a batch of 100 with one nack). O(1)."""
    if entry.last_forward == _NEVER_FORWARDED:
        return _ACKED
    full = (1 << entry.size) - 1  # type: ignore[operator]  # (known: the callers checked)
    return _ACKED if acked & full == full else _COVERED


def _no_index(*ids: Any) -> int:
    raise TypeError("this ArrivalFilter files no nacks: it was made without an index")


@dataclass(frozen=True)
class FilterCounts:
    """Counters of an :class:`ArrivalFilter` (since it was made)."""

    redelivered: int  # copies handed out for a forwarded nack
    held_back: int  # copies not handed out because their nack is pending or they came early
    dropped: int  # copies not handed out because the application acked or holds the message
    reforwarded: int  # forwards repeated because their copy came early or not at all
    abandoned: int  # forwards given up after ``max_reforwards`` (logged; the broker still has them)
    open_entries: int  # batched entries followed
    in_flight: int  # forwarded messages not handed out yet
    kept: int = 0  # nacks served by a parked copy kept in memory (ArrivalFilter.take_parked), not filed


class ArrivalFilter:
    """Classifies arrivals (:meth:`admit`) from nacks, forwards and acks. See the module docstring.

    ``reschedule(due_ms, ledger_id, entry_id, batch_index, topic)`` files a message for a new forward
    (the tracker's schedule); it is called without the filter's lock held. ``batch_size(token)`` tells the
    size of a batch from the ``token`` passed to :meth:`admit` (the message id).

    ``index``: the tracker's nack index, which this filter writes into: :meth:`file` adds a nack and
    :meth:`acked` removes one under the filter's lock, so that no ack, nack or arrival of the message sees
    the filter and the index disagree — **lock order: this filter's lock, then the index's** (the index
    never calls the filter). Its ``pending_mask`` tells which batch indexes of an entry are pending, so a
    batched entry whose messages are all acked or pending is kept as one bit (``_quiet``) instead of a
    record — the state of PIP-393's use case, one nack in a batch whose other messages are acked. Without
    an index (tests of the classification alone) the filter files nothing and keeps every entry as a
    record. ``ledgers``: the tracker's numbering of ledgers, shared with its index (the filter's own if
    None).

    ``reschedule`` stays a callable, not the tracker: the filter is below the tracker and must not import
    it; the tracker passes its refile method.
    """

    # (slots: 32 attributes are over the 30 CPython 3.11 keeps inline; the dict cost 1.3 KB a consumer)
    __slots__ = (
        "_abandoned",
        "_add",
        "_batch_size",
        "_clock",
        "_dropped",
        "_entries",
        "_flights",
        "_forwards",
        "_held_back",
        "_held_ms",
        "_index_len",
        "_kept",
        "_ledgers",
        "_lock",
        "_pending_mask",
        "_popped",
        "_recent",
        "_redelivered",
        "_reforwarded",
        "_remove",
        "_reschedule",
        "_sets",
        "_taken",
        "_target",
        "_waiting",
        "coalesce",
        "dues",
        "has_parked",
        "inferred",
        "lateness",
        "linger_ms",
        "max_reforwards",
    )

    def __init__(
        self,
        reschedule: Callable[[float, int, int, int, str], object],
        *,
        clock: Callable[[], float],
        batch_size: Callable[[Any], int] = int,
        index: NackIndex | None = None,
        linger_ms: float = 30_000.0,
        max_reforwards: int = 3,
        lateness_window: int = 4096,
        ledgers: LedgerRegistry | None = None,
    ) -> None:
        self._reschedule = reschedule
        self._clock = clock
        self._batch_size = batch_size
        # The index's calls, bound once: the nack and ack paths call them without an attribute lookup.
        self._pending_mask = index.pending_mask if index is not None else None
        self._add: Callable[..., int] = index.add if index is not None else _no_index
        self._remove = index.remove if index is not None else None
        self._index_len = index.__len__ if index is not None else None
        self.linger_ms = float(linger_ms)
        self.max_reforwards = max_reforwards
        self._lock = threading.Lock()
        self._entries: dict[Key, _Entry] = {}  # batched entries
        self._flights: dict[Key, _Flight] = {}  # non-batched messages in flight
        # Three sets of entries in shared 64-bit bitmaps (no bitmap per ledger: a few bytes a value at
        # 1,000 sparse ledgers, where a bitmap per ledger cost ~15): _PENDING, non-batched entries whose
        # nack is pending (and whole-entry nacks of batched ones); _QUIET, batched entries whose every
        # message is acked or pending in the index (no record); _WATCH, non-batched entries in flight
        # or recently handed out for a forward (in `_flights` or `_recent`) — an arrival or an ack of an
        # entry in neither _PENDING nor _WATCH is a plain one, decided with one dict and two bitmap
        # lookups (the per-message path while anything else is tracked).
        self._ledgers = ledgers if ledgers is not None else LedgerRegistry()
        self._sets = EntrySets(_SETS, self._ledgers)
        self._recent = _Recent(self._sets, clock())  # non-batched messages recently handed out for a forward
        # what each flush forwarded, in order: one list per forward time, [at, then topic, ledger id and
        # KeptIds for each ledger] — 3 pointers a ledger (a tuple a ledger cost ~80 B more: ~1 B per pending
        # nack at 1,000 sparse topics, where each flush forwards one entry of each). A list, expired from
        # its head in one slice a sweep: an empty deque keeps a 512-byte block, part of the fixed memory
        self._forwards: list[list[Any]] = []
        # lateness (arrival − the due time asked for) of a bounded sample of redeliveries
        self.lateness = LatenessHistogram(lateness_window)
        self.dues = DueSample()
        self._redelivered = self._held_back = self._dropped = self._reforwarded = self._abandoned = 0
        self._kept = 0
        #: Whether any copy was ever parked (:meth:`park`; until :meth:`clear`): the nack path asks
        #: :meth:`take_parked` only then (one attribute read per batched nack otherwise).
        self.has_parked = False
        #: Whether the consumer keeps copies of pending batch messages that come with a forward of their
        #: entry (its hold): then :meth:`forwarded` lets a message due while its entry's forward
        #: is under way wait for that forward's copy (see :data:`COALESCE_WITHIN_MS`).
        self.coalesce = False
        # Batch messages the consumer kept while a flush had popped them and not yet called forwarded()
        # (:meth:`take_popped_message`): that forwarded() leaves them out. Empty but in that race.
        self._taken: dict[Key, int] = {}
        # What a flush has popped from the index (:meth:`pop`) and not yet told :meth:`forwarded`, per
        # (topic, ledger), one DueIds a due bucket, in bucket order: still pending as far as a quiet
        # entry's rebuilt record and a copy of a quiet entry are concerned (:meth:`_popped_mask`). Empty
        # but during a flush.
        self._popped: dict[tuple[str, int], list[DueIds]] = {}
        # Batch messages :meth:`forwarded` made wait for a copy of their entry on its way
        # (:meth:`_wait_for_copy`), and still pending: the time (bucket) each was filed for when it first
        # waited. Each later flush files it again there, not at that flush's limit: its kept copy is handed
        # out at that bucket, and its lateness measured from it (filed at each limit, rounded up, it went
        # one bucket later per flush). Emptied as each leaves pending (forwarded, taken, acked). Empty but
        # then.
        self._waiting: dict[tuple[Key, int], int] = {}
        # A copy of a message the application has held this long (ms) is an ack timeout's: handed out.
        # None: the consumer has no ack timeout, and every such copy is a duplicate.
        self._held_ms: float | None = None
        self._target = 0  # the last forward's bucket time (forwarded(): its flights share the int)
        #: Entries taken over from a consumer that admitted messages without reading their ids
        #: (:meth:`infer`) → the batch indexes marked acked without having seen the ack: each one was acked
        #: by the application or has not reached it yet. Empty but after such a take-over.
        self.inferred: dict[Key, int] = {}

    def expect_ack_timeout(self, timeout_ms: float | None) -> None:
        """The consumer's ``unacked_messages_timeout_ms`` (None or 0: none). With one, the native client
        asks the broker at each timeout to redeliver every message the application holds (has not acked):
        a copy of such a message that comes a timeout (less :data:`ACK_TIMEOUT_SLACK_MS`) after it was
        handed out is handed out again, as the official consumer does; any other copy of it stays a
        duplicate. Call it before anything arrives. Raises ``ValueError`` for a negative or NaN
        ``timeout_ms`` (nothing changed)."""
        if timeout_ms is not None and not timeout_ms >= 0:
            raise ValueError(f"timeout_ms must be None or >= 0, got {timeout_ms!r}")
        self._held_ms = max(0.0, timeout_ms - ACK_TIMEOUT_SLACK_MS) if timeout_ms else None

    def _since(self) -> float:
        """A new entry's :attr:`_Entry.since`: now with an ack timeout, else 0 (no clock read)."""
        return self._clock() if self._held_ms is not None else 0.0

    @property
    def expects_ack_timeout(self) -> bool:
        """Whether :meth:`expect_ack_timeout` was given a timeout. O(1)."""
        return self._held_ms is not None

    @property
    def idle(self) -> bool:
        """Nothing pending, in flight or followed: every arrival of a non-batched message is new. O(1)."""
        bitmaps = self._sets.layout.bitmaps
        return not (self._entries or self._flights or any(bitmaps))

    # -- what the tracker tells it -------------------------------------------------------------------

    def pending(self, ledger_id: int, entry_id: int, batch_index: int, topic: str) -> bool | None:
        """A nack is recorded (without filing it in the index: :meth:`file` does both). Returns None for
        a batch message the application has already acked, else whether the index can skip its dedupe
        (``TimeBucketIndex.add(fresh=True)``): nothing it would merge with is pending. O(1)."""
        with self._lock:
            return self._record((topic, ledger_id, entry_id), ledger_id, entry_id, batch_index, topic)

    def file(
        self, due_ms: int, ledger_id: int, entry_id: int, batch_index: int, topic: str, nacked: bool = True
    ) -> int | None:
        """A nack: recorded (:meth:`pending`) and filed in the index (``add``, with its ``fresh``) under
        this filter's lock, so that an ack or an arrival of the message sees both or neither — an ack
        between the two left the index holding a nack of a message the application had acked, and its
        copy was handed out again. Returns the bucket time, or None (nothing filed) for a batch message
        the application acked; if ``add`` raises, the record is undone. ``nacked`` False: an id filed
        again (a forward repeated, a kept copy given back), not a nack — its due time is not the one the
        application asked for, so it adds nothing to the lateness estimate (:mod:`pulsar_nack.lateness`).
        O(1) plus the index's add.

        The nack path: one lock round-trip, one dict lookup and a few int operations besides the add
        (no lookup of whole pending entries when none are, no call to test whether the entry became
        quiet unless every message of it may be acked or pending)."""
        lock = self._lock
        lock.acquire()  # (not `with`: its __exit__ costs ~90 ns more, once per nack)
        try:
            key = (topic, ledger_id, entry_id)
            fresh = self._record(key, ledger_id, entry_id, batch_index, topic)
            if fresh is None:
                return None
            try:
                bucket = self._add(due_ms, ledger_id, entry_id, batch_index, topic, fresh)
            except BaseException:
                self._unrecord(ledger_id, entry_id, batch_index, topic)
                raise
            if not nacked:  # filed again (a forward repeated, a kept copy given back): no new due time
                return bucket
            self.lateness.offset(bucket, bucket - due_ms, entry_id)  # where its due time lies in its bucket
            dues = self.dues  # the exact due time, for the lateness of a sample of redeliveries
            every = dues.every
            if not every or offered(due_ms, every):  # (thinned only when the sample is full)
                dues.note(hash(key) ^ batch_index, due_ms)
            return bucket
        finally:
            lock.release()

    def _record(self, key: Key, ledger_id: int, entry_id: int, batch_index: int, topic: str) -> bool | None:
        """:meth:`pending`'s work (lock held)."""
        entry = self._entries.get(key)
        sets = self._sets
        layout = sets.layout
        bitmaps = layout.bitmaps
        pending_set, quiet_set = bitmaps[_PENDING], bitmaps[_QUIET]
        whole_pending = False  # the whole (non-batched) entry pending: never on a batched topic
        code = 0
        # A batch message needs the entry's code only to test the pending and quiet sets: with both
        # empty (a batched topic with no quiet entry) the ledger's ordinal is not looked up (~0.2 µs).
        ordinals = layout.ordinals if batch_index < 0 or pending_set or quiet_set else None
        ordinal = ordinals.get((topic, ledger_id) if topic else ledger_id) if ordinals else None
        if ordinal is not None:  # (the ledger's ordinal: a structure holds it, maybe not the sets)
            code = (ordinal >> layout.low) << layout.shift | entry_id << layout.low | ordinal & layout.mask
            if entry is None and quiet_set and code in quiet_set:  # (an empty set answers faster)
                entry = self._expand(key, 0)
                ordinal = None  # (its ledger's number may have gone with the bit)
            whole_pending = code in pending_set
        if batch_index < 0:  # fresh: no part of the entry pending (else the index merges)
            fresh = not whole_pending and (entry is None or not entry.pending)
            if whole_pending:
                pass
            elif ordinal is None:
                sets.add(_PENDING, (topic, ledger_id), entry_id)
            elif ordinal in sets.held_ordinals:  # EntrySets.add inlined (the nack path)
                (pending_set if type(pending_set) is BitMap64 else sets.writable(_PENDING)).add(code)
            else:
                sets.add(_PENDING, (topic, ledger_id), entry_id)
            return fresh
        if entry is None:
            entry = self._entries[key] = _Entry(None, self._since())
        bit = 1 << batch_index
        acked = entry.acked
        if acked & bit:
            return None
        pending = entry.pending
        entry.pending = now_pending = pending | bit
        entry.out |= bit
        # quiet needs every message acked or pending, so the top one at least (cheap, checked first:
        # the property costs a call per nack; each operation on a batch's >64-bit masks ~20 ns)
        size = entry.size
        maybe_quiet = acked < 0 or (
            size is not None and (now_pending | acked if acked else now_pending).bit_length() >= size
        )
        if maybe_quiet and self._pending_mask is not None and entry.quiet:
            self._make_quiet(key)
        # fresh: neither this message nor its whole entry pending (other messages of it may be)
        return not whole_pending and not pending & bit

    def pending_entries(self, entries: Mapping[tuple[str, int], BitMap]) -> None:
        """:meth:`pending` for many whole (non-batched) entries, ``(topic, ledger id)`` → entry ids — a
        restored snapshot's, taught to a filter that follows none of them yet. One bitmap update a ledger
        (the new ledgers numbered together: :meth:`EntrySets.update`). O(entries) numpy."""
        with self._lock:
            self._sets.update(_PENDING, entries)

    def pending_members(self, members: Mapping[Key, int]) -> None:
        """:meth:`pending` for batch messages of many entries, ``(topic, ledger id, entry id)`` → the mask
        of their batch indexes — a restored snapshot's partially pending batches: the state :meth:`pending`
        leaves called for each of them (an acked message left out, an entry whose every message is then
        acked or pending kept as one bit), one lock round-trip and one record update an entry.
        O(entries)."""
        entries = self._entries
        with self._lock:
            for key, mask in members.items():
                if mask <= 0:
                    continue
                entry = entries.get(key)
                if entry is None and self._is_quiet(*key):
                    entry = self._expand(key, 0)
                if entry is None:
                    entry = entries[key] = _Entry(None, self._since())
                acked = entry.acked
                bits = mask & ~acked
                if not bits:
                    continue
                entry.pending = now_pending = entry.pending | bits
                entry.out |= bits
                size = entry.size  # quiet: as _record tests it
                maybe_quiet = acked < 0 or (size is not None and (now_pending | acked).bit_length() >= size)
                if maybe_quiet and self._pending_mask is not None and entry.quiet:
                    self._make_quiet(key)

    def _unrecord(self, ledger_id: int, entry_id: int, batch_index: int, topic: str) -> None:
        """Undo :meth:`_record` (lock held; the index rejected the id). O(1)."""
        if batch_index < 0:
            self._sets.discard(_PENDING, (topic, ledger_id), entry_id)
        else:
            entry = self._entries.get((topic, ledger_id, entry_id))
            if entry is not None:
                entry.pending &= ~(1 << batch_index)

    def pop(
        self, pop_due_by_bucket: Callable[[int], list[tuple[int, DueIds]]], until: int
    ) -> list[tuple[int, DueIds]]:
        """A flush's pop of the index (``pop_due_by_bucket(until)``: one ledger's ids of one bucket each),
        under this filter's lock, each remembered until :meth:`forwarded` learns it: a quiet entry whose
        record is rebuilt meanwhile (a copy of it comes, the application acks or nacks one of its
        messages) would otherwise take the messages popped for that forward for acked — the forward would
        make no flight for them, and the copy it brings would be acked, not handed out. O(the pop)."""
        with self._lock:
            popped = pop_due_by_bucket(until)
            remembered = self._popped
            for _, ids in popped:  # (an entry may turn quiet, and be rebuilt, before forwarded() comes)
                ledger = (ids.topic, ids.ledger_id)
                earlier = remembered.get(ledger)
                if earlier is None:
                    remembered[ledger] = [ids]
                else:
                    earlier.append(ids)
            return popped

    def _popped_mask(self, topic: str, ledger_id: int, entry_id: int) -> int:
        """The batch indexes of an entry popped by a flush and not yet forwarded (-1: the whole entry, 0:
        none; lock held). O(1) without a flush under way, else O(popped entries of the ledger)."""
        popped = self._popped.get((topic, ledger_id)) if self._popped else None
        mask = 0
        for ids in popped or ():
            if (ids.entry_ids == entry_id).any():
                indexes = ids.batch_indexes.get(entry_id)
                if indexes is None:
                    return -1
                mask |= batch_mask(indexes)
        return mask

    def forwarded(
        self,
        topic: str,
        ledger_id: int,
        entry_ids: EntryIds,
        batch_indexes: Mapping[int, tuple[int, ...]],
        now: float,
        target: int,
    ) -> set[int] | None:
        """Entries of one ledger went to the native client at ``now`` for bucket time ``target``
        (``entry_ids``: a sequence or numpy array, kept until :meth:`sweep` retires it — 4 bytes per id
        as an array). O(entries + batch indexes).

        With :attr:`coalesce`, returns the entries not to forward (None: forward them all): those whose
        due messages (some of a batch) are waiting for the copy of a forward of their entry made less than
        :data:`COALESCE_WITHIN_MS` ago. Those messages stay pending, filed again for ``target`` (for the
        bucket they first waited at, if earlier): when the
        copy comes, the consumer keeps theirs until due (:meth:`take_pending_message`); if it does not,
        a later flush forwards them."""
        deferred: set[int] | None = None
        ledger = (topic, ledger_id)
        sets = self._sets
        with self._lock:
            if self._popped:
                popped = self._popped.get(ledger)
                if popped is not None:
                    # the group these ids came in (two flushes at once — a close that flushes while the
                    # timer does — interleave their groups), else the first: a flush learns in pop order
                    at = next((i for i, ids in enumerate(popped) if ids.entry_ids is entry_ids), 0)
                    del popped[at]
                    if not popped:
                        del self._popped[ledger]
                        if not self._popped:  # (emptied key by key, a dict keeps its grown table: a
                            self._popped = {}  # flush of 1,000 ledgers left 37 KB)
            any_pending = sets.any(_PENDING)  # (whole entries: none at all on a batched topic)
            ints = _ints(entry_ids)
            kept: KeptIds
            if len(ints) == 1:
                kept = ints[0]  # (the int the entry's key below holds too)
            elif isinstance(entry_ids, np.ndarray):
                # not a view (it would keep its buffer alive), and not an array object a ledger
                kept = entry_ids.tobytes() if entry_ids.dtype == _U32 else entry_ids.copy()
            else:
                kept = entry_ids
            # batch indexes: in the entries
            forwards = self._forwards
            if forwards and forwards[-1][0] == now:
                forwards[-1] += (topic, ledger_id, kept)
            else:
                forwards.append([now, topic, ledger_id, kept])
            dues = self.dues
            take = dues.take
            for entry_id in ints:
                key = (topic, ledger_id, entry_id)
                entry = self._entries.get(key)
                if entry is None and self._is_quiet(topic, ledger_id, entry_id):
                    entry = self._expand(key, batch_mask(batch_indexes.get(entry_id, ())))
                if entry is None:  # a non-batched message
                    flight = self._flights[key] = _Flight(now, target, self._flights.get(key))
                    due = take(hash(key) ^ -1, target) if dues.used else None
                    if flight.due is None:
                        flight.due = due
                        if due is not None:  # counted exactly: its offset is not drawn for another
                            self.lateness.taken(due)
                    sets.add(_WATCH, ledger, entry_id)
                    # no longer pending only now that it is watched: the lock-free first look of
                    # admit_entry and acked_entry (pending, then watched) sees it in one or the other
                    if any_pending:
                        sets.discard(_PENDING, ledger, entry_id)
                    continue
                indexes = batch_indexes.get(entry_id)
                # messages the consumer kept meanwhile (take_popped_message): not to forward
                taken = self._untake(key, indexes) if self._taken else 0
                if taken and indexes is not None:
                    indexes = tuple(index for index in indexes if not taken >> index & 1)
                if indexes == () or (
                    indexes is not None
                    and entry.flights
                    and self.coalesce
                    and not (any_pending and sets.contains(_PENDING, ledger, entry_id))
                    and self._wait_for_copy(entry, key, indexes, now, target)
                ):
                    if deferred is None:
                        deferred = set()
                    deferred.add(entry_id)
                    continue
                if any_pending:
                    sets.discard(_PENDING, ledger, entry_id)
                if indexes is not None:
                    mask = batch_mask(indexes)
                elif entry.size is not None:
                    mask = (1 << entry.size) - 1  # the whole entry was nacked
                else:
                    mask = entry.pending | entry.out
                if mask < 0:  # a whole-entry nack of a batch of unknown size: what is known pending
                    mask = max(entry.pending, 0)
                mask &= ~taken
                entry.pending &= ~mask
                code = hash(key)
                waiting = self._waiting
                # the flush's bucket time as one int object for all its ledgers (32 B a flight otherwise)
                if target == self._target:
                    target = self._target
                else:
                    self._target = target
                for index in batch_index_bits(mask & ~entry.acked):
                    # one that waited for a copy that did not come: labelled with its own bucket
                    due_at = waiting.pop((key, index), target) if waiting else target
                    flight = _Flight(now, min(due_at, target), _flight_of(entry, index), index)
                    _put_flight(entry, flight)
                    due = take(code ^ index, target) if dues.used else None
                    if flight.due is None:
                        flight.due = due
                        if due is not None:  # counted exactly: its offset is not drawn for another
                            self.lateness.taken(due)
                entry.last_forward = now
        return deferred

    def _untake(self, key: Key, indexes: tuple[int, ...] | None) -> int:
        """The messages of ``indexes`` (None: the whole entry) the consumer kept while their pop was under
        way (lock held), no longer recorded as such: a later bucket's pop of the entry's other messages
        has its own. O(indexes)."""
        taken = self._taken.get(key, 0)
        if indexes is not None:
            taken &= batch_mask(indexes)
        if taken:
            left = self._taken[key] & ~taken
            if left:
                self._taken[key] = left
            else:
                del self._taken[key]
        return taken

    def _wait_for_copy(
        self, entry: _Entry, key: Key, indexes: tuple[int, ...], now: float, target: int
    ) -> bool:
        """:meth:`forwarded`'s coalescing (lock held): if these due messages of ``entry`` are pending on
        their own, none in flight, while a forward of the entry made less than :data:`COALESCE_WITHIN_MS`
        ago has not brought its copy, file them again for ``target`` — on later flushes, for the bucket each
        first waited at (``_waiting``: never earlier than their bucket, not a bucket later per flush) — and
        return True; else False. O(flights + indexes)."""
        flights = _flight_list(entry)
        mask = batch_mask(indexes)
        if entry.pending & mask != mask or any(flight.index in indexes for flight in flights):
            return False
        if self._held_ms is not None or self._remove is None:
            return False  # with an ack timeout no copy is kept (see take_pending_message)
        if not any(0.0 <= now - flight.at < COALESCE_WITHIN_MS for flight in flights):
            return False
        topic, ledger_id, entry_id = key
        waiting = self._waiting
        for index in indexes:
            # at the bucket it first waited at (past: the flush's next-bucket floor keeps the timer from
            # firing again before the next bucket, when the next flush checks it again)
            held = (key, index)
            due_at = waiting.get(held)
            due_at = waiting[held] = target if due_at is None else due_at
            # (the time asked for is kept, not the bucket returned: a segment store may return a lower bound)
            self._add(due_at, ledger_id, entry_id, index, topic, False)
        return True

    # -- arrivals and acks ---------------------------------------------------------------------------

    def admit(self, ledger_id: int, entry_id: int, batch_index: int, topic: str, token: Any) -> Verdict:
        """Classify one arrival. ``batch_size(token)`` is called at most once per batched entry (when it
        is new), outside the lock; then one locked classification. O(1)."""
        if batch_index < 0:
            return self.admit_entry(ledger_id, entry_id, topic)
        key = (topic, ledger_id, entry_id)
        lock = self._lock
        bit = 1 << batch_index
        size: int | None = None  # the batch size, read from the id only for an entry not followed yet
        while True:  # twice at most: a new entry's size is read between two turns of the lock
            lock.acquire()  # (not `with`: its __exit__ costs ~90 ns more, once per message)
            try:
                entry = self._entries.get(key)
                if entry is None or entry.size is None:
                    if entry is None:
                        settled = self._unfollowed(key, batch_index)
                        if settled is not None:
                            return settled
                    if size is None:
                        entry = None  # no verdict this turn: the size first (a native call), then again
                    elif entry is None:
                        entry = self._entries[key] = _Entry(size, self._since())
                    else:
                        entry.size = size
                if entry is not None:
                    if not (entry.acked & bit or entry.pending & bit or entry.out & bit or entry.flights):
                        entry.out |= bit  # a first delivery: the common case
                        return _DELIVER
                    verdict, again, now = self._classify(entry, batch_index)
                    break
            finally:
                lock.release()
            size = self._batch_size(token)  # a message's batch size never changes: it is in its id
        if again is not None:
            self._reschedule(again.target + (now - again.at), ledger_id, entry_id, batch_index, topic)
        return verdict

    def admit_message(self, key: Key, batch_index: int, token: Any) -> Verdict:
        """:meth:`admit` for a batch message (``batch_index >= 0``) whose ``(topic, ledger id, entry id)``
        the caller has built: the per-message path of a batched consumer, one frame and one lock
        round-trip for any copy of a followed entry (a first delivery, or a copy of a redelivered batch).
        An entry not followed yet goes the way of :meth:`admit` (its size read outside the lock). O(1)."""
        lock = self._lock
        lock.acquire()  # (not `with`: its __exit__ costs ~90 ns more, once per message)
        try:
            entry = self._entries.get(key)
            if entry is not None and entry.size is not None:
                bit = 1 << batch_index
                acked = entry.acked
                if not (acked & bit or entry.pending & bit or entry.out & bit or entry.flights):
                    entry.out |= bit  # a first delivery: the common case
                    return _DELIVER
                if acked & bit:  # an acked sibling in a redelivered batch: the copy to drop
                    self._dropped += 1
                    return _dropped_copy(entry, acked)
                verdict, again, now = self._classify(entry, batch_index)
                if again is None:
                    return verdict
            else:
                entry = None
        finally:
            lock.release()
        topic, ledger_id, entry_id = key
        if entry is None:
            return self.admit(ledger_id, entry_id, batch_index, topic, token)  # a new entry, in full
        # an early copy of our forward: forward it again (outside the lock), as admit does
        assert again is not None
        self._reschedule(again.target + (now - again.at), ledger_id, entry_id, batch_index, topic)
        return verdict

    def admit_batched(
        self, arrivals: Sequence[tuple[int, int, int, str]], token: Callable[[int], Any]
    ) -> list[tuple[int, Verdict]]:
        """:meth:`admit` for many batch messages at once (a ``batch_receive``'s), each ``(ledger id, entry
        id, batch index >= 0, topic)``, with the verdicts :meth:`admit` would give them one after the
        other. Returns ``(position, verdict)`` of those not handed out (in order); every other one is
        ``DELIVER``. One lock round-trip for the lot (plus one per new entry, whose size is read outside
        the lock from ``token(position)``, the token :meth:`admit` takes, asked for only then), and the
        entry looked up once per run of messages of the same entry. O(messages)."""
        withheld: list[tuple[int, Verdict]] = []
        again: list[tuple[_Flight, float, int, int, int, str]] = []  # early copies of our forwards
        entries = self._entries
        lock = self._lock
        count = len(arrivals)
        position = 0
        sizes: dict[Key, int] = {}  # batch sizes read in this call (outside the lock)
        while position < count:
            new = False  # the message at `position` is of a new entry, whose size is read before going on
            lock.acquire()
            try:
                key: Key | None = None
                entry: _Entry | None = None
                while position < count:
                    ledger_id, entry_id, batch_index, topic = arrivals[position]
                    if key is None or entry_id != key[2] or ledger_id != key[1] or topic != key[0]:
                        key = (topic, ledger_id, entry_id)
                        entry = entries.get(key)
                    if entry is None or entry.size is None:
                        if entry is None:
                            settled = self._unfollowed(key, batch_index)
                            if settled is not None:
                                withheld.append((position, settled))
                                position += 1
                                continue
                        size = sizes.get(key)
                        if size is None:
                            new = True
                            break  # its size first (a native call), outside the lock
                        if entry is None:
                            entry = entries[key] = _Entry(size, self._since())
                        else:
                            entry.size = size
                    bit = 1 << batch_index
                    position += 1
                    acked = entry.acked
                    if not (acked & bit or entry.pending & bit or entry.out & bit or entry.flights):
                        entry.out |= bit  # a first delivery: the common case
                        continue
                    if acked & bit:  # an acked sibling in a redelivered batch: the copy to drop
                        self._dropped += 1
                        withheld.append((position - 1, _dropped_copy(entry, acked)))
                        continue
                    verdict, early, now = self._classify(entry, batch_index)
                    if verdict is not _DELIVER:
                        withheld.append((position - 1, verdict))
                    if early is not None:
                        again.append((early, now, ledger_id, entry_id, batch_index, topic))
            finally:
                lock.release()
            if new:
                ledger_id, entry_id, _, topic = arrivals[position]
                sizes[(topic, ledger_id, entry_id)] = self._batch_size(token(position))
        for early, now, ledger_id, entry_id, batch_index, topic in again:
            self._reschedule(early.target + (now - early.at), ledger_id, entry_id, batch_index, topic)
        return withheld

    def _classify(self, entry: _Entry, batch_index: int) -> tuple[Verdict, _Flight | None, float]:
        """A copy of a message of a followed batched entry of known size (lock held), as :meth:`admit`:
        acked → in flight → pending → handed out → new, the first that holds decides. Returns the verdict,
        and the flight to forward again with the time now if it is an early copy of our forward. O(1)."""
        bit = 1 << batch_index
        acked = entry.acked
        if acked & bit:  # a copy of a message the application acked
            self._dropped += 1
            return _dropped_copy(entry, acked), None, 0.0
        flight = _flight_of(entry, batch_index)
        if flight is None:
            if entry.pending & bit:
                self._held_back += 1
                return _HOLD, None, 0.0
            if entry.out & bit:
                if self._held_ms is not None and self._timed_out(entry, bit):
                    return _DELIVER, None, 0.0
                self._dropped += 1
                return _DUPLICATE, None, 0.0
            entry.out |= bit
            return _DELIVER, None, 0.0
        now = self._clock()
        verdict, again = self._landed(flight, now)
        if verdict is _DELIVER:
            _drop_flight(entry, batch_index)
            entry.out |= bit
        else:
            self._count(verdict)
        return verdict, again, now

    def _timed_out(self, entry: _Entry, bit: int) -> bool:
        """A copy of a message of ``entry`` the application holds (lock held; an ack timeout is set): True
        if it comes an ack timeout after the entry's messages were handed out — the native tracker's
        redelivery of the whole entry. Then every message of it the application holds is handed out again
        as its copy comes (their bits leave ``out``), and the timeout starts over. O(1)."""
        now = self._clock()
        if now - entry.since < self._held_ms:  # type: ignore[operator]  # (the caller checked)
            return False
        entry.since = now
        entry.out = entry.acked | entry.pending | bit
        return True

    def admit_entry(self, ledger_id: int, entry_id: int, topic: str) -> Verdict:
        """:meth:`admit` for a non-batched message. O(1): two lookups without the lock (the pending and
        the watched entries of its ledger) decide a first delivery; a message pending, in flight or
        recently redelivered is then classified under the lock.

        The lock-free first look: every change of those tables is one atomic step under the GIL, and
        :meth:`forwarded` watches an entry before it stops being pending, so reading pending first, then
        watched, cannot miss an entry moving from one to the other; an entry that has just left both was
        neither when it was read (a nack filed meanwhile is filed after this arrival, as with the lock)."""
        ledger = (topic, ledger_id)
        layout = self._sets.layout
        ordinal = layout.ordinals.get(ledger if topic else ledger_id)
        if ordinal is None:
            return _DELIVER  # a first delivery (the common case: no lock, no call)
        bitmaps = layout.bitmaps
        pending_set, watch_set = bitmaps[_PENDING], bitmaps[_WATCH]
        code = (ordinal >> layout.low) << layout.shift | entry_id << layout.low | ordinal & layout.mask
        if code not in pending_set and (not watch_set or code not in watch_set):
            return _DELIVER
        lock = self._lock
        lock.acquire()  # (not `with`: its __exit__ costs ~90 ns more, once per message)
        try:
            key = (topic, ledger_id, entry_id)
            flight = self._flights.get(key)
            again: _Flight | None = None  # a copy of our forward that came early: forward again
            held_ms = self._held_ms
            if flight is not None:
                now = self._clock()
                verdict, again = self._landed(flight, now)
                if verdict is _DELIVER:
                    # (stays watched; with an ack timeout, the time counts for the next copy)
                    self._recent.deliver(ledger, entry_id, None if held_ms is None else now)
                    flights = self._flights
                    del flights[key]
                    if not flights:
                        _release(flights)
            else:
                if self._sets.contains(_PENDING, ledger, entry_id):
                    verdict = _HOLD
                else:
                    verdict = self._recent.verdict(ledger, entry_id) or _DELIVER
                    if verdict is _DUPLICATE and held_ms is not None:
                        # held an ack timeout since it was handed out: the timeout's copy, handed out
                        at = self._recent.handed_at(key)
                        now = self._clock()
                        if at is not None and now - at >= held_ms:
                            verdict = _DELIVER
                            self._recent.deliver(ledger, entry_id, now)
            if verdict is not _DELIVER:
                self._count(verdict)
        finally:
            lock.release()
        if again is not None:
            self._reschedule(again.target + (now - again.at), ledger_id, entry_id, -1, topic)
        return verdict

    def _unfollowed(self, key: Key, batch_index: int) -> Verdict | None:
        """A copy of a batched entry that has no record (lock held): HOLD or ACKED if the entry is known
        as one bit (all acked or pending; acked after a recent redelivery), else None (a new entry)."""
        topic, ledger_id, entry_id = key
        if self._is_quiet(topic, ledger_id, entry_id):
            # a copy of an entry all acked or pending (after a reconnect, say): nothing to hand out
            mask = self._pending_mask(ledger_id, entry_id, topic)  # type: ignore[misc]
            mask |= self._popped_mask(topic, ledger_id, entry_id)  # its forward is under way
            verdict = _HOLD if mask >> batch_index & 1 else _ACKED
        elif self._recent and self._recent.is_settled((topic, ledger_id), entry_id):
            # a late copy of an entry acked after its redelivery: ack it (the broker may have lost the
            # entry's ack with a connection — this copy says it has not got one)
            verdict = _ACKED
        else:
            return None
        self._count(verdict)
        return verdict

    def _count(self, verdict: Verdict) -> None:
        """Count a copy not handed out (lock held)."""
        if verdict is _HOLD:
            self._held_back += 1
        else:
            self._dropped += 1

    def _landed(self, flight: _Flight, now: float) -> tuple[Verdict, _Flight | None]:
        """A copy of an in-flight message (lock held): hand it out, or hold it (and maybe re-forward)."""
        if flight.acked:
            return _ACKED, None
        asked_by_us = now >= flight.at + NATIVE_MIN_DELAY_MS
        if asked_by_us and now >= flight.target:
            self._redelivered += 1
            if flight.due is not None:
                self.lateness.add(now - flight.due)
            else:  # target: the bucket time (the flush labels each pop with its bucket)
                self.lateness.add_after_bucket(flight.target, now - flight.target)
            return _DELIVER, None
        if asked_by_us:
            # The copy our forward asked for came before the bucket time (the native delay is shorter
            # than assumed): forward again, as much earlier as this copy came.
            self._reforwarded += 1
            again = _Flight(flight.at, flight.target, None)
            flight.at = _NEVER  # waiting for the new forward, which replaces this flight
            return _HOLD, again
        return _HOLD, None  # asked for by something else (a sibling, a reconnect): ours follows

    def nack_free(self) -> bool:
        """Nothing pending, in flight, parked, kept as a bit or recently redelivered, and no followed
        batched entry forwarded: only records of batched entries whose messages the application was
        handed (and may have acked). O(followed entries) under the lock."""
        with self._lock:
            return self._nack_free()

    def _nack_free(self) -> bool:
        bitmaps = self._sets.layout.bitmaps
        pending, quiet, watch = bitmaps[_PENDING], bitmaps[_QUIET], bitmaps[_WATCH]
        if (
            self._flights
            or pending
            or quiet
            or watch
            or self._recent
            or self._popped
            or self._taken
            or self._waiting
        ):
            return False
        for entry in self._entries.values():
            if (
                entry.pending
                or entry.flights
                or entry.parked
                or entry.size is None
                or entry.last_forward != _NEVER_FORWARDED
            ):
                return False
        return True

    def unwatch_arrivals(self) -> bool:
        """The consumer is about to hand its messages out without telling this filter (nothing can make a
        copy withheld while :meth:`nack_free` holds): True if it holds, and every message of a followed
        entry not handed out yet is marked acked and :attr:`inferred` (:meth:`infer`), so that the entry is
        settled as the application acks the messages it was handed; False (nothing changed) if not.
        O(followed entries) under the lock."""
        with self._lock:
            if not self._nack_free():
                return False
            for key, entry in list(self._entries.items()):
                full = (1 << entry.size) - 1  # type: ignore[operator]  # (known: _nack_free checked)
                unseen = full & ~(entry.out | entry.acked)
                if entry.acked | unseen == full:
                    del self._entries[key]  # all acked but the unseen: nothing more can come for it
                    self.inferred.pop(key, None)
                elif unseen:
                    entry.acked |= unseen
                    self.inferred[key] = self.inferred.get(key, 0) | unseen
            if not self._entries:
                _release(self._entries)
            return True

    def infer(self, key: Key, size: int, held: int, queued: int = 0, seen: int = 0) -> None:
        """Follow a batched entry of ``size`` messages from a consumer that handed its messages out
        without telling this filter (nothing was tracked then): the application holds the batch indexes in
        ``held`` (a mask), and those in ``queued`` are known to be still in the receiver queue (never
        handed out: any copy of one is handed out, whatever its redelivery count). Of a new record, every
        other message was acked by the application or has not reached it yet: those are marked acked —
        and, unless in ``seen`` (known to have been handed out: below the highest batch index handed out
        lately, the receiver queue being FIFO), remembered in :attr:`inferred`: a copy of one is dropped as
        acked unless :meth:`first_copy` says it is the first. (A broker restart re-sends with redelivery
        count 0 too: a seen message's copy is always dropped.) A followed entry infers nothing more (its
        other messages were classified when they came, or by :meth:`unwatch_arrivals`); an acked or
        inferred message in ``queued`` is queued again, one handed out or pending is left as it is. O(1)
        under the lock."""
        with self._lock:
            entry = self._entries.get(key)
            inferred = self.inferred.get(key, 0)
            full = (1 << size) - 1
            if entry is None:
                if not held:
                    return  # not followed, nothing held: every copy of it is a first delivery anyway
                entry = self._entries[key] = _Entry(size, self._since())
                queued &= ~held
                unknown = full & ~(held | queued)
            else:
                if entry.size is None:
                    entry.size = size
                queued &= ~(held | entry.out | entry.pending | (entry.acked & ~inferred))
                unknown = 0
            entry.out |= held
            entry.acked = (entry.acked & ~(held | queued)) | unknown
            bits = (inferred & ~(held | queued)) | (unknown & ~seen)
            if bits:
                self.inferred[key] = bits
            else:
                self.inferred.pop(key, None)

    def first_copy(self, key: Key, batch_index: int) -> bool:
        """A copy of a message marked acked by :meth:`infer` came, and it is a first delivery (its
        redelivery count is 0: it was still in the receiver queue when the entry was taken over): True,
        and it counts as handed out now (the caller hands it out); False if it is not (or no longer)
        such a message. O(1)."""
        with self._lock:
            bits = self.inferred.get(key, 0)
            bit = 1 << batch_index
            if not bits & bit:
                return False
            bits &= ~bit
            if bits:
                self.inferred[key] = bits
            else:
                del self.inferred[key]
            entry = self._entries.get(key)  # (None: settled after a forward, its copies dropped as acked)
            if entry is not None:
                entry.acked &= ~bit
                entry.out |= bit
            self._dropped -= 1  # (counted as a dropped copy when it was classified)
            return True

    def park(self, ledger_id: int, entry_id: int, batch_index: int, topic: str, copy: Any) -> bool:
        """Keep a ``DUPLICATE`` copy until the application acks its own. False if the application has
        acked it meanwhile (the caller acks the copy now). O(1)."""
        with self._lock:
            entry = self._entries.get((topic, ledger_id, entry_id))
            if entry is None or entry.acked >> batch_index & 1:
                return False
            parked = entry.parked if entry.parked is not None else {}
            entry.parked = parked
            parked.setdefault(batch_index, []).append(copy)
            self.has_parked = True
            return True

    def take_parked(self, ledger_id: int, entry_id: int, batch_index: int, topic: str) -> Any | None:
        """The application nacks a batch message of which a copy is parked (:meth:`park`: it came with a
        redelivery of its entry while the application held the message): that copy leaves the parked ones
        and is returned, for the caller to keep and hand out when the nack is due — no nack is filed, and
        no forward makes the broker dispatch the entry again (a sibling nacked again after a
        later copy of its entry came). None (nothing changed) if no copy is parked, the application acked
        the message, or an ack timeout is set. O(1); one dict lookup without the lock when nothing is
        parked for the entry."""
        key = (topic, ledger_id, entry_id)
        entry = self._entries.get(key)
        if entry is None or not entry.parked or self._held_ms is not None:
            return None
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or not entry.parked or entry.acked >> batch_index & 1:
                return None
            copies = entry.parked.get(batch_index)
            if not copies:
                return None
            copy = copies.pop()
            if not copies:
                del entry.parked[batch_index]
                if not entry.parked:
                    entry.parked = None
            if entry.last_forward == _NEVER_FORWARDED:
                entry.last_forward = self._clock()  # (as in take_pending_message)
            self._kept += 1
            return copy

    def put_back(self, ledger_id: int, entry_id: int, batch_index: int, topic: str, copy: Any) -> bool:
        """Undo :meth:`take_parked` (the nack that took ``copy`` is filed after all): the copy is parked
        again and not counted as kept. False if the application acked the message meanwhile (the caller
        acks the copy now), as :meth:`park`. O(1)."""
        with self._lock:
            self._kept -= 1
        return self.park(ledger_id, entry_id, batch_index, topic, copy)

    def acked(
        self, ledger_id: int, entry_id: int, batch_index: int, topic: str
    ) -> tuple[Sequence[Any], bool, bool]:
        """The application acked this message. Returns parked copies to ack along with it, whether a
        nack of it was pending (removed from the index here, under the lock, when the filter was made
        with ``remove``; else the caller removes it), and whether the caller must ack
        the whole entry at the broker: every message of a batch that was forwarded is now acked, but no
        single delivered copy may be (the nacked message was never acked on the first copy, and the rest
        of a redelivered copy may still sit in the receiver queue). O(1)."""
        if batch_index < 0:
            return _NONE, self.acked_entry(ledger_id, entry_id, topic), False
        key = (topic, ledger_id, entry_id)  # (the common batched case is :meth:`acked_plain`, called first)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                if not self._is_quiet(topic, ledger_id, entry_id):
                    return _NONE, False, False  # acked twice, after the entry settled
                entry = self._expand(key, 0)  # a nack-then-ack of a quiet entry's message
            bit = 1 << batch_index
            entry.acked |= bit
            was_pending = bool(entry.pending & bit)
            entry.pending &= ~bit
            if was_pending and self._remove is not None:
                self._remove(ledger_id, entry_id, batch_index, topic)
            if self._waiting:
                self._waiting.pop((key, batch_index), None)
            flight = _flight_of(entry, batch_index)
            if flight is not None:
                flight.acked = True
            copies = entry.parked.pop(batch_index, _NONE) if entry.parked else _NONE
            ack_entry = entry.last_forward != _NEVER_FORWARDED and entry.all_acked
            if entry.settled:
                self._forget(key)
            elif self._pending_mask is not None and entry.quiet:
                self._make_quiet(key)
            return copies, was_pending, ack_entry

    def take_pending(self, ledger_id: int, entry_id: int, topic: str) -> bool:
        """A copy of a non-batched message whose nack is pending came (:meth:`admit_entry` said HOLD), and
        the caller keeps it to hand out at the nack's due time itself: the nack leaves the filter and the
        index, so nothing is forwarded for it. False (nothing changed) if it is not pending any more — its
        forward has begun: that forward's copy decides. O(1) plus the index's removal."""
        with self._lock:
            if not self._sets.discard(_PENDING, (topic, ledger_id), entry_id):
                return False
            if self._remove is not None:
                self._remove(ledger_id, entry_id, -1, topic)
            return True

    def take_pending_message(self, ledger_id: int, entry_id: int, batch_index: int, topic: str) -> bool:
        """:meth:`take_pending` for a batch message (``batch_index >= 0``): a copy of a sibling whose nack is
        pending came with a forward of its entry (:meth:`admit` said HOLD), and the caller keeps it to hand
        out at the nack's due time itself, instead of a forward of its own fetching the whole entry again.
        The nack leaves the filter and the index; the message counts as the application's
        (``out``): a later copy of it is a duplicate, acked along with it. False (nothing changed) if it is
        not pending on its own any more — forwarded meanwhile, or pending as part of a whole-entry nack.
        O(1) plus the index's removal."""
        remove = self._remove
        return remove is not None and self._take_message(ledger_id, entry_id, batch_index, topic, remove)

    def take_pending_due(
        self,
        ledger_id: int,
        entry_id: int,
        batch_index: int,
        topic: str,
        take: Callable[[int, int, int, str], tuple[int | None, bool]],
    ) -> int | None:
        """:meth:`take_pending_message` through ``take``, the index's ``due_of`` and ``remove`` in one call
        (:meth:`SegmentStore.take <pulsar_nack.snapshot.segments.SegmentStore.take>`): the nack's due time
        (bucket) if it was taken, else None. A restart's re-dispatch keeps a copy of every restored batch
        message, and the two index calls walked the entry's buckets twice each time. O(1) plus ``take``."""
        dues: list[int | None] = []

        def taking(ledger_id: int, entry_id: int, batch_index: int, topic: str) -> bool:
            due, removed = take(ledger_id, entry_id, batch_index, topic)
            dues.append(due)
            return removed

        return dues[0] if self._take_message(ledger_id, entry_id, batch_index, topic, taking) else None

    def _take_message(
        self,
        ledger_id: int,
        entry_id: int,
        batch_index: int,
        topic: str,
        remove: Callable[[int, int, int, str], object],
    ) -> bool:
        """:meth:`take_pending_message`'s work with ``remove`` as the index's removal."""
        key = (topic, ledger_id, entry_id)
        bit = 1 << batch_index
        with self._lock:
            entry = self._entries.get(key)
            if entry is None and self._is_quiet(topic, ledger_id, entry_id):
                entry = self._expand(key, 0)
            if entry is None or not entry.pending & bit or self._remove is None or self._held_ms is not None:
                return False  # (with an ack timeout the native client would redeliver a kept copy)
            if self._sets.contains(_PENDING, (topic, ledger_id), entry_id):
                return False  # a whole-entry nack covers it: that forward fetches the entry anyway
            if not remove(ledger_id, entry_id, batch_index, topic):
                return False  # popped by a flush under way: its forward's copy decides
            entry.pending &= ~bit
            entry.out |= bit
            if self._waiting:
                self._waiting.pop((key, batch_index), None)
            if entry.last_forward == _NEVER_FORWARDED:
                # The copy came with a redelivery of the entry that this record has not seen as a forward
                # (a quiet entry's, expanded here, or a reconnect's): its other copies may not all be acked
                # at the broker, so the entry is acked whole once its last message is (see acked).
                entry.last_forward = self._clock()
            return True

    def forwarded_lately(self, ledger_id: int, entry_id: int, topic: str) -> bool:
        """Whether a batched entry was forwarded within ``linger_ms``: a copy of it that comes now is
        likely one the broker sent for that forward (a broker that answers forwards), not an unasked one
        (a restart's or reconnect's re-dispatch). Its record has a flights table once it saw a forward
        (:meth:`forwarded`); ``last_forward`` alone may have been set by a kept copy
        (:meth:`take_pending_message`). O(1), without the lock (reads only)."""
        entry = self._entries.get((topic, ledger_id, entry_id))
        return (
            entry is not None
            and entry.flights is not None
            and self._clock() - entry.last_forward < self.linger_ms
        )

    def take_popped_message(self, ledger_id: int, entry_id: int, batch_index: int, topic: str) -> bool:
        """:meth:`take_pending_message` for a batch message pending here but no longer in the index: a
        flush under way has popped it and not yet told :meth:`forwarded`, and its copy has come meanwhile
        (with a forward of a sibling). Only with :attr:`coalesce` and no snapshots (whose unloaded segments
        hold pending ids the index does not): the caller keeps the copy, and that forwarded() leaves the
        message out — no forward of its own makes the broker dispatch the entry again. False
        (nothing changed) if it is not pending on its own here. O(1)."""
        key = (topic, ledger_id, entry_id)
        bit = 1 << batch_index
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or not entry.pending & bit or not self.coalesce or self._held_ms is not None:
                return False
            if self._sets.contains(_PENDING, (topic, ledger_id), entry_id):
                return False
            if self._remove is None:
                return False
            if not self._remove(ledger_id, entry_id, batch_index, topic):
                # popped and not yet forwarded: that forwarded() leaves it out (one filed again by a
                # forwarded() that made it wait is back in the index: removed, nothing to leave out)
                self._taken[key] = self._taken.get(key, 0) | bit
            entry.pending &= ~bit
            entry.out |= bit
            if self._waiting:
                self._waiting.pop((key, batch_index), None)
            if entry.last_forward == _NEVER_FORWARDED:
                entry.last_forward = self._clock()
            return True

    def take_due(self, ledger_id: int, entry_id: int, batch_index: int, topic: str, bucket: float) -> float:
        """The due time of a nack just taken (:meth:`take_pending`, :meth:`take_pending_message`) of
        ``bucket``, whose copy the consumer keeps until then: its exact due time if it was sampled
        (:attr:`dues`, its slot freed), else an estimate — the bucket time less an offset of its bucket's
        nacks drawn now (:meth:`~pulsar_nack.lateness.LatenessHistogram.kept_due`). Pass it to
        :meth:`held_out` when the copy is handed out, or to :meth:`untake_due` if the copy is not kept
        after all. O(1), O(buckets kept + cells) when not sampled."""
        with self._lock:
            if self.dues.used:
                due = self.dues.take(hash((topic, ledger_id, entry_id)) ^ batch_index, self._clock())
                if due is not None:
                    self.lateness.taken(due)  # counted exactly: its offset is not drawn for another copy
                    return due
            return self.lateness.kept_due(int(bucket))

    def untake_due(self, bucket: float, due_ms: float, entry_id: int) -> None:
        """A nack whose due time :meth:`take_due` gave is pending again (the hold had no room for its copy):
        its offset goes back to its bucket's, to be drawn for its forwarded copy. O(1) amortized."""
        with self._lock:
            self.lateness.offset(int(bucket), int(bucket - due_ms), entry_id)

    def held_out(self, due_ms: float | None, key: tuple[Any, ...] = ()) -> None:
        """A copy kept by the consumer (:meth:`take_pending`, :meth:`take_pending_message`) was handed out
        when due: it counts as redelivered, and its lateness counts in :attr:`lateness`, with the forwarded
        ones', from ``due_ms`` (:meth:`take_due`'s; None: not known). ``key``: the
        hold's, ``(topic, ledger id, entry id)`` for a non-batched message — it counts as recently
        redelivered, as the copy of a forward does, so that a later broker copy of it (a second re-dispatch,
        a request still on its way) is a duplicate, or acked once the application has acked it, not a first
        delivery (a kept batch message is the application's already: :meth:`take_pending_message`). O(1)."""
        with self._lock:
            self._redelivered += 1
            now = self._clock()
            if due_ms is not None:
                self.lateness.add(now - due_ms)
            if len(key) == 3:
                topic, ledger_id, entry_id = key
                ledger = (topic, ledger_id)
                self._recent.deliver(ledger, entry_id, None if self._held_ms is None else now)
                self._sets.add(_WATCH, ledger, entry_id)

    def acked_cumulative(self, ledger_id: int, entry_id: int, batch_index: int, topic: str) -> int:
        """The application acked every message of ``topic`` up to this one, inclusive (a cumulative ack):
        pending nacks of them are dropped from the index (the broker will never send them again, and
        their forwards would be redelivery requests for nothing — on an Exclusive or Failover subscription
        each one a redeliver-all), their forwards count as acked (no copy will come: none is repeated), and
        their batched entries are settled (copies parked with them are covered by the cumulative ack).
        Returns how many pending ids (entries or batch messages) were dropped.

        O(open batched entries + ledgers with pending whole entries + messages in flight) of all topics,
        plus the index's removals: a cumulative ack is rare beside per-message acks, and all it settles
        goes."""
        position = (ledger_id, entry_id)
        # the acked messages of the boundary entry: up to the batch index (a whole entry if not batched)
        boundary = -1 if batch_index < 0 else (1 << (batch_index + 1)) - 1
        remove = self._remove
        dropped = 0
        with self._lock:
            for (t, ledger), bitmap in list(self._sets.ledgers(_PENDING)):  # whole (non-batched) entries
                if t != topic or ledger > ledger_id:
                    continue
                gone = bitmap if ledger < ledger_id else bitmap & BitMap(range(entry_id + 1))
                dropped += len(gone)
                for whole in gone:
                    self._sets.discard(_PENDING, (t, ledger), whole)
                    if remove is not None:
                        remove(ledger, whole, -1, topic)
            for key, flight in self._flights.items():
                if key[0] == topic and key[1:] <= position:
                    flight.acked = True
            for (t, ledger), quiet in list(self._sets.ledgers(_QUIET)):  # records again, settled below
                if t == topic and ledger <= ledger_id:
                    below = quiet if ledger < ledger_id else quiet & BitMap(range(entry_id + 1))
                    for quiet_id in list(below):
                        self._expand((t, ledger, quiet_id), 0)
            for key in [k for k in self._entries if k[0] == topic and k[1:] <= position]:
                entry = self._entries[key]
                mask = boundary if key[1:] == position else -1
                pending = entry.pending & mask
                if pending:
                    dropped += pending.bit_count()
                    if remove is not None:
                        if mask == -1:
                            remove(key[1], key[2], -1, topic)
                        else:
                            for index in batch_index_bits(pending):
                                remove(key[1], key[2], index, topic)
                entry.pending &= ~mask
                entry.acked |= mask
                if entry.flights:
                    for flight in _flight_list(entry):
                        if mask >> flight.index & 1:
                            flight.acked = True
                if entry.parked:
                    for index in [i for i in entry.parked if mask >> i & 1]:
                        del entry.parked[index]
                if mask == -1 or entry.all_acked:
                    self._forget(key)  # settled (a late copy of a recent forward: acked, not handed out)
            for held in [h for h in self._waiting if h[0][0] == topic and h[0][1:] <= position]:
                if held[0][1:] < position or boundary >> held[1] & 1:
                    del self._waiting[held]  # acked: waits no more
        return dropped

    def acked_entry(self, ledger_id: int, entry_id: int, topic: str) -> bool:
        """:meth:`acked` for a non-batched message: returns whether a nack of it was pending (removed
        from the index here, as :meth:`acked` does). O(1): two lookups without the lock, as in
        :meth:`admit_entry`, unless the message is pending, in flight or was recently redelivered."""
        ledger = (topic, ledger_id)
        layout = self._sets.layout
        ordinal = layout.ordinals.get(ledger if topic else ledger_id)
        if ordinal is None:
            return False  # nothing to record: an ack of a message tracked in no way
        bitmaps = layout.bitmaps
        pending_set, watch_set = bitmaps[_PENDING], bitmaps[_WATCH]
        code = (ordinal >> layout.low) << layout.shift | entry_id << layout.low | ordinal & layout.mask
        if code not in pending_set and (not watch_set or code not in watch_set):
            return False
        lock = self._lock
        lock.acquire()  # (not `with`: its __exit__ costs ~90 ns more, once per ack)
        try:
            if self._sets.contains(_WATCH, ledger, entry_id):
                flight = self._flights.get((topic, ledger_id, entry_id))
                if flight is not None:
                    flight.acked = True  # a copy may still come: ack it, don't hand it out
                self._recent.ack(ledger, entry_id)
            if not self._sets.discard(_PENDING, ledger, entry_id):
                return False
            if self._remove is not None:  # under the lock: no nack of it is filed in between
                self._remove(ledger_id, entry_id, -1, topic)
            return True
        finally:
            lock.release()

    def acked_plain(self, key: Key, batch_index: int) -> bool:
        """The per-message fast path of :meth:`acked`: True (and the ack recorded, as :meth:`acked` does)
        if the message is of a followed batched entry of known size of which nothing is in flight or
        parked, that was never forwarded, and whose nack of this message is not pending (others may be:
        PIP-393's case, a few nacks in a batch whose other messages are acked) — then there are no copies
        to ack along and no entry to ack; False if :meth:`acked` must decide. O(1), one lock round-trip."""
        lock = self._lock
        lock.acquire()  # (not `with`: its __exit__ costs ~90 ns more, once per ack)
        try:
            entry = self._entries.get(key)
            if (
                entry is None
                or entry.size is None
                or entry.flights
                or entry.parked
                or entry.last_forward != _NEVER_FORWARDED
                or entry.pending >> batch_index & 1
            ):
                return False
            acked = entry.acked = entry.acked | 1 << batch_index
            pending = entry.pending
            full = (1 << entry.size) - 1
            if not pending:
                if acked == full:
                    entries = self._entries
                    del entries[key]  # settled, never forwarded: nothing more can come
                    if not entries:
                        _release(entries)
                    if self.inferred:
                        self.inferred.pop(key, None)
            elif acked | pending == full and self._pending_mask is not None:
                self._make_quiet(key)  # every message acked or pending: one bit
            return True
        finally:
            lock.release()

    def _is_quiet(self, topic: str, ledger_id: int, entry_id: int) -> bool:
        """Whether a batched entry is kept as one bit. O(1): one attribute read when nothing is kept."""
        layout = self._sets.layout
        quiet = layout.bitmaps[_QUIET]
        if not quiet:
            return False
        code = layout.code((topic, ledger_id), entry_id)
        return code is not None and code in quiet

    def _make_quiet(self, key: Key) -> None:
        """Keep an entry whose messages are all acked or pending as one bit (lock held); not one with
        :attr:`inferred` messages (a bit cannot tell those from acked ones)."""
        if self.inferred and key in self.inferred:
            return
        entries = self._entries
        del entries[key]
        if not entries:
            _release(entries)
        self._sets.add(_QUIET, key[:2], key[2])

    def _expand(self, key: Key, forwarded: int) -> _Entry:
        """A quiet entry back as a record (lock held): every message it does not have pending or
        ``forwarded`` (a mask of batch indexes just popped from the index) is acked. O(B_l) once."""
        topic, ledger_id, entry_id = key
        self._sets.discard(_QUIET, (topic, ledger_id), entry_id)
        entry = self._entries[key] = _Entry(None, self._since())
        assert self._pending_mask is not None  # nothing is quiet without it
        pending = self._pending_mask(ledger_id, entry_id, topic)
        entry.pending = max(pending, 0)
        entry.out = -1
        # a message a flush under way popped is not acked: pending still, until forwarded() learns it
        entry.pending |= max(self._popped_mask(topic, ledger_id, entry_id), 0)
        acked = ~(forwarded | entry.pending)
        entry.acked = _ALL_BUT_ONE.get(acked, acked)  # (one shared int, not 32 B an entry)
        return entry

    # -- housekeeping ---------------------------------------------------------------------------------

    def sweep(self) -> list[tuple[float, int, int, int, str]]:
        """Retire forwards older than ``linger_ms`` and the entries they kept; returns ids to forward
        again (due now) because their copy never came — a redelivery request lost with a broker
        connection — at most ``max_reforwards`` times per message, then counted as abandoned.
        Amortized O(1) per forward."""
        now = self._clock()
        horizon = now - self.linger_ms
        again: list[tuple[float, int, int, int, str]] = []
        with self._lock:
            dropped = self._recent.rotate(now, self.linger_ms / 2)
            # (7 KiB of a consumer's fixed memory, of no nack left; asked before the expired flights retire
            # below: those forwarded again are filed in the index only after this lock is released)
            if self._nothing_to_draw():
                self.lateness.forget_pending()
                self.dues.clear()
            if dropped is not None:
                self._unwatch(dropped)
                self._sets.tidy()  # (rotate emptied sets in place: all empty, the ledgers go back)
            if dropped is not None and self.inferred:  # those of entries settled: while they are settled
                recent = self._recent
                for key in [k for k in self.inferred if k not in self._entries]:
                    if not recent.is_settled(key[:2], key[2]):
                        del self.inferred[key]
            forwards = self._forwards
            expired = 0
            while expired < len(forwards) and forwards[expired][0] <= horizon:
                expired += 1
            records = forwards[:expired]
            del forwards[:expired]
            for record in records:
                at = record[0]
                for topic, ledger_id, entry_ids in zip(record[1::3], record[2::3], record[3::3], strict=True):
                    for entry_id in _ints(entry_ids):
                        key = (topic, ledger_id, entry_id)
                        flight = self._flights.get(key)
                        if flight is not None and flight.at == at and self._retire(flight, key, -1, again):
                            del self._flights[key]
                            if not self._recent.verdict((topic, ledger_id), entry_id):
                                self._sets.discard(_WATCH, (topic, ledger_id), entry_id)
                        entry = self._entries.get(key)
                        if entry is None or not entry.flights:
                            continue
                        for flight in _flight_list(entry):
                            index = flight.index
                            if flight.at == at and self._retire(flight, key, index, again):
                                _drop_flight(entry, index)
                                if not flight.acked:
                                    # abandoned: still unacked at the broker, and the application has no copy
                                    # of it — the next copy the broker sends (a reconnect's) is handed out
                                    entry.out &= ~(1 << index)
                        if entry.settled:
                            self._forget(key)
            for table in (self._flights, self._entries):
                if not table:
                    table.clear()  # an emptied dict keeps its hash table (2.6 MB after a big forward)
        return again

    def _unwatch(self, codes: AbstractBitMap64) -> None:
        """Stop watching these non-batched entries (codes of the filter's sets), but those still in
        flight or recently redelivered (lock held). O(entries)."""
        gone = codes - self._recent.delivered()
        if not gone:
            return
        sets = self._sets
        for ledger, bitmap in sets.decode(gone):
            topic, ledger_id = ledger
            for entry_id in bitmap:
                if (topic, ledger_id, entry_id) not in self._flights:
                    sets.discard(_WATCH, ledger, entry_id)

    def _forget(self, key: Key) -> None:
        """A settled entry (lock held): gone, or one bit for ``linger_ms`` if it was forwarded lately
        (a late copy of it is acked, not handed out)."""
        entries = self._entries
        entry = entries.pop(key)
        if not entries:
            _release(entries)
        # (its inferred messages stay in `inferred` while it is settled: a copy of one that is a first
        # delivery is still handed out, see first_copy; dropped at the sweep's next rotation)
        if entry.last_forward != _NEVER_FORWARDED and self._clock() - entry.last_forward < self.linger_ms:
            self._recent.settle(key[:2], key[2])

    def _retire(
        self, flight: _Flight, key: Key, index: int, again: list[tuple[float, int, int, int, str]]
    ) -> bool:
        """An old flight (lock held): True to forget it; else it is forwarded again (added to ``again``)."""
        if flight.acked:
            return True
        if flight.reforwards >= self.max_reforwards:
            self._abandoned += 1
            return True
        self._reforwarded += 1
        flight.at = _NEVER  # the new forward replaces it, counting on
        again.append((self._clock(), key[1], key[2], index, key[0]))
        return False

    @property
    def sweep_due(self) -> float | None:
        """When :meth:`sweep` has something to do (clock ms), or None."""
        forwards = self._forwards
        due = [forwards[0][0] + self.linger_ms] if forwards else []
        if self._recent:
            due.append(self._recent.started + self.linger_ms / 2)
        return min(due) if due else None

    def _nothing_to_draw(self) -> bool:
        """No nack pending in the index, popped for a forward or forwarded with its copy still on its way:
        the lateness estimator's offsets and sampled due times are of no nack left (the caller holds the
        lock, as a nack does while it files). O(1), O(batched entries followed) when all hold."""
        index_len = self._index_len
        if index_len is None or index_len() or self._flights or self._popped:
            return False
        return not any(entry.flights for entry in self._entries.values())

    def forget_holdings(self) -> None:
        """The application's unacked copies are void (``redeliver_unacknowledged_messages``): the broker
        sends them again and they are handed out again. Pending nacks stay pending."""
        with self._lock:
            for entry in self._entries.values():
                entry.out = entry.acked | entry.pending
                entry.parked = None
            self._unwatch(self._recent.forget_unacked())
            self._sets.tidy()

    def compact(self) -> None:
        """Shrink the sets' bitmaps to their values (:meth:`EntrySets.shrink
        <pulsar_nack.entry_sets.EntrySets.shrink>`): the tracker's compaction, off the nack path.
        O(containers)."""
        with self._lock:
            self._sets.shrink()

    def clear(self) -> None:
        """Forget everything (seek, close)."""
        with self._lock:
            self._entries.clear()
            self._flights.clear()
            self._forwards.clear()
            self._sets.clear()
            self.dues.clear()
            self.lateness.forget_pending()
            self._recent.reset(self._clock())
            self.has_parked = False
            self._taken.clear()
            self._popped.clear()
            self.inferred.clear()
            self._waiting.clear()

    def counts(self) -> FilterCounts:
        return FilterCounts(
            redelivered=self._redelivered,
            held_back=self._held_back,
            dropped=self._dropped,
            reforwarded=self._reforwarded,
            abandoned=self._abandoned,
            open_entries=len(self._entries) + self._sets.size(_QUIET),
            in_flight=len(self._flights) + sum(len(_flight_list(e)) for e in list(self._entries.values())),
            kept=self._kept,
        )

    def memory_bytes(self, sample: int = 64) -> int:
        """Bytes the filter holds: its containers and bitmaps measured, its per-entry and per-flight
        objects from a sample of up to ``sample`` of each. O(ledgers with pending non-batched nacks)."""
        with self._lock:
            tables = (self._entries, self._flights, self._forwards, self._taken, self._waiting, self.inferred)
            total = python_bytes(self) + sum(python_bytes(t) for t in tables) + self._sets.memory_bytes()
            # (a flush's popped ids, until forwarded() learns them: the index's objects, handed over)
            total += python_bytes(self._popped) + sum(map(python_bytes, self._popped.values()))
            total += sum(python_bytes(times) for times in self._recent.times)
            owns = self._ledgers.owns
            entries, flights = self._entries, self._flights
            for record in self._forwards:  # [at, (topic, ledger, ids) …]: the ids dominate
                total += python_bytes(record) + python_bytes(record[0])
                for topic, ledger_id, ids in zip(record[1::3], record[2::3], record[3::3], strict=True):
                    # (ints the registry's key or an entry's or flight's key holds are counted there)
                    total += 0 if owns(topic, ledger_id) else _int_bytes(ledger_id)
                    shared = isinstance(ids, int) and (
                        (topic, ledger_id, ids) in entries or (topic, ledger_id, ids) in flights
                    )
                    total += 0 if shared else _ids_bytes(ids)

            def key_bytes(key: Key) -> int:
                return _TUPLE3 + (0 if owns(key[0], key[1]) else _int_bytes(key[1])) + _int_bytes(key[2])

            total += _scaled(entries, sample, lambda key, entry: key_bytes(key) + _entry_bytes(entry))
            total += _scaled(flights, sample, lambda key, flight: key_bytes(key) + python_bytes(flight))
            total += self.lateness.nbytes + self.dues.nbytes
        return total


_TUPLE3 = python_bytes(("t", 1 << 40, 1 << 40))
_U32 = np.dtype(np.uint32)


def _ids_bytes(ids: KeptIds) -> int:
    if isinstance(ids, int):
        return _int_bytes(ids)
    if isinstance(ids, bytes):
        return python_bytes(ids)
    if isinstance(ids, np.ndarray):  # getsizeof counts an array's data only when the array owns it
        return python_bytes(ids) + (ids.nbytes if ids.base is not None else 0)
    return python_bytes(ids) + sum(_int_bytes(i) for i in ids)


def _ints(ids: KeptIds) -> Sequence[int]:
    """Plain ints of a sequence, numpy array or uint32 bytes, or one int (numpy ints would make other
    dict keys)."""
    if isinstance(ids, int):
        return (ids,)
    if isinstance(ids, bytes):
        return np.frombuffer(ids, _U32).tolist()  # type: ignore[no-any-return]
    return ids.tolist() if isinstance(ids, np.ndarray) else ids


def _int_bytes(value: int) -> int:
    return 0 if -5 <= value <= 256 else python_bytes(value)  # small ints are shared by CPython


def _entry_bytes(entry: _Entry) -> int:
    """An entry's record but its key. O(flights + parked)."""
    acked = entry.acked
    shared = _ALL_BUT_ONE.get(acked) is acked
    total = python_bytes(entry) + _int_bytes(entry.out) + _int_bytes(entry.pending)
    total += 0 if shared else _int_bytes(acked)
    if entry.flights is not None:
        flights = _flight_list(entry)
        total += len(flights) * python_bytes(_Flight(0, 0, None))
        if type(entry.flights) is not _Flight:
            total += python_bytes(entry.flights)
    if entry.parked:
        total += python_bytes(entry.parked) + sum(python_bytes(c) for c in entry.parked.values())
    return total


def _scaled(items: dict[Key, Any], sample: int, size: Callable[[Key, Any], int]) -> int:
    """``size`` summed over a sample of ``items``, scaled to all of them."""
    if not items:
        return 0
    taken = list(itertools.islice(items.items(), sample))
    return round(sum(size(k, v) for k, v in taken) * len(items) / len(taken))
