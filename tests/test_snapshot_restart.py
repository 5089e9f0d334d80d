"""Pending nacks survive a consumer killed with SIGKILL (issue 12), against real brokers and processes.

Consumer process A (tests/snapshot_consumer.py) nacks N messages with delays of 2-20 s, on a
``pulsar_nack.Client`` consumer with ``snapshot_dir`` and on an official ``pulsar.Client`` consumer of a
second subscription, and is killed with SIGKILL once the nacks are on disk. Then, in this process, a new
client subscribes with the same ``snapshot_dir``: every nacked message comes back exactly once, none earlier
than due - (2^k - 1) ms, none much later — while the official consumer's subscription gets them all at
once. A kill in the middle of a snapshot write leaves the previous snapshot intact, and it is used. With
the snapshot on a topic, B may also be another member of the Shared subscription (another consumer name):
it takes A's snapshot over at subscribe and holds A's messages back the same way."""

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
from pulsar_nack.stats import NackStats
from pulsar_nack.testing import Broker

HELPER = Path(__file__).resolve().parent / "snapshot_consumer.py"
EARLY_MS = 255 + 5  # 2^k - 1 with floor rounding (k = 8), plus reading two clocks
LATE_MS = 3_000  # generous: past due at the restart, or due later — handed out within this
OFFICIAL_DELAY_MS = 20_000  # the official consumer's one nack delay (it has no per-message delay)
START_TIMEOUT_S = 90.0


