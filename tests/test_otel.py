"""NackMeter: Java's PIP-342 names and attributes and ours, read through the OpenTelemetry SDK's in-memory
reader from a real consumer on pulsar-lite; the attributes of topic names; the missing extra."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import pulsar
import pytest
from fake_clock import FakeClock
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from test_metrics import TrackedConsumer

from pulsar_nack import Client
from pulsar_nack.otel import NackMeter, attributes_of
from pulsar_nack.testing import PulsarLite


def points(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, Any], float]]]:
    """{instrument name: [(attributes, value)]} of one collection."""
    data = reader.get_metrics_data()
    assert data is not None
    found: dict[str, list[tuple[dict[str, Any], float]]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            assert scope.scope.name == "pulsar_nack"
            for metric in scope.metrics:
                found[metric.name] = [(dict(p.attributes or {}), p.value) for p in metric.data.data_points]  # type: ignore[union-attr]
    return found


def value(found: dict[str, list[tuple[dict[str, Any], float]]], name: str, **extra: Any) -> float:
    [(_attributes, figure)] = [(a, v) for a, v in found[name] if all(a.get(k) == x for k, x in extra.items())]
    return figure


@pytest.fixture
def lite_client(pulsar_lite: PulsarLite) -> Iterator[Client]:
    client = Client(pulsar_lite.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        yield client
    finally:
        client.close()


def test_a_real_consumer_through_the_sdk_reader(lite_client: Client, unique_topic: str) -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    consumer = lite_client.subscribe(
        # 1.5 s: the first collection comes long before the first nack is forwarded, however loaded
        unique_topic,
        "sub",
        consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_redelivery_delay_ms=1_500,
    )
    producer = lite_client.create_producer(unique_topic, batching_enabled=False)
    for i in range(2):
        producer.send(f"m{i}".encode())
    NackMeter(consumer, meter_provider=provider, memory_ttl_s=0, topic_attributes=True)
    first = [consumer.receive(10_000) for _ in range(2)]
    consumer.negative_acknowledge(first[0])
    consumer.negative_acknowledge(first[1], delay_ms=60_000)
    found = points(reader)
    attributes = {
        "pulsar.tenant": "public",
        "pulsar.namespace": "public/default",
        "pulsar.subscription": "sub",
        "pulsar.topic": consumer.topic(),
    }
    assert found["pulsar.client.consumer.message.nack"] == [(attributes, 2)]
    assert found["pulsar.client.consumer.message.received.count"] == [(attributes, 2)]
    assert found["pulsar.client.consumer.message.received.size"] == [(attributes, 4)]  # b"m0", b"m1"
    assert found["pulsar.client.consumer.message.ack"] == [(attributes, 0)]
    assert found["pulsar_nack.consumer.nack.pending"] == [(attributes, 2)]
    assert value(found, "pulsar_nack.consumer.nack.buckets") >= 1
    assert value(found, "pulsar_nack.consumer.nack.memory") > 0
    assert value(found, "pulsar_nack.consumer.nack.held") == 0
    again = consumer.receive(10_000)
    assert again.data() == b"m0"
    consumer.acknowledge(again)
    deadline = time.monotonic() + 5
    found = points(reader)
    while value(found, "pulsar_nack.consumer.nack.redelivered") < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
        found = points(reader)
    assert value(found, "pulsar_nack.consumer.nack.redelivered") == 1
    assert value(found, "pulsar_nack.consumer.nack.pending") == 1
    assert value(found, "pulsar.client.consumer.message.nack") == 2
    assert value(found, "pulsar_nack.consumer.nack.lateness", quantile="0.99") >= 0.0
    assert value(found, "pulsar.client.consumer.message.received.count") == 3  # m0 again
    assert value(found, "pulsar.client.consumer.message.received.size") == 6
    assert value(found, "pulsar.client.consumer.message.ack") == 1
    producer.close()
    consumer.close()
    provider.shutdown()


def test_batch_receive_and_both_kinds_of_ack_are_counted(lite_client: Client, unique_topic: str) -> None:
    reader = InMemoryMetricReader()
    consumer = lite_client.subscribe(
        unique_topic,
        "sub",
        negative_ack_redelivery_delay_ms=60_000,
        batch_receive_policy=pulsar.ConsumerBatchReceivePolicy(10, -1, 2_000),
    )
    NackMeter(consumer, meter_provider=MeterProvider(metric_readers=[reader]), memory_ttl_s=None)
    producer = lite_client.create_producer(unique_topic, batching_max_publish_delay_ms=200)
    got: list[Any] = []
    for first in (0, 4):  # two rounds: the first one teaches the consumer its topic (another path)
        for i in range(first, first + 4):
            producer.send_async(f"batch-{i}".encode(), None)  # 7 bytes each, one batch of 4
        producer.flush()
        deadline = time.monotonic() + 10
        while len({m.data() for m in got}) < first + 4 and time.monotonic() < deadline:
            got += consumer.batch_receive()
    # pulsar-client 3.13's batch_receive on pulsar-lite now and then returns one message several times
    # (same id; the official consumer alike, side by side, 2 of 6 rounds): the wrapper hands out what the
    # native call returns, and the meter counts what was handed out.
    assert {m.data() for m in got} == {f"batch-{i}".encode() for i in range(8)}
    distinct = list({m.data(): m for m in got}.values())
    consumer.negative_acknowledge(distinct[0])
    consumer.acknowledge(distinct[1])
    consumer.acknowledge_cumulative(distinct[3])
    found = points(reader)
    # a consumer no meter observes counts messages, not their sizes (reading a size costs ~0.5 µs)
    plain = lite_client.subscribe(
        unique_topic, "unobserved", initial_position=pulsar.InitialPosition.Earliest
    )
    plain.receive(10_000)
    assert (plain.nack_stats().received, plain.nack_stats().received_bytes) == (1, 0)
    plain.close()
    assert value(found, "pulsar.client.consumer.message.received.count") == len(got)
    assert value(found, "pulsar.client.consumer.message.received.size") == 7 * len(got)
    assert value(found, "pulsar.client.consumer.message.ack") == 2
    producer.close()
    consumer.close()


def test_attributes_follow_javas_and_topic_is_opt_in() -> None:
    topic = "persistent://acme/orders/payments-partition-3"
    assert attributes_of(topic, "s") == {
        "pulsar.tenant": "acme",
        "pulsar.namespace": "acme/orders",
        "pulsar.subscription": "s",
    }
    assert attributes_of(topic, "s", topic_attributes=True)["pulsar.partition"] == 3
    assert (
        attributes_of(topic, "s", topic_attributes=True)["pulsar.topic"]
        == "persistent://acme/orders/payments"
    )
    assert "pulsar.partition" not in attributes_of("persistent://a/b/t", "s", topic_attributes=True)
    assert attributes_of("my-topic", "s")["pulsar.namespace"] == "public/default"


def test_without_the_extra_the_error_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    with pytest.raises(ImportError, match=r"pulsar-nack\[otel\]"):
        NackMeter()


def test_memory_is_walked_at_most_every_ttl_and_not_at_all_with_none() -> None:
    clock = FakeClock()
    consumer = TrackedConsumer(clock)
    consumer.nack(1, 60_000)
    reader = InMemoryMetricReader()
    NackMeter(consumer, meter_provider=MeterProvider(metric_readers=[reader]), memory_ttl_s=10, clock=clock)
    first = value(points(reader), "pulsar_nack.consumer.nack.memory")
    assert first > 0 and consumer.memory_walks == 1
    consumer.nack(2, 60_000)
    assert value(points(reader), "pulsar_nack.consumer.nack.pending") == 2  # fresh
    assert value(points(reader), "pulsar_nack.consumer.nack.memory") == first  # cached: no walk
    assert consumer.memory_walks == 1
    clock.now += 10_000.0  # (the fake clock is also the meter's: seconds here, ms for the tracker)
    points(reader)
    assert consumer.memory_walks == 2
    plain = InMemoryMetricReader()
    NackMeter(consumer, meter_provider=MeterProvider(metric_readers=[plain]), memory_ttl_s=None)
    assert "pulsar_nack.consumer.nack.memory" not in points(plain)
    assert consumer.memory_walks == 2


@pytest.mark.parametrize("ttl", [-1, float("nan"), "10", True])
def test_a_bad_memory_ttl_is_refused(ttl: Any) -> None:
    with pytest.raises(ValueError, match="memory_ttl_s"):
        NackMeter(memory_ttl_s=ttl)


def test_a_consumer_without_nack_stats_is_refused() -> None:
    with pytest.raises(TypeError, match="NackMeter takes consumers"):
        NackMeter(object())  # type: ignore[arg-type]
