"""A hierarchical hashed timing wheel (Kafka's ``SystemTimer`` design) with one sleeping thread.

Timeouts hash into the buckets of a wheel of ``wheel_size`` ticks; deadlines beyond the wheel's span
go to an overflow wheel with ticks ``wheel_size`` times coarser, created on demand, and cascade down as
time reaches them. Only *non-empty* buckets enter a heap ordered by expiration, so the thread:

* sleeps until the earliest non-empty bucket — no fixed tick, no scan of pending timeouts;
* waits without a timeout when nothing is scheduled (no work while idle);
* is woken when a timeout earlier than everything else is scheduled (unlike Java's nack tracker, whose
  timer makes a short nack wait behind a long one).

Complexity: :meth:`TimerWheel.schedule` and :meth:`Timeout.cancel` are O(1), plus O(log m) for the m
non-empty buckets when a bucket becomes non-empty; firing is O(1) per timeout per wheel level.

Range: a deadline more than :data:`MAX_WAIT_MS` (2**32 ms, ~50 days) ahead is parked at that horizon and
placed again when the horizon is reached (once per ~50 days), so the wheel never has more than
``log(MAX_WAIT_MS / tick_ms) / log(wheel_size) + 1`` levels (4 at the defaults) and the thread never waits
longer than a ``Condition`` can. Deadlines must be finite.

The thread starts on the first :meth:`~TimerWheel.schedule` (a wheel nothing is scheduled on costs no
thread) and ends at :meth:`~TimerWheel.close`. It never holds a reference to anything but the wheel and
the callbacks, so an owner that schedules weak callbacks (see :func:`weak_callback`) can be collected and
close the wheel from a ``weakref.finalize``. Should the thread's loop ever raise (a clock that fails, say),
the failure is logged and counted in :attr:`~TimerWheel.failures` and the loop starts again: timeouts keep
firing.

The thread sleeps on a lock of its own (``_wake``) rather than a ``threading.Condition``: a
``Condition.wait`` runs ~15 lines of Python (a waiter lock allocated, queued and dequeued) that, with the
caches cold after a sleep, cost ~20 µs of the thread's CPU per wake-up — a third of an empty wake-up's
cost, and the redelivery timer wakes every 68 ms at small precision. A scheduler that needs an
earlier wake-up releases ``_wake``, and only while the thread sleeps on it (``_sleeping``), so the thread's
own re-arming from a callback costs no extra wake-up.

Callbacks run on the timer thread, outside the wheel's lock, one at a time. A callback may schedule,
cancel, or :meth:`~TimerWheel.close` the wheel. A timeout never fires before its deadline (deadlines are
rounded up to whole ticks); it fires late by the time the thread needs to wake up plus the callbacks
before it.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
import time
import types
import weakref
from collections.abc import Callable

from pulsar_nack.memory import python_bytes

__all__ = ["MAX_WAIT_MS", "Timeout", "TimerWheel", "check_finite", "monotonic_ms", "weak_callback"]

_log = logging.getLogger(__name__)
#: The furthest ahead the wheel places a timeout; one due later is re-placed when this horizon is reached.
MAX_WAIT_MS = 2**32
_RESTART_PAUSE_S = (0.001, 1.0)  # pause before restarting a failed loop: doubles while failures repeat


def check_finite(value: float, name: str) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is a finite number of ms (inf, NaN and ints
    beyond a float's range are not). O(1)."""
    try:
        if math.isfinite(value):
            return
    except OverflowError:
        pass
    raise ValueError(f"{name} must be a finite number of milliseconds, got {value!r}")


def weak_callback(method: Callable[[], object]) -> Callable[[], None]:
    """A callback that calls the bound ``method`` while its object lives and does nothing after: a timer
    holding it does not keep the object alive. O(1).

    A weak reference to the object and the plain function, not a ``weakref.WeakMethod``: calling one runs
    its Python ``__call__`` and makes a bound method each time, which the redelivery timer paid at every
    forward with cold caches."""
    if not isinstance(method, types.MethodType):
        raise TypeError(f"weak_callback needs a bound method, got {type(method).__name__}")
    ref, function = weakref.ref(method.__self__), method.__func__

    def call() -> None:
        target = ref()
        if target is not None:
            function(target)

    return call


def monotonic_ms() -> float:
    """The default clock: ``time.monotonic()`` in milliseconds. O(1)."""
    return time.monotonic() * 1000.0