def run_consumer_a(broker: Broker, topic: str, tmp_path: Path, count: int, **extra: Any) -> dict[str, float]:
    """Start process A, wait for ``ready`` (and ``writing`` with ``stall``), SIGKILL it. Returns the due
    time (epoch ms) of each wrapped nack, by message."""
    dues = tmp_path / "dues.jsonl"
    config = {
        "service_url": broker.service_url,
        "topic": topic,
        "snapshot_dir": str(tmp_path / "snapshots"),
        "count": count,
        "delay_ms": [2_000, 20_000],
        "official_delay_ms": OFFICIAL_DELAY_MS,
        "seed": 12,
        "dues": str(dues),
        **extra,
    }
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HELPER.parent.parent), *sys.path])}
    process = subprocess.Popen(
        [sys.executable, str(HELPER), json.dumps(config)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert process.stdout is not None
        lines: list[str] = []
        waiting_for = ["ready", "writing"] if extra.get("stall") else ["ready"]
        deadline = time.monotonic() + START_TIMEOUT_S
        reader = threading.Thread(target=lambda: lines.extend(iter(process.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
        reader.start()
        while [line.strip() for line in lines] != waiting_for and time.monotonic() < deadline:
            assert process.poll() is None, f"consumer A exited with {process.returncode}: {lines}"
            time.sleep(0.05)
        assert [line.strip() for line in lines] == waiting_for, f"consumer A printed {lines}"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(30)
    assert process.returncode == -signal.SIGKILL
    return {row["data"]: row["due_ms"] for row in map(json.loads, dues.read_text().splitlines())}


def drain(
    consumer: Any,
    expected: set[str],
    last_due_ms: float,
    handouts: dict[str, list[float]],
    ids: dict[str, tuple[int, int, int]] | None = None,
) -> None:
    """Receive (and ack) until every expected message was handed out and 2 s passed with nothing new, or
    until 30 s after the last due time. Records hand-out times (epoch ms), and in ``ids`` each message's
    (ledger, entry, batch index). (bench/restart_lateness.py drains with it too.)"""
    deadline = max(last_due_ms / 1000, time.time()) + 30
    quiet_until = deadline
    missing = set(expected) - set(handouts)  # (a set built per message made the loop O(n²): 8 s of 10,000)
    while time.time() < min(deadline, quiet_until):
        try:
            message = consumer.receive(200)
        except pulsar.Timeout:
            continue
        data = message.data().decode()
        handouts.setdefault(data, []).append(time.time() * 1000)
        if ids is not None:
            mid = message.message_id()
            ids[data] = (mid.ledger_id(), mid.entry_id(), mid.batch_index())
        consumer.acknowledge(message)
        missing.discard(data)
        if quiet_until == deadline and not missing:
            quiet_until = time.time() + 2


def restart_and_check(
    broker: Broker,
    topic: str,
    tmp_path: Path,
    due: dict[str, float],
    snapshot_topic: str | None = None,
    consumer_name: str | None = None,
    late_ms: float = LATE_MS,
    p99_late_ms: float | None = None,
    forwards: bool = True,
) -> Any:
    """Consumer B and the official consumer after A's death: see the module docstring. With
    ``snapshot_topic``, B reads A's snapshot from that topic (no directory of A's); ``consumer_name``:
    B's (another than A's: B takes A's snapshot over as a member of the Shared subscription). ``late_ms``:
    none later than this after max(due, restart); ``p99_late_ms``: the 99th percentile of that lateness
    no more than this; ``forwards=False``: B hands every restored message out from the broker's
    re-dispatched copy — it forwards none. Returns B's nack stats right after it subscribed."""
    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    official_times: dict[str, list[float]] = {}

    def record(consumer: Any, message: Any) -> None:  # listener thread: record only
        official_times.setdefault(message.data().decode(), []).append(time.time() * 1000)
        consumer.acknowledge(message)

    official_client = pulsar.Client(broker.service_url, logger=logger)
    client = Client(broker.service_url, logger=logger)
    try:
        restarted_ms = time.time() * 1000
        official_client.subscribe(
            topic, "official", consumer_type=pulsar.ConsumerType.Shared, message_listener=record
        )
        snapshots: dict[str, Any] = (
            {"snapshot_storage": TopicSnapshotStorage(client, snapshot_topic)}
            if snapshot_topic
            else {"snapshot_dir": tmp_path / "snapshots"}
        )
        consumer = client.subscribe(
            topic,
            "wrapped",
            consumer_type=pulsar.ConsumerType.Shared,
            consumer_name=consumer_name,
            **snapshots,
        )
        restored = consumer.nack_stats()
        handouts: dict[str, list[float]] = {}
        drain(consumer, set(due), max(due.values()), handouts)
        drained = consumer.nack_stats()
    finally:
        client.close()
        official_client.close()
    assert restored.pending > 0 and restored.snapshots is not None, (
        f"B restored nothing ({restored}): A's nacks were due "
        f"{(restarted_ms - max(due.values())) / 1000:.1f} s before the restart at the latest"
    )
    if not forwards:
        assert drained.forwarded == 0, f"{drained.forwarded} entries forwarded after the restart: {drained}"
    assert_each_once_on_time(
        due, handouts, restarted_ms, EARLY_MS, late_ms, "nacked messages never came back"
    )
    if p99_late_ms is not None:
        lateness = sorted(v[0] - max(due[k], restarted_ms) for k, v in handouts.items())
        p99 = lateness[int(len(lateness) * 0.99)]
        assert p99 <= p99_late_ms, f"p99 lateness {p99:.0f} ms (max {lateness[-1]:.0f} ms)"
    # The contrast: the official consumer's pending nacks died with A; the broker redelivered them all
    # at once, long before most were due (A's own nacks would have waited OFFICIAL_DELAY_MS).
    assert set(official_times) == set(due)
    # (of the messages due well after the restart: those due by then cannot come early)
    later = {k for k in due if due[k] > restarted_ms + LATE_MS}
    official_early = [k for k in later if official_times[k][0] < due[k] - EARLY_MS]
    assert len(official_early) >= 0.8 * len(later), f"only {len(official_early)} of {len(later)} came early"
    assert max(v[0] for v in official_times.values()) - restarted_ms < LATE_MS
    return restored


@pytest.mark.parametrize("kind", ["lite", "apache"])
def test_nacks_come_back_at_their_due_times_after_sigkill(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    broker: Broker = request.getfixturevalue("pulsar_lite" if kind == "lite" else "apache_pulsar")
    topic = f"persistent://public/default/snap-{uuid.uuid4().hex[:8]}"
    producer_client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        produce(producer_client, topic, 300)
    finally:
        producer_client.close()
    due = run_consumer_a(broker, topic, tmp_path, 300)
    assert len(due) == 300
    restart_and_check(broker, topic, tmp_path, due)


@pytest.mark.lite_only
def test_a_kill_in_the_middle_of_a_snapshot_write_leaves_the_previous_one_in_charge(
    pulsar_lite: Broker, tmp_path: Path
) -> None:
    """A acks 20 of its 100 nacked messages after its snapshot is written, and is killed while it
    rewrites that snapshot without them (half of the new file on disk). B restores the previous snapshot,
    whole: the other 80 come back at their due times, once; the 20 acked never (the broker has their
    acks; their stale nacks find no copy)."""
    topic = f"persistent://public/default/snap-{uuid.uuid4().hex[:8]}"
    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    producer_client = pulsar.Client(pulsar_lite.service_url, logger=logger)
    try:
        produce(producer_client, topic, 100)
    finally:
        producer_client.close()
    due = run_consumer_a(pulsar_lite, topic, tmp_path, 100, stall=True, ack=20)
    acked = {f"m{i}" for i in range(20)}
    directory = tmp_path / "snapshots"
    temps = [n for n in os.listdir(directory) if n.startswith(".") and n.endswith(".tmp")]
    assert temps, f"no write in progress at the kill: {sorted(os.listdir(directory))}"
    client = Client(pulsar_lite.service_url, logger=logger)
    try:
        consumer = client.subscribe(
            topic, "wrapped", consumer_type=pulsar.ConsumerType.Shared, snapshot_dir=directory
        )
        assert not [n for n in os.listdir(directory) if n.endswith(".tmp")], "the dead writer's temp file"
        handouts: dict[str, list[float]] = {}
        drain(consumer, set(due) - acked, max(due.values()), handouts)
        stats = consumer.nack_stats()
    finally:
        client.close()
    # The previous snapshot, whole: all 100 nacks (the acks were not written) were due, and each was
    # forwarded or its copy — re-sent early by the broker at subscribe — kept and handed out then.
    assert type(stats) is NackStats
    assert stats.forwarded + stats.chunked_redelivered >= 100, stats
    assert not acked & set(handouts), f"acked before the kill, handed out: {sorted(acked & set(handouts))}"
    assert set(handouts) == set(due) - acked
    assert all(len(v) == 1 for v in handouts.values()), {k: len(v) for k, v in handouts.items() if len(v) > 1}
    early = {k: round(due[k] - v[0]) for k, v in handouts.items() if v[0] < due[k] - EARLY_MS}
    assert not early, f"handed out early (ms): {early}"


@pytest.mark.parametrize(
    "kind",
    [
        # pulsar-lite 0.2.0 stalls the dispatch of a dead consumer's unacked messages when the new one acks
        # (or asks for redeliveries) in random entry order while that re-dispatch is under way: B must read
        # every re-dispatched copy the native queue has before it hands out (and the application acks) a
        # kept one (a receive that handed out kept copies first got 3,128 of 10,000 back in 60 s)
        "lite",
        "apache",  # in every `make test`: 10,000 nacks due over 20 s
    ],
)
def test_ten_thousand_nacks_come_back_at_their_due_times_after_sigkill(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    broker: Broker = request.getfixturevalue("pulsar_lite" if kind == "lite" else "apache_pulsar")
    topic = f"persistent://public/default/snap-{uuid.uuid4().hex[:8]}"
    producer_client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        produce(producer_client, topic, 10_000)
    finally:
        producer_client.close()
    due = run_consumer_a(broker, topic, tmp_path, 10_000)
    restart_and_check(broker, topic, tmp_path, due)


@pytest.mark.lite_only
def test_ten_thousand_batched_nacks_come_back_at_their_due_times_after_sigkill(
    pulsar_lite: Broker, tmp_path: Path
) -> None:
    """Issue 27 item 4 on pulsar-lite: 10,000 messages in batches of 100, each nacked with its own delay
    (2-20 s), so one batch's messages are due at many times and sit in several snapshot segments. Every
    one comes back once and none early. Lateness past max(due, restart) is bounded generously (a loaded
    machine; the issue's goal, p99 <= 2.05 s and none past 5 s, is a figure bench/restart_lateness.py
    measures): none past 9.5 s, p99 <= 6 s — the issue's run had p99 8.2 s, max 10.1 s; a run at load 8-10
    on 2 cores had p99 5.1 s, max 6.4 s. Before the fix 476-686 never came back:
    restore kept only the earliest segment's part of a batch, and an entry on storage counted as pending
    whole, so the arrival filter took its pending messages for acked. Measured after, alone on 2 cores:
    p99 0.44 s, max 0.67 s; beside another test suite: p99 3.0 s, max 5.1 s."""
    topic = f"persistent://public/default/snap-{uuid.uuid4().hex[:8]}"
    producer_client = pulsar.Client(
        pulsar_lite.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )
    try:
        producer = producer_client.create_producer(
            topic, batching_enabled=True, batching_max_messages=100, batching_max_publish_delay_ms=20,
            block_if_queue_full=True,
        )  # fmt: skip
        for i in range(10_000):
            producer.send_async(f"m{i}".encode(), None)
        producer.flush()
        producer.close()
    finally:
        producer_client.close()
    due = run_consumer_a(pulsar_lite, topic, tmp_path, 10_000, batched=True)
    restart_and_check(pulsar_lite, topic, tmp_path, due, late_ms=9_500, p99_late_ms=6_000)


def produce_batched(broker: Broker, topic: str, count: int, batch: int) -> None:
    """``count`` messages ``m0``… in batches of ``batch``."""
    client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        producer = client.create_producer(
            topic, batching_enabled=True, batching_max_messages=batch, batching_max_publish_delay_ms=20,
            block_if_queue_full=True,
        )  # fmt: skip
        for i in range(count):
            producer.send_async(f"m{i}".encode(), None)
        producer.flush()
        producer.close()
    finally:
        client.close()


@pytest.mark.parametrize("kind", ["lite", "apache"])
def test_restored_batched_nacks_are_handed_out_from_the_redispatched_copies(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """1,000 messages in batches of 100, nacked with delays of 0.2-20 s — a share of them due by the time
    B has restored the snapshot. The broker re-dispatches every entry to B at once; B keeps each copy of a
    restored nack and hands it out when due, forwarding none — it used to forward the ids due at the
    restore before their copies came (every entry of the topic at once), take the copies that came a
    moment later for something else, and wait for the broker's answer to those forwards (on pulsar-lite,
    with 10,000 such nacks, 1,638 messages more than 5 s late). Each message once, none early, none more
    than 5 s after max(due, restart) (generous: a loaded machine)."""
    broker: Broker = request.getfixturevalue("pulsar_lite" if kind == "lite" else "apache_pulsar")
    topic = f"persistent://public/default/snap-{uuid.uuid4().hex[:8]}"
    produce_batched(broker, topic, 1_000, 100)
    # (up to 20 s: on a loaded machine A took long enough to snapshot that every nack of 0.2-10 s was due,
    # and forwarded, before it was killed — B then restored none)
    due = run_consumer_a(broker, topic, tmp_path, 1_000, batched=True, delay_ms=[200, 20_000])
    restart_and_check(broker, topic, tmp_path, due, late_ms=5_000, forwards=False)


@pytest.mark.parametrize("kind", ["lite", "apache"])
def test_a_member_taking_over_batched_nacks_hands_them_out_from_the_redispatched_copies(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The same as a takeover: A is ``worker-a`` of the Shared subscription and is killed; B, ``worker-b``
    on the same snapshot directory, adopts A's snapshot at subscribe while the broker hands it A's
    unacked messages at once. B keeps each copy and hands it out when due, forwarding none: an adopted
    id due before its copy came used to be forwarded at once (a restored one waited for its copy)."""
    broker: Broker = request.getfixturevalue("pulsar_lite" if kind == "lite" else "apache_pulsar")
    topic = f"persistent://public/default/snap-{uuid.uuid4().hex[:8]}"
    produce_batched(broker, topic, 1_000, 100)
    due = run_consumer_a(
        broker, topic, tmp_path, 1_000, batched=True, delay_ms=[200, 20_000], consumer_name="worker-a"
    )
    restored = restart_and_check(
        broker, topic, tmp_path, due, consumer_name="worker-b", late_ms=5_000, forwards=False
    )
    assert restored.pending > 0, "B took over A's pending nacks at subscribe"


@pytest.mark.parametrize("kind", ["lite", "apache"])
def test_nacks_kept_on_a_topic_come_back_on_another_machine(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The same with TopicSnapshotStorage: A keeps its snapshot on a topic of the broker; B, with no
    directory of A's (another machine), reads it from there."""
    broker: Broker = request.getfixturevalue("pulsar_lite" if kind == "lite" else "apache_pulsar")
    topic = f"persistent://public/default/snap-{uuid.uuid4().hex[:8]}"
    snapshot_topic = f"{topic}-nack-snapshots"
    producer_client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        produce(producer_client, topic, 300)
    finally:
        producer_client.close()
    due = run_consumer_a(broker, topic, tmp_path, 300, snapshot_topic=snapshot_topic)
    assert not (tmp_path / "snapshots").exists(), "A kept nothing on disk"
    restart_and_check(broker, topic, tmp_path / "elsewhere", due, snapshot_topic=snapshot_topic)


@pytest.mark.parametrize("kind", ["lite", "apache"])
def test_a_shared_member_takes_over_a_killed_members_nacks_kept_on_a_topic(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Process A (consumer ``worker-a`` of the Shared subscription) keeps its snapshot on a topic and is
    killed; B — another process's consumer, named ``worker-b``, no disk of A's — subscribes: the broker
    hands it A's unacked messages at once, B finds A's snapshot under the subscription's prefix, sees A's
    member lock free (A is dead), adopts A's pending nacks and deletes A's snapshot. Every message comes
    back exactly once, none earlier than its due time allows, none much later."""
    broker: Broker = request.getfixturevalue("pulsar_lite" if kind == "lite" else "apache_pulsar")
    topic = f"persistent://public/default/snap-{uuid.uuid4().hex[:8]}"
    snapshot_topic = f"{topic}-nack-snapshots"
    producer_client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        produce(producer_client, topic, 300)
    finally:
        producer_client.close()
    due = run_consumer_a(
        broker, topic, tmp_path, 300, snapshot_topic=snapshot_topic, consumer_name="worker-a"
    )
    restored = restart_and_check(
        broker, topic, tmp_path / "elsewhere", due, snapshot_topic=snapshot_topic, consumer_name="worker-b"
    )
    assert restored.pending >= 300, "B took over A's pending nacks at subscribe"
    # A's snapshot is gone from the topic (B deleted it after writing the nacks into its own), and B's
    # own snapshot is empty again (every nack came back and was acked).
    reader_client = Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        storage = TopicSnapshotStorage(reader_client, snapshot_topic)
        left = [n for n in storage.list() if ".seg-" in n]
        storage.close()
    finally:
        reader_client.close()
    assert not left, f"snapshot segments left on the topic: {left}"
