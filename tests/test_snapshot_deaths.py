"""A member learns of another's death the moment it dies (pulsar_nack.snapshot.deaths, the local
directory's watch) and holds arrivals back while it adopts the snapshot (pulsar_nack.snapshot.takeover).
Real processes killed with SIGKILL, real files, real inotify; the end-to-end test with brokers is
tests/test_snapshot_running_takeover.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pulsar_nack.snapshot import LocalDirectoryStorage, SegmentConfig, SegmentStore
from pulsar_nack.snapshot.deaths import CloseWatch
from pulsar_nack.snapshot.namespace import SubscriptionStorage, snapshot_key
from pulsar_nack.snapshot.takeover import Adoption, Takeover

TOPIC, SUBSCRIPTION = "orders", "shared"
WAIT_S = 20.0  # generous: a bound, not a measurement


def live_member(path: Path, name: str, nacks: int = 0) -> subprocess.Popen[str]:
    """A member in another process: locks (and announces) its key, keeps ``nacks`` pending nacks in its
    snapshot, prints ``locked`` and sleeps until killed."""
    script = (
        "import time\n"
        "from pulsar_nack.snapshot import LocalDirectoryStorage, SegmentStore\n"
        "from pulsar_nack.snapshot.namespace import SubscriptionStorage, snapshot_key\n"
        f"view = SubscriptionStorage(LocalDirectoryStorage({str(path)!r}, fsync=False), "
        f"snapshot_key({TOPIC!r}, {SUBSCRIPTION!r}, {name!r}))\n"
        "view.lock()\n"
        "store = SegmentStore(view, precision_bits=4)\n"
        f"for entry in range({nacks}):\n"
        "    store.add(60_000 + entry, 1, entry)\n"
        "store.checkpoint(0)\n"
        "print('locked', flush=True)\n"
        "time.sleep(600)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline()
    if line.strip() != "locked":
        process.kill()
        process.wait(30)
        raise AssertionError(f"member {name} did not start: {line!r}")
    return process


@pytest.fixture
def members(tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(30)


def wait_for(condition: threading.Event, what: str) -> None:
    assert condition.wait(WAIT_S), what


def test_a_killed_members_death_is_reported_once_and_the_watch_thread_ends(
    tmp_path: Path, members: list[subprocess.Popen[str]]
) -> None:
    members.append(live_member(tmp_path, "a"))
    storage = LocalDirectoryStorage(tmp_path, fsync=False)
    key = snapshot_key(TOPIC, SUBSCRIPTION, "a")
    died = threading.Event()
    calls: list[str] = []

    def on_death() -> None:  # the watch thread: record only
        calls.append(key)
        died.set()

    assert storage.watch_member(key, on_death)
    thread = storage.watch_thread
    assert thread is not None and thread.is_alive()
    time.sleep(0.2)
    assert not died.is_set(), "reported dead while it lives"
    members[0].send_signal(signal.SIGKILL)
    members[0].wait(30)
    wait_for(died, "the death was never reported")
    thread.join(WAIT_S)
    assert not thread.is_alive(), "the watch thread outlived its last watch"
    assert calls == [key] and storage.watched_members() == []
    assert SubscriptionStorage(storage, key).try_lock(), "the dead member's lock is free"


def test_a_receiver_that_polls_learns_of_a_death_before_the_watch_thread_wakes(
    tmp_path: Path, members: list[subprocess.Popen[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watch thread may wake after a receiver thread admitted the dead member's first copy (both
    wait for the GIL): ``poll_deaths`` reports the death the kernel queued on the caller's thread, once.
    Here the watch thread is held back until the poll is done."""
    members.append(live_member(tmp_path, "a"))
    late = threading.Event()
    run = CloseWatch._run

    def late_run(self: CloseWatch, fd: int) -> None:
        late.wait(WAIT_S)
        run(self, fd)

    monkeypatch.setattr(CloseWatch, "_run", late_run)
    storage = LocalDirectoryStorage(tmp_path, fsync=False)
    key = snapshot_key(TOPIC, SUBSCRIPTION, "a")
    threads: list[str] = []
    assert storage.watch_member(key, lambda: threads.append(threading.current_thread().name))
    thread = storage.watch_thread
    assert thread is not None
    storage.poll_deaths()
    assert threads == [], "reported dead while it lives"
    members[0].send_signal(signal.SIGKILL)
    members[0].wait(30)
    storage.poll_deaths()
    storage.poll_deaths()
    assert threads == [threading.current_thread().name], "the poll did not report the death, once, here"
    assert storage.watched_members() == []
    late.set()
    thread.join(WAIT_S)
    assert not thread.is_alive(), "the watch thread outlived its last watch"
    assert threads == [threading.current_thread().name], "reported twice"


