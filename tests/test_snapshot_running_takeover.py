"""A member of a Shared subscription that is already running holds a killed member's copies back at once
(issue 12), against real brokers and real processes.

Process A (tests/snapshot_consumer.py, consumer ``worker-a`` of the Shared subscription ``wrapped``)
receives every message, nacks each with a delay of 2-20 s and keeps its snapshot in the shared storage.
Consumer B (``worker-b``, this process, same storage) is running and receiving before A dies: once B
watches A (:attr:`Takeover.watched <pulsar_nack.snapshot.takeover.Takeover.watched>`), A is killed with
SIGKILL. The broker hands A's unacked messages to B at once; B learns of A's death the moment it happens,
holds its arrivals until A's snapshot is adopted, and then holds A's copies until due. Every one of A's
nacked messages is handed out by B exactly once, never earlier than due - (2^k - 1) ms.

On pulsar-lite with the topic storage, the broker may hand B the first copies a fraction of a ms before
A's alive marker (it handles the closes of A's two connections in either order:
tests/snapshot_lite_close_order.py); those go out at once. There the test checks that no copy is handed
out early by a ``receive`` that began after B learned of the death, and everything else as elsewhere —
each exactly once (the duplicates B's lock probes caused there, closing B's connection, are gone with
``probe_client``), none late.

Before the watch (B looked every 5 s only), B handed the copies that arrived before its next look out at
once — up to 20 s early: this test failed then (A is killed ~1 s after B subscribed, long before its
next look, with every nack due 1-19 s later).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pulsar
import pytest
from messaging import produce
from snapshot_helpers import assert_each_once_on_time

from pulsar_nack import Client
from pulsar_nack.snapshot.topic import TopicSnapshotStorage
from pulsar_nack.testing import Broker

HELPER = Path(__file__).resolve().parent / "snapshot_consumer.py"
COUNT = 200
EARLY_MS = 255 + 5  # 2^k - 1 with floor rounding (k = 8), plus reading two clocks
LATE_MS = 3_000  # generous: handed out within this after its due time (or after the kill)
START_TIMEOUT_S = 90.0
WATCH_TIMEOUT_S = 30.0


def start_consumer_a(broker: Broker, topic: str, tmp_path: Path, **extra: Any) -> subprocess.Popen[str]:
    """Start process A and wait until its nacks are in its snapshot (it prints ``ready``)."""
    config = {
        "service_url": broker.service_url,
        "topic": topic,
        "snapshot_dir": str(tmp_path / "snapshots"),
        "count": COUNT,
        "delay_ms": [2_000, 20_000],
        "official_delay_ms": 20_000,
        "official": False,
        "seed": 12,
        "dues": str(tmp_path / "dues.jsonl"),
        "consumer_name": "worker-a",
        **extra,
    }
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HELPER.parent.parent), *sys.path])}
    process = subprocess.Popen(
        [sys.executable, str(HELPER), json.dumps(config)], stdout=subprocess.PIPE, text=True, env=env
    )
    lines: list[str] = []
    assert process.stdout is not None
    stdout = process.stdout
    threading.Thread(target=lambda: lines.extend(iter(stdout.readline, "")), daemon=True).start()
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while [line.strip() for line in lines] != ["ready"] and time.monotonic() < deadline:
            assert process.poll() is None, f"consumer A exited with {process.returncode}: {lines}"
            time.sleep(0.05)
        assert [line.strip() for line in lines] == ["ready"], f"consumer A printed {lines}"
    except BaseException:
        process.kill()
        process.wait(30)
        raise
    return process


def run_and_kill(broker: Broker, tmp_path: Path, storage: str, *, unordered: bool = False) -> None:
    """The scenario of the module docstring, with the snapshots in a local directory or on a topic.
    ``unordered``: the broker may hand B copies before A's alive marker (pulsar-lite): those handed out
    before B learned of the death may be early; every other check holds (exactly once, none late)."""
    topic = f"persistent://public/default/live-{uuid.uuid4().hex[:8]}"
    snapshot_topic = f"{topic}-nack-snapshots"
    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    producer_client = pulsar.Client(broker.service_url, logger=logger)
    try:
        produce(producer_client, topic, COUNT)
    finally:
        producer_client.close()
    # A's alive marker on a connection of its own (TopicSnapshotStorage(alive_client=...)): opened after
    # the data's, closed before it when A dies — without it pulsar-lite handed B the data before the
    # marker in 1 of 3 runs (docs/snapshots.md, the race that is left). The members ask whether the
    # others live on a connection of their own too (probe_client=): pulsar-lite closes the connection of
    # a refused Exclusive subscribe, and with B's data consumer on it, B's copies came twice.
    extra = (
        {"snapshot_topic": snapshot_topic, "alive_client": True, "probe_client": True}
        if storage == "topic"
        else {}
    )
    process = start_consumer_a(broker, topic, tmp_path, **extra)
    client = Client(broker.service_url, logger=logger)
    probe_client = pulsar.Client(broker.service_url, logger=logger) if storage == "topic" else None
    handouts: dict[str, list[float]] = {}
    informed: dict[str, bool] = {}  # key → whether B knew of a death before the receive that handed it out
    try:
        # pulsar-lite 0.2.0 never answers a subscribe to a subscription that has a consumer with the same
        # consumer id on another connection (ids count from 0 per client): B's ids must not be A's.
        for each in (client, probe_client) if probe_client is not None else (client,):
            for i in range(5):
                pulsar.Client.subscribe(each, f"{topic}-spacer", f"spacer-{i}").close()
        snapshots: dict[str, Any] = (
            {"snapshot_storage": TopicSnapshotStorage(client, snapshot_topic, probe_client=probe_client)}
            if storage == "topic"
            else {"snapshot_dir": tmp_path / "snapshots"}
        )
        consumer = client.subscribe(
            topic, "wrapped", consumer_type=pulsar.ConsumerType.Shared, consumer_name="worker-b", **snapshots
        )
        takeover = consumer._nacks.tracker.takeover
        assert takeover is not None
        assert consumer.nack_stats().pending == 0, "A is alive: nothing taken over at subscribe"
        # (getattr: the test also runs against the code before the watch, to see it fail there)
        deadline = time.monotonic() + WATCH_TIMEOUT_S
        while not getattr(takeover, "watched", True) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert getattr(takeover, "watched", True), "B never watched A"
        # B is running: receiving (nothing comes while A holds every message) when A is killed.
        stop = threading.Event()
        receiving = threading.Thread(
            target=receive_until, args=(consumer, stop, handouts, takeover, informed), daemon=True
        )
        receiving.start()
        # With the snapshots in a directory, another thread of B runs Python at the kill: the watch's
        # thread and the receiver then wait for the GIL, and the receiver may win (CI: one copy handed
        # out 9 s early). B polls the deaths before admitting (Takeover.check_deaths): none is early.
        busy = threading.Event()
        if storage == "directory":
            threading.Thread(target=hold_the_gil, args=(busy,), daemon=True).start()
        time.sleep(0.3)
        killed_ms = time.time() * 1000
        process.send_signal(signal.SIGKILL)
        process.wait(30)
        assert process.returncode == -signal.SIGKILL
        time.sleep(1.0)
        busy.set()
        due = {
            row["data"]: row["due_ms"]
            for row in map(json.loads, (tmp_path / "dues.jsonl").read_text().splitlines())
        }
        end = max(due.values()) / 1000 + LATE_MS / 1000 + 2
        while time.time() < end and not (set(handouts) >= set(due)):
            time.sleep(0.2)
        time.sleep(2)  # a duplicate would come now
        stop.set()
        receiving.join(30)
        assert not receiving.is_alive()
        deaths = getattr(takeover, "deaths_seen", 0)
        noticed_ms = getattr(takeover, "last_death_ms", None)
    finally:
        client.close()
        if probe_client is not None:
            probe_client.close()
    assert len(due) == COUNT
    # The test means something: most of A's nacks were still pending (not yet due) at the kill.
    assert sum(d > killed_ms + 1_000 for d in due.values()) >= 0.8 * COUNT
    assert deaths >= 1, "B's watch never reported A's death"
    assert noticed_ms is not None and noticed_ms - killed_ms < 1_000, "B learned of A's death late"
    if unordered:
        # The broker re-dispatches the messages of A's two connections in no set order: the copies it
        # hands B before the marker are handed out at once, before B can know (the race left on
        # pulsar-lite, shown by tests/snapshot_lite_close_order.py). Only those: none handed out by a
        # receive that began after B learned of the death.
        early = {k for k, v in handouts.items() if k in due and v[0] < due[k] - EARLY_MS}
        knew = sorted(k for k in early if informed[k])
        assert not knew, f"{len(knew)} handed out early after B learned of A's death: {knew[:10]}"
        print(f"{len(early)} copies handed out before B learned of A's death")  # (pytest -s shows it)
        due = {k: handouts[k][0] if k in early else v for k, v in due.items()}
    assert_each_once_on_time(due, handouts, killed_ms, EARLY_MS, LATE_MS, "of A's nacked messages never came")


def hold_the_gil(stop: threading.Event) -> None:
    """Run Python (holding the GIL but for the switch interval) until ``stop``, at most 30 s."""
    deadline = time.monotonic() + 30
    while not stop.is_set() and time.monotonic() < deadline:
        sum(range(10_000))


def receive_until(
    consumer: Any,
    stop: threading.Event,
    handouts: dict[str, list[float]],
    takeover: Any,
    informed: dict[str, bool],
) -> None:
    """B's application: receive and ack, recording hand-out times (epoch ms), until ``stop``; and for each
    key's first hand-out whether B's takeover had seen a death before that ``receive`` began."""
    while not stop.is_set():
        knew = getattr(takeover, "deaths_seen", 0) > 0
        try:
            message = consumer.receive(200)
        except pulsar.Timeout:
            continue
        key = message.data().decode()
        informed.setdefault(key, knew)
        handouts.setdefault(key, []).append(time.time() * 1000)
        consumer.acknowledge(message)


@pytest.mark.parametrize("storage", ["directory", "topic"])
@pytest.mark.parametrize("kind", ["lite", "apache"])
def test_a_running_member_holds_a_killed_members_copies_back_at_once(
    kind: str, storage: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    broker: Broker = request.getfixturevalue("pulsar_lite" if kind == "lite" else "apache_pulsar")
    run_and_kill(broker, tmp_path, storage, unordered=kind == "lite" and storage == "topic")
