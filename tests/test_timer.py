"""TimerWheel: fake-clock behaviour, re-arming, closing from and during callbacks, real-clock lateness;
far and non-finite deadlines, a failing loop, the lazily started thread."""

from __future__ import annotations

import gc
import math
import threading
import time
import tracemalloc
import weakref

import pytest
from fake_clock import FakeClock

from pulsar_nack.timer import MAX_WAIT_MS, TimerWheel, _Wheel, monotonic_ms, weak_callback


def test_fires_in_deadline_order_never_early_with_fake_clock() -> None:
    clock = FakeClock(1_000.0)
    wheel = TimerWheel(tick_ms=1, wheel_size=8, clock=clock, start=False)
    fired: list[tuple[int, float]] = []
    deadlines = [1_003, 1_001, 1_500, 1_007, 90_000, 1_002]  # spans several wheel levels
    for d in deadlines:

        def fire(d: int = d) -> None:
            fired.append((d, clock.now))

        wheel.schedule(d, fire)
    assert len(wheel) == len(deadlines)
    assert wheel.next_deadline_ms() == 1_001
    while clock.now < 100_000:
        clock.now += 1
        wheel.run_due()
    assert [d for d, _ in fired] == sorted(deadlines)
    assert all(at == d for d, at in fired), "fires at the first clock reading >= its deadline"
    assert len(wheel) == 0 and wheel.next_deadline_ms() is None


def test_coarse_ticks_round_up_and_never_fire_early() -> None:
    clock = FakeClock(0)
    wheel = TimerWheel(tick_ms=10, wheel_size=4, clock=clock, start=False)
    fired: list[float] = []
    wheel.schedule(13, lambda: fired.append(clock.now))
    for now in range(0, 60):
        clock.now = now
        wheel.run_due()
    assert fired == [20]


def test_cancel_is_exact_and_idempotent() -> None:
    clock = FakeClock(1_000.0)
    wheel = TimerWheel(clock=clock, start=False)
    fired: list[str] = []
    keep = wheel.schedule(1_010, lambda: fired.append("keep"))
    drop = wheel.schedule(1_010, lambda: fired.append("drop"))
    far = wheel.schedule(1_000_000, lambda: fired.append("far"))
    assert drop.cancel() and not drop.cancel()
    assert far.cancel()
    assert len(wheel) == 1 and keep.pending and not drop.pending
    clock.now = 2_000_000
    wheel.run_due()
    assert fired == ["keep"] and not keep.cancel()


def test_due_on_arrival_fires_at_next_run() -> None:
    clock = FakeClock(1_000.0)
    wheel = TimerWheel(clock=clock, start=False)
    fired: list[int] = []
    wheel.schedule(clock.now - 5, lambda: fired.append(1))
    assert wheel.run_due() == 1 and fired == [1]


def test_thread_sleeps_then_is_rearmed_by_an_earlier_deadline() -> None:
    """A short timeout scheduled after a long one must not wait behind it (unlike Java's nack timer)."""
    wheel = TimerWheel()
    try:
        done = threading.Event()
        start = monotonic_ms()
        wheel.schedule(start + 60_000, lambda: None)
        time.sleep(0.05)  # let the thread go to sleep for 60 s
        wheel.schedule(start + 100, done.set)
        assert done.wait(5.0), "the earlier deadline must wake the sleeping thread"
        assert monotonic_ms() - start < 4_000
    finally:
        assert wheel.close()


def test_idle_thread_does_no_work() -> None:
    """With nothing scheduled the thread waits without a timeout: the heap stays empty, nothing runs."""
    calls = 0

    def counting_clock() -> float:
        nonlocal calls
        calls += 1
        return monotonic_ms()

    wheel = TimerWheel(clock=counting_clock)
    try:
        time.sleep(0.05)
        before = calls
        time.sleep(0.3)
        assert calls == before, "an idle wheel must not poll the clock"
    finally:
        assert wheel.close()


