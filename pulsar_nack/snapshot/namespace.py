"""Whose snapshot is it: the key of a subscription's segments, and the view of a storage under that key.

Several consumers may share one storage (one ``snapshot_dir`` for a whole application). Each consumer's
segments are kept apart by a **key** that names the subscription — the topics, the subscription name and
the consumer name the application gave (if any) — and every file name it uses is prefixed with that key:
``<key>.seg-<sequence>.pnk``. The key is ``<readable>-<subscription digest>-<consumer digest>``:
``readable`` is the subscription name reduced to ``[A-Za-z0-9_-]`` (at most 40 characters, for people
listing the directory); the subscription digest is the first 20 hex digits of a BLAKE2b hash of the
canonical topic names (sorted, short names expanded to ``persistent://public/default/...`` as the broker
does) and the subscription name — what keeps two subscriptions apart; the consumer digest, 8 hex digits of
one of the consumer name, keeps the members of one subscription apart. Every member's key starts with
the same :func:`subscription_prefix`, so a member finds the others' snapshots by listing the storage
(:meth:`SubscriptionStorage.peers`): how a Shared subscription's consumers take over a dead member's
pending nacks (:mod:`~pulsar_nack.snapshot.takeover`).

:class:`SubscriptionStorage` is that view: a :class:`~pulsar_nack.snapshot.storage.SnapshotStorage` whose
names are the store's own (``seg-....pnk``) and whose files are the base storage's with the prefix. On a
storage that has member locks (:class:`~pulsar_nack.snapshot.storage.MemberLocks`: a local directory, a
``flock`` on ``<key>.lock``; a Pulsar topic, an Exclusive subscription) it also holds its key's lock for
as long as the consumer lives (:meth:`SubscriptionStorage.lock`): two live consumers with the same key —
two consumers of one Shared subscription without distinct ``consumer_name`` — would overwrite each other's
segments, so the second is refused. The lock goes when the process dies, also by ``kill -9`` (the kernel
drops the ``flock``; the broker drops the subscription's consumer with its connection), so a restarted
consumer takes it again — and so another member can tell that the snapshot's owner is dead.
"""

from __future__ import annotations

import builtins
import errno
import hashlib
import logging
import re
import time
from collections.abc import Sequence
from typing import Any

from pulsar_nack.snapshot.storage import MemberLocks, MemberWatch, SnapshotStorage, SnapshotStorageError

__all__ = [
    "SubscriptionStorage",
    "canonical_topic",
    "legacy_snapshot_key",
    "snapshot_key",
    "subscription_prefix",
]

_log = logging.getLogger(__name__)

_READABLE = re.compile(r"[^A-Za-z0-9_-]+")
_READABLE_CHARS = 40
_SUBSCRIPTION_DIGEST_BYTES = 10
_CONSUMER_DIGEST_BYTES = 4
_LEGACY_DIGEST_BYTES = 12
_KEY = re.compile(r"(?P<prefix>.+-[0-9a-f]{20}-)(?P<consumer>[0-9a-f]{8})")
_LOCK_SUFFIX = ".lock"


def canonical_topic(topic: str) -> str:
    """A topic's full name, as the broker resolves a short one: ``t`` →
    ``persistent://public/default/t``; ``tenant/ns/t`` → ``persistent://tenant/ns/t``. O(len(topic))."""
    if "://" in topic:
        return topic
    if topic.count("/") == 2:
        return f"persistent://{topic}"
    return f"persistent://public/default/{topic}"


def subscription_prefix(topic: Any, subscription: str) -> str:
    """What the keys of every member of a subscription start with: ``<readable>-<subscription digest>-``
    (see the module docstring). Arguments and errors as :func:`snapshot_key`'s. O(length of the names)."""
    return snapshot_key(topic, subscription)[: -2 * _CONSUMER_DIGEST_BYTES]


