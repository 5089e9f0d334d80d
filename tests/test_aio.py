"""pulsar_nack.aio against real brokers: the Python client's asyncio nack test, per-call delays, batches,
cancellation, lifecycle and bad input.

Each test runs one coroutine with ``asyncio.run`` (bounded by ``asyncio.wait_for``); timing bounds are
generous: these machines are shared.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pulsar
import pulsar.asyncio
import pytest

import pulsar_nack
from pulsar_nack import MultiplierRedeliveryBackoff, aio
from pulsar_nack.testing import Broker

SHARED = pulsar.ConsumerType.Shared
TEST_TIMEOUT_S = 60


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), TEST_TIMEOUT_S))


@pytest.fixture
def client(broker: Broker) -> Iterator[aio.Client]:
    c = aio.Client(
        broker.service_url, operation_timeout_seconds=30, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn)
    )
    try:
        yield c
    finally:
        asyncio.run(c.close())


async def subscribe(client: aio.Client, topic: str, **kwargs: Any) -> aio.NackConsumer:
    kwargs.setdefault("consumer_type", SHARED)
    return await client.subscribe(topic, "sub", **kwargs)


async def produce(client: aio.Client, topic: str, count: int, one_batch: bool = False) -> None:
    """``msg-0`` ... Awaiting each send (the upstream test's way) makes one batch per message with the
    asyncio producer's default batching; ``one_batch`` sends them together, as one batch entry."""
    producer = await client.create_producer(topic, batching_max_publish_delay_ms=50)
    if one_batch:
        await asyncio.gather(*(producer.send(f"msg-{i}".encode()) for i in range(count)))
    else:
        for i in range(count):
            await producer.send(f"msg-{i}".encode())
    await producer.close()


async def receive_all(
    consumer: aio.NackConsumer, count: int, timeout_s: float = 15.0
) -> list[pulsar.Message]:
    """Receive exactly ``count`` messages (fails on timeout)."""
    got: list[pulsar.Message] = []
    try:
        async with asyncio.timeout(timeout_s):
            while len(got) < count:
                got.append(await consumer.receive())
    except TimeoutError:
        pytest.fail(f"timed out with {len(got)} of {count}: {[m.data() for m in got]}")
    return got


async def nothing_more(consumer: aio.NackConsumer, wait_s: float = 0.8) -> None:
    try:
        extra = await asyncio.wait_for(consumer.receive(), wait_s)
    except TimeoutError:
        return
    pytest.fail(f"unexpected extra message {extra.data()!r}")


@pytest.mark.parametrize("one_batch", [False, True], ids=["batch-per-message", "one-batch"])
def test_ack_1_and_3_nack_0_2_4_brings_back_exactly_0_2_4(
    client: aio.Client, unique_topic: str, one_batch: bool
) -> None:
    """The Python client's asyncio test. In one batch, the entry that comes back holds msg-1 and msg-3
    too (acked before): they must not be handed out again."""

    async def scenario() -> None:
        consumer = await subscribe(client, unique_topic, negative_ack_redelivery_delay_ms=100)
        await produce(client, unique_topic, 5, one_batch)
        msgs = await receive_all(consumer, 5)
        assert [m.data() for m in msgs] == [f"msg-{i}".encode() for i in range(5)]
        entries = {m.message_id().entry_id() for m in msgs}
        assert len(entries) == (1 if one_batch else 5)
        await consumer.acknowledge(msgs[1])
        await consumer.acknowledge(msgs[3])
        for i in (0, 2, 4):
            await consumer.negative_acknowledge(msgs[i])
        again = await receive_all(consumer, 3)
        assert [m.data() for m in again] == [b"msg-0", b"msg-2", b"msg-4"]
        assert all(m.redelivery_count() == 1 for m in again)
        for message in again:
            await consumer.acknowledge(message)
        await nothing_more(consumer)
        stats = consumer.nack_stats()
        assert (stats.nacked, stats.forwarded, stats.redelivered, stats.pending) == (
            3,
            1 if one_batch else 3,
            3,
            0,
        )
        assert stats.memory_bytes is None, "not measured unless asked"
        memory = consumer.nack_stats(with_memory=True).memory_bytes
        assert memory is not None and memory > 0
        if one_batch:
            assert stats.dropped == 2, "msg-1 and msg-3 came back with the entry and were not handed out"
        await consumer.close()

    run(scenario)


def test_per_call_delay_overrides_default_and_backoff(client: aio.Client, unique_topic: str) -> None:
    """Per-call delays (ceil rounding: never early) beat a 60 s default and a 30 s backoff; the
    messages come back in due order, by message and by id alike."""

    async def scenario() -> None:
        consumer = await subscribe(
            client,
            unique_topic,
            negative_ack_redelivery_delay_ms=60_000,
            negative_ack_redelivery_backoff=MultiplierRedeliveryBackoff(30_000, 60_000),
            negative_ack_rounding="ceil",
        )
        await produce(client, unique_topic, 3)
        messages = await receive_all(consumer, 3)
        nacked = time.monotonic()
        delays = {b"msg-0": 900, b"msg-1": 600, b"msg-2": 300}
        for i, message in enumerate(messages):
            target = message if i % 2 else message.message_id()
            await consumer.negative_acknowledge(target, delay_ms=delays[message.data()])
        arrivals: list[tuple[bytes, float]] = []
        for message in await receive_all(consumer, 3):
            arrivals.append((message.data(), (time.monotonic() - nacked) * 1000))
            await consumer.acknowledge(message)
        assert [data for data, _ in arrivals] == [b"msg-2", b"msg-1", b"msg-0"]
        for data, elapsed_ms in arrivals:
            assert delays[data] <= elapsed_ms <= delays[data] + 1500, (data, elapsed_ms)
        await nothing_more(consumer)
        await consumer.close()

    run(scenario)


def test_zero_delay_comes_back_at_the_native_minimum(client: aio.Client, unique_topic: str) -> None:
    """The native consumer is subscribed with NATIVE_DELAY_MS: a 0 ms nack is back in about 100 ms, not
    after the official 60 s default; the redelivery hook runs on the timer thread, not on the loop."""
    hook_threads: list[threading.Thread] = []

    async def scenario() -> None:
        consumer = await subscribe(
            client,
            unique_topic,
            negative_ack_redelivery_delay_ms=0,
            on_redelivery=lambda _due: hook_threads.append(threading.current_thread()),
        )
        await produce(client, unique_topic, 1)
        message = (await receive_all(consumer, 1))[0]
        nacked = time.monotonic()
        await consumer.negative_acknowledge(message)
        again = (await receive_all(consumer, 1, timeout_s=5))[0]
        elapsed_ms = (time.monotonic() - nacked) * 1000
        assert again.data() == b"msg-0" and pulsar_nack.NATIVE_DELAY_MS - 5 <= elapsed_ms <= 1000
        await consumer.acknowledge(again)
        await consumer.close()

    run(scenario)
    assert hook_threads and all(t is not threading.main_thread() for t in hook_threads)


def test_backoff_by_redelivery_count(client: aio.Client, unique_topic: str) -> None:
    backoff = MultiplierRedeliveryBackoff(100, 400)

    async def scenario() -> None:
        consumer = await subscribe(
            client, unique_topic, negative_ack_redelivery_backoff=backoff, negative_ack_rounding="ceil"
        )
        await produce(client, unique_topic, 1)
        message = (await receive_all(consumer, 1))[0]
        for count in range(3):
            assert message.redelivery_count() == count
            nacked = time.monotonic()
            await consumer.negative_acknowledge(message)
            message = (await receive_all(consumer, 1))[0]
            assert (time.monotonic() - nacked) * 1000 >= backoff.next(count)
        await consumer.acknowledge(message)
        await consumer.close()

    run(scenario)


def test_a_cancelled_receive_loses_no_message(client: aio.Client, unique_topic: str) -> None:
    """pulsar.asyncio's own receive, cancelled by a timeout, leaves a native receive behind that silently
    eats the next message. Here every message still arrives, in order."""

    async def scenario() -> None:
        consumer = await subscribe(client, unique_topic)
        for _ in range(3):
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(consumer.receive(), 0.1)
        await produce(client, unique_topic, 5)
        got: list[pulsar.Message] = []
        while len(got) < 5:  # short timeouts: some receives are cancelled after their message arrived
            try:
                got.append(await asyncio.wait_for(consumer.receive(), 0.05))
            except TimeoutError:
                continue
        assert [m.data() for m in got] == [f"msg-{i}".encode() for i in range(5)]
        for message in got:
            await consumer.acknowledge(message)
        await nothing_more(consumer, 0.3)
        await consumer.close()

    run(scenario)


@pytest.mark.parametrize("on_close", ["drop", "flush"])
def test_close_with_pending_nacks(client: aio.Client, unique_topic: str, on_close: str) -> None:
    """Either way the messages come back to the subscription; the closed consumer refuses nacks."""

    async def scenario() -> None:
        consumer = await subscribe(
            client, unique_topic, negative_ack_redelivery_delay_ms=60_000, on_close=on_close
        )
        await produce(client, unique_topic, 3)
        messages = await receive_all(consumer, 3)
        for message in messages:
            await consumer.negative_acknowledge(message)
        assert consumer.nack_stats().pending == 3
        await consumer.close()
        await consumer.close()  # closing twice is fine (as in the Go client's test)
        await consumer.negative_acknowledge(messages[0])  # does nothing, like the official consumer's
        assert consumer.nack_stats().nacked == 3
        with pytest.raises(pulsar.asyncio.PulsarException):
            await consumer.receive()
        other = await subscribe(client, unique_topic)
        again = await receive_all(other, 3)
        assert sorted(m.data() for m in again) == [b"msg-0", b"msg-1", b"msg-2"]
        for message in again:
            await other.acknowledge(message)
        await other.close()

    run(scenario)


def test_bad_inputs_name_the_problem_and_change_nothing(client: aio.Client, unique_topic: str) -> None:
    async def scenario() -> None:
        consumer = await subscribe(
            client, unique_topic, max_redelivery_delay_ms=10_000, negative_ack_redelivery_delay_ms=1000
        )
        await produce(client, unique_topic, 1)
        message = (await receive_all(consumer, 1))[0]
        with pytest.raises(TypeError, match=r"pulsar\.Message"):
            await consumer.negative_acknowledge("msg-0")
        with pytest.raises(ValueError, match="delay_ms"):
            await consumer.negative_acknowledge(message, delay_ms=-1)
        with pytest.raises(TypeError, match="delay_ms"):
            await consumer.negative_acknowledge(message, delay_ms="soon")  # type: ignore[arg-type]
        with pytest.raises(pulsar_nack.DelayLimitExceeded, match="10000 milliseconds"):
            await consumer.negative_acknowledge(message, delay_ms=20_000)
        assert consumer.nack_stats().pending == 0, "nothing filed by a rejected nack"
        await consumer.close()
        cases: list[tuple[dict[str, Any], type[Exception], str]] = [
            ({"negative_ack_precision_bit_cnt": 31}, ValueError, "negative_ack_precision_bit_cnt"),
            ({"negative_ack_rounding": "up"}, ValueError, "rounding"),
            ({"negative_ack_redelivery_delay_ms": -5}, ValueError, "negative_ack_redelivery_delay_ms"),
            ({"on_close": "keep"}, ValueError, "on_close"),
            ({"negative_ack_redelivery_backoff": 5}, TypeError, "negative_ack_redelivery_backoff"),
            ({"message_listener": print}, TypeError, "message_listener"),  # pulsar.asyncio has none
        ]
        for kwargs, error, text in cases:
            with pytest.raises(error, match=text):
                await subscribe(client, unique_topic, **kwargs)

    run(scenario)


@pytest.mark.parametrize("kind", ["sync", "aio"])
def test_closing_the_client_stops_unclosed_consumers_trackers(
    broker: Broker, unique_topic: str, kind: str
) -> None:
    """Otherwise each consumer's timer thread outlives the client (pending nacks can go nowhere)."""
    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn)
    if kind == "sync":
        client = pulsar_nack.Client(broker.service_url, logger=logger)
        consumer: Any = client.subscribe(unique_topic, "sub", consumer_type=SHARED)
        client.close()
    else:

        async def scenario() -> Any:
            client = aio.Client(broker.service_url, logger=logger)
            consumer = await client.subscribe(unique_topic, "sub", consumer_type=SHARED)
            await client.close()
            return consumer

        consumer = asyncio.run(scenario())
    tracker = consumer._nacks.tracker
    assert tracker.closed
    assert not tracker._wheel._thread or not tracker._wheel._thread.is_alive()


