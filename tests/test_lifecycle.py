"""Object lifecycle like the official client's, on pulsar-lite: a consumer the application drops without
closing is garbage-collected as the official one is, nacks pending or not, and its timer thread ends."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from typing import Any

import pulsar

import pulsar_nack
from pulsar_nack.testing import PulsarLite


def _drop_unclosed(client_type: Any, service_url: str, topic: str) -> tuple[bool, bool]:
    """Subscribe, nack an id (pending for a minute), drop client and consumer unclosed; returns whether the
    consumer was collected and whether a timer thread was left running for it."""
    client = client_type(
        service_url, operation_timeout_seconds=30, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )
    subscription = f"sub-{client_type.__module__}"
    consumer = client.subscribe(topic, subscription, consumer_type=pulsar.ConsumerType.Shared)
    consumer.negative_acknowledge(pulsar.MessageId(-1, 3, 5, -1)._msg_id)  # what both take
    # the wrapper's part that holds the native consumer and the tracker (the consumer itself is a shell)
    bridge = getattr(consumer, "_nacks", None)
    thread = bridge.tracker._wheel._thread if bridge is not None else None
    dropped = [weakref.ref(consumer)] + ([weakref.ref(bridge)] if bridge is not None else [])
    del consumer, client, bridge
    deadline = time.monotonic() + 10.0
    while any(ref() is not None for ref in dropped) and time.monotonic() < deadline:
        gc.collect()  # native callbacks may hold it briefly
        time.sleep(0.05)
    if thread is not None:
        thread.join(5.0)
    return all(ref() is None for ref in dropped), thread is not None and thread.is_alive()


def test_a_dropped_unclosed_consumer_is_collected_as_the_official_one_is(
    pulsar_lite: PulsarLite, unique_topic: str
) -> None:
    threads_before = {t.ident for t in threading.enumerate()}
    official = _drop_unclosed(pulsar.Client, pulsar_lite.service_url, unique_topic)
    wrapped = _drop_unclosed(pulsar_nack.Client, pulsar_lite.service_url, unique_topic)
    assert official == (True, False), "the official consumer is collected when dropped with its client"
    assert wrapped == official, "so is the wrapped one, and its timer thread ends"
    left = [t.name for t in threading.enumerate() if t.ident not in threads_before and "nack" in t.name]
    assert left == []
