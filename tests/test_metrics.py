"""NackCollector: exposition text, aggregation, the memory cache, bad input and the missing extra;
unit-level on tracker-backed fakes (fake clock), plus one scrape of a real consumer on pulsar-lite."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import pulsar
import pytest
from fake_clock import FakeClock
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pulsar_nack import Client, NackStats
from pulsar_nack.lowlevel import TimerWheel
from pulsar_nack.metrics import NackCollector
from pulsar_nack.testing import PulsarLite
from pulsar_nack.tracker import NackTracker


class TrackedConsumer:
    """A consumer stand-in: a real NackTracker on a fake clock, driven by hand; counts memory walks."""

    def __init__(
        self, clock: FakeClock, topic: str = "persistent://public/default/t", sub: str = "sub"
    ) -> None:
        self.clock = clock
        self.wheel = TimerWheel(clock=clock, start=False)
        self.tracker = NackTracker(lambda _due: None, precision_bits=0, clock=clock, wheel=self.wheel)
        self._topic, self._sub = topic, sub
        self.memory_walks = 0

    def nack_stats(self, *, with_memory: bool = False) -> NackStats:
        self.memory_walks += with_memory
        return self.tracker.stats(with_memory=with_memory)

    def topic(self) -> str:
        return self._topic

    def subscription_name(self) -> str:
        return self._sub

    def nack(self, entry_id: int, delay_ms: float) -> None:
        self.tracker.schedule(self.clock.now + delay_ms, 7, entry_id, -1, self._topic)

    def advance(self, ms: float) -> None:
        until = self.clock.now + ms
        while self.clock.now < until:
            self.clock.now += 1
            self.wheel.run_due()


def registry_of(*collectors: NackCollector) -> CollectorRegistry:
    registry = CollectorRegistry()
    for collector in collectors:
        assert collector.register(registry) is collector
    return registry


def samples_of(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value}, parsed from the registry's exposition text."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
    }


def scrape(*collectors: NackCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return samples_of(registry_of(*collectors))


def labels(
    topic: str = "persistent://public/default/t", sub: str = "sub", **extra: str
) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"topic": topic, "subscription": sub, **extra}.items()))


def test_exposition_text_has_every_gauge_and_counter() -> None:
    clock = FakeClock()
    consumer = TrackedConsumer(clock)
    for entry_id in range(3):
        consumer.nack(entry_id, 1000)
    consumer.nack(10, 5000)
    consumer.advance(1000)  # entries 0-2 forwarded
    for entry_id in range(3):
        consumer.tracker.arrivals.admit(7, entry_id, -1, consumer.topic(), 0)
    consumer.tracker.arrivals.admit(7, 10, -1, consumer.topic(), 0)  # early: held back
    collector = NackCollector(consumer)
    text = generate_latest(registry_of(collector)).decode()
    assert "# TYPE pulsar_nack_nacked_total counter" in text
    assert "# TYPE pulsar_nack_pending_ids gauge" in text
    assert 'pulsar_nack_pending_ids{subscription="sub",topic="persistent://public/default/t"} 1.0' in text
    samples = scrape(NackCollector(consumer))
    assert samples[("pulsar_nack_pending_ids", labels())] == 1
    assert samples[("pulsar_nack_buckets", labels())] == 1
    assert samples[("pulsar_nack_memory_bytes", labels())] > 0
    assert samples[("pulsar_nack_nacked_total", labels())] == 4
    assert samples[("pulsar_nack_forwarded_total", labels())] == 3
    assert samples[("pulsar_nack_redelivered_total", labels())] == 3
    assert samples[("pulsar_nack_held_back_total", labels())] == 1
    assert samples[("pulsar_nack_dropped_total", labels())] == 0
    assert samples[("pulsar_nack_timer_failures_total", labels())] == 0
    stats = consumer.tracker.stats()
    assert stats.lateness_p50_ms is not None and stats.lateness_p99_ms is not None
    p50 = samples[("pulsar_nack_redelivery_lateness_seconds", labels(quantile="0.5"))]
    p99 = samples[("pulsar_nack_redelivery_lateness_seconds", labels(quantile="0.99"))]
    assert (p50, p99) == pytest.approx((stats.lateness_p50_ms / 1000, stats.lateness_p99_ms / 1000))


def test_no_lateness_sample_before_any_redelivery_and_a_custom_namespace() -> None:
    consumer = TrackedConsumer(FakeClock())
    consumer.nack(1, 1000)
    samples = scrape(NackCollector(consumer, namespace="app_nacks"))
    assert samples[("app_nacks_pending_ids", labels())] == 1
    assert not any(name.startswith("pulsar_nack") for name, _ in samples)
    assert not any(name == "app_nacks_redelivery_lateness_seconds" for name, _ in samples)


def test_consumers_of_one_subscription_are_summed_others_kept_apart() -> None:
    clock = FakeClock()
    a, b = TrackedConsumer(clock), TrackedConsumer(clock)
    other = TrackedConsumer(clock, sub="audit")
    a.nack(1, 1000)
    b.nack(2, 1000)
    b.nack(3, 1000)
    other.nack(4, 1000)
    samples = scrape(NackCollector(a, b, other))
    assert samples[("pulsar_nack_pending_ids", labels())] == 3
    assert samples[("pulsar_nack_nacked_total", labels())] == 3
    assert samples[("pulsar_nack_pending_ids", labels(sub="audit"))] == 1


def test_memory_is_walked_at_most_once_per_ttl() -> None:
    clock = FakeClock()
    consumer = TrackedConsumer(clock)
    consumer.nack(1, 60_000)
    collector = NackCollector(consumer, memory_ttl_s=5.0, clock=lambda: clock.now / 1000)
    registry = registry_of(collector)
    first = samples_of(registry)
    for entry_id in range(2, 200):  # the index grows; the cached figure stays until the ttl is over
        consumer.nack(entry_id, 60_000)
    clock.now += 4_000
    second = samples_of(registry)
    assert consumer.memory_walks == 1
    assert second[("pulsar_nack_memory_bytes", labels())] == first[("pulsar_nack_memory_bytes", labels())]
    assert second[("pulsar_nack_pending_ids", labels())] == 199, "the other figures are fresh"
    clock.now += 1_000
    third = samples_of(registry)
    assert consumer.memory_walks == 2
    assert third[("pulsar_nack_memory_bytes", labels())] > first[("pulsar_nack_memory_bytes", labels())]
    collector.remove(consumer)
    assert samples_of(registry) == {}
    assert consumer.memory_walks == 2


def test_memory_ttl_none_never_walks_and_exports_no_memory_metric() -> None:
    clock = FakeClock()
    consumer = TrackedConsumer(clock)
    consumer.nack(1, 60_000)
    collector = NackCollector(consumer, memory_ttl_s=None, clock=lambda: clock.now / 1000)
    registry = registry_of(collector)
    for _ in range(3):
        samples = samples_of(registry)
        clock.now += 60_000
    assert consumer.memory_walks == 0
    assert samples[("pulsar_nack_pending_ids", labels())] == 1, "every other figure is exported"
    text = generate_latest(registry).decode()
    assert "memory_bytes" not in text, "no family, not a sample of 0"


class Unmeasured(TrackedConsumer):
    """A source that cannot measure its memory: ``memory_bytes`` stays None even when asked."""

    def nack_stats(self, *, with_memory: bool = False) -> NackStats:
        return super().nack_stats(with_memory=False)


def test_a_series_gets_a_memory_sample_only_when_all_its_consumers_were_measured() -> None:
    clock = FakeClock()
    measured, unmeasured = TrackedConsumer(clock), Unmeasured(clock)
    alone = Unmeasured(clock, sub="audit")
    for source in (measured, unmeasured, alone):
        source.nack(1, 60_000)
    samples = scrape(NackCollector(measured, unmeasured, alone))
    assert samples[("pulsar_nack_pending_ids", labels())] == 2
    assert samples[("pulsar_nack_pending_ids", labels(sub="audit"))] == 1
    assert ("pulsar_nack_memory_bytes", labels()) not in samples, "not a partial sum"
    assert ("pulsar_nack_memory_bytes", labels(sub="audit")) not in samples, "not 0"
    assert scrape(NackCollector(measured))[("pulsar_nack_memory_bytes", labels())] > 0


def test_registering_does_not_walk_memory() -> None:
    consumer = TrackedConsumer(FakeClock())
    NackCollector(consumer).register(CollectorRegistry())
    assert consumer.memory_walks == 0


def test_bad_input_names_the_parameter() -> None:
    consumer = TrackedConsumer(FakeClock())
    with pytest.raises(ValueError, match="namespace"):
        NackCollector(consumer, namespace="pulsar-nack")
    for bad in (-1, "10", True, float("nan")):
        with pytest.raises(ValueError, match="memory_ttl_s"):
            NackCollector(consumer, memory_ttl_s=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"nack_stats\(\).*got str"):
        NackCollector("consumer")  # type: ignore[arg-type]
    collector = NackCollector()
    with pytest.raises(TypeError, match="got int"):
        collector.add(5)  # type: ignore[arg-type]
    collector.add(consumer)
    collector.add(consumer)
    assert collector.consumers == (consumer,)


def test_missing_prometheus_client_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "prometheus_client" or m.startswith("prometheus_client.")]:
        monkeypatch.setitem(sys.modules, name, None)  # makes `import prometheus_client...` fail
    with pytest.raises(ImportError, match=r"pulsar-nack\[prometheus\]"):
        NackCollector()


@pytest.fixture
def lite_client(pulsar_lite: PulsarLite) -> Iterator[Client]:
    client = Client(pulsar_lite.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        yield client
    finally:
        client.close()


def test_a_real_consumer_on_pulsar_lite(lite_client: Client, unique_topic: str) -> None:
    consumer = lite_client.subscribe(
        # 1.5 s: the first scrape comes long before the first nack is forwarded, however loaded the machine
        unique_topic, "sub", consumer_type=pulsar.ConsumerType.Shared, negative_ack_redelivery_delay_ms=1_500
    )
    producer = lite_client.create_producer(unique_topic, batching_enabled=False)
    for i in range(2):
        producer.send(f"m{i}".encode())
    collector = NackCollector(consumer)
    first = [consumer.receive(10_000) for _ in range(2)]
    consumer.negative_acknowledge(first[0])
    consumer.negative_acknowledge(first[1], delay_ms=60_000)
    assert scrape(collector)[("pulsar_nack_pending_ids", labels(unique_topic))] == 2
    again = consumer.receive(10_000)
    assert again.data() == b"m0"
    consumer.acknowledge(again)
    deadline = time.monotonic() + 5
    samples = scrape(collector)
    while (
        samples[("pulsar_nack_redelivered_total", labels(unique_topic))] < 1 and time.monotonic() < deadline
    ):
        time.sleep(0.05)
        samples = scrape(collector)
    assert samples[("pulsar_nack_pending_ids", labels(unique_topic))] == 1
    assert samples[("pulsar_nack_nacked_total", labels(unique_topic))] == 2
    assert samples[("pulsar_nack_forwarded_total", labels(unique_topic))] == 1
    assert samples[("pulsar_nack_redelivered_total", labels(unique_topic))] == 1
    assert ("pulsar_nack_redelivery_lateness_seconds", labels(unique_topic, quantile="0.99")) in samples
    producer.close()
    consumer.close()