class Timeout:
    """A scheduled callback; :meth:`cancel` it until it fires."""

    __slots__ = ("_bucket", "_wheel", "callback", "deadline_ms")

    def __init__(self, wheel: TimerWheel, deadline_ms: int, callback: Callable[[], object]) -> None:
        self._wheel = wheel
        self.deadline_ms = deadline_ms
        self.callback = callback
        self._bucket: _Bucket | None = None

    @property
    def pending(self) -> bool:
        """True until the timeout fires or is cancelled. O(1)."""
        return self._bucket is not None

    def cancel(self) -> bool:
        """Stop the timeout from firing; False if it already fired or was cancelled. O(1)."""
        return self._wheel._cancel(self)

    def __repr__(self) -> str:
        return f"Timeout(deadline_ms={self.deadline_ms}, pending={self.pending})"


class _Bucket:
    __slots__ = ("expiration", "home", "slot", "timeouts")

    def __init__(self, home: dict[int, _Bucket] | None = None, slot: int = 0) -> None:
        self.timeouts: dict[Timeout, None] = {}
        self.expiration = -1  # -1: not in the heap
        # the level's slots and the slot this bucket sits at, so that it can leave once empty
        self.home = home
        self.slot = slot

    def release(self) -> None:
        """Leave the level's slot once empty: slots a run has used do not keep a bucket each for the
        wheel's life (memory would grow with run time at constant pending). A stale heap entry may still
        refer to it until popped. O(1)."""
        home = self.home
        if home is not None and home.get(self.slot) is self:
            del home[self.slot]
            if not home:
                home.clear()  # a dict keeps its table when its entries are deleted; clear() frees it


class _Wheel:
    """One level: ``size`` buckets of ``tick`` ms, covering [current, current + tick * size)."""

    __slots__ = ("buckets", "current", "interval", "overflow", "size", "tick")

    def __init__(self, tick: int, size: int, start: int) -> None:
        self.tick = tick
        self.size = size
        self.interval = tick * size
        self.current = start - start % tick
        # Only the slots in use, made on first use and gone once empty: a level holds a handful of
        # timeouts (one a due bucket of nacks), so a list of every slot (4 KB a level, up to 4 levels)
        # was most of the fixed memory a consumer keeps.
        self.buckets: dict[int, _Bucket] = {}
        self.overflow: _Wheel | None = None

    def bucket_for(self, deadline: int) -> tuple[_Bucket, int] | None:
        """The bucket and its expiration for ``deadline``, or None if it is due within the current tick."""
        if deadline < self.current + self.tick:
            return None
        if deadline < self.current + self.interval:
            virtual = deadline // self.tick
            slot = virtual % self.size
            bucket = self.buckets.get(slot)
            if bucket is None:
                bucket = self.buckets[slot] = _Bucket(self.buckets, slot)
            return bucket, virtual * self.tick
        if self.overflow is None:
            self.overflow = _Wheel(self.interval, self.size, self.current)
        return self.overflow.bucket_for(deadline)

    def advance(self, now: int) -> None:
        if now >= self.current + self.tick:
            self.current = now - now % self.tick
            if self.overflow is not None:
                self.overflow.advance(self.current)


