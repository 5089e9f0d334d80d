#!/usr/bin/env python3
"""Give an existing ``pulsar.Consumer`` per-call nack delays with ``pulsar_nack.wrap``.

Code that already creates its consumers with the plain ``pulsar.Client`` keeps doing so, with one change:
subscribe with ``negative_ack_redelivery_delay_ms=pulsar_nack.NATIVE_DELAY_MS`` (the native tracker then
redelivers what pulsar_nack forwards within milliseconds). ``pulsar_nack.wrap`` returns a consumer that is
still a ``pulsar.Consumer`` and whose ``negative_acknowledge`` takes a per-call ``delay_ms``.

Here message *i* of *n* is nacked with a delay of (n − i) · ``--step-ms``: the last one sent comes back
first. The official consumer has a single delay for every nack, so they would come back in sending order.

    python examples/wrap_existing_consumer.py                         # embedded broker, 4 messages
    python examples/wrap_existing_consumer.py --messages 6 --step-ms 150
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid

import pulsar

import pulsar_nack
from pulsar_nack.testing import broker_url


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--service-url", help="a running broker (default: start an embedded pulsar-lite)")
    parser.add_argument("--messages", type=positive_int, default=4, help="messages to nack (default 4)")
    parser.add_argument("--step-ms", type=positive_int, default=300, help="delay step between messages")
    parser.add_argument("--max-seconds", type=positive_int, default=60, help="give up after this long")
    return parser.parse_args()


def run(service_url: str, args: argparse.Namespace) -> int:
    topic = f"persistent://public/default/wrap-{uuid.uuid4().hex[:8]}"
    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        native = client.subscribe(  # existing code: a plain pulsar.Client consumer...
            topic,
            "sub",
            consumer_type=pulsar.ConsumerType.Shared,
            negative_ack_redelivery_delay_ms=pulsar_nack.NATIVE_DELAY_MS,  # ...with this one change
        )
        consumer = pulsar_nack.wrap(
            native,
            native_delay_ms=pulsar_nack.NATIVE_DELAY_MS,  # what it was subscribed with
            negative_ack_redelivery_delay_ms=10_000,  # the default for nacks without a delay_ms
            negative_ack_rounding="ceil",
            negative_ack_precision_bit_cnt=4,
        )
        still_plain = isinstance(consumer, pulsar.Consumer)
        print(f"wrapped: {type(consumer).__name__}, still a pulsar.Consumer: {still_plain}")
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(args.messages):
            producer.send(f"m{i}".encode())

        requested: dict[bytes, int] = {}
        nacked_at = time.monotonic()
        for i in range(args.messages):
            message = consumer.receive(args.max_seconds * 1000)
            delay_ms = (args.messages - i) * args.step_ms
            requested[message.data()] = delay_ms
            consumer.negative_acknowledge(message, delay_ms=delay_ms)
            print(f"nacked {message.data().decode()} with delay_ms={delay_ms}", flush=True)

        order: list[bytes] = []
        deadline = time.monotonic() + args.max_seconds
        while len(order) < args.messages and time.monotonic() < deadline:
            try:
                message = consumer.receive(200)
            except pulsar.Timeout:
                continue
            elapsed_ms = (time.monotonic() - nacked_at) * 1000
            data = message.data()
            print(
                f"back: {data.decode()} after {elapsed_ms:.0f} ms (asked {requested[data]} ms), "
                f"redelivery_count={message.redelivery_count()}",
                flush=True,
            )
            order.append(data)
            consumer.acknowledge(message)

        expected = sorted(requested, key=requested.__getitem__)
        stats = consumer.nack_stats()
        print(f"tracker: {stats.nacked} nacked, {stats.redelivered} redelivered, {stats.pending} pending")
        consumer.close()  # stops the tracker; the plain client does not know about it
        producer.close()
        if order != expected:
            print(f"error: came back as {order}, expected {expected}", file=sys.stderr)
            return 1
        print(f"summary: all {len(order)} messages came back in due order, shortest delay first")
        return 0
    finally:
        client.close()


def main() -> int:
    args = parse_args()
    with broker_url(args.service_url) as service_url:
        return run(service_url, args)


if __name__ == "__main__":
    sys.exit(main())
