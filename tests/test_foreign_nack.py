"""A nack of a message another subscription's consumer received (a wrapped or a bare pulsar consumer), side
by side with the official client on both brokers: this consumer's own first copy of that message is handed
out at once, as a first delivery."""

from __future__ import annotations

from typing import Any

import pulsar
import pytest

from pulsar_nack import Client

SHARED = pulsar.ConsumerType.Shared
DELAY_MS = 60_000  # far beyond the receive timeout: a held-back first copy would not come in time
RECEIVE_MS = 10_000  # generous on a loaded machine


@pytest.mark.parametrize("other_is", ["wrapped", "official"])
def test_nacking_another_subscriptions_message_does_not_hold_back_our_own_copy(
    nack_client: Client, pulsar_client: Any, unique_topic: str, other_is: str
) -> None:
    options = {"consumer_type": SHARED, "negative_ack_redelivery_delay_ms": DELAY_MS}
    other = (nack_client if other_is == "wrapped" else pulsar_client).subscribe(
        unique_topic, "other", **options
    )
    ours = nack_client.subscribe(unique_topic, "ours", **options)
    official = pulsar_client.subscribe(unique_topic, "official", **options)
    producer = pulsar_client.create_producer(unique_topic, batching_enabled=False)
    producer.send(b"m")
    foreign = other.receive(RECEIVE_MS)
    for consumer in (ours, official):
        consumer.negative_acknowledge(foreign)
    for consumer in (ours, official):
        own = consumer.receive(RECEIVE_MS)  # pulsar.Timeout if the nack held it back
        assert (own.data(), own.redelivery_count()) == (b"m", 0)
        consumer.acknowledge(own)
    other.acknowledge(foreign)
    assert ours.nack_stats().pending == 0 and ours.nack_stats().held_back == 0
    for consumer in (ours, official):
        with pytest.raises(pulsar.Timeout):
            consumer.receive(500)  # nothing more: the broker had no unacked copy to redeliver