def legacy_snapshot_key(topic: Any, subscription: str, consumer_name: str | None = None) -> str:
    """The key the snapshots of the first release of this package were written under,
    ``<readable>-<24 hex digits of BLAKE2b(topics, subscription, consumer name)>``: a consumer takes a
    snapshot it finds there over (:meth:`SubscriptionStorage.peers`), so that an upgrade loses no
    pending nack. Arguments and errors as :func:`snapshot_key`'s. O(length of the names)."""
    snapshot_key(topic, subscription, consumer_name)  # checks the arguments
    identity = "\0".join([*_topics(topic), "", subscription, "", consumer_name or ""])
    digest = hashlib.blake2b(identity.encode("utf-8"), digest_size=_LEGACY_DIGEST_BYTES).hexdigest()
    return f"{_readable(subscription)}-{digest}"


def _readable(subscription: str) -> str:
    return _READABLE.sub("_", subscription)[:_READABLE_CHARS].strip("_-") or "sub"


def _topics(topic: Any) -> list[str]:
    """The canonical topic names of what ``subscribe`` takes (see :func:`snapshot_key`)."""
    if isinstance(topic, str):
        return [canonical_topic(topic)]
    if isinstance(topic, re.Pattern):
        return [f"regex:{topic.pattern}"]
    if isinstance(topic, Sequence) and all(isinstance(t, str) for t in topic):
        topics = sorted({canonical_topic(t) for t in topic})
        if not topics:
            raise ValueError("topic: an empty list of topics has no snapshot")
        return topics
    raise TypeError(f"topic must be a str, a list of str or a regex, got {type(topic).__name__}")


def snapshot_key(topic: Any, subscription: str, consumer_name: str | None = None) -> str:
    """The key of a consumer's snapshot (see the module docstring). ``topic``: what ``subscribe`` takes —
    a name, a list of names, or a compiled regex (its pattern is used). O(total length of the names).

    Raises ``TypeError`` naming ``topic``/``subscription_name``/``consumer_name`` for values of another
    type, ``ValueError`` for an empty topic list or subscription name."""
    topics = _topics(topic)
    if not isinstance(subscription, str):
        raise TypeError(f"subscription_name must be a str, got {type(subscription).__name__}")
    if not subscription:
        raise ValueError("subscription_name must not be empty")
    if consumer_name is not None and not isinstance(consumer_name, str):
        raise TypeError(f"consumer_name must be a str or None, got {type(consumer_name).__name__}")
    identity = "\0".join([*topics, "", subscription])
    digest = hashlib.blake2b(identity.encode("utf-8"), digest_size=_SUBSCRIPTION_DIGEST_BYTES).hexdigest()
    member = hashlib.blake2b(
        (consumer_name or "").encode("utf-8"), digest_size=_CONSUMER_DIGEST_BYTES
    ).hexdigest()
    return f"{_readable(subscription)}-{digest}-{member}"


