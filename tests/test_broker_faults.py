"""A broker crash while nacks are pending and in flight (issue 9): every nacked message comes back, none
is handed out twice or before its time, nothing the application acked is handed out again, and the
subscription drains — batched and not, on both brokers (each test starts and SIGKILLs its own broker)."""

from __future__ import annotations

import random
import time
import uuid

import pulsar
import pytest
from messaging import leftover, own_broker, receive_all

from pulsar_nack import Client

MESSAGES = 200
EARLY_ALLOWANCE_S = 0.256 + 0.005  # 2^k ms with floor rounding (k = 8), plus reading the clocks


@pytest.mark.parametrize("fast_receive", [False, True], ids=["classified", "fast"])
@pytest.mark.parametrize("batching", [False, True], ids=["single", "batched"])
@pytest.mark.parametrize("kind", ["lite", "apache"])
def test_broker_killed_with_nacks_pending_and_in_flight(
    kind: str, batching: bool, fast_receive: bool, request: pytest.FixtureRequest
) -> None:
    """With ``fast_receive`` the messages are handed out in fast mode and the first nack takes over
    (docs/receive_cost.md): the acks made before it are inferred, and the copies the restarted broker
    sends (redelivery count 0) of acked messages must still be dropped."""
    rng = random.Random(11)
    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    with own_broker(kind, request) as broker:
        client = Client(broker.service_url, operation_timeout_seconds=30, logger=logger)
        topic = f"persistent://public/default/kill-{uuid.uuid4().hex[:8]}"
        consumer = client.subscribe(
            topic, "sub", consumer_type=pulsar.ConsumerType.Shared, fast_receive=fast_receive
        )
        producer = client.create_producer(
            topic, batching_enabled=batching, batching_max_messages=10, batching_max_publish_delay_ms=20
        )
        for i in range(MESSAGES):
            producer.send_async(f"m{i}".encode(), None)
        producer.flush()
        producer.close()
        due: dict[bytes, float] = {}
        acked: set[bytes] = set()
        to_nack = []
        for message in receive_all(consumer, MESSAGES):
            if rng.random() < 0.5:
                consumer.acknowledge(message)
                acked.add(message.data())
            else:
                to_nack.append(message)
        # The acks reach the broker's storage first: Apache persists a cursor's acks at most once a second
        # (managedLedgerDefaultMarkDeleteRateLimit), and a SIGKILL loses the later ones — their messages
        # then come again to any consumer, the official one too (seen: m100..m113 after 0.35 s).
        time.sleep(1.5)
        for message in to_nack:  # some due before the crash (in flight), some during it, some long after
            delay_ms = rng.choice([200, 400, 800, 1_500, 3_000, 6_000])
            due[message.data()] = time.monotonic() + delay_ms / 1000
            consumer.negative_acknowledge(message, delay_ms=delay_ms)
        time.sleep(0.35)  # the first forwards are in flight
        killed = time.monotonic()
        broker.kill()
        time.sleep(0.5)
        broker.start()
        handouts: dict[bytes, list[float]] = {}
        deadline = time.monotonic() + 60
        quiet_until = deadline  # once everything is back: 2 s more for anything handed out twice
        while time.monotonic() < min(deadline, quiet_until):
            try:
                message = consumer.receive(300)
            except pulsar.Timeout:
                continue
            handouts.setdefault(message.data(), []).append(time.monotonic())
            consumer.acknowledge(message)
            if quiet_until == deadline and set(handouts) >= set(due):
                quiet_until = time.monotonic() + 2.0
        missing = sorted(set(due) - set(handouts))
        # A message handed out before the crash may come again once after it (its first hand-out's ack was
        # not made before the kill); none may come twice after the restart.
        twice = {k: [round(t - killed, 2) for t in v] for k, v in handouts.items() if len(v) > 1}
        twice = {k: v for k, v in twice.items() if v[0] > 0}
        again = sorted(set(handouts) & acked)
        early = {
            k: round(due[k] - v[0], 3)
            for k, v in handouts.items()
            if k in due and v[0] < due[k] - EARLY_ALLOWANCE_S
        }
        assert not missing, f"nacked messages never came back: {missing[:10]}"
        assert not twice, f"handed out more than once after the restart (s after the kill): {twice}"
        assert not again, f"acked before the crash, handed out again: {again[:10]}"
        assert not early, f"handed out early (s): {early}"
        consumer.close()
        left = leftover(client, topic, "sub")
        assert not left, f"a fresh consumer of the subscription got {len(left)} messages: {left[:10]}"
        client.close()
