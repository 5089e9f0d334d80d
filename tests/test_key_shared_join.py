"""Key_Shared and hold-back (issue 27 item 7; PIP-493, apache/pulsar #26418): a consumer joins while the
wrapper holds copies of pending nacks.

A client that holds received messages without acking them can stall Key_Shared's key draining when a
consumer joins: the broker gives the joiner a share of the hashes and sends it nothing of a moved hash until
the old owner has acked what it was sent of that hash. The wrapper holds copies: a copy of a message whose
nack is pending, re-sent early (here by ``redeliver_unacknowledged_messages``), is kept and handed out at the
nack's due time (:meth:`pulsar_nack.bridge` ``_keep``). So a moved key waits at most until its nacks are due
— as long as with the official consumer, whose pending nacks are unacked at the broker too.

Apache Pulsar standalone only (pulsar-lite's Key_Shared stalls same-key redeliveries). One test, the official
and the wrapped consumers side by side on one topic (a subscription each): two Key_Shared consumers receive
``KEYS`` keys' messages and nack them all (``DELAY_MS``); a redeliver-all makes the broker re-send them early
(the wrapper holds those copies; the official consumer hands them out); a third consumer joins while a
producer keeps sending every key. A second official subscription does the same without the redeliver-all: its
pending nacks are unacked at the broker until due, like the wrapper's held copies. Asserted for the wrapper:
every key keeps flowing (no message waits longer than 2 × the delay from its send, or from the join for the
nacked ones, to its hand-out), each message is handed out once after its nack (the fresh ones once in all),
none early. The official consumers' figures are printed beside it; of them only that every message comes is
asserted.

Measured (Apache 4.0.7, delay 4 s): the wrapper held 40 copies at the join; its moved keys' fresh messages
waited up to 3.7 s (for the held copies' due time, when the application acks them), none early; the official
consumer after the redeliver-all hands all 40 nacked messages out early and nothing waits (0.04 s); the
official consumer without it: fresh messages of moved keys waited up to 4.7 s for its pending nacks.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

import pulsar
import pytest

import pulsar_nack
from harness.standalone import PulsarStandalone

pytestmark = pytest.mark.apache_only

KEYS = 8
NACKED_PER_KEY = 5
DELAY_MS = 4_000
SEND_EVERY_S = 0.25
SEND_FOR_S = 2.5 * DELAY_MS / 1000  # fresh messages after the join: past the nacks' due time
EARLY_MS = 255 + 5  # 2^k - 1 ms with the wrapper's floor rounding (k = 8), plus reading the clocks
FLOW_S = 2 * DELAY_MS / 1000  # the bound: every key keeps flowing within 2 x the delay


class _Side:
    """One side (official or wrapped): its consumers, what was sent and what was handed out, when."""

    def __init__(self, client: Any, topic: str, subscription: str) -> None:
        self.client = client
        self.topic = topic
        self.subscription = subscription
        self.consumers: list[Any] = []
        self.handouts: dict[str, list[tuple[float, int]]] = {}  # payload -> [(when, consumer number)]
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.acking = threading.Event()  # before it is set, the receivers nack every first copy

    def join(self) -> None:
        consumer = self.client.subscribe(
            self.topic, self.subscription, consumer_type=pulsar.ConsumerType.KeyShared,
            negative_ack_redelivery_delay_ms=DELAY_MS,
            consumer_name=f"{self.subscription}-{len(self.consumers)}",
        )  # fmt: skip
        self.consumers.append(consumer)
        thread = threading.Thread(target=self._receive, args=(consumer, len(self.consumers) - 1), daemon=True)
        self.threads.append(thread)
        thread.start()

    def _receive(self, consumer: Any, number: int) -> None:
        while not self.stop.is_set():
            try:
                message = consumer.receive(200)
            except pulsar.Timeout:
                continue
            now = time.monotonic()
            payload = message.data().decode()
            with self.lock:
                seen = self.handouts.setdefault(payload, [])
                seen.append((now, number))
                first = len(seen) == 1
            if first and payload.startswith("n") and not self.acking.is_set():
                consumer.negative_acknowledge(message)
            else:
                consumer.acknowledge(message)

    def count(self, prefix: str) -> int:
        with self.lock:
            return sum(1 for k in self.handouts if k.startswith(prefix))

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(5)
        for consumer in self.consumers:
            consumer.close()


def _wait(condition: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()  # type: ignore[no-any-return]


def _figures(
    side: _Side, nacked_at: dict[str, float], sent_at: dict[str, float], joined: float
) -> dict[str, Any]:
    """What a side's application saw: for the nacked messages, hand-outs after the nack, how many early
    and the longest wait past the join; for the fresh ones, how many more than once and the longest wait
    from send to hand-out."""
    with side.lock:
        handouts = {k: list(v) for k, v in side.handouts.items()}
    after_nack = {k: [t for t, _ in handouts.get(k, [])[1:]] for k in nacked_at}
    due = {k: nacked_at[k] + DELAY_MS / 1000 for k in nacked_at}
    early = sorted(k for k, v in after_nack.items() if any(t < due[k] - EARLY_MS / 1000 for t in v))
    repeated_nacked = sorted(k for k, v in after_nack.items() if len(v) > 1)
    missing_nacked = sorted(k for k, v in after_nack.items() if not v)
    wait_nacked = max((max(v) - max(joined, due[k]) for k, v in after_nack.items() if v), default=0.0)
    fresh = {k: [t for t, _ in handouts.get(k, [])] for k in sent_at}
    missing_fresh = sorted(k for k, v in fresh.items() if not v)
    repeated_fresh = sorted(k for k, v in fresh.items() if len(v) > 1)
    wait_fresh = max((v[0] - sent_at[k] for k, v in fresh.items() if v), default=0.0)
    on_joiner = sum(1 for k in sent_at for _, n in handouts.get(k, [])[:1] if n == 2)
    return {
        "nacked": len(nacked_at), "early": len(early), "early_ids": early[:10],
        "nacked_missing": len(missing_nacked), "nacked_repeated": len(repeated_nacked),
        "nacked_max_wait_after_due_s": round(wait_nacked, 3),
        "fresh": len(sent_at), "fresh_missing": len(missing_fresh), "fresh_repeated": len(repeated_fresh),
        "fresh_max_wait_s": round(wait_fresh, 3), "fresh_on_joiner": on_joiner,
    }  # fmt: skip


def test_a_consumer_joining_while_copies_are_held_does_not_stall_keys(
    apache_pulsar: PulsarStandalone,
) -> None:
    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    topic = f"persistent://public/default/ks-join-{uuid.uuid4().hex[:8]}"
    official_client = pulsar.Client(apache_pulsar.service_url, logger=logger, operation_timeout_seconds=30)
    wrapped_client = pulsar_nack.Client(
        apache_pulsar.service_url, logger=logger, operation_timeout_seconds=30
    )
    sides = {
        "official": _Side(official_client, topic, "official"),
        "official_no_redeliver": _Side(official_client, topic, "official_no_redeliver"),
        "wrapped": _Side(wrapped_client, topic, "wrapped"),
    }
    try:
        for side in sides.values():
            side.join()
            side.join()
        producer = official_client.create_producer(topic, batching_enabled=False)
        nacked_payloads = [f"n{i}" for i in range(KEYS * NACKED_PER_KEY)]
        for i, payload in enumerate(nacked_payloads):
            producer.send(payload.encode(), partition_key=f"k{i % KEYS}")
        for name, side in sides.items():
            assert _wait(lambda s=side: s.count("n") == len(nacked_payloads), 30), f"{name}: first delivery"
        nacked_at = {
            name: {k: v[0][0] for k, v in side.handouts.items() if k.startswith("n")}
            for name, side in sides.items()
        }
        for side in sides.values():
            side.acking.set()  # from now on every copy is acked
        # Every nack is pending: make the broker re-send the messages early; the wrapper holds those copies.
        for name in ("official", "wrapped"):
            for consumer in sides[name].consumers:
                consumer.redeliver_unacknowledged_messages()
        time.sleep(0.5)
        held = sum(c.nack_stats().chunked_held for c in sides["wrapped"].consumers)
        for side in sides.values():
            side.join()  # the third consumer: the broker moves a share of the hashes to it
        joined = time.monotonic()
        sent_at: dict[str, float] = {}
        i = 0
        while time.monotonic() - joined < SEND_FOR_S:
            for key in range(KEYS):
                payload = f"f{i}"
                producer.send(payload.encode(), partition_key=f"k{key}")
                sent_at[payload] = time.monotonic()
                i += 1
            time.sleep(SEND_EVERY_S)
        producer.close()
        for side in sides.values():
            _wait(lambda s=side: s.count("f") == len(sent_at), FLOW_S + 5)
        time.sleep(1.0)  # anything repeated comes now
        for side in sides.values():
            side.close()
    finally:
        for side in sides.values():
            side.stop.set()
        wrapped_client.close()
        official_client.close()
    figures = {name: _figures(side, nacked_at[name], sent_at, joined) for name, side in sides.items()}
    figures["wrapped"]["held_at_join"] = held
    print("key_shared_join " + json.dumps(figures, sort_keys=True))
    wrapped = figures["wrapped"]
    assert held > 0, "the scenario must have the wrapper hold copies when the consumer joins"
    assert wrapped["fresh_on_joiner"] > 0, "the joiner must own some keys"
    assert wrapped["nacked_missing"] == 0 and wrapped["fresh_missing"] == 0, wrapped
    assert wrapped["nacked_repeated"] == 0 and wrapped["fresh_repeated"] == 0, wrapped
    assert wrapped["early"] == 0, wrapped
    assert wrapped["fresh_max_wait_s"] <= FLOW_S, wrapped
    assert wrapped["nacked_max_wait_after_due_s"] <= FLOW_S, wrapped
    for name in ("official", "official_no_redeliver"):
        assert figures[name]["fresh_missing"] == 0 and figures[name]["nacked_missing"] == 0, figures[name]
