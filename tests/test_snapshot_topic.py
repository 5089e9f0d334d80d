"""TopicSnapshotStorage against a real broker: blobs keyed by name, deletes as tombstones, a second
storage on the topic (another machine) reads the latest state, and a segment store restores from it."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pulsar
import pytest

from pulsar_nack.snapshot import SegmentStore, SnapshotStorageError
from pulsar_nack.snapshot.topic import TopicSnapshotStorage


@pytest.fixture
def client(pulsar_lite: Any) -> Iterator[pulsar.Client]:
    client = pulsar.Client(pulsar_lite.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    yield client
    client.close()


@pytest.fixture
def topic() -> str:
    return f"persistent://public/default/snaps-{uuid.uuid4().hex[:8]}"


def test_blobs_and_tombstones_are_read_back_by_another_storage(client: pulsar.Client, topic: str) -> None:
    first = TopicSnapshotStorage(client, topic)
    assert first.list() == []
    first.put("k.seg-0000000000000001.pnk", b"one")
    first.put("k.seg-0000000000000002.pnk", b"two")
    first.put("k.seg-0000000000000001.pnk", b"one again")
    first.delete("k.seg-0000000000000002.pnk")
    first.delete("k.seg-0000000000000009.pnk")  # not stored: nothing sent
    big = bytes(range(256)) * (4 * 1024)  # 1 MB
    first.put("k.seg-0000000000000003.pnk", big)
    second = TopicSnapshotStorage(client, topic)  # another machine: reads the topic
    assert second.list() == ["k.seg-0000000000000001.pnk", "k.seg-0000000000000003.pnk"]
    assert second.get("k.seg-0000000000000001.pnk") == b"one again"
    assert second.get("k.seg-0000000000000003.pnk") == big
    with pytest.raises(SnapshotStorageError, match="no snapshot"):
        second.get("k.seg-0000000000000002.pnk")
    first.close()
    second.close()


def test_a_segment_store_restores_from_the_topic(client: pulsar.Client, topic: str) -> None:
    store = SegmentStore(TopicSnapshotStorage(client, topic), precision_bits=0)
    for entry in range(100):
        store.add(10_000 + entry, 7, entry, topic="t")
    store.close(0)
    restored = SegmentStore(TopicSnapshotStorage(client, topic), precision_bits=0)
    assert restored.restore(0).ids == 100
    assert restored.due_of(7, 42, topic="t") == 10_042


def test_bad_arguments_and_blobs_are_refused(client: pulsar.Client, topic: str) -> None:
    with pytest.raises(TypeError, match="client"):
        TopicSnapshotStorage("pulsar://127.0.0.1:6650", topic)
    with pytest.raises(TypeError, match="topic"):
        TopicSnapshotStorage(client, "")
    with pytest.raises(TypeError, match="alive_client"):
        TopicSnapshotStorage(client, topic, alive_client="pulsar://127.0.0.1:6650")
    storage = TopicSnapshotStorage(client, topic, max_bytes=10)
    with pytest.raises(SnapshotStorageError, match="tombstone"):
        storage.put("k.a", b"")
    with pytest.raises(SnapshotStorageError, match="invalid snapshot name"):
        storage.put("../a", b"x")
    storage.put("k.a", b"more than ten bytes")
    with pytest.raises(SnapshotStorageError, match="more than allowed"):
        TopicSnapshotStorage(client, topic, max_bytes=10)


def test_refresh_reads_another_processes_writes(client: pulsar.Client, topic: str) -> None:
    mine = TopicSnapshotStorage(client, topic)
    other = TopicSnapshotStorage(client, topic)  # another member, writing meanwhile
    other.put("k.seg-0000000000000001.pnk", b"one")
    mine.put("j.seg-0000000000000001.pnk", b"mine")
    assert mine.list() == ["j.seg-0000000000000001.pnk"], "read once, at construction"
    mine.refresh()
    assert mine.list() == ["j.seg-0000000000000001.pnk", "k.seg-0000000000000001.pnk"]
    other.delete("k.seg-0000000000000001.pnk")
    mine.refresh()
    assert mine.list() == ["j.seg-0000000000000001.pnk"]
    mine.close()
    other.close()


def test_member_locks_are_exclusive_subscriptions(pulsar_lite: Any, topic: str) -> None:
    """A key's lock is held by one storage (a live consumer) at a time; another storage — another process
    in real life — cannot take it (pulsar-lite does not answer a second Exclusive consumer: the wait
    ends after lock_timeout_ms); once the holder lets go (its connection closes at its death) it can. A
    ``forget`` unlock deletes the lock subscription."""
    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    holder_client = pulsar.Client(pulsar_lite.service_url, logger=logger)
    other_client = pulsar.Client(pulsar_lite.service_url, logger=logger)
    try:
        holder = TopicSnapshotStorage(holder_client, topic, lock_timeout_ms=1_000)
        other = TopicSnapshotStorage(other_client, topic, lock_timeout_ms=1_000)
        assert holder.lock_member("k-1")
        assert not holder.lock_member("k-1"), "held by this storage: a live consumer of this process"
        assert not other.lock_member("k-1"), "held by a live consumer"
        assert other.lock_member("k-2"), "another key"
        holder_client.close()  # as a process's death closes its connection
        taken = False
        for _ in range(20):  # the broker drops the holder's consumer with its connection
            taken = other.lock_member("k-1")
            if taken:
                break
        assert taken
        other.unlock_member("k-1", forget=True)
        other.unlock_member("k-2")
        assert other.lock_member("k-2"), "a closed lock can be taken again"
        other.close()
        with pytest.raises(ValueError, match="lock_timeout_ms"):
            TopicSnapshotStorage(other_client, topic, lock_timeout_ms=0)
    finally:
        other_client.close()
        with contextlib.suppress(pulsar.PulsarException):
            holder_client.close()  # closed already, unless the test failed before


def test_a_consumer_waits_for_the_broker_to_drop_its_dead_predecessors_lock(
    pulsar_lite: Any, topic: str
) -> None:
    """Subscribing, a consumer asks for its own key's lock again while it is held, ``lock_wait_ms`` long
    (the previous owner may be a vanished machine the broker has not noticed yet): it gets the lock once
    the holder's connection closes; without the wait it is refused as a duplicate name."""
    from pulsar_nack.snapshot.namespace import SubscriptionStorage

    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    holder_client = pulsar.Client(pulsar_lite.service_url, logger=logger)
    client = pulsar.Client(pulsar_lite.service_url, logger=logger)
    try:
        holder = TopicSnapshotStorage(holder_client, topic, lock_timeout_ms=500)
        assert holder.lock_member("k-1")
        impatient = SubscriptionStorage(
            TopicSnapshotStorage(client, topic, lock_timeout_ms=500, lock_wait_ms=0), "k-1"
        )
        with pytest.raises(SnapshotStorageError, match="in use by another live consumer"):
            impatient.lock()
        patient = SubscriptionStorage(
            TopicSnapshotStorage(client, topic, lock_timeout_ms=500, lock_wait_ms=30_000), "k-1"
        )
        closer = threading.Timer(1.5, holder_client.close)  # the broker notices the holder is gone
        closer.start()
        patient.lock()
        closer.join(30)
        assert not closer.is_alive()
        patient.unlock()
    finally:
        client.close()
        with contextlib.suppress(pulsar.PulsarException):
            holder_client.close()