def test_real_clock_lateness_is_small() -> None:
    wheel = TimerWheel()
    lateness: list[float] = []
    done = threading.Event()
    try:
        now = monotonic_ms()
        deadlines = [now + 20 + 7 * i for i in range(30)]
        for i, d in enumerate(deadlines):

            def record(d: float = d, last: bool = i == len(deadlines) - 1) -> None:
                lateness.append(monotonic_ms() - d)
                if last:
                    done.set()

            wheel.schedule(d, record)
        assert done.wait(10.0)
    finally:
        assert wheel.close()
    assert len(lateness) == 30
    assert min(lateness) >= -0.001, "never early"
    assert max(lateness) < 500, "generous bound: shared machines jitter"


def test_close_from_inside_a_callback() -> None:
    wheel = TimerWheel()
    closed = threading.Event()

    def close_me() -> None:
        assert wheel.close() is True  # must not join itself
        closed.set()

    wheel.schedule_after(10, close_me)
    wheel.schedule_after(20, lambda: pytest.fail("must not fire after close"))
    assert closed.wait(5.0)
    time.sleep(0.05)
    assert wheel.closed and len(wheel) == 0
    with pytest.raises(RuntimeError, match="closed"):
        wheel.schedule_after(1, lambda: None)


def test_close_while_a_callback_runs_does_not_deadlock() -> None:
    """apache/pulsar #23650: closing during a redelivery flush must not deadlock."""
    app_lock = threading.Lock()
    wheel = TimerWheel()
    entered = threading.Event()

    def flush() -> None:
        entered.set()
        with app_lock:  # the flush needs a lock the closing thread holds
            pass

    wheel.schedule_after(5, flush)
    with app_lock:
        assert entered.wait(5.0)
        started = time.monotonic()
        assert wheel.close(timeout=0.2) is False  # bounded: reports it could not stop yet
        assert time.monotonic() - started < 2.0
    assert wheel.close(timeout=5.0) is True  # once the lock is free the thread ends
    assert wheel.close() is True  # idempotent


def test_callback_errors_do_not_stop_the_timer(caplog: pytest.LogCaptureFixture) -> None:
    wheel = TimerWheel()
    done = threading.Event()
    try:
        wheel.schedule_after(1, lambda: 1 / 0)
        wheel.schedule_after(5, done.set)
        assert done.wait(5.0)
    finally:
        wheel.close()
    assert "timer callback" in caplog.text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"tick_ms": 0}, "tick_ms"), ({"wheel_size": 1}, "wheel_size"), ({"tick_ms": 1.5}, "tick_ms")],
)
def test_bad_arguments_name_the_parameter(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TimerWheel(start=False, **kwargs)  # type: ignore[arg-type]


def test_bad_schedule_arguments() -> None:
    wheel = TimerWheel(start=False)
    with pytest.raises(TypeError, match="callback"):
        wheel.schedule(1, "not callable")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="deadline_ms"):
        wheel.schedule("soon", lambda: None)  # type: ignore[arg-type]
    assert len(wheel) == 0


@pytest.mark.parametrize("deadline", [math.inf, -math.inf, math.nan])
def test_non_finite_deadlines_are_rejected(deadline: float) -> None:
    wheel = TimerWheel(start=False)
    with pytest.raises(ValueError, match="deadline_ms must be a finite"):
        wheel.schedule(deadline, lambda: None)
    with pytest.raises(ValueError, match="deadline_ms must be a finite"):
        wheel.schedule_after(deadline, lambda: None)
    assert len(wheel) == 0 and wheel.next_deadline_ms() is None


def _levels(wheel: TimerWheel) -> int:
    level: _Wheel | None
    level, count = wheel._wheel, 0
    while level is not None:
        level, count = level.overflow, count + 1
    return count