class SubscriptionStorage:
    """One subscription's view of a shared :class:`SnapshotStorage`: names prefixed with ``key + "."``.
    Every method is the base storage's, O(its cost); :meth:`list` is O(names in the base storage)."""

    def __init__(self, base: SnapshotStorage, key: str, legacy_key: str | None = None) -> None:
        """``legacy_key``: this consumer's key in the format before the subscription prefix
        (:func:`legacy_snapshot_key`): a snapshot found under it is this consumer's from before the
        upgrade, listed by :meth:`peers` so that it is taken over like a dead member's."""
        if not isinstance(base, SnapshotStorage):
            raise TypeError(f"snapshot_storage must be a SnapshotStorage, got {type(base).__name__}")
        self.base = base
        self.key = key
        self.legacy_key = legacy_key
        self._prefix = key + "."
        self._locked = False

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

    def peers(self) -> builtins.list[str]:
        """The keys of the other members of this subscription that have a snapshot in the base storage
        (segments or a pop watermark; a key with only a lock file has nothing to take over), sorted. A
        storage with a ``refresh()`` (a Pulsar topic written by other processes) is read up to its end
        first. O(names in the base storage)."""
        match = _KEY.fullmatch(self.key)
        if match is None:
            return []
        refresh = getattr(self.base, "refresh", None)
        if callable(refresh):
            refresh()
        keys = set()
        for name in self.base.list():
            key, _, rest = name.partition(".")
            if rest != _LOCK_SUFFIX[1:] and key != self.key:
                peer = _KEY.fullmatch(key)
                if (peer is not None and peer["prefix"] == match["prefix"]) or key == self.legacy_key:
                    keys.add(key)
        return sorted(keys)

    def members(self, *, refresh: bool = True) -> builtins.list[str]:
        """The keys of the other members of this subscription that announced themselves — a lock file
        in a local directory, a ``<key>.lock`` blob on a topic — with a snapshot or not: the ones to
        watch (:meth:`~pulsar_nack.snapshot.storage.MemberWatch.watch_member`). Sorted. ``refresh``: read
        a topic storage up to its end first. O(names in the base storage)."""
        match = _KEY.fullmatch(self.key)
        if match is None:
            return []
        if refresh:
            read_on = getattr(self.base, "refresh", None)
            if callable(read_on):
                read_on()
        keys = set()
        for name in self.base.list():
            key, _, rest = name.partition(".")
            if rest == _LOCK_SUFFIX[1:] and key != self.key:
                peer = _KEY.fullmatch(key)
                if peer is not None and peer["prefix"] == match["prefix"]:
                    keys.add(key)
        return sorted(keys)

    def peer(self, key: str) -> SubscriptionStorage:
        """The view of another member's snapshot (a key from :meth:`peers`), not locked. O(1)."""
        return SubscriptionStorage(self.base, key)

    def lock(self) -> None:
        """Hold this key's member lock until :meth:`unlock` or the process ends, on a storage that has
        member locks (:class:`~pulsar_nack.snapshot.storage.MemberLocks`); raises
        :class:`SnapshotStorageError` (``EBUSY``) if another live consumer holds it. A storage whose
        "held" may only mean that the holder's death is not noticed yet (a topic: the broker drops a
        vanished machine's consumers after its keep-alive timeout) sets ``lock_wait_ms``: the lock is
        asked for again, once a second, that long before giving up. Other storages: nothing (they
        cannot tell). Idempotent. O(1) (a local directory) or broker round trips."""
        if self._locked or not isinstance(self.base, MemberLocks):
            return
        deadline = time.monotonic() + getattr(self.base, "lock_wait_ms", 0) / 1000
        while not self.base.lock_member(self.key):
            if time.monotonic() >= deadline:
                where = getattr(self.base, "path", None) or getattr(
                    self.base, "topic", type(self.base).__name__
                )
                raise SnapshotStorageError(
                    errno.EBUSY,
                    f"the snapshot {self.key} in {where} is in use by another live consumer of the same "
                    "subscription: give each consumer its own consumer_name (or snapshot_dir)",
                )
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        self._locked = True
        if isinstance(self.base, MemberWatch):
            try:  # so that the other members learn of this one's death at once
                self.base.announce_member(self.key)
            except SnapshotStorageError as exc:
                _log.warning(
                    "cannot announce %s to the other members (%s): its death is noticed late", self.key, exc
                )

    def try_lock(self) -> bool:
        """Take this key's member lock if no live consumer holds it: True if taken (the owner is dead, or
        gone), False if held, or if the storage cannot tell (no member locks). O(1) or one round trip."""
        if self._locked:
            return True
        if not isinstance(self.base, MemberLocks):
            return False
        self._locked = self.base.lock_member(self.key, probe=True)
        return self._locked

    def unlock(self, *, forget: bool = False) -> None:
        """Release :meth:`lock` (a local lock file stays: removing it would race with a consumer taking
        it). ``forget``: the member is gone for good (its snapshot was taken over): a storage may drop
        what it kept for the lock (a topic's lock subscription)."""
        if self._locked and isinstance(self.base, MemberLocks):
            self.base.unlock_member(self.key, forget=forget)
        self._locked = False