class TimerWheel:
    """Schedules callbacks at absolute deadlines (ms on ``clock``) and fires them on one thread.

    ``tick_ms``: resolution of the finest wheel (deadlines round up to it); ``wheel_size``: buckets per
    level. ``clock``: a monotonic millisecond clock, injectable for tests. The thread starts on the first
    :meth:`schedule`; with ``start=False`` it never does and the owner calls :meth:`run_due` itself
    (deterministic tests with a fake clock).
    """

    def __init__(
        self,
        tick_ms: int = 1,
        wheel_size: int = 512,
        clock: Callable[[], float] = monotonic_ms,
        name: str = "pulsar-nack-timer",
        start: bool = True,
    ) -> None:
        if isinstance(tick_ms, bool) or not isinstance(tick_ms, int) or tick_ms < 1:
            raise ValueError(f"tick_ms must be an int >= 1, got {tick_ms!r}")
        if isinstance(wheel_size, bool) or not isinstance(wheel_size, int) or wheel_size < 2:
            raise ValueError(f"wheel_size must be an int >= 2, got {wheel_size!r}")
        self._clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Lock()  # held while nobody asked for a wake-up; see the module docstring
        self._wake.acquire()
        self._sleeping = False  # the thread waits (or is about to wait) on _wake
        self._wheel = _Wheel(tick_ms, wheel_size, self._now())
        self._heap: list[tuple[int, int, _Bucket]] = []
        self._sequence = itertools.count()
        self._ready: list[Timeout] = []  # due on arrival; fired by the next run
        self._pending = 0
        self._closed = False
        self._failures = 0
        self._name = name
        self._start = start
        self._thread: threading.Thread | None = None

    # -- public API -----------------------------------------------------------------------------------

    def schedule(self, deadline_ms: float, callback: Callable[[], object]) -> Timeout:
        """Run ``callback`` on the timer thread once ``clock() >= deadline_ms``. O(1) amortized.

        ``deadline_ms`` must be finite (else ``ValueError``); one beyond :data:`MAX_WAIT_MS` from now is
        parked at that horizon and placed again from there. Starts the thread on first use.
        """
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {type(callback).__name__}")
        kind = type(deadline_ms)  # (a float or an int passes with two identity tests)
        number = kind is float or kind is int or (kind is not bool and isinstance(deadline_ms, int | float))
        if not number:
            raise TypeError(f"deadline_ms must be a number of milliseconds, got {deadline_ms!r}")
        if isinstance(deadline_ms, float) and deadline_ms - deadline_ms != 0.0:  # inf or NaN
            check_finite(deadline_ms, "deadline_ms")
        with self._lock:
            if self._closed:
                raise RuntimeError("TimerWheel is closed")
            if self._thread is None and self._start:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            tick = self._wheel.tick
            timeout = Timeout(self, -(-math.ceil(deadline_ms) // tick) * tick, callback)
            head = self._heap[0][0] if self._heap else None
            self._pending += 1
            self._place(timeout)
            if self._ready or (self._heap and self._heap[0][0] != head):
                self._notify()  # an earlier wake-up than the thread is sleeping for
            return timeout

    def schedule_after(self, delay_ms: float, callback: Callable[[], object]) -> Timeout:
        """Like :meth:`schedule`, ``delay_ms`` from now. O(1) amortized, as :meth:`schedule`."""
        return self.schedule(self._clock() + delay_ms, callback)

    def __len__(self) -> int:
        """Timeouts scheduled and not yet fired or cancelled. O(1)."""
        return self._pending

    def next_deadline_ms(self) -> int | None:
        """When the thread will next wake (the earliest non-empty bucket), or None if idle. Amortized
        O(log m) for m non-empty buckets (stale heap entries of cancelled buckets are dropped on the way)."""
        with self._lock:
            if self._ready:
                return int(self._now())
            return self._head_expiration()

    def run_due(self) -> int:
        """Fire every timeout due now, on the calling thread; returns how many fired.

        The wheel's own thread calls this; with ``start=False`` the owner does. O(log m) per due bucket
        plus O(1) per due timeout per wheel level it cascades through, plus the callbacks.
        """
        with self._lock:
            due = self._collect_due(self._now())
        for timeout in due:
            _fire(timeout)
        return len(due)

    def memory_bytes(self) -> int:
        """Bytes the wheel holds: its levels' bucket slots, the buckets made so far, the heap and the
        pending timeouts (not what their callbacks refer to). O(levels × wheel_size + pending)."""
        with self._lock:
            total = python_bytes(self) + python_bytes(self._heap) + python_bytes(self._ready)
            total += len(self._heap) * _HEAP_ENTRY_BYTES
            level: _Wheel | None = self._wheel
            while level is not None:
                total += python_bytes(level) + python_bytes(level.buckets)
                for bucket in level.buckets.values():
                    total += python_bytes(bucket) + python_bytes(bucket.timeouts)
                    total += len(bucket.timeouts) * _TIMEOUT_BYTES
                level = level.overflow
            return total + len(self._ready) * _TIMEOUT_BYTES

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called. O(1)."""
        return self._closed

    @property
    def failures(self) -> int:
        """How often the thread's loop raised (each logged, and the loop restarted). O(1)."""
        return self._failures

    def close(self, timeout: float | None = 10.0) -> bool:
        """Cancel everything and stop the thread; True once it has stopped.

        Safe from any thread, from inside a callback (then it does not wait for itself) and while a
        callback runs (then it waits at most ``timeout`` seconds for that callback to return). Idempotent.
        O(pending timeouts).
        """
        with self._lock:
            self._closed = True
            for _, _, bucket in self._heap:
                for pending in bucket.timeouts:
                    pending._bucket = None
                bucket.timeouts.clear()
                bucket.expiration = -1
            self._heap.clear()
            self._ready.clear()
            self._pending = 0
            self._notify()
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def __enter__(self) -> TimerWheel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals (called with the lock held unless noted) ------------------------------------------------

    def _now(self) -> int:
        return math.floor(self._clock())

    def _place(self, timeout: Timeout) -> None:
        """File ``timeout`` in its bucket; one beyond the horizon in the horizon's (re-placed from there)."""
        now = self._now()
        found = self._wheel.bucket_for(min(timeout.deadline_ms, now + MAX_WAIT_MS))
        if found is None or timeout.deadline_ms <= now:
            self._ready.append(timeout)
            timeout._bucket = _READY
            return
        bucket, expiration = found
        bucket.timeouts[timeout] = None
        timeout._bucket = bucket
        if bucket.expiration != expiration:
            bucket.expiration = expiration
            heapq.heappush(self._heap, (expiration, next(self._sequence), bucket))

    def _cancel(self, timeout: Timeout) -> bool:
        with self._lock:
            bucket = timeout._bucket
            if bucket is None:
                return False
            timeout._bucket = None
            self._pending -= 1
            if bucket is _READY:
                self._ready.remove(timeout)
                return True
            del bucket.timeouts[timeout]
            if not bucket.timeouts:
                bucket.expiration = -1  # its heap entry is now stale
                bucket.release()
                self._notify()
            return True

    def _head_expiration(self) -> int | None:
        """Earliest live heap entry, dropping stale ones. Amortized O(log m)."""
        heap = self._heap
        while heap:
            expiration, _, bucket = heap[0]
            if bucket.expiration == expiration:
                return expiration
            heapq.heappop(heap)
        return None

    def _collect_due(self, now: int) -> list[Timeout]:
        due, self._ready = self._ready, []
        while True:
            expiration = self._head_expiration()
            if expiration is None or expiration > now:
                break
            _, _, bucket = heapq.heappop(self._heap)
            self._wheel.advance(expiration)
            timeouts = bucket.timeouts
            bucket.timeouts = {}
            bucket.expiration = -1
            bucket.release()  # cascading timeouts go to finer levels, never back into this bucket
            for timeout in timeouts:
                if timeout.deadline_ms <= now:
                    due.append(timeout)  # (the usual case: a bucket of the finest level)
                else:
                    self._place(timeout)  # cascade to a finer wheel
            if self._ready:
                due.extend(self._ready)
                self._ready = []
        self._wheel.advance(now)
        for timeout in due:
            timeout._bucket = None
        self._pending -= len(due)
        return due

    def _run(self) -> None:
        """The timer thread: run :meth:`_loop`; should it raise, log, count, pause briefly and run it again
        (the pause doubles while failures repeat within a minute), so redelivery never stops silently."""
        pause = _RESTART_PAUSE_S[0]
        while True:
            started = time.monotonic()
            try:
                self._loop()
                return
            except Exception:
                self._failures += 1
                _log.exception(
                    "timer thread %r failed (%d so far); restarting it", self._name, self._failures
                )
            if time.monotonic() - started > 60.0:
                pause = _RESTART_PAUSE_S[0]
            with self._lock:
                if self._closed:
                    return
                self._sleeping = True
            self._sleep(pause * 1000.0)
            pause = min(2 * pause, _RESTART_PAUSE_S[1])

    def _notify(self) -> None:
        """(Lock held.) Wake the thread if it sleeps: it then looks at the heap again. O(1)."""
        if self._sleeping and self._wake.locked():
            self._wake.release()

    def _sleep(self, wait_ms: float | None) -> None:
        """(Lock *not* held; ``_sleeping`` set under it.) Sleep ``wait_ms`` (None: until notified) or until
        :meth:`_notify`. A notification between the lock's release and this wait is not lost: ``_wake``
        is then already released and the acquire returns at once. O(1)."""
        if wait_ms is None:
            self._wake.acquire()
        else:
            self._wake.acquire(True, wait_ms / 1000.0)
        self._sleeping = False  # (a notification after the timeout costs one spurious turn: harmless)

    def _loop(self) -> None:
        """Sleep until the earliest non-empty bucket, fire, repeat; return once closed."""
        lock = self._lock
        while True:
            with lock:
                if self._closed:
                    return
                now = self._clock()
                if self._ready:
                    wait: float | None = 0.0
                else:
                    head = self._head_expiration()
                    wait = None if head is None else head - now
                if wait is None or wait > 0:
                    self._sleeping = True
                else:
                    due = self._collect_due(math.floor(now))
            if wait is None or wait > 0:
                self._sleep(wait)  # None: idle, nothing scheduled
                continue
            for timeout in due:
                if self._closed:
                    return
                _fire(timeout)


_READY = _Bucket()  # marker bucket of timeouts that were due on arrival
_TIMEOUT_BYTES = python_bytes(Timeout(None, 1 << 40, int)) + python_bytes(1 << 40)  # type: ignore[arg-type]
_HEAP_ENTRY_BYTES = python_bytes((1 << 40, 1 << 40, _READY)) + 2 * python_bytes(1 << 40)


def _fire(timeout: Timeout) -> None:
    try:
        timeout.callback()
    except Exception:  # a failing callback must not kill the timer thread
        _log.exception("timer callback %r failed", timeout.callback)