def test_a_deadline_beyond_the_horizon_is_parked_there_and_fires_on_time() -> None:
    """10**13 ms (317 years) and 1e300 ms ahead: placed at most MAX_WAIT_MS ahead (few wheel levels, a
    wait a Condition can do), re-placed each time the horizon is reached, fired exactly at the deadline."""
    clock = FakeClock(0)
    wheel = TimerWheel(clock=clock, start=False)
    fired: list[float] = []
    far = 10**13
    wheel.schedule(far, lambda: fired.append(clock.now))
    forever = wheel.schedule(1e300, lambda: fired.append(-1.0))
    assert _levels(wheel) <= 4, "levels for a 2**32 ms horizon at 1 ms x 512, not ~110 for 1e300"
    head = wheel.next_deadline_ms()
    assert head is not None and head <= MAX_WAIT_MS
    steps = 0
    while not fired and steps < 2 * far // MAX_WAIT_MS:  # jump from horizon to horizon
        head = wheel.next_deadline_ms()
        assert head is not None and head - clock.now <= MAX_WAIT_MS
        clock.now = min(head, far)
        wheel.run_due()
        steps += 1
    assert fired == [far], "fires at its deadline, not at a horizon"
    # once per horizon, give or take the rounding of the coarsest level's ticks
    assert far // MAX_WAIT_MS <= steps <= far // MAX_WAIT_MS * 1.1, "re-placed once per horizon"
    assert forever.pending and len(wheel) == 1 and _levels(wheel) <= 4


def test_a_far_deadline_does_not_kill_the_thread() -> None:
    """Once a 10**13 ms timeout headed the wheel, Condition.wait raised OverflowError and the thread died:
    every later timeout was filed and never fired."""
    wheel = TimerWheel()
    done = threading.Event()
    try:
        wheel.schedule_after(10**13, lambda: None)
        time.sleep(0.05)  # the thread goes to sleep for the far one
        wheel.schedule_after(20, done.set)
        assert done.wait(5.0)
        assert wheel.failures == 0, "no failure to recover from"
    finally:
        assert wheel.close()


def test_a_failing_loop_is_restarted_logged_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    """Anything raising in the thread's loop (here the clock, once) must not stop later timeouts."""
    failed = threading.Event()

    def flaky_clock() -> float:
        if threading.current_thread().name == "flaky" and not failed.is_set():
            failed.set()
            raise OSError("clock source gone")
        return monotonic_ms()

    wheel = TimerWheel(clock=flaky_clock, name="flaky")
    fired: list[int] = []
    done = threading.Event()
    try:
        wheel.schedule_after(10, lambda: fired.append(1))
        assert failed.wait(5.0)
        wheel.schedule_after(30, lambda: fired.append(2))
        wheel.schedule_after(60, done.set)
        assert done.wait(5.0), "the thread went on after the failure"
    finally:
        assert wheel.close()
    assert fired == [1, 2]
    assert wheel.failures == 1
    assert "restarting it" in caplog.text and "clock source gone" in caplog.text


def test_the_thread_starts_on_the_first_schedule_and_ends_at_close() -> None:
    wheel = TimerWheel()
    assert wheel._thread is None, "no thread for a wheel nothing is scheduled on"
    wheel.schedule_after(60_000, lambda: None)
    thread = wheel._thread
    assert thread is not None and thread.is_alive()
    assert wheel.close()
    assert not thread.is_alive()


def test_memory_bytes_agrees_with_tracemalloc_and_falls_back_once_fired() -> None:
    """What ``nack_stats().memory_bytes`` adds for a tracker's own wheel: within 15 % of what tracemalloc
    sees the wheel allocate for 10,000 pending timeouts, and back near empty once they fired."""
    clock = FakeClock(1_000.0)
    wheel = TimerWheel(clock=clock, start=False)
    empty = wheel.memory_bytes()

    def callback() -> None:
        pass

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(10_000):
            wheel.schedule(clock.now + 1 + i * 7 % 100_000, callback)
        traced = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    reported = wheel.memory_bytes() - empty
    assert abs(reported / traced - 1) <= 0.15, (reported, traced)
    clock.now += 200_000
    assert wheel.run_due() == 10_000
    assert wheel.memory_bytes() - empty < reported / 4


def _buckets_held(wheel: TimerWheel) -> int:
    held = 0
    level: _Wheel | None = wheel._wheel
    while level is not None:
        held += len(level.buckets)
        level = level.overflow
    return held


