"""``acknowledge_cumulative`` beside the official consumer, on Apache Pulsar (issue 27).

On Exclusive and Failover subscriptions a redelivery request is a redeliver-all in the native client: the
broker sends every unacked message again. A cumulative ack covering a nacked message used to leave its
nack pending in the wrapper: forwarded when due — a redeliver-all — and, no copy of an acked message ever
coming, forwarded again every 30 s up to 3 times (32 duplicate hand-outs in 100 s where the official
consumer had 7). Now the cumulative ack settles every pending nack, forward and batch record up to the
acked message: nothing of it is forwarded, and the wrapper hands out no more duplicates than the official
consumer. (pulsar-lite ignores nacks on these subscription types: Apache only.)

Each consumer, on its own subscription of one topic: 20 messages (batches of 5, or not batched); nack m3,
then ``acknowledge_cumulative`` m9 (the message, or its id), hold m10-m19 unacked; then count the
messages handed out again over the nack's delay plus 4 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any

import pulsar
import pytest
from messaging import produce, produce_bursts, receive_all

import pulsar_nack
from pulsar_nack import aio
from pulsar_nack.testing import Broker

COUNT = 20
NACKED = "m3"
CUMULATIVE = "m9"  # the last message of the second batch of 5
NACK_DELAY_MS = 2_000
WATCH_S = NACK_DELAY_MS / 1000 + 4


def _run(consumer: Any, by_id: bool) -> dict[str, int]:
    """The scenario on one consumer; returns how often each message was handed out again."""
    first = {m.data().decode(): m for m in receive_all(consumer, COUNT)}
    assert set(first) == {f"m{i}" for i in range(COUNT)}
    consumer.negative_acknowledge(first[NACKED])
    acked = first[CUMULATIVE]
    consumer.acknowledge_cumulative(acked.message_id() if by_id else acked)
    again: dict[str, int] = {}
    end = time.monotonic() + WATCH_S
    while (left := end - time.monotonic()) > 0:
        try:
            message = consumer.receive(max(1, int(left * 1000)))
        except pulsar.Timeout:
            break
        key = message.data().decode()
        again[key] = again.get(key, 0) + 1
    for message in first.values():
        consumer.acknowledge(message)
    return again


@pytest.mark.apache_only
@pytest.mark.parametrize("batching", [False, True], ids=["single", "batched"])
@pytest.mark.parametrize(
    "kind", [pulsar.ConsumerType.Exclusive, pulsar.ConsumerType.Failover], ids=["exclusive", "failover"]
)
def test_a_cumulative_ack_settles_the_nacks_it_covers(
    broker: Broker, kind: pulsar.ConsumerType, batching: bool
) -> None:
    topic = f"persistent://public/default/cumul-{uuid.uuid4().hex[:8]}"
    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    options: dict[str, Any] = {"consumer_type": kind, "negative_ack_redelivery_delay_ms": NACK_DELAY_MS}
    official_client = pulsar.Client(broker.service_url, logger=logger)
    wrapped_client = pulsar_nack.Client(broker.service_url, logger=logger)
    try:
        official = official_client.subscribe(topic, "official", **options)
        wrapped = wrapped_client.subscribe(topic, "wrapped", **options)
        if batching:
            produce_bursts(official_client, topic, COUNT, batch_size=5)
        else:
            produce(official_client, topic, COUNT)
        by_official = _run(official, by_id=batching)
        by_wrapper = _run(wrapped, by_id=batching)
        stats = wrapped.nack_stats()
    finally:
        wrapped_client.close()
        official_client.close()
    settled = {f"m{i}" for i in range(10)}
    assert not settled & set(by_wrapper), f"cumulatively acked, handed out again: {by_wrapper}"
    assert stats.pending == 0 and stats.forwarded == 0, f"the covered nack was forwarded: {stats}"
    assert sum(by_wrapper.values()) <= sum(by_official.values()), (by_wrapper, by_official)


@pytest.mark.apache_only
def test_the_asyncio_consumers_cumulative_ack_settles_the_nacks_it_covers(broker: Broker) -> None:
    """The same on ``pulsar_nack.aio`` (Exclusive, batched, by message): nothing forwarded, nothing of
    m0-m9 handed out again."""
    topic = f"persistent://public/default/cumul-{uuid.uuid4().hex[:8]}"
    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    producer_client = pulsar.Client(broker.service_url, logger=logger)

    async def scenario() -> tuple[dict[str, int], Any]:
        client = aio.Client(broker.service_url, logger=logger)
        try:
            consumer = await client.subscribe(
                topic,
                "wrapped-aio",
                consumer_type=pulsar.ConsumerType.Exclusive,
                negative_ack_redelivery_delay_ms=NACK_DELAY_MS,
            )
            await asyncio.to_thread(produce_bursts, producer_client, topic, COUNT, batch_size=5)
            first: dict[str, Any] = {}
            async with asyncio.timeout(30):
                while len(first) < COUNT:
                    message = await consumer.receive()
                    first[message.data().decode()] = message
            await consumer.negative_acknowledge(first[NACKED])
            await consumer.acknowledge_cumulative(first[CUMULATIVE])
            again: dict[str, int] = {}
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(WATCH_S):
                    while True:
                        key = (await consumer.receive()).data().decode()
                        again[key] = again.get(key, 0) + 1
            return again, consumer.nack_stats()
        finally:
            await client.close()

    try:
        again, stats = asyncio.run(scenario())
    finally:
        producer_client.close()
    assert not {f"m{i}" for i in range(10)} & set(again), again
    assert stats.pending == 0 and stats.forwarded == 0, stats


@pytest.mark.lite_only
def test_a_refused_cumulative_ack_settles_nothing(broker: Broker) -> None:
    """On a Shared subscription the official call refuses a cumulative ack (as it does a wrong type): the
    wrapper raises the same and its pending nack stays."""
    topic = f"persistent://public/default/cumul-{uuid.uuid4().hex[:8]}"
    client = pulsar_nack.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        consumer = client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared)
        produce(client, topic, 2)
        first, second = receive_all(consumer, 2)
        consumer.negative_acknowledge(first)
        with pytest.raises(pulsar.CumulativeAcknowledgementNotAllowedError):
            consumer.acknowledge_cumulative(second)
        with pytest.raises(TypeError):
            consumer.acknowledge_cumulative("m1")
        assert consumer.nack_stats().pending == 1
    finally:
        client.close()
