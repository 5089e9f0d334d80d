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
  receive), and then every ``interval_ms`` on the tracker's timer thread.
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
from pulsar_nack.snapshot.storage import SnapshotStorage, SnapshotStorageError

__all__ = ["Takeover"]

_log = logging.getLogger(__name__)


class Takeover:
    """One member's watch over the others: :meth:`run` adopts every dead member's snapshot now; calling
    the object starts it on a thread of its own at most every ``interval_ms`` (the tracker calls it on
    its timer thread, which must not wait: asking a topic storage whether a member lives takes a broker
    round trip, up to its ``lock_timeout_ms`` on a broker that does not answer).

    ``view``: this member's storage view (locked); ``adopt``: takes a dead member's storage view and
    returns how many ids it adopted (:meth:`NackTracker.adopt <pulsar_nack.tracker.NackTracker.adopt>`).
    """

    def __init__(
        self,
        view: SubscriptionStorage,
        adopt: Callable[[SnapshotStorage], int],
        *,
        interval_ms: int = 5_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(interval_ms, int) or interval_ms < 0:
            raise ValueError(f"interval_ms must be an int >= 0, got {interval_ms!r}")
        self.view = view
        self._adopt = adopt
        self.interval_ms = interval_ms
        self._clock = clock
        self._last: float | None = None
        self._running: threading.Thread | None = None
        self._stopped = False
        self.adopted_members = 0
        self.adopted_ids = 0

    def __call__(self) -> None:
        """Start :meth:`run` on a daemon thread if ``interval_ms`` passed since the last run and none is
        running. O(1)."""
        now = self._clock()
        due = self._last is None or (now - self._last) * 1000 >= self.interval_ms
        if due and not self._stopped and (self._running is None or not self._running.is_alive()):
            self._last = now
            self._running = threading.Thread(
                target=self._run_logged, name="pulsar-nack-takeover", daemon=True
            )
            self._running.start()

    def stop(self) -> None:
        """No further run, and no further member adopted by one in progress (its current adoption
        finishes). O(1); does not wait."""
        self._stopped = True

    def _run_logged(self) -> None:
        try:
            self.run()
        except Exception:  # a bug: keep watching at the next interval
            _log.exception("taking over dead members' snapshots failed")

    def run(self) -> int:
        """Adopt the snapshot of every member whose lock can be taken; returns how many ids. A storage
        failure is logged and retried at the next run. O(names in the storage + ids adopted)."""
        self._last = self._clock()
        try:
            peers = self.view.peers()
        except SnapshotStorageError as exc:
            _log.warning("cannot list the other members' snapshots (%s); retrying later", exc)
            return 0
        total = 0
        for key in peers:
            if self._stopped:
                break
            peer = self.view.peer(key)
            try:
                if not peer.try_lock():
                    continue  # alive
            except SnapshotStorageError as exc:
                _log.warning("cannot tell whether member %s is alive (%s); retrying later", key, exc)
                continue
            adopted = False
            try:
                count = self._adopt(peer)
                adopted = True
            except SnapshotStorageError as exc:
                _log.warning("cannot take over the snapshot of dead member %s (%s); retrying later", key, exc)
                continue
            finally:
                peer.unlock(forget=adopted)
            self.adopted_members += 1
            self.adopted_ids += count
            total += count
            _log.info("took over %d pending nacks of a dead member of the subscription (%s)", count, key)
        return total