@pytest.mark.parametrize("kind", ["sync", "aio"])
def test_bad_nack_options_subscribe_nothing(broker: Broker, unique_topic: str, kind: str) -> None:
    """Options are checked before the native subscribe: a rejected subscribe leaves no consumer behind
    (an Exclusive subscription would stay busy)."""
    options: dict[str, Any] = {
        "logger": pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        "operation_timeout_seconds": 10,
    }
    exclusive: dict[str, Any] = {"consumer_type": pulsar.ConsumerType.Exclusive}
    bad: list[dict[str, Any]] = [{"negative_ack_precision_bit_cnt": 31}, {"negative_ack_rounding": "up"}]
    if kind == "sync":
        client = pulsar_nack.Client(broker.service_url, **options)
        for nack_options in bad:
            with pytest.raises(ValueError):
                client.subscribe(unique_topic, "excl", **exclusive, **nack_options)
        client.subscribe(unique_topic, "excl", **exclusive).close()
        client.close()
        return

    async def scenario() -> None:
        client = aio.Client(broker.service_url, **options)
        for nack_options in bad:
            with pytest.raises(ValueError):
                await client.subscribe(unique_topic, "excl", **exclusive, **nack_options)
        await (await client.subscribe(unique_topic, "excl", **exclusive)).close()
        await client.close()

    run(scenario)


