"""pulsar-lite alone: the order in which it re-dispatches the unacked messages of a killed process's two
connections (docs/snapshots.md, "The race that is left"). No pulsar_nack code but the broker launcher.

    python tests/snapshot_lite_close_order.py [RUNS]

Process A opens two clients, the second after the first: on the first it receives every message of the
Shared subscription ``s`` of a data topic, on the second the one message of the Shared subscription
``alive`` of a marker topic, and acks nothing. Process B (this one, one client, so one connection)
subscribes to both with a message listener each (one listener thread: callbacks run in the order the
frames arrive) and gets nothing while A lives. A is killed with SIGKILL: its second connection's socket
has the higher descriptor and is released first, so its FIN goes out first. For each run the script
prints whether B got the marker before the first data message, and the gap. With
``TOKIO_WORKER_THREADS=1`` in the environment (inherited by the broker) the broker's runtime has one
worker thread.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pulsar

from pulsar_nack.testing import PulsarLite

COUNT = 50

CHILD = r"""
import sys, time, pulsar
url, data, marker, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
first = pulsar.Client(url, logger=logger)
consumer = first.subscribe(data, "s", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=1000,
                           initial_position=pulsar.InitialPosition.Earliest)
held = [consumer.receive(10_000) for _ in range(count)]
second = pulsar.Client(url, logger=logger)
alive = second.subscribe(marker, "alive", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=1,
                         initial_position=pulsar.InitialPosition.Earliest)
held.append(alive.receive(10_000))
print("ready", flush=True)
time.sleep(3600)
"""


def one_run(url: str, logger: pulsar.ConsoleLogger) -> tuple[bool, float]:
    """One kill; returns (marker first, first data arrival minus marker arrival in ms)."""
    data = f"persistent://public/default/order-{uuid.uuid4().hex[:8]}"
    marker = data + "-marker"
    producer_client = pulsar.Client(url, logger=logger)
    producer = producer_client.create_producer(data, batching_enabled=False)
    for i in range(COUNT):
        producer.send(f"m{i}".encode())
    pulsar.Client.create_producer(producer_client, marker, batching_enabled=False).send(b"marker")
    producer_client.close()
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, url, data, marker, str(COUNT)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        arrivals: list[tuple[str, float]] = []
        lock = threading.Lock()

        def record(kind: str) -> object:
            def listener(consumer: object, message: pulsar.Message) -> None:
                with lock:
                    arrivals.append((kind, time.perf_counter()))

            return listener

        client = pulsar.Client(url, logger=logger)
        # pulsar-lite refuses a consumer id that another connection's consumer of the subscription has
        for i in range(3):
            client.subscribe(data + "-spacer", f"spacer-{i}").close()
        client.subscribe(data, "s", consumer_type=pulsar.ConsumerType.Shared, message_listener=record("data"))
        client.subscribe(
            marker, "alive", consumer_type=pulsar.ConsumerType.Shared, message_listener=record("marker")
        )
        time.sleep(0.3)
        assert not arrivals, "B got something while A lived"
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(arrivals) < COUNT + 1:
            time.sleep(0.01)
        client.close()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
    kinds = [kind for kind, _ in arrivals]
    assert kinds.count("marker") == 1 and kinds.count("data") >= COUNT, kinds
    at_marker = next(t for kind, t in arrivals if kind == "marker")
    at_data = next(t for kind, t in arrivals if kind == "data")
    return kinds[0] == "marker", (at_data - at_marker) * 1000


def main(runs: int) -> None:
    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    with PulsarLite() as broker:
        results = [one_run(broker.service_url, logger) for _ in range(runs)]
    for i, (first, gap) in enumerate(results):
        order = "marker first" if first else "DATA FIRST"
        print(f"run {i + 1}: {order} (first data - marker: {gap:+.2f} ms)")
    late = sum(not first for first, _ in results)
    workers = os.environ.get("TOKIO_WORKER_THREADS", "default")
    print(f"TOKIO_WORKER_THREADS={workers}: data before the marker in {late} of {runs} runs")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
