"""Fast mode (issue 28) across a reconnect: the first nack ends fast mode while siblings of the nacked
message's batch are still in the receiver queue (the filter infers them acked or queued: ArrivalFilter.infer),
then the broker goes away and comes back. The C++ client drops its receiver queue at the reconnect and
the broker sends every unacked entry again, so the queued siblings never reach the application from the
queue: their copies after the reconnect must be handed out (not dropped and acked as inferred acks).

Side by side with the official consumer on the same broker, the same script on each (its own topic):
every message reaches the application at least once, the nacked one comes back, and the subscription
ends with nothing unacked — on both brokers, with the nack forwarded before the fault or still pending
across it.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections import Counter
from typing import Any

import pulsar
import pytest
from messaging import leftover, own_broker, produce_bursts, receive_all, subscribe_fast

from pulsar_nack import Client

MESSAGES = 2_000
BATCH = 100  # the receiver queue (1,000) holds ten batches: the first batch's siblings wait in it
FIRST = 5  # received before the fault: m0..m2 acked, m3 held, m4 nacked
NACKED = b"m4"
SUB = "fast-faults"
# (name, negative_ack_redelivery_delay_ms): the nack forwarded (its entry re-sent) before the fault, or
# still pending across it
DELAYS = (("forwarded", 100), ("pending", 4_000))


def _cut_connections(port: int) -> int:
    """Shut down this process's TCP connections to ``port`` (a network drop: the broker stays up and
    keeps its state, e.g. redelivery counts; each client sees its connection fail and reconnects).
    Returns how many were cut. O(sockets)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if int(fields[2].rsplit(":", 1)[1], 16) == port and fields[3] == "01":  # established
                    inodes.add(fields[9])
    cut = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # (closed meanwhile)
        if target.startswith("socket:[") and target[8:-1] in inodes:
            with socket.socket(fileno=os.dup(int(fd))) as dup:  # (closing the dup leaves the client's fd)
                dup.shutdown(socket.SHUT_RDWR)
            cut += 1
    return cut


def _before_fault(consumer: Any) -> tuple[list[bytes], Any, bool | None]:
    """Receive m0..m4 (the rest waits in the receiver queue), ack m0..m2, nack m4 and keep m3 unacked.
    Returns the payloads handed out, the held m3, and whether the wrapper was in fast mode."""
    first = receive_all(consumer, FIRST)
    payloads = [m.data() for m in first]
    assert payloads == [f"m{i}".encode() for i in range(FIRST)], f"premise: in order, {payloads}"
    fast = getattr(getattr(consumer, "_nacks", None), "fast", None)
    for message in first[:3]:
        consumer.acknowledge(message)
    consumer.negative_acknowledge(first[4])
    return payloads, first[3], fast


def _drain(
    consumer: Any,
    held: Any,
    limit_s: float = 120.0,
    idle_s: float = 4.0,
    expect: int = MESSAGES - FIRST,
    nacked: bytes = NACKED,
) -> Counter[bytes]:
    """After the fault: ack the held message (m3), then receive and ack every message until ``expect``
    distinct ones (all of m0..m1999 not received before) and the ``nacked`` one (m4) have come and nothing
    came for ``idle_s`` (or ``limit_s`` passed)."""
    consumer.acknowledge(held)
    got: Counter[bytes] = Counter()
    deadline = time.monotonic() + limit_s
    last = time.monotonic()
    while time.monotonic() < deadline:
        try:
            message = consumer.receive(500)
        except pulsar.Timeout:
            if len(got) >= expect and nacked in got and time.monotonic() - last > idle_s:
                break
            continue
        last = time.monotonic()
        got[message.data()] += 1
        consumer.acknowledge(message)
    return got