def test_async_for_hands_out_every_message_and_its_redelivery_then_ends_at_close(
    client: aio.Client, unique_topic: str
) -> None:
    """Issue 10 (pulsar-client-python #279): ``async for message in consumer``; a nacked batch message
    comes back once; the loop ends when the consumer is closed."""

    async def scenario() -> None:
        consumer = await subscribe(client, unique_topic, negative_ack_redelivery_delay_ms=200)
        await produce(client, unique_topic, 9, one_batch=True)
        seen: list[bytes] = []
        async for message in consumer:
            seen.append(message.data())
            if message.redelivery_count() == 0 and int(message.data()[4:]) % 3 == 0:
                await consumer.negative_acknowledge(message)
            else:
                await consumer.acknowledge(message)
            if len(seen) == 12:
                break
        twice = [b"msg-0", b"msg-3", b"msg-6"]
        assert sorted(seen) == sorted([f"msg-{i}".encode() for i in range(9)] + twice)
        await nothing_more(consumer)

        async def drain() -> list[bytes]:
            return [m.data() async for m in consumer]

        pending = asyncio.ensure_future(drain())
        await asyncio.sleep(0.2)
        await consumer.close()
        assert await asyncio.wait_for(pending, 5) == []  # ended by the close, nothing handed out

    run(scenario)


