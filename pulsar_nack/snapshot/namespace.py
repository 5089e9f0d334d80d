"""Whose snapshot is it: the key of a subscription's segments, and the view of a storage under that key.

Several consumers may share one storage (one ``snapshot_dir`` for a whole application). Each consumer's
segments are kept apart by a **key** that names the subscription — the topics, the subscription name and
the consumer name the application gave (if any) — and every file name it uses is prefixed with that key:
``<key>.seg-<sequence>.pnk``. The key is ``<readable>-<digest>``: ``readable`` is the subscription name
reduced to ``[A-Za-z0-9_-]`` (at most 40 characters, for people listing the directory); ``digest`` is the
first 24 hex digits of a BLAKE2b hash of the canonical topic names (sorted, short names expanded to
``persistent://public/default/...`` as the broker does), the subscription name and the consumer name —
what actually keeps two subscriptions apart.

:class:`SubscriptionStorage` is that view: a :class:`~pulsar_nack.snapshot.storage.SnapshotStorage` whose
names are the store's own (``seg-....pnk``) and whose files are the base storage's with the prefix. On a
:class:`~pulsar_nack.snapshot.storage.LocalDirectoryStorage` it also takes an exclusive ``flock`` on
``<key>.lock`` for as long as the consumer lives (:meth:`SubscriptionStorage.lock`): two live consumers
with the same key — two consumers of one Shared subscription without distinct ``consumer_name`` — would
overwrite each other's segments, so the second is refused. The kernel drops the lock when the process
dies, also by ``kill -9``, so a restarted consumer takes it again.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
from collections.abc import Sequence
from typing import Any

from pulsar_nack.snapshot.storage import LocalDirectoryStorage, SnapshotStorage, SnapshotStorageError

__all__ = ["SubscriptionStorage", "canonical_topic", "snapshot_key"]

_READABLE = re.compile(r"[^A-Za-z0-9_-]+")
_READABLE_CHARS = 40
_DIGEST_BYTES = 12
_LOCK_SUFFIX = ".lock"


def canonical_topic(topic: str) -> str:
    """A topic's full name, as the broker resolves a short one: ``t`` →
    ``persistent://public/default/t``; ``tenant/ns/t`` → ``persistent://tenant/ns/t``. O(len(topic))."""
    if "://" in topic:
        return topic
    if topic.count("/") == 2:
        return f"persistent://{topic}"
    return f"persistent://public/default/{topic}"


def snapshot_key(topic: Any, subscription: str, consumer_name: str | None = None) -> str:
    """The key of a consumer's snapshot (see the module docstring). ``topic``: what ``subscribe`` takes —
    a name, a list of names, or a compiled regex (its pattern is used). O(total length of the names).

    Raises ``TypeError`` naming ``topic``/``subscription_name``/``consumer_name`` for values of another
    type, ``ValueError`` for an empty topic list or subscription name."""
    if isinstance(topic, str):
        topics = [canonical_topic(topic)]
    elif isinstance(topic, re.Pattern):
        topics = [f"regex:{topic.pattern}"]
    elif isinstance(topic, Sequence) and all(isinstance(t, str) for t in topic):
        topics = sorted({canonical_topic(t) for t in topic})
        if not topics:
            raise ValueError("topic: an empty list of topics has no snapshot")
    else:
        raise TypeError(f"topic must be a str, a list of str or a regex, got {type(topic).__name__}")
    if not isinstance(subscription, str):
        raise TypeError(f"subscription_name must be a str, got {type(subscription).__name__}")
    if not subscription:
        raise ValueError("subscription_name must not be empty")
    if consumer_name is not None and not isinstance(consumer_name, str):
        raise TypeError(f"consumer_name must be a str or None, got {type(consumer_name).__name__}")
    identity = "\0".join([*topics, "", subscription, "", consumer_name or ""])
    digest = hashlib.blake2b(identity.encode("utf-8"), digest_size=_DIGEST_BYTES).hexdigest()
    readable = _READABLE.sub("_", subscription)[:_READABLE_CHARS].strip("_-") or "sub"
    return f"{readable}-{digest}"


class SubscriptionStorage:
    """One subscription's view of a shared :class:`SnapshotStorage`: names prefixed with ``key + "."``.
    Every method is the base storage's, O(its cost); :meth:`list` is O(names in the base storage)."""

    def __init__(self, base: SnapshotStorage, key: str) -> None:
        if not isinstance(base, SnapshotStorage):
            raise TypeError(f"snapshot_storage must be a SnapshotStorage, got {type(base).__name__}")
        self.base = base
        self.key = key
        self._prefix = key + "."
        self._lock_fd: int | None = None

    def put(self, name: str, data: bytes) -> None:
        self.base.put(self._prefix + name, data)

    def get(self, name: str) -> bytes:
        return self.base.get(self._prefix + name)

    def delete(self, name: str) -> None:
        self.base.delete(self._prefix + name)

    def list(self) -> list[str]:
        prefix = self._prefix
        return [n[len(prefix) :] for n in self.base.list() if n.startswith(prefix) and n != self._lock_name]

    @property
    def _lock_name(self) -> str:
        return self.key + _LOCK_SUFFIX

    def lock(self) -> None:
        """On a local directory: hold ``<key>.lock`` exclusively until :meth:`unlock` or the process
        ends; raises :class:`SnapshotStorageError` (``EBUSY``) if another live consumer holds it. Other
        storages: nothing (they cannot tell). Idempotent. O(1)."""
        if self._lock_fd is not None or not isinstance(self.base, LocalDirectoryStorage):
            return
        path = os.path.join(self.base.path, self._lock_name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise SnapshotStorageError(exc.errno, f"cannot open {path}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise SnapshotStorageError(
                    errno.EBUSY,
                    f"the snapshot {self.key} in {self.base.path} is in use by another live consumer of the "
                    "same subscription: give each consumer its own consumer_name (or snapshot_dir)",
                ) from None
            raise SnapshotStorageError(exc.errno, f"cannot lock {path}: {exc}") from exc
        self._lock_fd = fd

    def unlock(self) -> None:
        """Release :meth:`lock` (the file stays: removing it would race with a consumer taking it)."""
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
