"""The harness: Apache Pulsar standalone (admin REST, strict delayed delivery, its settings), Java
discovery, and start_broker."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from datetime import timedelta
from typing import Any

import pulsar
import pytest
from messaging import nothing_more, receive_all

from harness.maven import apache_pulsar_available, java_available
from harness.standalone import PulsarStandalone, start_broker
from pulsar_nack.testing import Broker, BrokerError


def _subscribe(client: Any, topic: str) -> Any:
    return client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared)


# --------------------------------------------------------------------------------------------
# Apache Pulsar standalone


@pytest.mark.apache_only
def test_partitioned_topic_via_rest(broker: Broker, pulsar_client: Any, unique_topic: str) -> None:
    assert isinstance(broker, PulsarStandalone)
    broker.create_partitioned_topic(unique_topic, 3)
    name = unique_topic.split("/")[-1]
    meta = broker.admin("GET", f"/admin/v2/persistent/public/default/{name}/partitions")
    assert meta["partitions"] == 3
    with pytest.raises(BrokerError, match="409"):
        broker.create_partitioned_topic(unique_topic, 3)

    consumer = _subscribe(pulsar_client, unique_topic)
    producer = pulsar_client.create_producer(
        unique_topic,
        batching_enabled=False,
        message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution,
    )
    sent = [f"p-{i:02d}".encode() for i in range(30)]
    for payload in sent:
        producer.send(payload)
    producer.close()
    got = receive_all(consumer, 30, timeout_s=30)
    for msg in got:
        consumer.acknowledge(msg)
    assert sorted(m.data() for m in got) == sent
    partitions = {m.topic_name().rsplit("-partition-", 1)[1] for m in got}
    assert partitions == {"0", "1", "2"}
    nothing_more(consumer, wait_ms=500)


@pytest.mark.apache_only
@pytest.mark.parametrize("delay_s", [0.3, 2.0])
def test_deliver_after_is_honoured(
    broker: Broker, pulsar_client: Any, unique_topic: str, delay_s: float
) -> None:
    # 0.3 s: below Pulsar's default 1 s tick, only honoured with the harness's strict delivery
    consumer = _subscribe(pulsar_client, unique_topic)
    producer = pulsar_client.create_producer(unique_topic, batching_enabled=False)
    sent_at = time.monotonic()
    producer.send(b"later", deliver_after=timedelta(seconds=delay_s))
    producer.send(b"now")
    first = consumer.receive(timeout_millis=10_000)
    consumer.acknowledge(first)
    assert first.data() == b"now"
    second = consumer.receive(timeout_millis=10_000)
    waited = time.monotonic() - sent_at
    consumer.acknowledge(second)
    assert second.data() == b"later"
    assert delay_s <= waited < delay_s + 2.0, waited
    producer.close()


def test_misnamed_apache_settings_are_rejected() -> None:
    with pytest.raises(ValueError, match="delayedDeliveryMaxDelayInMillis"):
        PulsarStandalone(settings={"delayedDeliveryMaxDeliveryDelayInMillis": 1000})


# --------------------------------------------------------------------------------------------
# Java discovery, start_broker


def test_java_available_reports_the_java_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """java_available() agrees with what `java -version` on this machine says: the version it names is the
    one installed, and it is refused below the minimum."""
    monkeypatch.delenv("JAVA_HOME", raising=False)
    java = shutil.which("java")
    ok, reason = java_available()
    if java is None:
        assert not ok and "no `java`" in reason
        assert not apache_pulsar_available()[0]
        return
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30, check=False)
    major = int(re.search(r'version "(\d+)', out.stderr + out.stdout).group(1))  # type: ignore[union-attr]
    assert ok == (major >= 17), reason
    if ok:
        assert reason.startswith("java ") and java in reason and str(major) in reason
    too_old = f"{java} is Java {major}; Apache Pulsar 4.0 needs Java {major + 1}+"
    assert java_available(min_version=major + 1) == (False, too_old)
    if not ok:
        assert not apache_pulsar_available()[0]


def test_start_broker_rejects_unknown_kind() -> None:
    with pytest.raises(ValueError, match="unknown broker kind"):
        start_broker("kafka")  # type: ignore[arg-type]
