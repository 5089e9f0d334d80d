"""Helpers for tests that send and receive through a real broker (sync clients)."""

from __future__ import annotations

import time
from typing import Any

import pulsar
import pytest


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
        assert remaining > 0, f"timed out with {len(got)} of {count}: {[m.data() for m in got]}"
        try:
            got.append(consumer.receive(min(remaining, 1000)))
        except pulsar.Timeout:
            continue
    return got


def nothing_more(consumer: Any, wait_ms: int = 800) -> None:
    """Fail if a message arrives within ``wait_ms``."""
    with pytest.raises(pulsar.Timeout):
        extra = consumer.receive(wait_ms)
        pytest.fail(f"unexpected extra message {extra.data()!r}")
