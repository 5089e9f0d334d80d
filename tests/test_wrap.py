"""``pulsar_nack.wrap`` and ``pulsar_nack.aio.wrap`` on a real broker (pulsar-lite): each takes an existing
consumer over once — a second wrap of the same consumer raises ``TypeError`` (docs/parameters.md) and
leaves the first wrapper working; the asyncio one exists, as the README says ("aio does the same")."""

from __future__ import annotations

import asyncio
import inspect
import uuid

import pulsar
import pulsar.asyncio
import pytest

import pulsar_nack
from pulsar_nack import aio
from pulsar_nack.testing import Broker

SHARED = pulsar.ConsumerType.Shared


def _topic() -> str:
    return f"persistent://public/default/wrap-{uuid.uuid4().hex[:12]}"


def test_wrapping_a_consumer_twice_raises_and_the_first_wrapper_keeps_working(pulsar_lite: Broker) -> None:
    client = pulsar.Client(pulsar_lite.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        topic = _topic()
        native = client.subscribe(
            topic, "sub", consumer_type=SHARED, negative_ack_redelivery_delay_ms=pulsar_nack.NATIVE_DELAY_MS
        )
        first = pulsar_nack.wrap(native, native_delay_ms=pulsar_nack.NATIVE_DELAY_MS)
        with pytest.raises(TypeError, match="already wrapped"):
            pulsar_nack.wrap(native, native_delay_ms=pulsar_nack.NATIVE_DELAY_MS)
        with pytest.raises(TypeError, match="already wrapped"):
            pulsar_nack.wrap(first, native_delay_ms=pulsar_nack.NATIVE_DELAY_MS)
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(b"m0")
        message = first.receive(10_000)
        first.negative_acknowledge(message, delay_ms=300)
        again = first.receive(10_000)
        assert again.data() == b"m0" and again.redelivery_count() == 1
        first.acknowledge(again)
        with pytest.raises(pulsar.Timeout):
            first.receive(1_000)  # once: a second tracker would have forwarded it again
        stats = first.nack_stats()
        assert stats.redelivered == 1 and stats.pending == 0
    finally:
        client.close()


async def _aio_wrap(service_url: str) -> None:
    client = pulsar.asyncio.Client(service_url)
    try:
        topic = _topic()
        native = await client.subscribe(
            topic, "sub", consumer_type=SHARED, negative_ack_redelivery_delay_ms=pulsar_nack.NATIVE_DELAY_MS
        )
        consumer = aio.wrap(native, native_delay_ms=pulsar_nack.NATIVE_DELAY_MS)
        assert isinstance(consumer, aio.NackConsumer) and isinstance(consumer, pulsar.asyncio.Consumer)
        with pytest.raises(TypeError, match="already wrapped"):
            aio.wrap(native, native_delay_ms=pulsar_nack.NATIVE_DELAY_MS)
        with pytest.raises(TypeError, match=r"takes a pulsar\.Consumer"):
            pulsar_nack.wrap(native, native_delay_ms=pulsar_nack.NATIVE_DELAY_MS)  # the sync wrap: not this
        producer = await client.create_producer(topic, batching_enabled=False)
        for i in range(3):
            await producer.send(f"m{i}".encode())
        delays = {b"m0": 600, b"m1": 200}  # per-call delays; m2 is acked at once
        async with asyncio.timeout(20):
            for _ in range(3):
                message = await consumer.receive()
                if message.data() in delays:
                    await consumer.negative_acknowledge(message, delay_ms=delays[message.data()])
                else:
                    await consumer.acknowledge(message)
            back = [await consumer.receive() for _ in range(2)]
        assert sorted(m.data() for m in back) == [b"m0", b"m1"], "each nacked one, once"
        assert all(m.redelivery_count() == 1 for m in back)
        for message in back:
            await consumer.acknowledge(message)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(consumer.receive(), 1.0)
        assert consumer.nack_stats().redelivered == 2
        await consumer.close()
    finally:
        await client.close()


def test_aio_wrap_takes_an_asyncio_consumer_over(pulsar_lite: Broker) -> None:
    asyncio.run(asyncio.wait_for(_aio_wrap(pulsar_lite.service_url), 60))


def test_aio_wrap_has_the_sync_wraps_options() -> None:
    sync, asynchronous = inspect.signature(pulsar_nack.wrap), inspect.signature(aio.wrap)
    assert list(asynchronous.parameters) == list(sync.parameters)
    with pytest.raises(TypeError, match=r"aio\.wrap\(\) takes a pulsar\.asyncio\.Consumer"):
        aio.wrap("not a consumer", native_delay_ms=pulsar_nack.NATIVE_DELAY_MS)
