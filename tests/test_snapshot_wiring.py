"""The ``snapshot_dir`` / ``snapshot_storage`` options: defined once in NackOptions (so subscribe, the
asyncio subscribe and wrap all take them), exclusive, checked before anything is subscribed or created."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pulsar
import pytest

import pulsar_nack
from pulsar_nack import NackOptions
from pulsar_nack.snapshot import InMemoryStorage, LocalDirectoryStorage, SegmentStore
from pulsar_nack.snapshot.wiring import subscription_storage, tracker_snapshot_arguments


def options(**arguments: Any) -> NackOptions:
    return NackOptions.from_arguments(arguments, caller="subscribe")


def test_snapshot_dir_is_shorthand_for_a_local_directory_storage(tmp_path: Path) -> None:
    given = options(snapshot_dir=tmp_path / "snaps")
    assert given.snapshot_dir == tmp_path / "snaps" and given.snapshot_storage is None
    assert not (tmp_path / "snaps").exists(), "checking the options creates nothing"
    view = given.snapshots_for("t", "s")
    assert view is not None and isinstance(view.base, LocalDirectoryStorage)
    assert (tmp_path / "snaps").is_dir() and os.stat(tmp_path / "snaps").st_mode & 0o777 == 0o700
    view.unlock()
    storage = InMemoryStorage()
    view = options(snapshot_storage=storage).snapshots_for("t", "s")
    assert view is not None and view.base is storage
    assert options().snapshots_for("t", "s") is None


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        (
            {"snapshot_dir": "d", "snapshot_storage": InMemoryStorage()},
            TypeError,
            "snapshot_dir and snapshot_storage",
        ),
        ({"snapshot_dir": 5}, TypeError, "snapshot_dir must be"),
        ({"snapshot_dir": b"d"}, TypeError, "snapshot_dir must be"),
        ({"snapshot_dir": ""}, ValueError, "snapshot_dir"),
        ({"snapshot_storage": "d"}, TypeError, "snapshot_storage must be.*use snapshot_dir"),
        ({"snapshot_storage": object()}, TypeError, "snapshot_storage must be"),
    ],
)
def test_bad_snapshot_options_are_refused_naming_them(
    arguments: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        options(**arguments)


def test_subscribe_refuses_bad_options_before_subscribing(tmp_path: Path) -> None:
    quiet = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    client = pulsar_nack.Client(
        "pulsar://127.0.0.1:9", operation_timeout_seconds=1, logger=quiet
    )  # none there
    try:
        with pytest.raises(TypeError, match="snapshot_dir and snapshot_storage"):
            client.subscribe("t", "s", snapshot_dir=tmp_path / "x", snapshot_storage=InMemoryStorage())
        with pytest.raises(pulsar_nack.snapshot.SnapshotStorageError):  # a file where the dir should be
            (tmp_path / "file").write_bytes(b"")
            client.subscribe("t", "s", snapshot_dir=tmp_path / "file")
        assert not (tmp_path / "x").exists()
        view = subscription_storage(tmp_path / "held", None, "t", "s")  # another live consumer holds it
        with pytest.raises(pulsar_nack.snapshot.SnapshotStorageError, match="in use"):
            client.subscribe("t", "s", snapshot_dir=tmp_path / "held")
        assert view is not None
        view.unlock()
        with pytest.raises(pulsar.Timeout):  # no broker: subscribe fails, and the key is unlocked again
            client.subscribe("t", "s", snapshot_dir=tmp_path / "held")
        again = subscription_storage(tmp_path / "held", None, "t", "s")
        assert again is not None
        again.unlock()
    finally:
        client.close()


def test_the_tracker_gets_a_store_of_its_precision_and_an_epoch_clock() -> None:
    assert tracker_snapshot_arguments(None, 8, "floor") == {}
    arguments = tracker_snapshot_arguments(InMemoryStorage(), 5, "ceil")
    store = arguments["index"]
    assert isinstance(store, SegmentStore)
    assert store.add(1000, 1, 1) == 1024, "k = 5, ceil"
    assert abs(arguments["clock"]() - pulsar_nack.timer.monotonic_ms()) > 1e12, "epoch ms, not monotonic"


@pytest.mark.parametrize("entry", ["subscribe", "wrap", "aio"])
def test_every_entry_point_keeps_and_restores_a_snapshot(
    entry: str, pulsar_lite: Any, unique_topic: str, tmp_path: Path
) -> None:
    """A nack through subscribe, wrap or the asyncio subscribe reaches the snapshot at close, and the
    next consumer of the subscription (same entry point, same directory, same consumer name: wrap() has
    no other way to know it) has it pending again."""
    import asyncio

    from pulsar_nack import aio

    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    options = {
        "consumer_type": pulsar.ConsumerType.Shared,
        "initial_position": pulsar.InitialPosition.Earliest,
        "consumer_name": "worker-1",
    }
    producer_client = pulsar.Client(pulsar_lite.service_url, logger=logger)
    producer_client.create_producer(unique_topic).send(b"m")
    producer_client.close()

    def sync_life(nack: bool) -> int:
        if entry == "subscribe":
            client = pulsar_nack.Client(pulsar_lite.service_url, logger=logger)
            consumer = client.subscribe(unique_topic, "s", snapshot_dir=tmp_path, **options)
        else:
            client = pulsar.Client(pulsar_lite.service_url, logger=logger)
            native = client.subscribe(unique_topic, "s", negative_ack_redelivery_delay_ms=102, **options)
            consumer = pulsar_nack.wrap(native, native_delay_ms=102, snapshot_dir=tmp_path)
        pending = consumer.nack_stats().pending
        if nack:
            consumer.negative_acknowledge(consumer.receive(10_000), delay_ms=600_000)
        consumer.close()
        client.close()
        return pending

    async def aio_life(nack: bool) -> int:
        client = aio.Client(pulsar_lite.service_url, logger=logger)
        consumer = await client.subscribe(unique_topic, "s", snapshot_dir=tmp_path, **options)
        pending = consumer.nack_stats().pending
        if nack:
            await consumer.negative_acknowledge(await consumer.receive(), delay_ms=600_000)
        await consumer.close()
        await client.close()
        return pending

    def life(nack: bool) -> int:
        return asyncio.run(aio_life(nack)) if entry == "aio" else sync_life(nack)

    assert life(nack=True) == 0
    assert life(nack=False) == 1, "the nack came back from the snapshot"


def segment_files(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith((".pnk", ".pnw")))


@pytest.mark.parametrize("entry", ["subscribe", "wrap", "aio"])
def test_unsubscribe_deletes_the_snapshot(
    entry: str, pulsar_lite: Any, unique_topic: str, tmp_path: Path
) -> None:
    """The subscription is gone: its pending nacks are void, and no file of them is left behind (the
    asyncio consumer too, whose ``unsubscribe`` is its own coroutine). A consumer that closes instead
    leaves its snapshot (the control: the nack did reach the storage)."""
    import asyncio

    from pulsar_nack import aio

    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    options = {
        "consumer_type": pulsar.ConsumerType.Shared,
        "initial_position": pulsar.InitialPosition.Earliest,
        "consumer_name": "worker-1",
    }
    producer_client = pulsar.Client(pulsar_lite.service_url, logger=logger)
    producer_client.create_producer(unique_topic).send(b"m")
    producer_client.close()

    def sync_life(subscription: str, unsubscribe: bool) -> None:
        if entry == "subscribe":
            client = pulsar_nack.Client(pulsar_lite.service_url, logger=logger)
            consumer = client.subscribe(unique_topic, subscription, snapshot_dir=tmp_path, **options)
        else:
            client = pulsar.Client(pulsar_lite.service_url, logger=logger)
            native = client.subscribe(
                unique_topic, subscription, negative_ack_redelivery_delay_ms=102, **options
            )
            consumer = pulsar_nack.wrap(native, native_delay_ms=102, snapshot_dir=tmp_path)
        try:
            consumer.negative_acknowledge(consumer.receive(10_000), delay_ms=600_000)
            consumer.unsubscribe() if unsubscribe else consumer.close()
        finally:
            client.close()

    async def aio_life(subscription: str, unsubscribe: bool) -> None:
        client = aio.Client(pulsar_lite.service_url, logger=logger)
        try:
            consumer = await client.subscribe(unique_topic, subscription, snapshot_dir=tmp_path, **options)
            await consumer.negative_acknowledge(await consumer.receive(), delay_ms=600_000)
            await (consumer.unsubscribe() if unsubscribe else consumer.close())
        finally:
            await client.close()

    def life(subscription: str, unsubscribe: bool) -> None:
        if entry == "aio":
            asyncio.run(aio_life(subscription, unsubscribe))
        else:
            sync_life(subscription, unsubscribe)

    life("kept", unsubscribe=False)
    kept = segment_files(tmp_path)
    assert kept, "a closed consumer keeps its snapshot"
    life("gone", unsubscribe=True)
    assert segment_files(tmp_path) == kept, "the unsubscribed consumer's snapshot is deleted"


def test_two_wrapped_consumers_of_one_subscription_have_a_snapshot_each(
    pulsar_lite: Any, unique_topic: str, tmp_path: Path
) -> None:
    """wrap() keys the snapshot by the consumer's name too: two wrapped consumers of one Shared
    subscription share a directory (neither is refused as "in use"), each nack lands in its consumer's
    own snapshot; one restarted under its name gets its own back (and takes over the other's)."""
    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    producer_client = pulsar.Client(pulsar_lite.service_url, logger=logger)
    producer = producer_client.create_producer(unique_topic)
    for i in range(4):
        producer.send(f"m{i}".encode())
    producer_client.close()
    client = pulsar.Client(pulsar_lite.service_url, logger=logger)

    def wrapped(name: str) -> Any:
        native = client.subscribe(
            unique_topic,
            "s",
            consumer_type=pulsar.ConsumerType.Shared,
            initial_position=pulsar.InitialPosition.Earliest,
            negative_ack_redelivery_delay_ms=102,
            receiver_queue_size=1,
            consumer_name=name,
        )
        return pulsar_nack.wrap(native, native_delay_ms=102, snapshot_dir=tmp_path)

    try:
        first, second = wrapped("worker-1"), wrapped("worker-2")
        nacked = {"worker-1": 0, "worker-2": 0}
        for name, consumer in (("worker-1", first), ("worker-2", second)):
            consumer.negative_acknowledge(consumer.receive(10_000), delay_ms=600_000)
            nacked[name] += 1
        deadline = time.monotonic() + 10  # each checkpoints its own within a second
        while len({n.split(".")[0] for n in segment_files(tmp_path)}) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len({n.split(".")[0] for n in segment_files(tmp_path)}) == 2, segment_files(tmp_path)
        # (worker-2 may take worker-1's over when it sees worker-1 close: its watch reports a close.)
        takeover = second._nacks.tracker.takeover
        first.close()
        second.close()
        if takeover._running is not None:  # an adoption of worker-1's holds its lock: let it finish
            takeover._running.join(10)
        # worker-1 again: its own nack back, and worker-2's — a closed member's pending nacks are taken
        # over (its messages went back to the broker, for the members to hold back; docs/snapshots.md).
        again = wrapped("worker-1")
        assert again.nack_stats().pending == sum(nacked.values())
        again.close()
        assert len({n.split(".")[0] for n in segment_files(tmp_path)}) == 1, segment_files(tmp_path)
    finally:
        client.close()
