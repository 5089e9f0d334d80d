"""The ``snapshot_dir`` / ``snapshot_storage`` options: defined once in NackOptions (so subscribe, the
asyncio subscribe and wrap all take them), exclusive, checked before anything is subscribed or created."""

from __future__ import annotations

import os
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
    store = arguments["snapshots"]
    assert isinstance(store, SegmentStore)
    assert store.add(1000, 1, 1) == 1024, "k = 5, ceil"
    assert abs(arguments["clock"]() - pulsar_nack.timer.monotonic_ms()) > 1e12, "epoch ms, not monotonic"


@pytest.mark.parametrize("entry", ["subscribe", "wrap", "aio"])
def test_every_entry_point_keeps_and_restores_a_snapshot(
    entry: str, pulsar_lite: Any, unique_topic: str, tmp_path: Path
) -> None:
    """A nack through subscribe, wrap or the asyncio subscribe reaches the snapshot at close, and the
    next consumer of the subscription (same entry point, same directory) has it pending again."""
    import asyncio

    from pulsar_nack import aio

    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    options = {
        "consumer_type": pulsar.ConsumerType.Shared,
        "initial_position": pulsar.InitialPosition.Earliest,
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
