"""A copy the wrapper holds is the message (issue 27): pending nacks whose copies came early.

pulsar-lite ignores nacks on partitioned topics. After a broker restart it re-dispatches every unacked
message at once: the official consumer hands out all of them then, long before their nack delay. The
wrapper used to drop those copies (their nacks were pending), forward the nacks when due into a broker that
ignores them, give up after 3 tries — and the application never saw the messages again while the
consumer lived. Now it keeps the early copy of a pending nack and hands it out at the nack's due time
itself: nothing is forwarded, nothing abandoned. A batch message's copy is kept whatever its due time when
it came unasked (no forward of its entry lately: a restart's re-dispatch); one that came with a forward of
a sibling only when due within ``HOLD_SIBLINGS_WITHIN_MS`` (the broker answered that forward: it will
answer the message's own).

One test, non-batched (8 s delay) and batched (a delay beyond ``HOLD_SIBLINGS_WITHIN_MS``): a topic of 3
partitions on its own pulsar-lite, 300 messages, the official and the wrapped consumer (Shared, one
subscription each) nack every message; the broker restarts; every message must come back to the wrapper
once, none early, none later than due + 3 s, with 0 abandoned.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pulsar
import pytest
from messaging import leftover, produce, receive_all

import pulsar_nack
from pulsar_nack.arrivals import ArrivalFilter, Verdict
from pulsar_nack.bridge import HOLD_SIBLINGS_WITHIN_MS
from pulsar_nack.index import TimeBucketIndex
from pulsar_nack.testing import PulsarLite

COUNT = 300
DELAY_MS = 8_000
EARLY_MS = 255 + 5  # the wrapper's 2^k - 1 ms with floor rounding (k = 8), plus reading the clocks
LATE_MS = 3_000  # generous: a shared machine


def _drain(consumer: Any, until: float, handouts: dict[str, list[float]]) -> None:
    """Receive (and ack) until ``until`` (monotonic s), recording each message's hand-out times."""
    while (left := until - time.monotonic()) > 0:
        try:
            message = consumer.receive(max(1, int(min(left, 1.0) * 1000)))
        except pulsar.Timeout:
            continue
        handouts.setdefault(message.data().decode(), []).append(time.monotonic())
        consumer.acknowledge(message)


