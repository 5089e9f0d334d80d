"""A Shared subscription's members take over the snapshot of a member that died.

When a consumer of a Shared subscription dies, the broker hands its unacked messages to the other
consumers at once — also those it had nacked for later. A member that knows the dead one's pending nacks
holds those copies back until their due times, exactly as the dead consumer restarted would have
(docs/snapshots.md, "Shared subscriptions: taking over a dead member").

How a member finds them (:class:`Takeover`):

* **Whose**: every member's snapshot key starts with the subscription's prefix
  (:func:`~pulsar_nack.snapshot.namespace.subscription_prefix`), so listing the storage gives the other
  members' keys (:meth:`~pulsar_nack.snapshot.namespace.SubscriptionStorage.peers`; a topic storage is
  read on to its end first).
* **Dead or alive**: a live member holds its key's member lock
  (:class:`~pulsar_nack.snapshot.storage.MemberLocks`: an ``flock`` in a local directory, an Exclusive
  subscription on a topic); the lock goes with the member's process. A key whose lock can be taken is a
  dead member's. A storage without member locks cannot tell: nothing is taken over there.
* **When**: at subscribe, right after the consumer's own snapshot is restored (before the application can
  receive); then the moment a watched member dies; and every ``interval_ms`` (a periodic look, on a
  thread of its own started from the tracker's timer thread) for the members not watched.
* **Watching** (:class:`~pulsar_nack.snapshot.storage.MemberWatch`): at each look, every other member that
  announced itself (a lock file; a topic's ``<key>.lock`` blob) is watched — one watch per member, ended
  when it is taken over or this member stops. A local directory watches the holder's process through a
  pidfd (:mod:`~pulsar_nack.snapshot.deaths`: one thread for all); a topic waits, as a second consumer of
  the member's Shared *alive* subscription, for the marker the member holds unacked — the broker hands it
  over the moment the member's connection goes, as it hands over the member's messages.
* **Holding arrivals back while adopting**: the moment a death is seen, ``hold(adoption)`` is called with
  an :class:`Adoption` (the consumer sets it on its admit path: one attribute read per message when
  none is in progress); arrivals wait on it — at most ``hold_ms`` — until the adoption is done and the
  arrival filter knows the dead member's pending nacks, then are classified (held if pending and not
  due); ``hold(None)`` when done. The broker re-dispatches the dead member's messages as soon as it sees
  its connection close, about the same moment, and a receiver may win the GIL before the watch's
  thread wakes up: so before admitting a message the receiver calls :attr:`Takeover.check_deaths`,
  which reports on its own thread a death the kernel has already queued (a local directory) — while
  a member is watched; with none (a lone consumer) it is None and the receiver pays nothing. On a
  topic the race left is one broker dispatch to the watcher.
* **How**: holding the dead member's lock, the member adds its pending nacks to its own (at their due
  times; earliest wins), writes them into its own snapshot, deletes the dead member's snapshot, then
  releases the lock (a topic's lock subscription is deleted). A crash in between leaves both snapshots:
  the next member to look adopts the rest; an id then pending twice fires once per held copy — the
  broker ignores a redelivery request for a message the consumer does not hold.
* **If the dead member comes back** (same consumer name) after the takeover, it finds no snapshot and
  starts empty: its nacks and the messages are the taker's now. While a member holds its lock to take it
  over (one storage round trip per segment), it is refused like a duplicate name (``EBUSY``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from pulsar_nack.snapshot.namespace import SubscriptionStorage
from pulsar_nack.snapshot.storage import MemberWatch, SnapshotStorage, SnapshotStorageError

__all__ = ["Adoption", "Takeover"]

_log = logging.getLogger(__name__)

#: How long a reported death's lock is tried (see Takeover._take): a topic storage's broker drops the
#: dead process's two connections in either order, and a loaded Apache broker took over 200 ms for the
#: second (a CI run: the death judged a misleading watch, 51 copies handed out early). Arrivals wait
#: meanwhile (hold_ms, 10 s, bounds that).
_REPORTED_RETRY_MS = 2_000


class Adoption:
    """A dead member's snapshot being adopted: arrivals :meth:`wait` until :meth:`done` (bounded)."""

    __slots__ = ("_done", "timeout_s")

    def __init__(self, timeout_ms: int) -> None:
        self._done = threading.Event()
        self.timeout_s = timeout_ms / 1000

    def wait(self) -> bool:
        """Block until the adoption is done or ``timeout_ms`` passed; True if done. O(1)."""
        return self._done.wait(self.timeout_s)

    def done(self) -> None:
        self._done.set()

    @property
    def is_done(self) -> bool:
        return self._done.is_set()