def test_a_poll_waits_for_a_death_the_watch_thread_is_reporting(
    tmp_path: Path, members: list[subprocess.Popen[str]]
) -> None:
    """The watch thread read the close (the watch is gone) but has not finished its callback: a
    receiver's poll returns only after it finished (else the receiver admits the dead member's copy
    before the hold is set: CI saw all 200 copies of a takeover handed out early this way)."""
    members.append(live_member(tmp_path, "a"))
    storage = LocalDirectoryStorage(tmp_path, fsync=False)
    key = snapshot_key(TOPIC, SUBSCRIPTION, "a")
    reporting, reported = threading.Event(), threading.Event()

    def slow_on_death() -> None:  # the watch thread: a slow report
        reporting.set()
        time.sleep(0.5)
        reported.set()

    assert storage.watch_member(key, slow_on_death)
    thread = storage.watch_thread
    assert thread is not None
    members[0].send_signal(signal.SIGKILL)
    members[0].wait(30)
    wait_for(reporting, "the death was never reported")
    assert storage.watched_members() == []
    storage.poll_deaths()
    assert reported.is_set(), "the poll returned while the death was half reported"
    thread.join(WAIT_S)
    assert not thread.is_alive(), "the watch thread outlived its last watch"


def test_taking_or_trying_a_lock_is_no_death_and_unwatching_ends_the_thread(
    tmp_path: Path, members: list[subprocess.Popen[str]]
) -> None:
    """Other members open a lock file only to read it or to try its lock (read-only): no close for
    writing, no report. Unwatching every member ends the one thread, whatever the number watched."""
    names = ["a", "b", "c"]
    members.extend(live_member(tmp_path, name) for name in names)
    storage = LocalDirectoryStorage(tmp_path, fsync=False)
    calls: list[str] = []
    keys = [snapshot_key(TOPIC, SUBSCRIPTION, name) for name in names]
    for key in keys:
        assert storage.watch_member(key, lambda key=key: calls.append(key))  # type: ignore[misc]
    watchers = [t for t in threading.enumerate() if t.name == "pulsar-nack-member-watch"]
    assert len(watchers) == 1, "one thread for every watch"
    other = LocalDirectoryStorage(tmp_path, fsync=False)
    for key in keys:  # another member's periodic look: try the locks (held), read the directory
        assert not SubscriptionStorage(other, key).try_lock()
    assert not SubscriptionStorage(storage, keys[0]).try_lock()
    time.sleep(0.3)
    assert calls == [], "a read-only open was taken for a death"
    thread = storage.watch_thread
    assert thread is not None
    for key in keys:
        storage.unwatch_member(key)
    thread.join(WAIT_S)
    assert not thread.is_alive(), "the watch thread outlived its watches"
    for process in members:
        process.kill()
        process.wait(30)
    time.sleep(0.3)
    assert calls == [], "reported after unwatch"


