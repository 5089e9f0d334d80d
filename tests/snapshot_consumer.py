"""Consumer process A of the restart tests (tests/test_snapshot_restart.py): run as a script, killed with
SIGKILL by the test.

    python snapshot_consumer.py CONFIG_JSON

It subscribes twice to the topic: with ``pulsar_nack.Client`` and ``snapshot_dir`` (subscription
``wrapped``) and with the official ``pulsar.Client`` (subscription ``official``); receives ``count``
messages on each and nacks every one — the wrapper with its own delay, the official consumer with its one
delay for all (it has no other) — and writes ``{"data": ..., "due_ms": epoch ms, "nacked_ms": epoch ms}``
per wrapped nack to ``dues``. Once every nack is in the snapshot on disk (or on ``snapshot_topic``, if
given) it prints ``ready``. ``consumer_name``: the wrapped consumer's (a member of the Shared subscription
``wrapped``); ``official: false`` skips the official consumer; ``batched: true``: the topic's messages are
batched (A waits for every id the index has pending to be on storage, batched or not); ``alive_client`` /
``probe_client``: give the topic storage those clients (``TopicSnapshotStorage``).
With ``stall``: then acks the
first ``ack`` nacked messages and makes the next snapshot write (the rewrite without them) stop half-way
through its temp file, printing ``writing`` — where the test kills it. Then it sleeps.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
from typing import Any

import pulsar

import pulsar_nack
from pulsar_nack.snapshot import LocalDirectoryStorage, SnapshotStorage
from pulsar_nack.snapshot.topic import TopicSnapshotStorage

READY_TIMEOUT_S = 60.0


class StallingStorage(LocalDirectoryStorage):
    """The real local storage; once ``stall`` is set, the next temp file gets half its bytes and the
    writer stops there (the test kills the process in the middle of that write)."""

    stall = threading.Event()

    def _write_temp(self, temp: str, data: bytes) -> None:
        if not self.stall.is_set():
            super()._write_temp(temp, data)
            return
        super()._write_temp(temp, data[: len(data) // 2])
        print("writing", flush=True)
        time.sleep(3600)


def receive(consumer: Any, count: int) -> list[pulsar.Message]:
    got: list[pulsar.Message] = []
    deadline = time.monotonic() + READY_TIMEOUT_S
    while len(got) < count and time.monotonic() < deadline:
        try:
            got.append(consumer.receive(1000))
        except pulsar.Timeout:
            continue
    if len(got) < count:
        raise SystemExit(f"received {len(got)} of {count}")
    return got


def main(config: dict[str, Any]) -> None:
    rng = random.Random(config["seed"])
    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    count = config["count"]
    if config.get("official", True):
        official_client = pulsar.Client(config["service_url"], logger=logger)
        official = official_client.subscribe(
            config["topic"],
            "official",
            consumer_type=pulsar.ConsumerType.Shared,
            initial_position=pulsar.InitialPosition.Earliest,
            negative_ack_redelivery_delay_ms=config["official_delay_ms"],
        )
        for message in receive(official, count):
            official.negative_acknowledge(message)
    client = pulsar_nack.Client(config["service_url"], logger=logger)
    storage: SnapshotStorage
    if config.get("snapshot_topic"):  # on the broker: B needs no disk of A's
        alive = pulsar.Client(config["service_url"], logger=logger) if config.get("alive_client") else None
        probe = pulsar.Client(config["service_url"], logger=logger) if config.get("probe_client") else None
        storage = TopicSnapshotStorage(
            client, config["snapshot_topic"], alive_client=alive, probe_client=probe
        )
    else:
        storage = StallingStorage(config["snapshot_dir"])
    consumer = client.subscribe(
        config["topic"],
        "wrapped",
        consumer_type=pulsar.ConsumerType.Shared,
        initial_position=pulsar.InitialPosition.Earliest,
        receiver_queue_size=1000,
        consumer_name=config.get("consumer_name"),
        snapshot_storage=storage,
    )
    messages = receive(consumer, count)
    low, high = config["delay_ms"]
    with open(config["dues"], "w") as dues:
        for message in messages:
            delay = rng.uniform(low, high)
            now_ms = time.time() * 1000
            row = {"data": message.data().decode(), "due_ms": now_ms + delay, "nacked_ms": now_ms}
            dues.write(json.dumps(row))
            dues.write("\n")
            consumer.negative_acknowledge(message, delay_ms=delay)
    # Seal and write the nacks now, as the consumer's timer does every checkpoint interval (a test's look
    # inside: waiting for the timer's snapshot to be durable took > 20 s once on a quiet machine — A reads
    # no redelivered copy, so the arrival filter files every due message whose entry's copy is on its way
    # again at each bucket, and the snapshot store was durable only between such filings and the next seal).
    tracker = consumer._nacks.tracker
    keeper = consumer._nacks.keeper
    assert keeper is not None
    store = keeper.store
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        store.checkpoint(int(tracker.now()))
        snapshots = consumer.nack_stats().snapshots
        assert snapshots is not None
        # every id sealed by now written (ids_not_durable less ids_unsealed: sealed segments whose write
        # has not succeeded); ids filed since are due messages waiting for their copy (due at a restart)
        if snapshots.ids_not_durable == snapshots.ids_unsealed:
            break
        time.sleep(0.05)
    else:
        raise SystemExit("the nacks never reached the snapshot")
    print("ready", flush=True)
    if config.get("stall"):
        for message in messages[: config["ack"]]:
            consumer.acknowledge(message)
        time.sleep(0.3)  # the acks reach the broker (the client groups them for 100 ms)
        StallingStorage.stall.set()  # the next write: the snapshot rewritten without the acked ids
    time.sleep(3600)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