class Takeover:
    """One member's watch over the others: :meth:`run` adopts every dead member's snapshot now and watches
    the live ones; :meth:`member_died` (a watch) adopts one at once; calling the object starts a
    periodic look on a thread of its own at most every ``interval_ms`` (the tracker calls it on its
    timer thread, which must not wait: asking a topic storage whether a member lives takes a broker
    round trip, up to its ``lock_timeout_ms`` on a broker that does not answer).

    ``view``: this member's storage view (locked); ``adopt``: takes a dead member's storage view and
    returns how many ids it adopted
    (:meth:`SnapshotKeeper.adopt <pulsar_nack.snapshot.keeper.SnapshotKeeper.adopt>`);
    ``hold``: called with an :class:`Adoption` when a death is seen and with None when its adoption is
    done (see the module docstring); ``hold_ms``: how long an arrival waits for an adoption at most;
    ``publish``: called (under the takeover's lock) with :attr:`check_deaths` each time it changes, so
    that the receiver reads it as an attribute of its own (see :attr:`check_deaths`).
    """

    def __init__(
        self,
        view: SubscriptionStorage,
        adopt: Callable[[SnapshotStorage], int],
        *,
        interval_ms: int = 5_000,
        clock: Callable[[], float] = time.monotonic,
        hold: Callable[[Adoption | None], None] | None = None,
        hold_ms: int = 10_000,
        publish: Callable[[Callable[[], None] | None], None] | None = None,
    ) -> None:
        if not isinstance(interval_ms, int) or interval_ms < 0:
            raise ValueError(f"interval_ms must be an int >= 0, got {interval_ms!r}")
        if not isinstance(hold_ms, int) or hold_ms < 0:
            raise ValueError(f"hold_ms must be an int >= 0, got {hold_ms!r}")
        self.view = view
        self._adopt = adopt
        self.interval_ms = interval_ms
        self.hold_ms = hold_ms
        self._hold = hold
        self._clock = clock
        self._last: float | None = None
        self._lock = threading.Lock()
        self._running: threading.Thread | None = None  # the last worker thread started (tests join it)
        self._working = False  # a worker is on its loop (decided under the lock: no request is lost)
        self._look = False  # a periodic look is asked for
        self._dead: set[str] = set()  # members whose death a watch reported, to adopt now
        self._adoption: Adoption | None = None
        self._watched: set[str] = set()
        self._unwatchable: set[str] = set()  # a watch that reported a live member: looked at instead
        self._stopped = False
        self.adopted_members = 0
        self.adopted_ids = 0
        self.deaths_seen = 0
        self.last_death_ms: float | None = None  #: epoch ms a watch last reported a death (diagnostics)
        self._publish = publish
        self._poll: Callable[[], None] | None = (
            view.base.poll_deaths if isinstance(view.base, MemberWatch) else None
        )
        self._arming = 0  # watches being registered (run): polled from before each registration
        #: The arrival path calls it before admitting a message: the deaths the storage can already see,
        #: reported on the receiver's thread (:meth:`MemberWatch.poll_deaths`). None while this member
        #: watches no other (a lone consumer): the poll would find nothing to report, and it cost ~0.35 µs
        #: (three calls) per message - ~2 % of a consumer's CPU at 10,000 nacks/s. Set before a watch is
        #: registered (a death right after it is polled for), and back to None only under the lock that
        #: ``member_died`` holds while it calls ``hold``: by then ``adopting`` is set on the consumer.
        self.check_deaths: Callable[[], None] | None = None

    def _update_check(self) -> None:
        """(Lock held.) Poll for deaths while a member is watched or a watch is being registered;
        publish a change. O(1)."""
        check = self._poll if (self._watched or self._arming) and not self._stopped else None
        if check is not self.check_deaths:
            self.check_deaths = check
            if self._publish is not None:
                self._publish(check)

    @property
    def watched(self) -> list[str]:
        """The members watched now, sorted."""
        with self._lock:
            return sorted(self._watched)

    def __call__(self) -> None:
        """Start a periodic look (:meth:`run`) on the worker thread if ``interval_ms`` passed since the
        last. O(1)."""
        now = self._clock()
        if self._last is None or (now - self._last) * 1000 >= self.interval_ms:
            with self._lock:
                if self._stopped:
                    return
                self._last = now
                self._look = True
                self._kick()

    def member_died(self, key: str) -> None:
        """A watch saw member ``key`` die: hold arrivals back and adopt its snapshot now, on the worker
        thread. Returns at once (it runs on the watch's thread). O(1)."""
        with self._lock:
            if self._stopped:
                return
            self.deaths_seen += 1
            self.last_death_ms = time.time() * 1000
            self._watched.discard(key)
            self._dead.add(key)
            if self._adoption is None:
                self._adoption = Adoption(self.hold_ms)
                if self._hold is not None:
                    self._hold(self._adoption)
            self._update_check()  # (after hold: a receiver that no longer polls sees `adopting`)
            self._kick()

    def _kick(self) -> None:
        """(Lock held.) Make sure a worker runs."""
        if not self._working:
            self._working = True
            self._running = threading.Thread(target=self._work, name="pulsar-nack-takeover", daemon=True)
            self._running.start()

    def _work(self) -> None:
        """The worker thread: adopt the reported dead, look when asked, until nothing is left; then let
        the held arrivals go."""
        while True:
            with self._lock:
                if self._stopped or not (self._dead or self._look):
                    self._working = False
                    adoption, self._adoption = self._adoption, None
                    if adoption is not None:
                        if self._hold is not None:
                            self._hold(None)
                        adoption.done()
                    return
                dead, self._dead = sorted(self._dead), set()
                look, self._look = self._look, False
            try:
                for key in dead:
                    if self._take(key, retry_ms=_REPORTED_RETRY_MS) is None:  # it lives: the watch misled
                        _log.info(
                            "member %s, reported dead, holds its lock: looked at every few seconds", key
                        )
                        self._unwatch(key)
                        with self._lock:
                            self._unwatchable.add(key)
                if look:
                    self.run()
            except Exception:  # a bug: keep watching at the next interval
                _log.exception("taking over dead members' snapshots failed")

    def stop(self) -> None:
        """No further run, no further member adopted by one in progress (its current adoption finishes),
        every watch ended, held arrivals let go. O(watches); does not wait for a broker."""
        with self._lock:
            self._stopped = True
            watched, self._watched = sorted(self._watched), set()
            self._update_check()
            adoption, self._adoption = self._adoption, None
        if adoption is not None:
            if self._hold is not None:
                self._hold(None)
            adoption.done()
        for key in watched:
            self._unwatch(key)

    def run(self) -> int:
        """Watch every other announced member not watched yet; adopt the snapshot of every member whose
        lock can be taken — on a storage whose watch reports closes too, only of those not watched
        before this run (a member that died before its watch began sends no notice). A member with no
        snapshot whose lock can be taken (it is gone) is not watched. Returns how many ids. A storage
        failure is logged and retried at the next run. O(names in the storage + ids adopted)."""
        self._last = self._clock()
        try:
            peers = self.view.peers()
            members = self.view.members(refresh=False)
        except SnapshotStorageError as exc:
            _log.warning("cannot list the other members' snapshots (%s); retrying later", exc)
            return 0
        base = self.view.base
        watched_before = set(self.watched)
        if isinstance(base, MemberWatch):
            # Watch before looking at the locks: a member dying in between is then seen either way.
            newly = []
            for key in members:
                with self._lock:
                    if self._stopped or key in self._watched or key in self._unwatchable:
                        continue
                    self._arming += 1  # the receiver polls from now on: a death right after is seen
                    self._update_check()
                watching = False
                try:
                    watching = base.watch_member(key, lambda key=key: self.member_died(key))  # type: ignore[misc]
                finally:
                    with self._lock:
                        self._arming -= 1
                        if watching and not self._stopped:
                            self._watched.add(key)
                            newly.append(key)
                        self._update_check()
                if watching and key not in newly:  # stopped meanwhile
                    base.unwatch_member(key)
                    break
            for key in set(newly) - set(peers):  # nothing to adopt: watched only while it lives
                peer = self.view.peer(key)
                try:
                    gone = peer.try_lock()
                except SnapshotStorageError:
                    continue
                if gone:
                    peer.unlock()
                    self._unwatch(key)
                    with self._lock:
                        self._watched.discard(key)
                        self._update_check()
        total = 0
        skip_watched = getattr(base, "watch_sees_close", False)
        for key in peers:
            with self._lock:
                if self._stopped:
                    break
                if skip_watched and key in self._watched and key in watched_before:
                    continue  # alive: its watch says when it dies or closes (no lock round trip)
            total += self._take(key) or 0
        return total

    def _unwatch(self, key: str) -> None:
        base = self.view.base
        if isinstance(base, MemberWatch):
            base.unwatch_member(key)

    def _take(self, key: str, *, retry_ms: int = 0) -> int | None:
        """Adopt member ``key``'s snapshot if its lock can be taken; returns how many ids, or None if a
        live member holds the lock (0 also when the storage failed: retried at the next look).
        ``retry_ms``: try the lock again, every ms, that long (a death reported while the kernel is
        still releasing the dead process's files: the lock may go a moment after the watched close)."""
        peer = self.view.peer(key)
        base = self.view.base
        deadline = time.monotonic() + retry_ms / 1000
        try:
            while not peer.try_lock():
                if time.monotonic() >= deadline:
                    return None
                time.sleep(0.001)
        except SnapshotStorageError as exc:
            _log.warning("cannot tell whether member %s is alive (%s); retrying later", key, exc)
            return 0
        adopted = False
        try:
            count = self._adopt(peer)
            adopted = True
        except SnapshotStorageError as exc:
            _log.warning("cannot take over the snapshot of dead member %s (%s); retrying later", key, exc)
            return 0
        finally:
            peer.unlock(forget=adopted)
            if adopted and isinstance(base, MemberWatch):
                base.unwatch_member(key, forget=True)
        with self._lock:
            self._watched.discard(key)
            self._unwatchable.discard(key)
            self._update_check()
        if count:
            self.adopted_members += 1
            self.adopted_ids += count
            _log.info("took over %d pending nacks of a dead member of the subscription (%s)", count, key)
        return count
