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
``get``/``list`` are served from memory and this process's own writes. It assumes one writer per name (the
consumer that owns the key); a second live writer of the same names is not detected (the local directory's
lock is not available here). A segment must fit the broker's ``maxMessageSize`` (5 MB by default; a
segment holds at most 5,000 ids and a merge of four at most 20,000: a few hundred KB at worst); a larger
one fails to write and the store keeps it in memory, with a warning (chunking would lift the limit, but
pulsar-lite 0.2.0 mixes up the chunks of two producers of one topic). Retention: the topic must keep its
messages (a retention policy, or a subscription on it) — with the broker's default retention a topic
without subscriptions may be trimmed.
"""

from __future__ import annotations

import contextlib
import errno
from typing import Any

import pulsar

from pulsar_nack.snapshot.storage import SnapshotStorageError, check_name

__all__ = ["TopicSnapshotStorage"]

_READ_TIMEOUT_MS = 30_000
_OPENED = ".opened"  # not a valid blob name (check_name): never collides with one


class TopicSnapshotStorage:
    """A :class:`~pulsar_nack.snapshot.storage.SnapshotStorage` on the Pulsar topic ``topic``, written and
    read through ``client`` (a ``pulsar.Client`` or ``pulsar_nack.Client``). See the module docstring.

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
    ) -> None:
        if not isinstance(client, pulsar.Client):
            raise TypeError(f"client must be a pulsar.Client, got {type(client).__name__}")
        if not isinstance(topic, str) or not topic:
            raise TypeError(f"topic must be a non-empty str, got {topic!r}")
        self.topic = topic
        self.max_bytes = int(max_bytes)
        self._blobs: dict[str, bytes] = {}
        try:
            self._producer = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
            # A tombstone of a key no blob can have: the topic is never empty when read (pulsar-lite 0.2.0
            # fails has_message_available on an empty topic), and compaction removes it.
            self._producer.send(b"", partition_key=_OPENED)
            self._read_all(client, read_timeout_ms)
        except pulsar.PulsarException as exc:
            raise SnapshotStorageError(errno.EIO, f"cannot open snapshot topic {topic}: {exc}") from exc

    def _read_all(self, client: Any, read_timeout_ms: int) -> None:
        """The latest value of every key, from the earliest message on. O(messages)."""
        reader = client.create_reader(self.topic, pulsar.MessageId.earliest)
        try:
            while reader.has_message_available():
                message = reader.read_next(read_timeout_ms)
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
        finally:
            reader.close()

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
        self._send(name, bytes(data))
        self._blobs[name] = bytes(data)

    def get(self, name: str) -> bytes:
        try:
            return self._blobs[check_name(name)]
        except KeyError:
            raise SnapshotStorageError(errno.ENOENT, f"no snapshot {name} in {self.topic}") from None

    def delete(self, name: str) -> None:
        """A tombstone for ``name`` (nothing is sent for a name not stored). O(1)."""
        if check_name(name) in self._blobs:
            self._send(name, b"")
            del self._blobs[name]

    def list(self) -> list[str]:
        return sorted(self._blobs)

    def close(self) -> None:
        """Close the producer (the client closes it too)."""
        with contextlib.suppress(pulsar.PulsarException):
            self._producer.close()
