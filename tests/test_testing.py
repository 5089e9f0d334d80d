"""The broker life cycle (pulsar_nack.testing.Broker) against pulsar-lite and Apache Pulsar standalone, and
pulsar-lite's own options."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pulsar
import pytest

from harness.standalone import start_broker
from pulsar_nack.testing import Broker, PulsarLite

RECEIVE_MS = 1_000  # one bounded receive()
QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn)


def _client(broker: Broker) -> Any:
    return pulsar.Client(broker.service_url, operation_timeout_seconds=30, logger=QUIET)


def _subscribe(client: Any, topic: str, name: str = "sub", **kwargs: Any) -> Any:
    return client.subscribe(
        topic,
        name,
        consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_redelivery_delay_ms=100,
        **kwargs,
    )


def _produce(client: Any, topic: str, count: int, prefix: str = "m") -> list[bytes]:
    producer = client.create_producer(topic, batching_enabled=False)
    payloads = [f"{prefix}-{i:03d}".encode() for i in range(count)]
    for payload in payloads:
        producer.send(payload)
    producer.close()
    return payloads


def _receive_n(consumer: Any, count: int, within_s: float) -> list[Any]:
    """Receive up to ``count`` messages, giving up after ``within_s`` seconds in total."""
    messages: list[Any] = []
    deadline = time.monotonic() + within_s
    while len(messages) < count and time.monotonic() < deadline:
        try:
            messages.append(consumer.receive(timeout_millis=RECEIVE_MS))
        except pulsar.Timeout:
            continue
    return messages


def _nothing_more(consumer: Any, wait_ms: int = 500) -> bool:
    try:
        msg = consumer.receive(timeout_millis=wait_ms)
    except pulsar.Timeout:
        return True
    consumer.acknowledge(msg)
    return False


def _listening_addresses(pid: int) -> set[tuple[str, int]]:
    """(ip, port) of every listening TCP socket of process ``pid`` (Linux /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found: set[tuple[str, int]] = set()
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if cols[3] != "0A" or cols[9] not in inodes:  # 0A = LISTEN
                continue
            hex_ip, hex_port = cols[1].split(":")
            if v6:
                ip = "::1" if hex_ip == "0" * 24 + "01000000" else f"v6:{hex_ip}"
                if hex_ip == "0" * 32:
                    ip = "::"
            else:
                ip = ".".join(str(int(hex_ip[i : i + 2], 16)) for i in (6, 4, 2, 0))
            found.add((ip, int(hex_port, 16)))
    return found


# --------------------------------------------------------------------------------------------
# both brokers


def test_produce_consume_ack(broker: Broker, pulsar_client: Any, unique_topic: str) -> None:
    consumer = _subscribe(pulsar_client, unique_topic)
    sent = _produce(pulsar_client, unique_topic, 20)
    got = _receive_n(consumer, 20, within_s=30)
    for msg in got:
        consumer.acknowledge(msg)
    assert sorted(m.data() for m in got) == sent
    assert _nothing_more(consumer)


def test_nack_one_message_comes_back(broker: Broker, pulsar_client: Any, unique_topic: str) -> None:
    consumer = _subscribe(pulsar_client, unique_topic)
    sent = _produce(pulsar_client, unique_topic, 5)
    got = _receive_n(consumer, 5, within_s=30)
    assert sorted(m.data() for m in got) == sent
    victim = got[2]
    nacked_at = time.monotonic()
    consumer.negative_acknowledge(victim)
    for msg in got:
        if msg is not victim:
            consumer.acknowledge(msg)
    again = _receive_n(consumer, 1, within_s=15)
    assert [m.data() for m in again] == [victim.data()]
    assert time.monotonic() - nacked_at >= 0.09  # the 100 ms native nack delay
    consumer.acknowledge(again[0])
    assert _nothing_more(consumer)


def test_restart_redelivers_unacked(broker: Broker, unique_topic: str) -> None:
    client = _client(broker)
    try:
        consumer = _subscribe(client, unique_topic)
        sent = _produce(client, unique_topic, 20)
        got = _receive_n(consumer, 20, within_s=30)
        assert sorted(m.data() for m in got) == sent
        acked = {m.data() for m in got[:10]}
        for msg in got[:10]:
            consumer.acknowledge(msg)
        time.sleep(1.2)  # let the broker persist the acks (Pulsar's mark-delete rate is 1/s)
        pid_before = broker.pid
        broker.restart()
        assert broker.running and broker.pid != pid_before
        # the same consumer reconnects by itself and gets the unacked half back
        back = _receive_n(consumer, 10, within_s=60)
        assert {m.data() for m in back} == set(sent) - acked
        for msg in back:
            consumer.acknowledge(msg)
        assert _nothing_more(consumer, wait_ms=1_000)
    finally:
        client.close()


def test_kill_then_start_recovers(broker: Broker, unique_topic: str) -> None:
    client = _client(broker)
    try:
        sent = _produce(client, unique_topic, 10)  # acknowledged by the broker: stored
    finally:
        client.close()
    pid = broker.pid
    assert pid is not None
    broker.kill()
    assert not broker.running
    assert not _pid_exists(pid)
    broker.start()
    client = _client(broker)
    try:
        consumer = _subscribe(client, unique_topic, initial_position=pulsar.InitialPosition.Earliest)
        got = _receive_n(consumer, 10, within_s=60)
        assert sorted(m.data() for m in got) == sent
        for msg in got:
            consumer.acknowledge(msg)
    finally:
        client.close()


def test_listens_on_loopback_only(broker: Broker) -> None:
    pid = broker.pid
    assert pid is not None
    addresses = _listening_addresses(pid)
    assert addresses, "the broker listens nowhere?"
    assert {ip for ip, _ in addresses} == {"127.0.0.1"}, addresses
    ports = {port for _, port in addresses}
    assert int(broker.service_url.rsplit(":", 1)[1]) in ports
    assert 8080 not in ports


@pytest.mark.parametrize("kind", ["lite", pytest.param("apache", marks=pytest.mark.apache)])
def test_stop_leaves_no_process_and_no_temp_dir(kind: str, request: pytest.FixtureRequest) -> None:
    if kind == "apache":
        request.getfixturevalue("require_apache")  # skips (or fails) without Java/Maven
    b = start_broker(kind)  # type: ignore[arg-type]
    try:
        pid, data_dir = b.pid, b.data_dir
        assert pid is not None and _pid_exists(pid)
        assert data_dir.is_dir() and b.log_path.is_file()
    finally:
        b.stop()
    assert not b.running and b.pid is None
    assert not _pid_exists(pid)
    assert not data_dir.exists()
    b.stop()  # idempotent


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# --------------------------------------------------------------------------------------------
# pulsar-lite only


@pytest.mark.lite_only
def test_lite_partitions_only_from_config(broker: Broker) -> None:
    with pytest.raises(NotImplementedError, match="default_partitions"):
        broker.create_partitioned_topic("persistent://public/default/x", 3)


def test_lite_default_partitions_and_own_data_dir(tmp_path: Path, unique_topic: str) -> None:
    with PulsarLite(default_partitions=3, data_dir=tmp_path / "lite") as lite:
        assert lite.config_path.read_text().count("default_partitions = 3") == 1
        client = _client(lite)
        try:
            consumer = _subscribe(client, unique_topic)
            sent = _produce(client, unique_topic, 12)
            got = _receive_n(consumer, 12, within_s=30)
            for msg in got:
                consumer.acknowledge(msg)
            assert sorted(m.data() for m in got) == sent
            assert {m.topic_name().rsplit("-partition-", 1)[-1] for m in got} <= {"0", "1", "2"}
        finally:
            client.close()
    assert (tmp_path / "lite").is_dir()  # a caller's data dir is kept
    assert (tmp_path / "lite" / "pulsar-lite.log").is_file()