def test_buckets_leave_their_slots_once_fired_or_cancelled() -> None:
    """Memory is flat in run time: a wheel that fired or cancelled everything holds no bucket, however
    many slots its timeouts passed through."""
    clock = FakeClock(1_000.0)
    wheel = TimerWheel(tick_ms=1, wheel_size=64, clock=clock, start=False)
    cancelled = [wheel.schedule(clock.now + 5 + i * 101, lambda: None) for i in range(500)]
    assert _buckets_held(wheel) > 32
    for timeout in cancelled:
        timeout.cancel()
    assert _buckets_held(wheel) == 0, "a bucket emptied by cancels leaves at once"
    for i in range(2_000):  # every slot of the finest level, and many of the coarser ones
        wheel.schedule(clock.now + 1 + i * 37, lambda: None)
    assert _buckets_held(wheel) > 32
    while len(wheel):
        clock.now += 50
        wheel.run_due()
    assert _buckets_held(wheel) == 0
    empty = wheel.memory_bytes()
    for _ in range(3):  # a steady run: the same pending count, slots reused, nothing accumulates
        for i in range(200):
            wheel.schedule(clock.now + 1 + i * 13, lambda: None)
        clock.now += 200 * 13 + 10
        wheel.run_due()
        assert _buckets_held(wheel) == 0 and wheel.memory_bytes() <= empty


def test_a_drained_wheel_holds_no_more_than_a_fresh_one_but_its_levels() -> None:
    """A wheel's fixed memory is part of what a consumer keeps whatever is pending (issue 23: 16 KiB in
    all): once its timeouts fired, it holds its levels' objects, not a table of every slot (4 KB a level
    at the default 512 slots)."""
    clock = FakeClock(1_000.0)
    wheel = TimerWheel(clock=clock, start=False)
    fresh = wheel.memory_bytes()
    for i in range(5_000):  # deadlines over ~80 min: three levels
        wheel.schedule(clock.now + 1 + i * 997, lambda: None)
    assert wheel._wheel.overflow is not None and wheel._wheel.overflow.overflow is not None
    while len(wheel):
        clock.now += 5_000
        wheel.run_due()
    assert wheel.memory_bytes() <= fresh + 1_024


def test_weak_callback_calls_its_object_while_it_lives_and_does_not_keep_it() -> None:
    class Owner:
        def __init__(self) -> None:
            self.calls = 0

        def tick(self) -> None:
            self.calls += 1

    owner = Owner()
    callback = weak_callback(owner.tick)
    callback()
    assert owner.calls == 1
    alive = weakref.ref(owner)
    del owner
    gc.collect()
    assert alive() is None, "the callback must not keep its object alive"
    callback()  # its object is gone: nothing happens
    with pytest.raises(TypeError, match="bound method"):
        weak_callback(lambda: None)


def test_a_callback_rearming_the_wheel_does_not_wake_the_thread_again() -> None:
    """The thread is woken (its wake lock released) only while it sleeps: a callback that schedules an
    earlier head from the timer thread itself (the redelivery timer, every forward) must leave the lock
    held, else the next sleep returns at once and costs a wake-up for nothing. From another thread,
    while the thread sleeps, the same schedule must release it."""
    wheel = TimerWheel()
    held_after_own_schedule: list[bool] = []
    fired = threading.Event()

    def rearm() -> None:
        wheel.schedule(monotonic_ms() + 60_000, lambda: None)  # the new head: the heap was empty
        held_after_own_schedule.append(wheel._wake.locked())
        fired.set()

    try:
        wheel.schedule(monotonic_ms() + 10, rearm)
        assert fired.wait(5.0)
        assert held_after_own_schedule == [True], "the thread must not notify itself"
        woken = threading.Event()
        for _ in range(200):  # until the thread sleeps again (bounded: 2 s)
            if wheel._sleeping:
                break
            time.sleep(0.01)
        assert wheel._sleeping
        wheel.schedule(monotonic_ms() + 20, woken.set)  # earlier than the 60-s head: wake it
        assert woken.wait(5.0), "a schedule from another thread must wake the sleeping thread"
    finally:
        assert wheel.close()