@pytest.mark.parametrize("fault", ["restart", "cut"])
@pytest.mark.parametrize("kind", ["lite", "apache"])
def test_a_reconnect_after_the_first_nack_loses_no_queued_sibling(
    kind: str, fault: str, request: pytest.FixtureRequest
) -> None:
    """Batches of 100; each consumer receives m0..m4 while nothing is nacked (the wrapper in fast mode),
    acks m0..m2, holds m3 and nacks m4 — m5..m99 and nine more batches wait in the receiver queue — then
    the connection drops: the broker is killed and started again (``restart``: its redelivery counts start
    at 0), or the client's connections are shut down while the broker stays up (``cut``: a forwarded
    nack's entry comes again with redelivery count 1, queued siblings included). Every message reaches
    the application at least once (m5..m99 after the reconnect), m4 comes back, and nothing is left
    unacked; the wrapper hands out no message the official consumer does not."""
    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    every = {f"m{i}".encode() for i in range(MESSAGES)}
    with own_broker(kind, request) as broker:
        clients = {
            "official": pulsar.Client(broker.service_url, operation_timeout_seconds=30, logger=logger),
            "wrapper": Client(broker.service_url, operation_timeout_seconds=30, logger=logger),
        }
        runs: dict[tuple[str, str], dict[str, Any]] = {}
        for (name, client), (shape, delay_ms) in ((c, d) for c in clients.items() for d in DELAYS):
            topic = f"persistent://public/default/fast-{shape}-{name}-{uuid.uuid4().hex[:8]}"
            consumer = subscribe_fast(
                client,
                topic,
                SUB,
                consumer_type=pulsar.ConsumerType.Shared,
                negative_ack_redelivery_delay_ms=delay_ms,
            )
            produce_bursts(client, topic, MESSAGES, batch_size=BATCH)
            before, held, fast = _before_fault(consumer)
            runs[name, shape] = {"topic": topic, "consumer": consumer, "before": before, "held": held}
            runs[name, shape]["fast"] = fast
        time.sleep(0.6)  # the acks reach the broker (grouped for 100 ms); the short nack is forwarded
        if fault == "restart":
            broker.kill()
            time.sleep(0.5)
            broker.start()
        else:
            port = int(broker.service_url.rsplit(":", 1)[1])
            assert _cut_connections(port) >= 2, "premise: both clients' connections cut"
        for run in runs.values():
            run["after"] = _drain(run["consumer"], run["held"])
            run["consumer"].close()
        for (name, _), run in runs.items():
            run["leftover"] = leftover(clients[name], run["topic"], SUB)
        for client in clients.values():
            client.close()
    summary = _summary(runs, every)
    for (name, shape), run in runs.items():
        seen = set(run["before"]) | set(run["after"])
        assert seen == every, (f"{name}/{shape}: never handed out: {sorted(every - seen)[:10]}", summary)
        assert run["after"][NACKED] >= 1, (f"{name}/{shape}: the nacked m4 never came back", summary)
        assert run["leftover"] == [], (f"{name}/{shape}: left unacked: {run['leftover'][:10]}", summary)
    for shape, _ in DELAYS:
        wrapper, official = runs["wrapper", shape], runs["official", shape]
        assert wrapper["fast"] is True, ("premise: the wrapper received m0..m4 in fast mode", summary)
        extra = set(wrapper["after"]) - set(official["after"])
        assert not extra, (f"{shape}: handed out by the wrapper only: {sorted(extra)[:10]}", summary)