def test_a_running_member_holds_arrivals_while_it_adopts_a_killed_members_snapshot(
    tmp_path: Path, members: list[subprocess.Popen[str]]
) -> None:
    """B's takeover watches A (alive: nothing adopted); A is killed; B is told at once, holds arrivals
    (an :class:`Adoption` handed to ``hold``) until A's 5 pending nacks are in its store, then lets them
    go. Stopping B ends every watch and the watch thread."""
    members.append(live_member(tmp_path, "a", nacks=5))
    base = LocalDirectoryStorage(tmp_path, fsync=False)
    view = SubscriptionStorage(base, snapshot_key(TOPIC, SUBSCRIPTION, "b"))
    view.lock()
    store = SegmentStore(view, SegmentConfig(), precision_bits=4)
    adopting = threading.Event()
    proceed = threading.Event()
    held: list[Adoption | None] = []
    waited: list[tuple[bool, int]] = []  # (the adoption was done, ids in B's store) when a wait ended

    def adopt(peer: object) -> int:  # the worker thread: stalls until the test lets it go
        adopting.set()
        proceed.wait(WAIT_S)
        return store.adopt(peer, 0)  # type: ignore[arg-type]

    def hold(adoption: Adoption | None) -> None:
        held.append(adoption)

    takeover = Takeover(view, adopt, hold=hold)
    assert takeover.run() == 0 and takeover.watched == [snapshot_key(TOPIC, SUBSCRIPTION, "a")]
    members[0].send_signal(signal.SIGKILL)
    members[0].wait(30)
    wait_for(adopting, "the death did not start an adoption")
    assert len(held) == 1 and isinstance(held[0], Adoption), "arrivals were not held before adopting"
    adoption = held[0]
    arrival = threading.Thread(target=lambda: waited.append((adoption.wait(), len(store))))
    arrival.start()  # an arrival on the consumer's thread: waits for the adoption
    time.sleep(0.2)
    assert not waited, "the arrival did not wait for the adoption"
    proceed.set()
    arrival.join(WAIT_S)
    assert waited == [(True, 5)], "the arrival went on before A's nacks were adopted"
    deadline = time.monotonic() + WAIT_S
    while len(held) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert held[1:] == [None] and takeover.adopted_ids == 5 and takeover.deaths_seen == 1
    # Stop: no watch, no thread left behind (a live member c is watched first).
    members.append(live_member(tmp_path, "c"))
    takeover.run()
    assert takeover.watched == [snapshot_key(TOPIC, SUBSCRIPTION, "c")]
    thread = base.watch_thread
    assert thread is not None
    takeover.stop()
    assert takeover.watched == [] and base.watched_members() == []
    thread.join(WAIT_S)
    assert not thread.is_alive()
    view.unlock()


def test_an_adoption_wait_is_bounded() -> None:
    adoption = Adoption(timeout_ms=50)
    started = time.monotonic()
    assert adoption.wait() is False
    assert time.monotonic() - started < WAIT_S
    adoption.done()
    assert adoption.wait() is True and adoption.is_done


def test_the_receiver_polls_for_deaths_only_while_a_member_is_watched(
    tmp_path: Path, members: list[subprocess.Popen[str]]
) -> None:
    """A lone member has nothing to poll: ``check_deaths`` stays None (the receiver skips the poll, ~0.35
    µs per message). It becomes the storage's poll — published to the consumer — *before* a watch of a
    new member is registered, and goes back to None when the last watched member died, only after the
    adoption's ``hold`` (a receiver that stops polling sees ``adopting`` instead); and at ``stop``."""
    base = LocalDirectoryStorage(tmp_path, fsync=False)
    view = SubscriptionStorage(base, snapshot_key(TOPIC, SUBSCRIPTION, "b"))
    view.lock()
    store = SegmentStore(view, SegmentConfig(), precision_bits=4)
    events: list[tuple[str, object]] = []
    done = threading.Event()

    def hold(adoption: Adoption | None) -> None:
        events.append(("hold", adoption))
        if adoption is None:
            done.set()

    def publish(check: object) -> None:
        events.append(("publish", check))
        events.append(("watches", len(base.watched_members())))

    takeover = Takeover(view, lambda peer: store.adopt(peer, 0), hold=hold, publish=publish)
    assert takeover.run() == 0
    assert takeover.check_deaths is None and events == [], "a lone member polls for deaths"
    members.append(live_member(tmp_path, "a", nacks=3))
    assert takeover.run() == 0 and takeover.watched == [snapshot_key(TOPIC, SUBSCRIPTION, "a")]
    assert takeover.check_deaths == base.poll_deaths
    assert events == [("publish", base.poll_deaths), ("watches", 0)], "the poll began after the watch"
    members[0].send_signal(signal.SIGKILL)
    members[0].wait(30)
    wait_for(done, "the death was not adopted")
    assert takeover.adopted_ids == 3 and takeover.check_deaths is None
    kinds = [(kind, value if kind != "hold" else value is not None) for kind, value in events[2:]]
    assert kinds[:2] == [("hold", True), ("publish", None)], f"polling ended before the hold: {events}"
    members.append(live_member(tmp_path, "c"))
    takeover.run()
    assert takeover.check_deaths == base.poll_deaths
    takeover.stop()
    assert takeover.check_deaths is None and events[-2] == ("publish", None)
    view.unlock()
