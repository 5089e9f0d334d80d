"""Snapshots on a Pulsar topic: :class:`TopicSnapshotStorage`, for consumers without a disk of their own.

A consumer restarted on another machine — a container rescheduled without its volume — finds its pending
nacks where it finds its messages: on the broker. Every blob is one message whose key
(``partition_key``) is the blob's name; a delete is an empty message with that key — a *tombstone*, what
Pulsar's topic compaction removes, so a compacted topic holds one message per live segment. The names are
those of the consumer's :class:`~pulsar_nack.snapshot.namespace.SubscriptionStorage` view (the
subscription's key, then ``seg-….pnk``), so consumers of many subscriptions may share one topic and each
still reads only its own; one topic per subscription keeps the read at start small.

What it guarantees: a ``put``/``delete`` returned once the broker persisted the message (a synchronous
send); a reader sees the writes of a storage in order, so the latest message of a key is its value. At
construction the whole topic is read once (a reader from the earliest message, until none is available)
and kept in memory — O(topic size) time and memory, bounded by ``max_bytes`` per message; after that
``get``/``list`` are served from memory and this process's own writes; :meth:`TopicSnapshotStorage.refresh`
reads on from where the last read ended (the writes of other processes: a member of a Shared subscription
taking over a dead member's snapshot). One writer per name (the consumer that owns the key): the member
locks (:class:`~pulsar_nack.snapshot.storage.MemberLocks`) are Exclusive subscriptions, one per key, on the
topic ``<topic>-members`` (nothing is ever published there): a live consumer holds its key's, the broker
drops it with the consumer's connection — at once for a process killed on a live machine, after the
broker's keep-alive timeout for a machine that vanished — which is also when it hands the consumer's
unacked messages to the others. A second consumer of the same key is refused; a member whose lock can
be taken is dead. A live member also holds an *alive marker* on ``<topic>-members-<key>``
(:meth:`TopicSnapshotStorage.announce_member`), which the broker hands to a watching member the moment
the member's connection goes (:meth:`TopicSnapshotStorage.watch_member`). A segment must fit the
broker's ``maxMessageSize`` (5 MB by default; a
segment holds at most 5,000 ids and a merge of four at most 20,000: a few hundred KB at worst); a larger
one fails to write and the store keeps it in memory, with a warning (chunking would lift the limit, but
pulsar-lite 0.2.0 mixes up the chunks of two producers of one topic). Retention: the topic must keep its
messages (a retention policy, or a subscription on it) — with the broker's default retention a topic
without subscriptions may be trimmed.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

import pulsar

from pulsar_nack.native.client import OK, REFUSED, subscribe_exclusive_async
from pulsar_nack.snapshot.storage import SnapshotStorageError, check_name

__all__ = ["TopicSnapshotStorage"]

_log = logging.getLogger(__name__)

_READ_TIMEOUT_MS = 30_000
_LOCK_TIMEOUT_MS = 3_000
_LOCK_WAIT_MS = 60_000  # the broker's keep-alive timeout is 30 s by default (keepAliveIntervalSeconds)
_OPENED = ".opened"  # not a valid blob name (check_name): never collides with one


class TopicSnapshotStorage:
    """A :class:`~pulsar_nack.snapshot.storage.SnapshotStorage` (and
    :class:`~pulsar_nack.snapshot.storage.MemberLocks`) on the Pulsar topic ``topic``, written and read
    through ``client`` (a ``pulsar.Client`` or ``pulsar_nack.Client``). See the module docstring.

    ``lock_timeout_ms``: how long :meth:`lock_member` waits for the broker's answer; no answer counts as
    *held* (pulsar-lite 0.2.0 never answers a second Exclusive consumer: the subscribe times out).
    ``lock_wait_ms``: how long a consumer subscribing asks again for its own key's lock while it is held
    (:meth:`SubscriptionStorage.lock <pulsar_nack.snapshot.namespace.SubscriptionStorage.lock>`) — the
    previous owner may be a vanished machine whose consumers the broker drops only after its keep-alive
    timeout; then ``SnapshotStorageError`` (``EBUSY``).
    ``alive_client``: another ``pulsar.Client`` for the alive marker (:meth:`announce_member`), so that
    it has a connection of its own, opened after ``client``'s: a dying process's connections are closed
    last-opened-first, so the broker sees the marker's go first and hands it to a watcher before it
    hands out the member's messages — Apache Pulsar does; pulsar-lite 0.2.0 handles two connections
    that close at once in either order, so it may still hand a few messages out first (docs/snapshots.md,
    "The race that is left").
    ``probe_client``: another ``pulsar.Client`` for asking whether *other* members are alive
    (:meth:`lock_member` with ``probe=True``), so that the question has a connection of its own:
    pulsar-lite 0.2.0 answers an Exclusive subscribe that it refuses by closing the connection — with
    it every consumer and producer on it, and a consumer's unacked messages go back to the broker
    (handed out again: duplicates; its own member lock dropped until it reconnects). Apache Pulsar
    answers ``ConsumerBusy`` and keeps the connection. Without it, ``client`` asks.
    Thread-safe: one lock orders the writes, reads and refreshes of the in-memory copy.

    Raises :class:`~pulsar_nack.snapshot.storage.SnapshotStorageError` if the topic cannot be read at
    construction, and from every method whose broker operation fails; ``TypeError`` for a ``client`` or
    ``topic`` of the wrong type."""

    def __init__(
        self,
        client: Any,
        topic: str,
        *,
        max_bytes: int = 256 * 2**20,
        read_timeout_ms: int = _READ_TIMEOUT_MS,
        lock_timeout_ms: int = _LOCK_TIMEOUT_MS,
        lock_wait_ms: int = _LOCK_WAIT_MS,
        alive_client: Any = None,
        probe_client: Any = None,
    ) -> None:
        if not isinstance(client, pulsar.Client):
            raise TypeError(f"client must be a pulsar.Client, got {type(client).__name__}")
        if not isinstance(topic, str) or not topic:
            raise TypeError(f"topic must be a non-empty str, got {topic!r}")
        if not isinstance(lock_timeout_ms, int) or lock_timeout_ms < 1:
            raise ValueError(f"lock_timeout_ms must be an int >= 1, got {lock_timeout_ms!r}")
        if not isinstance(lock_wait_ms, int) or lock_wait_ms < 0:
            raise ValueError(f"lock_wait_ms must be an int >= 0, got {lock_wait_ms!r}")
        self.topic = topic
        self.members_topic = topic + "-members"
        self.max_bytes = int(max_bytes)
        self.read_timeout_ms = int(read_timeout_ms)
        self.lock_timeout_ms = lock_timeout_ms
        self.lock_wait_ms = lock_wait_ms
        self._client = client
        if alive_client is not None and not isinstance(alive_client, pulsar.Client):
            raise TypeError(f"alive_client must be a pulsar.Client, got {type(alive_client).__name__}")
        self._alive_client = alive_client if alive_client is not None else client
        if probe_client is not None and not isinstance(probe_client, pulsar.Client):
            raise TypeError(f"probe_client must be a pulsar.Client, got {type(probe_client).__name__}")
        self._probe_client = probe_client if probe_client is not None else client
        self._blobs: dict[str, bytes] = {}
        self._lock = threading.RLock()
        self._members: dict[str, Any] = {}  # key → the _pulsar.Consumer holding its Exclusive subscription
        self._alive: dict[str, Any] = {}  # own key → the consumer holding its alive marker (announce_member)
        self._watches: dict[str, Any] = {}  # peer key → the consumer waiting for its alive marker
        try:
            self._producer = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
            # A tombstone of a key no blob can have: the topic is never empty when read (pulsar-lite 0.2.0
            # fails has_message_available on an empty topic), and compaction removes it.
            self._producer.send(b"", partition_key=_OPENED)
            self._reader = client.create_reader(self.topic, pulsar.MessageId.earliest)
            self._read_on()
        except pulsar.PulsarException as exc:
            raise SnapshotStorageError(errno.EIO, f"cannot open snapshot topic {topic}: {exc}") from exc

    def _read_on(self) -> None:
        """Read from where the last read ended to the end of the topic: the latest value of every key.
        O(messages read)."""
        with self._lock:
            while self._reader.has_message_available():
                message = self._reader.read_next(self.read_timeout_ms)
                name, data = message.partition_key(), message.data()
                if name == _OPENED:
                    continue
                if len(data) > self.max_bytes:
                    raise SnapshotStorageError(
                        errno.EFBIG,
                        f"snapshot {name} in {self.topic} has {len(data)} bytes, more than allowed",
                    )
                if data:
                    self._blobs[name] = data
                else:
                    self._blobs.pop(name, None)

    def refresh(self) -> None:
        """Read the messages written since the last read — other processes' writes (this one's are known
        already; read again, they end in the same state). O(messages read)."""
        try:
            self._read_on()
        except pulsar.PulsarException as exc:
            raise SnapshotStorageError(errno.EIO, f"cannot read snapshot topic {self.topic}: {exc}") from exc

    def _send(self, name: str, data: bytes) -> None:
        try:
            self._producer.send(data, partition_key=name)
        except pulsar.PulsarException as exc:
            raise SnapshotStorageError(
                errno.EIO, f"cannot write snapshot {name} to {self.topic}: {exc}"
            ) from exc

    def put(self, name: str, data: bytes) -> None:
        """One message keyed ``name``, sent synchronously. O(len(data))."""
        check_name(name)
        if not data:
            raise SnapshotStorageError(errno.EINVAL, f"snapshot {name}: an empty blob is a tombstone")
        with self._lock:
            self._send(name, bytes(data))
            self._blobs[name] = bytes(data)

    def get(self, name: str) -> bytes:
        with self._lock:
            try:
                return self._blobs[check_name(name)]
            except KeyError:
                raise SnapshotStorageError(errno.ENOENT, f"no snapshot {name} in {self.topic}") from None

    def delete(self, name: str) -> None:
        """A tombstone for ``name`` (nothing is sent for a name not stored). O(1)."""
        with self._lock:
            if check_name(name) in self._blobs:
                self._send(name, b"")
                del self._blobs[name]

    def list(self) -> list[str]:
        with self._lock:
            return sorted(self._blobs)

    def lock_member(self, key: str, *, probe: bool = False) -> bool:
        """Subscribe to ``<topic>-members`` as the one Exclusive consumer of the subscription ``key``:
        True if taken; False if held by this storage (a live consumer of this process), if the broker
        refuses (``ConsumerBusy``: a live consumer holds it) or does not answer within
        ``lock_timeout_ms``. A subscription that succeeds after that wait is closed at once. ``probe``:
        another member's key — asked through ``probe_client`` (see the class docstring; a dead
        member's lock taken is then held there while its snapshot is adopted). Raises
        :class:`~pulsar_nack.snapshot.storage.SnapshotStorageError` for another failure. One round
        trip."""
        check_name(key)
        with self._lock:
            if key in self._members:
                return False
        answered = threading.Event()
        outcome: dict[str, Any] = {}
        guard = threading.Lock()

        def settled(result: Any, consumer: Any) -> None:  # a client thread: record, or close if too late
            with guard:
                late = outcome.setdefault("late", False)
                if not late:
                    outcome["result"], outcome["consumer"] = result, consumer
            if late and result == OK:
                consumer.close_async(lambda _result: None)
            answered.set()

        client = self._probe_client if probe else self._client
        subscribe_exclusive_async(client, self.members_topic, key, settled)
        answered.wait(self.lock_timeout_ms / 1000)
        with guard:
            if "result" not in outcome:
                outcome["late"] = True
                return False
        result = outcome["result"]
        if result == OK:
            with self._lock:
                self._members[key] = outcome["consumer"]
            return True
        if result in REFUSED:
            return False
        raise SnapshotStorageError(errno.EIO, f"cannot lock {key} on {self.members_topic}: {result}")

    def unlock_member(self, key: str, *, forget: bool = False) -> None:
        """Close the lock's consumer; ``forget``: unsubscribe instead (the member's lock subscription is
        deleted: it was taken over). Never raises. One round trip."""
        with self._lock:
            consumer = self._members.pop(key, None)
            alive = self._alive.pop(key, None)
        if alive is not None:  # its own: the marker goes to a watcher, who finds the lock free
            with contextlib.suppress(Exception):
                self.delete(key + ".lock")
            with contextlib.suppress(Exception):
                alive.close()
        elif forget:  # a dead member's, taken over: nobody is to watch it any more
            with contextlib.suppress(Exception):
                self.delete(key + ".lock")
        if consumer is None:
            return
        with contextlib.suppress(Exception):
            if forget:
                consumer.unsubscribe()
            else:
                consumer.close()

    #: a watch reports a close as well as a death (the marker goes back with either)
    watch_sees_close = True

    def alive_topic(self, key: str) -> str:
        """The topic of ``key``'s alive marker: ``<topic>-members-<key>``."""
        return f"{self.members_topic}-{check_name(key)}"

    def announce_member(self, key: str) -> None:
        """Hold ``key``'s *alive marker*: subscribe the Shared subscription ``alive`` of
        :meth:`alive_topic` (receiver queue 1), publish one marker (a random nonce) and receive it without
        acking it (older markers are acked); then put the blob ``<key>.lock`` that tells the other members
        to watch it. A member watching (:meth:`watch_member`) is a second consumer of that subscription
        that gets nothing while this one holds the marker; when this consumer's connection goes (a
        killed process, a close), the broker hands the unacked marker to a watcher at once — as it hands
        the member's unacked messages of the data topic to the others. Without the marker back within
        ``lock_timeout_ms`` (a watcher took it), the member is not watchable: others keep looking every
        few seconds. Raises :class:`~pulsar_nack.snapshot.storage.SnapshotStorageError` if the broker
        refuses. A few round trips."""
        topic = self.alive_topic(key)
        nonce = secrets.token_hex(16).encode()
        try:
            consumer = pulsar.Client.subscribe(
                self._alive_client,
                topic,
                "alive",
                consumer_type=pulsar.ConsumerType.Shared,
                receiver_queue_size=1,
                initial_position=pulsar.InitialPosition.Earliest,
            )
            producer = pulsar.Client.create_producer(self._client, topic, batching_enabled=False)
            try:
                producer.send(nonce)
            finally:
                producer.close()
        except pulsar.PulsarException as exc:
            raise SnapshotStorageError(errno.EIO, f"cannot announce member {key} on {topic}: {exc}") from exc
        deadline = time.monotonic() + self.lock_timeout_ms / 1000
        held = False
        while not held and time.monotonic() < deadline:
            try:
                message = consumer.receive(max(1, int((deadline - time.monotonic()) * 1000)))
            except pulsar.Timeout:
                break
            except pulsar.PulsarException as exc:
                _log.warning("cannot receive the alive marker of member %s (%s)", key, exc)
                break
            if message.data() == nonce:
                held = True  # kept unacked for as long as this consumer lives
            else:
                consumer.acknowledge(message)  # a marker of an earlier life of this key
        with self._lock:
            self._alive[key] = consumer
        if not held:
            _log.warning("member %s did not get its alive marker back: its death is noticed late", key)
            return
        self.put(key + ".lock", nonce)

    def watch_member(self, key: str, on_death: Callable[[], None]) -> bool:
        """Wait for ``key``'s alive marker (see :meth:`announce_member`) as a second consumer of its
        Shared subscription: ``on_death()`` runs once, on a client listener thread, when the broker
        hands it the marker — the holder's connection went. False if ``key`` has no ``<key>.lock``
        blob (not announced) or is this storage's own. True if watched already. One round trip."""
        with self._lock:
            if key in self._watches:
                return True
            if key in self._alive or key in self._members or check_name(key + ".lock") not in self._blobs:
                return False
        fired = threading.Event()

        def marker(_consumer: Any, _message: Any) -> None:  # a client listener thread
            if not fired.is_set():
                fired.set()
                on_death()

        try:
            consumer = pulsar.Client.subscribe(
                self._client,
                self.alive_topic(key),
                "alive",
                consumer_type=pulsar.ConsumerType.Shared,
                receiver_queue_size=1,
                initial_position=pulsar.InitialPosition.Earliest,
                message_listener=marker,
            )
        except pulsar.PulsarException as exc:
            _log.warning("cannot watch member %s (%s); looking every few seconds instead", key, exc)
            return False
        with self._lock:
            self._watches[key] = consumer
        return True

    def unwatch_member(self, key: str, *, forget: bool = False) -> None:
        """Close the watch's consumer (its marker, if it got one, goes back to the subscription);
        ``forget``: unsubscribe instead (the member was taken over: nobody needs its marker). Never
        raises. One round trip."""
        with self._lock:
            consumer = self._watches.pop(key, None)
        if consumer is not None:
            with contextlib.suppress(Exception):
                if forget:
                    consumer.unsubscribe()
                else:
                    consumer.close()

    def poll_deaths(self) -> None:
        """Nothing: a death is seen only when the broker hands the dead member's marker over, on the
        client's thread (the marker may come a moment after the member's data: docs/snapshots.md)."""

    def watched_members(self) -> builtins.list[str]:
        """The keys watched now, sorted."""
        with self._lock:
            return sorted(self._watches)

    def close(self) -> None:
        """Close the producer, the reader, the member locks and watches (the client closes them too)."""
        for key in list(self._watches):
            self.unwatch_member(key)
        for key in list(self._members):
            self.unlock_member(key)
        with contextlib.suppress(pulsar.PulsarException):
            self._producer.close()
        with contextlib.suppress(pulsar.PulsarException):
            self._reader.close()