def test_async_message_listener_gets_each_message_once_and_its_redelivery(
    client: aio.Client, unique_topic: str
) -> None:
    """An async ``message_listener``: nacks on first sight come back once; a listener that raises does not
    stop the others; close ends the listener task."""

    async def scenario() -> None:
        calls: list[tuple[bytes, int]] = []
        done = asyncio.Event()

        async def listener(consumer: aio.NackConsumer, message: pulsar.Message) -> None:
            calls.append((message.data(), min(message.redelivery_count(), 1)))  # 1: a redelivery
            if message.data() == b"msg-1" and message.redelivery_count() == 0:
                raise RuntimeError("listener failure on purpose")  # logged; msg-1 stays unacked
            if message.redelivery_count() == 0:
                await consumer.negative_acknowledge(message, delay_ms=150)
            else:
                await consumer.acknowledge(message)
            if len(calls) == 11:
                done.set()

        consumer = await subscribe(client, unique_topic, message_listener=listener)
        await produce(client, unique_topic, 6, one_batch=True)
        await asyncio.wait_for(done.wait(), 15)
        await asyncio.sleep(0.8)  # nothing more may come
        first_sight = [(f"msg-{i}".encode(), 0) for i in range(6)]
        redelivered = [(f"msg-{i}".encode(), 1) for i in range(6) if i != 1]  # msg-1's listener call failed
        assert sorted(calls) == sorted(first_sight + redelivered)
        task = consumer._listener_task
        await consumer.close()
        assert task is not None and task.done()

    run(scenario)


def test_a_message_listener_must_be_async(client: aio.Client, unique_topic: str) -> None:
    async def scenario() -> None:
        with pytest.raises(TypeError, match="message_listener"):
            await subscribe(client, unique_topic, message_listener=lambda consumer, message: None)

    run(scenario)
