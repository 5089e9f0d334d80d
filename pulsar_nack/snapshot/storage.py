"""Where segment files live: the :class:`SnapshotStorage` protocol and its local-directory implementation.

What :class:`LocalDirectoryStorage` guarantees: a ``put`` that returned survives a crash of the process or
of the machine (the data and the directory entry are fsync-ed); a ``put`` interrupted at any point leaves
the previous file of that name intact (write to a temp file in the same directory, flush, ``fsync``,
``os.replace``, ``fsync`` the directory) — readers see the old bytes or the new, never a mix; files are
created 0600 and the directory is 0700 (pending nacks name messages of the subscription); names cannot
escape the directory. Temp files of writers that died are removed when a storage opens the directory.
It does not guarantee anything across machines: a container rescheduled without its disk starts empty.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import resource
import secrets
import stat
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from pulsar_nack.snapshot.deaths import CloseWatch

__all__ = [
    "InMemoryStorage",
    "LocalDirectoryStorage",
    "MemberLocks",
    "MemberWatch",
    "SnapshotStorage",
    "SnapshotStorageError",
    "check_name",
]

_log = logging.getLogger(__name__)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_TEMP_SUFFIX = ".tmp"
_ANNOUNCE_FD = 1000  # the lowest descriptor number for an announcement (see announce_member)
_TEMP = re.compile(r"\.(?P<name>.+)\.(?P<pid>\d+)\.[0-9a-f]{16}\.tmp")


class SnapshotStorageError(OSError):
    """A storage operation failed (I/O error, missing file, bad name, oversized file)."""


def check_name(name: str) -> str:
    """Return ``name`` if it is a safe file name: ``[A-Za-z0-9][A-Za-z0-9._-]{0,127}``, no ``..``, not a
    temp name; else raise :class:`SnapshotStorageError`. O(len(name))."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name or name.endswith(_TEMP_SUFFIX):
        raise SnapshotStorageError(errno.EINVAL, f"invalid snapshot name {name!r}")
    return name


@runtime_checkable
class SnapshotStorage(Protocol):
    """A flat namespace of immutable blobs. Every method may raise :class:`SnapshotStorageError`.

    ``put`` replaces atomically: after a crash a reader finds the old blob or the new one, whole."""

    def put(self, name: str, data: bytes) -> None: ...

    def get(self, name: str) -> bytes: ...

    def delete(self, name: str) -> None: ...

    def list(self) -> list[str]: ...


@runtime_checkable
class MemberLocks(Protocol):
    """A storage that can tell whether the consumer owning a key is alive: a live consumer holds its key's
    lock, and the lock goes with its process (also by ``kill -9``). How a consumer of a Shared
    subscription knows that a member's snapshot is a dead member's, to take over
    (:mod:`~pulsar_nack.snapshot.takeover`)."""

    def lock_member(self, key: str, *, probe: bool = False) -> bool:
        """Take ``key``'s lock: True if taken (no live holder), False if a live consumer holds it. May
        raise :class:`SnapshotStorageError` (the storage cannot be reached). ``probe``: ``key`` is
        another member's (is it alive?), not the caller's own — a storage may ask on another path."""
        ...

    def unlock_member(self, key: str, *, forget: bool = False) -> None:
        """Release a lock :meth:`lock_member` took; ``forget``: the member is gone for good."""
        ...


@runtime_checkable
class MemberWatch(Protocol):
    """A storage with member locks that can also tell when a lock's holder dies, the moment it dies — not
    only when asked (:class:`MemberLocks`): how a running member of a Shared subscription learns of
    another's death before the broker hands it the dead member's messages
    (:mod:`~pulsar_nack.snapshot.takeover`). ``watch_sees_close``: whether a watch also reports a holder
    that closed (released its lock and lives on)."""

    watch_sees_close: bool

    def announce_member(self, key: str) -> None:
        """Called by the holder of ``key``'s lock (its own, not a peer's taken over): make its death
        watchable. May raise :class:`SnapshotStorageError`."""
        ...

    def watch_member(self, key: str, on_death: Callable[[], None]) -> bool:
        """Call ``on_death()`` once, from another thread and quickly, when the holder of ``key``'s lock
        dies (or closes). False if ``key`` cannot be watched now (not announced, or a holder this
        process cannot watch): the caller keeps looking from time to time."""
        ...

    def unwatch_member(self, key: str, *, forget: bool = False) -> None:
        """Stop watching ``key``; ``forget``: the member is gone for good (taken over). Never raises."""
        ...

    def poll_deaths(self) -> None:
        """Report, on the caller's thread and now, the deaths this process could already see (the
        ``on_death`` of :meth:`watch_member`): the arrival path calls it before admitting each message,
        so it must be cheap — nothing while nothing is watched, O(1) while nobody died. Never raises."""
        ...