@pytest.mark.parametrize("kind", ["lite", "apache"])
def test_copies_the_broker_sends_while_nothing_is_nacked_are_handed_out_as_the_official_consumer_does(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """The behaviour change of fast mode (docs/receive_cost.md): two batches of 10 received, m0..m4 and
    m10..m14 acked, the rest held, nothing nacked; then the broker sends every unacked entry again —
    asked by ``redeliver_unacknowledged_messages()``, or after a reconnect (the connections cut). The
    official consumer hands the acked siblings out again with the held ones; so does the wrapper now (it
    used to withhold copies of messages acked or held in a partly acked batch): the same messages as the
    official consumer, and nothing left unacked."""
    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    acked = {f"m{i}".encode() for i in (*range(5), *range(10, 15))}
    with own_broker(kind, request) as broker:
        clients = {
            "official": pulsar.Client(broker.service_url, operation_timeout_seconds=30, logger=logger),
            "wrapper": Client(broker.service_url, operation_timeout_seconds=30, logger=logger),
        }
        runs: dict[tuple[str, str], dict[str, Any]] = {}
        for trigger in ("redeliver", "cut"):
            for name, client in clients.items():
                topic = f"persistent://public/default/copies-{trigger}-{name}-{uuid.uuid4().hex[:8]}"
                consumer = subscribe_fast(client, topic, SUB, consumer_type=pulsar.ConsumerType.Shared)
                produce_bursts(client, topic, 20, batch_size=10)
                first = receive_all(consumer, 20)
                held = [m for m in first if m.data() not in acked]
                for message in first:
                    if message.data() in acked:
                        consumer.acknowledge(message)
                fast = getattr(getattr(consumer, "_nacks", None), "fast", None)
                runs[name, trigger] = {"topic": topic, "consumer": consumer, "held": held, "fast": fast}
            time.sleep(0.6)  # the acks reach the broker (grouped for 100 ms)
            if trigger == "redeliver":
                for name in clients:
                    runs[name, trigger]["consumer"].redeliver_unacknowledged_messages()
            else:
                assert _cut_connections(int(broker.service_url.rsplit(":", 1)[1])) >= 2, "premise: cut"
            for name in clients:
                run = runs[name, trigger]
                again: Counter[bytes] = Counter()
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    try:
                        message = run["consumer"].receive(2_000)
                    except pulsar.Timeout:
                        break
                    again[message.data()] += 1
                    run["consumer"].acknowledge(message)
                for message in run["held"]:
                    run["consumer"].acknowledge(message)
                run["again"] = again
                run["consumer"].close()
                run["leftover"] = leftover(clients[name], run["topic"], SUB)
        for client in clients.values():
            client.close()
    summary = {
        key: (run["fast"], dict(sorted(run["again"].items())), run["leftover"]) for key, run in runs.items()
    }
    for trigger in ("redeliver", "cut"):
        official, wrapper = runs["official", trigger], runs["wrapper", trigger]
        assert wrapper["fast"] is True, ("premise: the wrapper in fast mode", summary)
        assert set(official["again"]) & acked, (
            "premise: the official consumer hands acked ones out",
            summary,
        )
        assert set(wrapper["again"]) == set(official["again"]), (trigger, summary)
        assert wrapper["leftover"] == [] and official["leftover"] == [], (trigger, summary)


#: Receiving threads that each took a message from the receiver queue and number it (fast mode) only after
#: other threads handed out messages of the next entry: more than the 16 messages the take-over read before
#: (NackBridge._follow), fewer than the 256 it reads now (consumer._FAST_RECENT).
LATE = 32


def _late_numbering(consumer: Any) -> tuple[list[bytes], Any, bool | None]:
    """Receive m0..m110 — the first entry (m0..m99) and m100..m110 of the second — as ``LATE`` receiving
    threads of the wrapper can hand them out: m68..m99 taken from the native receiver queue first, then
    m100..m110 received and numbered, then m68..m99 numbered (``NackBridge.admit``, what ``receive()``
    does with a message once the native receive returned it; a thread preempted between the two). The
    official consumer receives them in order. Acks all but m103 (held) and m104, which it nacks.
    Returns the payloads handed out, the held m103 and whether the wrapper was in fast mode at the nack."""
    nacks = getattr(consumer, "_nacks", None)
    if nacks is None:
        first = receive_all(consumer, 111)
    else:
        first = receive_all(consumer, 100 - LATE)
        late = []
        for _ in range(LATE):  # what LATE threads' native receive returned (taken from the queue)
            message = pulsar.Message()
            message._message = consumer._consumer.receive(20_000)
            message._schema = consumer._schema
            late.append(message)
        first += receive_all(consumer, 11)  # other threads hand m100..m110 out meanwhile
        for message in late:  # the LATE threads go on: admitted (numbered) last
            assert nacks.admit(message), "premise: handed out in fast mode"
        first[100 - LATE : 100 - LATE] = late
    payloads = [m.data() for m in first]
    assert payloads == [f"m{i}".encode() for i in range(111)], f"premise: in order, {payloads}"
    fast = getattr(nacks, "fast", None)
    for message in first:
        if message.data() not in (b"m103", b"m104"):
            consumer.acknowledge(message)
    consumer.negative_acknowledge(first[104])
    return payloads, first[103], fast


@pytest.mark.parametrize("kind", ["lite", "apache"])
def test_more_receiving_threads_than_the_old_window_lose_no_queued_sibling_at_a_reconnect(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """The take-over reads the ids of the last 256 messages handed out (``_FAST_RECENT``) to find which
    messages of the entry being received are still queued. With ``LATE`` = 32 receiving threads numbering
    the first entry's last messages after other threads handed out m100..m110 (see ``_late_numbering``),
    the last 16 were all of the first entry: m111..m199 were taken for acked (inferred), and the cut —
    the nack of m104 forwarded, the second entry re-sent with redelivery count 1 — dropped them (fails
    with a window of 16 on pulsar-lite). Every message reaches the application at least once, m104 comes
    back, nothing is left unacked, and the wrapper hands out no message the official consumer does not."""
    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    every = {f"m{i}".encode() for i in range(MESSAGES)}
    with own_broker(kind, request) as broker:
        clients = {
            "official": pulsar.Client(broker.service_url, operation_timeout_seconds=30, logger=logger),
            "wrapper": Client(broker.service_url, operation_timeout_seconds=30, logger=logger),
        }
        runs: dict[str, dict[str, Any]] = {}
        for name, client in clients.items():
            topic = f"persistent://public/default/fast-late-{name}-{uuid.uuid4().hex[:8]}"
            consumer = subscribe_fast(
                client,
                topic,
                SUB,
                consumer_type=pulsar.ConsumerType.Shared,
                negative_ack_redelivery_delay_ms=100,
            )
            produce_bursts(client, topic, MESSAGES, batch_size=BATCH)
            before, held, fast = _late_numbering(consumer)
            runs[name] = {"topic": topic, "consumer": consumer, "before": before, "held": held, "fast": fast}
        time.sleep(0.6)  # the acks reach the broker (grouped for 100 ms); the nack is forwarded
        assert _cut_connections(int(broker.service_url.rsplit(":", 1)[1])) >= 2, "premise: both cut"
        for run in runs.values():
            run["after"] = _drain(run["consumer"], run["held"], expect=MESSAGES - 111, nacked=b"m104")
            run["consumer"].close()
        for name, run in runs.items():
            run["leftover"] = leftover(clients[name], run["topic"], SUB)
        for client in clients.values():
            client.close()
    summary = _summary(runs, every)
    assert runs["wrapper"]["fast"] is True, ("premise: the wrapper received m0..m110 in fast mode", summary)
    for name, run in runs.items():
        seen = set(run["before"]) | set(run["after"])
        assert seen == every, (f"{name}: never handed out: {sorted(every - seen)[:10]}", summary)
        assert run["after"][b"m104"] >= 1, (f"{name}: the nacked m104 never came back", summary)
        assert run["leftover"] == [], (f"{name}: left unacked: {run['leftover'][:10]}", summary)
    extra = set(runs["wrapper"]["after"]) - set(runs["official"]["after"])
    assert not extra, (f"handed out by the wrapper only: {sorted(extra)[:10]}", summary)


def _summary(runs: dict[Any, dict[str, Any]], every: set[bytes]) -> dict[Any, dict[str, Any]]:
    """What each run handed out after the fault, for the assertion messages."""
    return {
        key: {
            "fast": run["fast"],
            "after": len(run["after"]),
            "copies": sum(run["after"].values()),
            "missing": sorted(every - set(run["before"]) - set(run["after"]))[:10],
            "leftover": len(run["leftover"]),
        }
        for key, run in runs.items()
    }
