"""Helpers for tests that send and receive through a real broker (sync clients)."""

from __future__ import annotations

import time
from typing import Any

import pulsar
import pytest

from harness.standalone import PulsarStandalone
from pulsar_nack import Client
from pulsar_nack.testing import Broker, PulsarLite


def produce(
    client: Any, topic: str, count: int, batching: bool = False, prefix: str = "m", keys: int = 0
) -> None:
    """Send ``prefix0``, ``prefix1``, ... (``keys`` > 0: partition keys ``k0`` .. ``k{keys-1}`` in turn)."""
    producer = client.create_producer(
        topic, batching_enabled=batching, batching_max_publish_delay_ms=20, block_if_queue_full=True
    )
    for i in range(count):
        producer.send_async(f"{prefix}{i}".encode(), None, partition_key=f"k{i % keys}" if keys else None)
    producer.flush()
    producer.close()


def receive_all(consumer: Any, count: int, timeout_s: float = 20.0) -> list[pulsar.Message]:
    """Receive exactly ``count`` messages; fails the test on timeout, naming what did arrive."""
    got: list[pulsar.Message] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count:
        remaining = int((deadline - time.monotonic()) * 1000)
        assert remaining > 0, f"timed out with {len(got)} of {count}: {[_short(m.data()) for m in got]}"
        try:
            got.append(consumer.receive(min(remaining, 1000)))
        except pulsar.Timeout:
            continue
    return got


def receive_into(consumer: Any, got: list[bytes], errors: list[str]) -> None:
    """``receive()`` without a timeout, acking everything, until the consumer is closed (a thread's target;
    the close under the receive, how a test ends it, lands in ``errors``). A message is appended to ``got``
    once acked: a test that closes the consumer when ``got`` fills must not close it between the two."""
    try:
        while True:
            message = consumer.receive()
            consumer.acknowledge(message)
            got.append(message.data())
    except Exception as error:  # closed under the receive
        errors.append(repr(error))


def _short(data: bytes, keep: int = 40) -> bytes | str:
    """A payload as a failure message shows it: chunked tests' payloads are megabytes."""
    return data if len(data) <= keep else f"{data[:keep]!r}... ({len(data):,} bytes)"


def nothing_more(consumer: Any, wait_ms: int = 800) -> None:
    """Fail if a message arrives within ``wait_ms``."""
    with pytest.raises(pulsar.Timeout):
        extra = consumer.receive(wait_ms)
        pytest.fail(f"unexpected extra message {_short(extra.data())!r}")


def produce_bursts(
    client: Any,
    topic: str,
    count: int,
    rng: Any = None,
    max_batch: int = 100,
    batch_size: int = 0,
    prefix: str = "m",
) -> list[int]:
    """Send ``prefix0`` .. batched: bursts of ``batch_size`` messages (0: ``rng.randint(1, max_batch)``
    each), every burst flushed as one batch. Returns the burst sizes, in order."""
    limit = batch_size or max_batch
    producer = client.create_producer(
        topic,
        batching_enabled=True,
        batching_max_messages=limit,
        batching_max_publish_delay_ms=60_000,  # only a full batch or a flush sends
        max_pending_messages=max(1000, 2 * limit),
        block_if_queue_full=True,
    )
    bursts: list[int] = []
    sent = 0
    while sent < count:
        size = min(batch_size or rng.randint(1, max_batch), count - sent)
        for i in range(sent, sent + size):
            producer.send_async(f"{prefix}{i}".encode(), None)
        if not batch_size:  # a full batch of batch_size is sent as soon as it is full
            producer.flush()
        bursts.append(size)
        sent += size
    producer.flush()
    producer.close()
    return bursts


def leftover(client: Any, topic: str | list[str], subscription: str, wait_ms: int = 2000) -> list[bytes]:
    """What a fresh consumer of ``client`` on ``subscription`` (Shared) receives within ``wait_ms``
    without acking: empty once every entry of the subscription has been acked at the broker."""
    consumer = client.subscribe(topic, subscription, consumer_type=pulsar.ConsumerType.Shared)
    got: list[bytes] = []
    deadline = time.monotonic() + wait_ms / 1000
    while (remaining := int((deadline - time.monotonic()) * 1000)) > 0:
        try:
            got.append(consumer.receive(remaining).data())
        except pulsar.Timeout:
            break
    consumer.close()
    return got


def own_broker(kind: str, request: pytest.FixtureRequest) -> Broker:
    """A broker for one test alone (not started): ``kind`` 'apache' (skipped without Java, as the
    ``require_apache`` fixture decides) or 'lite'."""
    if kind == "apache":
        request.getfixturevalue("require_apache")
        return PulsarStandalone()
    return PulsarLite()


def subscribe_fast(client: Any, topic: str, subscription: str, **options: Any) -> Any:
    """``client.subscribe``; a pulsar-nack client's consumer with ``fast_receive=True`` (fast mode), the
    official consumer as it is."""
    if isinstance(client, Client):
        options["fast_receive"] = True
    return client.subscribe(topic, subscription, **options)