@pytest.mark.parametrize(
    ("batching", "delay_ms"),
    # batched: due later than the 30 s within which a sibling's copy that came with a forward is kept
    [(False, DELAY_MS), (True, HOLD_SIBLINGS_WITHIN_MS + 2_000)],
    ids=["single", "batched"],
)
def test_early_copies_of_pending_nacks_come_back_at_their_time_when_the_broker_ignores_forwards(
    batching: bool, delay_ms: int
) -> None:
    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    topic = f"persistent://public/default/held-{uuid.uuid4().hex[:8]}"
    options: dict[str, Any] = {
        "consumer_type": pulsar.ConsumerType.Shared,
        "negative_ack_redelivery_delay_ms": delay_ms,
    }
    with PulsarLite(default_partitions=3) as broker:
        official_client = pulsar.Client(broker.service_url, logger=logger)
        wrapped_client = pulsar_nack.Client(broker.service_url, logger=logger)
        try:
            official = official_client.subscribe(topic, "official", **options)
            wrapped = wrapped_client.subscribe(topic, "wrapped", **options)
            produce(official_client, topic, COUNT, batching=batching)
            nacked: dict[str, dict[str, float]] = {"official": {}, "wrapped": {}}
            for name, consumer in (("official", official), ("wrapped", wrapped)):
                for message in receive_all(consumer, COUNT):
                    consumer.negative_acknowledge(message)
                    nacked[name][message.data().decode()] = time.monotonic()
            broker.restart()
            restarted = time.monotonic()
            handouts: dict[str, dict[str, list[float]]] = {"official": {}, "wrapped": {}}
            watch_s = delay_ms / 1000 + LATE_MS / 1000 + 2
            until = max(nacked["wrapped"].values()) + watch_s
            threads = [
                threading.Thread(target=_drain, args=(c, until, handouts[n]))
                for n, c in (("official", official), ("wrapped", wrapped))
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(watch_s + 60)
            stats = wrapped.nack_stats()
            wrapped.close()
            left = leftover(official_client, topic, "wrapped")  # every ack of a kept copy reached the broker
        finally:
            wrapped_client.close()
            official_client.close()
    got, due = handouts["wrapped"], {k: v + delay_ms / 1000 for k, v in nacked["wrapped"].items()}
    assert set(got) == set(due), f"{len(set(due) - set(got))} of {COUNT} never came back"
    twice = {k: len(v) for k, v in got.items() if len(v) > 1}
    assert not twice, f"handed out more than once: {twice}"
    early = {k: round(due[k] - v[0], 3) for k, v in got.items() if v[0] < due[k] - EARLY_MS / 1000}
    assert not early, f"handed out early (s before due): {early}"
    late = {k: round(v[0] - due[k], 3) for k, v in got.items() if v[0] > due[k] + LATE_MS / 1000}
    assert not late, f"handed out late (s after due): {late}"
    assert stats.abandoned == 0 and stats.reforwarded == 0, stats
    assert not left, f"{len(left)} messages unacked at the broker after the application acked them all"
    # The contrast: the official consumer got its messages at the restart, before their delay.
    official_early = [
        k for k, v in handouts["official"].items() if v[0] < nacked["official"][k] + delay_ms / 1000 - 1
    ]
    assert len(official_early) >= 0.8 * COUNT, (len(official_early), restarted)


def test_take_pending_takes_a_pending_nack_only() -> None:
    """The filter's side, without a broker: a pending non-batched nack leaves the filter and the index;
    one whose forward has begun (in flight) or that is not pending stays as it is."""
    index = TimeBucketIndex(0, "floor")
    arrivals = ArrivalFilter(
        lambda *ids: None,
        clock=lambda: 1_000.0,
        index=index,
    )
    for entry in (1, 2):
        arrivals.file(5_000, 7, entry, -1, "t")
    arrivals.forwarded("t", 7, [2], {}, 1_000.0, 5_000)
    assert arrivals.admit_entry(7, 1, "t") is Verdict.HOLD
    assert arrivals.take_pending(7, 1, "t") is True
    assert index.due_of(7, 1, -1, "t") is None and arrivals.admit_entry(7, 1, "t") is Verdict.DELIVER
    assert arrivals.take_pending(7, 1, "t") is False, "taken already"
    assert arrivals.take_pending(7, 2, "t") is False, "in flight: its forward's copy decides"
    assert arrivals.take_pending(7, 3, "t") is False
    assert arrivals.counts().in_flight == 1


def test_a_later_copy_of_a_kept_message_handed_out_is_not_handed_out_again() -> None:
    """A kept copy of a non-batched message is the message: once it is handed out (``held_out`` with its
    key), a later broker copy of it — a second re-dispatch after a restart, or the copy of a request that
    was still on its way — is a duplicate while the application holds the message and acked once it has
    acked it, as the copy of a forward is (:class:`~pulsar_nack.arrivals.ArrivalFilter`'s recent
    redeliveries), not a first delivery."""
    index = TimeBucketIndex(0, "floor")
    arrivals = ArrivalFilter(
        lambda *ids: None,
        clock=lambda: 1_000.0,
        index=index,
    )
    arrivals.file(5_000, 7, 1, -1, "t")
    assert arrivals.admit_entry(7, 1, "t") is Verdict.HOLD
    assert arrivals.take_pending(7, 1, "t") is True
    arrivals.held_out(None, ("t", 7, 1))
    assert arrivals.admit_entry(7, 1, "t") is Verdict.DUPLICATE, "the application holds it"
    arrivals.acked_entry(7, 1, "t")
    assert arrivals.admit_entry(7, 1, "t") is Verdict.ACKED, "the application acked it"
    assert arrivals.counts().redelivered == 1