class LocalDirectoryStorage:
    """Segment files in one local directory (created 0700 if missing). See the module docstring.

    ``max_bytes``: ``get`` refuses larger files before reading them (a hostile file cannot make it
    allocate more). ``fsync=False`` skips the fsyncs (tests, tmpfs): atomic still, not durable."""

    def __init__(
        self, path: str | os.PathLike[str], *, max_bytes: int = 256 * 2**20, fsync: bool = True
    ) -> None:
        self.path = os.fspath(path)
        self.max_bytes = int(max_bytes)
        self.fsync = fsync
        try:
            os.makedirs(self.path, mode=0o700, exist_ok=True)
            info = os.stat(self.path)
            if not stat.S_ISDIR(info.st_mode):
                raise SnapshotStorageError(errno.ENOTDIR, f"{self.path} is not a directory")
            if info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) != 0o700:
                os.chmod(self.path, 0o700)
            if not os.access(self.path, os.W_OK | os.X_OK):  # read-only: refused now, not at the 1st write
                raise SnapshotStorageError(errno.EACCES, f"cannot write in {self.path}")
        except SnapshotStorageError:
            raise
        except OSError as exc:
            raise SnapshotStorageError(exc.errno, f"cannot open {self.path}: {exc}") from exc
        self.removed_temp_files = self.clean_temp_files()
        self._locks: dict[str, int] = {}  # key → the open lock file this storage holds an flock on
        self._announced: dict[str, int] = {}  # key → its lock file, open for writing (announce_member)
        self._watch = CloseWatch()  # its thread runs only while a member is watched

    def lock_member(self, key: str, *, probe: bool = False) -> bool:
        """An exclusive ``flock`` on ``<key>.lock`` (created 0600, opened read-only: see
        :mod:`~pulsar_nack.snapshot.deaths`), held until :meth:`unlock_member` or the process ends (the
        kernel drops it, also at ``kill -9``). True if taken; False if held — by another process, another
        storage in this one, or this storage (a live consumer of this process sharing it); the same for a
        ``probe``. Raises :class:`SnapshotStorageError` for a file that cannot be opened. O(1)."""
        if key in self._locks:
            return False
        path = self._file(key + ".lock")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise SnapshotStorageError(exc.errno, f"cannot open {path}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False
            raise SnapshotStorageError(exc.errno, f"cannot lock {path}: {exc}") from exc
        self._locks[key] = fd
        return True

    def unlock_member(self, key: str, *, forget: bool = False) -> None:
        """Drop the ``flock``, then close the announcement (the file stays, even with ``forget``:
        removing it would race with a consumer opening it to take the lock). O(1)."""
        fd = self._locks.pop(key, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        announced = self._announced.pop(key, None)
        if announced is not None:  # after the lock: a watcher woken by this close finds it free
            with contextlib.suppress(OSError):
                os.close(announced)

    #: a watch reports a close as well as a death (the announcement is closed with either)
    watch_sees_close = True

    def announce_member(self, key: str) -> None:
        """Open ``<key>.lock`` for writing and keep it open while the lock is held: its close — at
        :meth:`unlock_member`, or by the kernel when the process ends — is what the other members watch
        (``IN_CLOSE_WRITE``, :mod:`~pulsar_nack.snapshot.deaths`). O(1)."""
        if key not in self._locks or key in self._announced:
            return
        path = self._file(key + ".lock")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError as exc:
            raise SnapshotStorageError(exc.errno, f"cannot announce {path}: {exc}") from exc
        # A dying process's files are released last-opened-first (the kernel runs the deferred closes
        # of an exiting task in LIFO order, by descriptor number): a descriptor numbered above the broker
        # connection's is closed before it, so the watchers learn of the death before the broker does.
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = min(_ANNOUNCE_FD, soft - 1) if soft != resource.RLIM_INFINITY else _ANNOUNCE_FD
        if target > fd:
            with contextlib.suppress(OSError):
                high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, target)
                os.close(fd)
                fd = high
        self._announced[key] = fd

    def watch_member(self, key: str, on_death: Callable[[], None]) -> bool:
        """Watch ``<key>.lock`` for its announcement's close (inotify,
        :class:`~pulsar_nack.snapshot.deaths.CloseWatch`): ``on_death()`` runs on the watch thread the
        moment the member dies or closes. False for a lock this storage holds, a missing file, or a
        system without inotify. O(1)."""
        if key in self._locks:
            return False
        return self._watch.watch(key, self._file(key + ".lock"), on_death)

    def unwatch_member(self, key: str, *, forget: bool = False) -> None:
        """Stop watching ``key`` (the watch thread ends with the last watch). O(1)."""
        self._watch.unwatch(key)

    def poll_deaths(self) -> None:
        """The watched lock files closed whose events the watch thread has not read yet: their
        ``on_death`` now (:meth:`CloseWatch.poll <pulsar_nack.snapshot.deaths.CloseWatch.poll>`, ~0.6 µs
        while a member is watched). Never raises."""
        try:
            self._watch.poll()
        except OSError as exc:  # the watch thread still reports it
            _log.warning("cannot poll the watched members' lock files: %s", exc)

    def watched_members(self) -> list[str]:
        """The keys watched now, sorted. O(watches)."""
        return self._watch.watching()

    @property
    def watch_thread(self) -> Any:
        """The watch thread while one runs, else None (tests check that it ends)."""
        return self._watch.thread

    def _file(self, name: str) -> str:
        return os.path.join(self.path, check_name(name))

    def put(self, name: str, data: bytes) -> None:
        """Write ``data`` under ``name`` atomically and durably; a directory removed meanwhile is created
        again (0700), so writes resume once the storage is back. O(len(data))."""
        final = self._file(name)
        temp = os.path.join(self.path, f".{name}.{os.getpid()}.{secrets.token_hex(8)}{_TEMP_SUFFIX}")
        try:
            try:
                self._write_temp(temp, data)
            except FileNotFoundError:
                os.makedirs(self.path, mode=0o700, exist_ok=True)
                self._write_temp(temp, data)
            self._commit(temp, final)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise SnapshotStorageError(exc.errno, f"cannot write snapshot {name}: {exc}") from exc

    def _write_temp(self, temp: str, data: bytes) -> None:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            os.fchmod(fd, 0o600)
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def _commit(self, temp: str, final: str) -> None:
        os.replace(temp, final)
        self._sync_directory()

    def _sync_directory(self) -> None:
        if not self.fsync:
            return
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def get(self, name: str) -> bytes:
        """Read a whole file (a regular file, no symlink, at most ``max_bytes``). O(size)."""
        path = self._file(name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError as exc:
            raise SnapshotStorageError(exc.errno, f"cannot read snapshot {name}: {exc}") from exc
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise SnapshotStorageError(errno.EINVAL, f"snapshot {name} is not a regular file")
            if info.st_size > self.max_bytes:
                raise SnapshotStorageError(
                    errno.EFBIG, f"snapshot {name} has {info.st_size} bytes, more than {self.max_bytes}"
                )
            chunks = []
            left = info.st_size + 1  # one byte more: notices a file that grew meanwhile
            while left > 0:
                chunk = os.read(fd, min(left, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            data = b"".join(chunks)
            if len(data) > self.max_bytes:
                raise SnapshotStorageError(errno.EFBIG, f"snapshot {name} grew beyond {self.max_bytes} bytes")
            return data
        except SnapshotStorageError:
            raise
        except OSError as exc:
            raise SnapshotStorageError(exc.errno, f"cannot read snapshot {name}: {exc}") from exc
        finally:
            os.close(fd)

    def delete(self, name: str) -> None:
        """Remove a file; a missing one is not an error. O(1)."""
        try:
            os.unlink(self._file(name))
        except FileNotFoundError:
            return
        except OSError as exc:
            raise SnapshotStorageError(exc.errno, f"cannot delete snapshot {name}: {exc}") from exc
        try:
            self._sync_directory()
        except OSError as exc:
            raise SnapshotStorageError(exc.errno, f"cannot sync {self.path}: {exc}") from exc

    def list(self) -> list[str]:
        """Names of the stored files (temp files and anything that is not a valid name excluded), sorted.
        O(directory entries)."""
        try:
            names = os.listdir(self.path)
        except OSError as exc:
            raise SnapshotStorageError(exc.errno, f"cannot list {self.path}: {exc}") from exc
        return sorted(n for n in names if _valid(n) and os.path.isfile(os.path.join(self.path, n)))

    def clean_temp_files(self) -> int:
        """Remove temp files left by writers that are no longer running; returns how many. A temp file of
        a live process (another storage on the same directory, mid-write) is left alone. O(entries)."""
        removed = 0
        try:
            names = os.listdir(self.path)
        except OSError:
            return 0
        for entry in names:
            match = _TEMP.fullmatch(entry)
            if match is None:
                continue
            pid = int(match["pid"])
            if pid != os.getpid() and _alive(pid):
                continue
            try:
                os.unlink(os.path.join(self.path, entry))
                removed += 1
            except OSError:
                pass
        return removed


def _valid(name: str) -> bool:
    try:
        check_name(name)
    except SnapshotStorageError:
        return False
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class InMemoryStorage:
    """A dict of blobs, for tests and for a consumer that wants the segment life cycle without a disk.
    Same name rules and errors as :class:`LocalDirectoryStorage`; nothing survives the process."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}

    def put(self, name: str, data: bytes) -> None:
        self.blobs[check_name(name)] = bytes(data)

    def get(self, name: str) -> bytes:
        try:
            return self.blobs[check_name(name)]
        except KeyError:
            raise SnapshotStorageError(errno.ENOENT, f"no snapshot {name}") from None

    def delete(self, name: str) -> None:
        self.blobs.pop(check_name(name), None)

    def list(self) -> list[str]:
        return sorted(self.blobs)