def test_asking_whether_another_member_lives_leaves_the_askers_connection_alone(
    pulsar_lite: Any, topic: str
) -> None:
    """pulsar-lite 0.2.0 refuses an Exclusive subscribe to a held lock by closing the asker's connection —
    with every consumer on it: a running member's data consumer got its unacked messages handed out again
    (the duplicates of tests/test_snapshot_running_takeover.py). The probe goes through ``probe_client``,
    a connection of its own: the data consumer on ``client`` gets nothing again."""
    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    holder_client = pulsar.Client(pulsar_lite.service_url, logger=logger)
    client = pulsar.Client(pulsar_lite.service_url, logger=logger)
    probe_client = pulsar.Client(pulsar_lite.service_url, logger=logger)
    try:
        holder = TopicSnapshotStorage(holder_client, topic, lock_timeout_ms=1_000)
        assert holder.lock_member("k-1")
        # pulsar-lite never answers a subscribe whose consumer id a consumer of the subscription on another
        # connection has (ids count from 0 per client): the probe's must differ from the holder's.
        for i in range(3):
            pulsar.Client.subscribe(probe_client, f"{topic}-spacer", f"spacer-{i}").close()
        data_topic = f"{topic}-data"
        consumer = client.subscribe(data_topic, "s", consumer_type=pulsar.ConsumerType.Shared)
        producer = client.create_producer(data_topic, batching_enabled=False)
        producer.send(b"unacked")
        message = consumer.receive(10_000)  # not acked: the broker hands it out again if `client` drops
        asker = TopicSnapshotStorage(client, topic, lock_timeout_ms=1_000, probe_client=probe_client)
        assert not asker.lock_member("k-1", probe=True), "held by a live member"
        with pytest.raises(pulsar.Timeout):
            again = consumer.receive(3_000)
            pytest.fail(f"handed out again: {again.data()!r} (the asker's connection was closed)")
        consumer.acknowledge(message)
        with pytest.raises(TypeError, match="probe_client"):
            TopicSnapshotStorage(client, topic, probe_client="pulsar://127.0.0.1:6650")
    finally:
        for each in (probe_client, client, holder_client):
            with contextlib.suppress(pulsar.PulsarException):
                each.close()
