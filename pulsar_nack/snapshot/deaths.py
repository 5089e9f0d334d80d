"""Learning that another process died the moment it dies: inotify's close events, one thread for all.

A member of a Shared subscription that keeps its snapshot in a local directory holds an ``flock`` on
``<key>.lock`` while it lives, and keeps the file open for writing besides (its *announcement*:
``LocalDirectoryStorage.announce_member``).
When its process ends — also at ``kill -9`` — the kernel closes its files one by one, in descriptor
order: the lock is released, the announcement's close raises inotify's ``IN_CLOSE_WRITE`` on the lock
file, and the process's broker connection is closed in the same pass; only then can the broker see the
connection go and hand the dead consumer's messages to the others. So a member that watches the lock
file with inotify learns of the death within microseconds of the broker, and before the broker's
answer reaches it — unless its own wake-up is slower (a busy machine: the race that is left).

Why not the alternatives: a thread blocked in ``flock(LOCK_EX)`` learns it as early, but cannot be
stopped (no timeout; a signal cannot be aimed at it from a library), so a closed consumer would leave
one blocked thread per live peer; a ``pidfd`` is readable only once the whole process has exited,
after its files — the broker is faster (measured: the first copy reached the survivor 0.2 ms before
the pidfd did). inotify needs the members on one kernel (one machine, or containers sharing a volume);
on a network file system the events of another machine do not come, and the periodic look remains.

The watch thread's wake-up can still lose to a receiver thread's: both wait for the GIL, and a
receiver that runs on admits the first copy before the watch thread reports the death (CI saw one
copy handed out 9 s early this way on pulsar-lite). So the arrival path also calls :meth:`CloseWatch.poll`
before it admits a message: the kernel queued the close's event before the broker could see the
connection go, and the poll reports it on the receiver's own thread.

Only ``IN_CLOSE_WRITE`` is watched: every other opener of a lock file (taking a lock, reading) opens it
read-only, so a close for writing is the announcement's — the member died or closed.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import selectors
import struct
import termios
import threading
from collections.abc import Callable

__all__ = ["CloseWatch"]

_log = logging.getLogger(__name__)

_IN_CLOSE_WRITE = 0x00000008
_IN_IGNORED = 0x00008000  # the watch is gone (the file was deleted, or inotify_rm_watch)
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then len bytes of name)


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.inotify_init1  # noqa: B018  # exists (Linux)
    except (OSError, AttributeError):
        return None
    return libc


class CloseWatch:
    """Calls ``on_close()`` once when a file watched under a token is closed after being written to
    (``IN_CLOSE_WRITE``); one daemon thread for every watch, started by the first and ended when none is
    left (or at :meth:`close`). Thread-safe. ``on_close`` runs on that thread: it must return quickly."""

    def __init__(self, name: str = "pulsar-nack-member-watch") -> None:
        self._name = name
        self._libc = _libc()
        self._lock = threading.Lock()
        self._watches: dict[str, tuple[int, Callable[[], None]]] = {}  # token → (wd, on_close)
        self._tokens: dict[int, str] = {}  # wd → token
        self._fd = -1  # the inotify instance, while the thread runs
        self._wake_r, self._wake_w = -1, -1
        self._thread: threading.Thread | None = None
        self._closed = False
        self._unread = array.array("i", [0])  # FIONREAD's answer (poll, under the lock)
        self._firing = threading.Lock()  # held from reading events to the end of their callbacks

    def watch(self, token: str, path: str, on_close: Callable[[], None]) -> bool:
        """Watch ``path`` under ``token`` (replacing a watch of the same token). False if it cannot be
        (no inotify, no such file, closed). O(1)."""
        if self._libc is None:
            return False
        with self._lock:
            if self._closed:
                return False
            if self._fd < 0:
                fd = self._libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
                if fd < 0:
                    _log.warning("inotify_init1 failed: %s", os.strerror(ctypes.get_errno()))
                    return False
                self._fd = fd
                self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
            self._drop(token)
            wd = self._libc.inotify_add_watch(self._fd, os.fsencode(path), _IN_CLOSE_WRITE)
            if wd < 0:
                code = ctypes.get_errno()
                if code != errno.ENOENT:
                    _log.warning("cannot watch %s: %s", path, os.strerror(code))
                self._stop_if_idle()
                return False
            old = self._tokens.get(wd)  # the same file under another token: one watch per file
            if old is not None:
                self._watches.pop(old, None)
            self._watches[token] = (wd, on_close)
            self._tokens[wd] = token
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, args=(self._fd,), name=self._name, daemon=True
                )
                self._thread.start()
        return True

    def unwatch(self, token: str) -> None:
        """Stop watching ``token`` (nothing if not watched). O(1)."""
        with self._lock:
            self._drop(token)
            self._stop_if_idle()

    def watching(self) -> list[str]:
        """The watched tokens, sorted. O(watches)."""
        with self._lock:
            return sorted(self._watches)

    def poll(self) -> None:
        """Call, on this thread and now, the callbacks of the watched files closed whose events the watch
        thread has not read yet — or wait for the watch thread to finish calling those it read. The
        kernel queues a close's event the moment the file is closed, but the watch thread may run its
        callbacks later — up to a GIL switch interval (5 ms) when other threads run Python: a receiver
        that polls before admitting a message learns of a death the broker already acted on. Nothing
        while nothing is watched or being reported; O(1) while nothing closed (two locks and an
        ``ioctl``: ~0.7 µs)."""
        if not self._watches and not self._firing.locked():  # (read in this order: see _run)
            return
        with self._firing:
            with self._lock:
                fd = self._fd
                if fd < 0:
                    return
                fcntl.ioctl(fd, termios.FIONREAD, self._unread, True)
                if not self._unread[0]:
                    return
                fired = self._drain_events(fd)
                self._stop_if_idle()  # the last watch fired here: the thread, in select, must still end
            self._fire(fired)

    @property
    def thread(self) -> threading.Thread | None:
        """The watch thread, while one runs (tests join it)."""
        return self._thread

    def close(self) -> None:
        """Stop every watch; the thread ends at once (not waited for). Idempotent. O(watches)."""
        with self._lock:
            self._closed = True
            for token in list(self._watches):
                self._drop(token)
            self._stop_if_idle()

    def _drop(self, token: str) -> None:
        """(Lock held.) Remove ``token``'s watch from the kernel and the maps."""
        watch = self._watches.pop(token, None)
        if watch is not None:
            self._tokens.pop(watch[0], None)
            if self._libc is not None and self._fd >= 0:
                self._libc.inotify_rm_watch(self._fd, watch[0])

    def _stop_if_idle(self) -> None:
        """(Lock held.) No watch left: wake the thread, which closes the instance and ends."""
        if not self._watches and self._wake_w >= 0:
            with contextlib.suppress(BlockingIOError):
                os.write(self._wake_w, b"x")
            if self._thread is None:  # never started (a watch that failed): close here
                self._close_fds()

    def _close_fds(self) -> None:
        """(Lock held.)"""
        for fd in (self._fd, self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._fd, self._wake_r, self._wake_w = -1, -1, -1

    def _run(self, fd: int) -> None:
        """The thread: read events; call the closed files' callbacks; end when nothing is watched."""
        selector = selectors.DefaultSelector()
        try:
            selector.register(fd, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while True:
                with self._lock:
                    if not self._watches:
                        self._close_fds()
                        self._thread = None
                        return
                selector.select()
                # `_firing` before a watch is popped, released after its callback ran: a poll that
                # finds the watch gone waits for the callback (a death is never half reported).
                with self._firing:
                    with self._lock:
                        if self._wake_r >= 0:
                            with contextlib.suppress(BlockingIOError):
                                os.read(self._wake_r, 4096)
                        fired = self._drain_events(fd)
                    self._fire(fired)
        except Exception:  # a bug: the watches end; the caller's periodic look still finds the dead
            _log.exception("watching the other members' lock files failed")
            with self._lock:
                self._watches.clear()
                self._tokens.clear()
                self._close_fds()
                self._thread = None
        finally:
            selector.close()

    @staticmethod
    def _fire(fired: list[Callable[[], None]]) -> None:
        for on_close in fired:
            try:
                on_close()
            except Exception:
                _log.exception("a member-death callback failed")

    def _drain_events(self, fd: int) -> list[Callable[[], None]]:
        """(Lock held.) Read the inotify queue; returns the callbacks of the files closed (their watches
        removed: each fires once, on whichever thread read its event)."""
        fired: list[Callable[[], None]] = []
        while True:
            try:
                data = os.read(fd, 64 * 1024)
            except BlockingIOError:
                break
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size + length
                token = self._tokens.get(wd)
                if token is None:
                    continue
                if mask & (_IN_CLOSE_WRITE | _IN_IGNORED):
                    watch = self._watches.pop(token)
                    del self._tokens[wd]
                    if mask & _IN_CLOSE_WRITE:
                        self._libc.inotify_rm_watch(fd, wd)  # type: ignore[union-attr]
                        fired.append(watch[1])
        return fired
