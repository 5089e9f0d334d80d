"""TopicSnapshotStorage against a real broker: blobs keyed by name, deletes as tombstones, a second
storage on the topic (another machine) reads the latest state, and a segment store restores from it."""

from __future__ import annotations

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
    storage = TopicSnapshotStorage(client, topic, max_bytes=10)
    with pytest.raises(SnapshotStorageError, match="tombstone"):
        storage.put("k.a", b"")
    with pytest.raises(SnapshotStorageError, match="invalid snapshot name"):
        storage.put("../a", b"x")
    storage.put("k.a", b"more than ten bytes")
    with pytest.raises(SnapshotStorageError, match="more than allowed"):
        TopicSnapshotStorage(client, topic, max_bytes=10)
