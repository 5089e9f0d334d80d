#!/usr/bin/env python3
"""Close orders that are still unpaid N minutes after they were placed — with per-call nack delays.

The use case of the delayed-message article (an e-commerce order must be paid within 30 minutes, or it is
closed): instead of scanning the order table every minute, the order service publishes each new order, and
this consumer nacks it with a delay equal to the time the order has left. When the order comes back — at
its deadline, never before (``negative_ack_rounding="ceil"``) — it is closed if still unpaid, and acked
either way. One pending nack per open order; no polling.

Scaled down to seconds (``--timeout-ms``). Payments are simulated: every ``--pay-every``-th order is paid
halfway through its timeout.

    python examples/order_timeout.py                      # embedded broker, 6 orders, 3 s timeout
    python examples/order_timeout.py --orders 10 --timeout-ms 2000 --service-url pulsar://127.0.0.1:6650
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
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
    parser.add_argument("--orders", type=positive_int, default=6, help="orders to place (default 6)")
    parser.add_argument("--timeout-ms", type=positive_int, default=3000, help="time to pay (default 3000)")
    parser.add_argument("--pay-every", type=positive_int, default=2, help="every k-th order gets paid")
    parser.add_argument("--max-seconds", type=positive_int, default=60, help="give up after this long")
    return parser.parse_args()


def now_ms() -> float:
    return time.time() * 1000.0  # wall clock: orders carry their creation time across processes


class Payments:
    """Simulated payment service: pays chosen orders at a given time."""

    def __init__(self) -> None:
        self._paid: set[str] = set()
        self._lock = threading.Lock()
        self._timers: list[threading.Timer] = []

    def pay_later(self, order_id: str, after_ms: float) -> None:
        timer = threading.Timer(after_ms / 1000.0, self._pay, args=(order_id,))
        timer.daemon = True
        timer.start()
        self._timers.append(timer)

    def _pay(self, order_id: str) -> None:
        with self._lock:
            self._paid.add(order_id)
        print(f"  payment received for {order_id}", flush=True)

    def is_paid(self, order_id: str) -> bool:
        with self._lock:
            return order_id in self._paid

    def cancel(self) -> None:
        for timer in self._timers:
            timer.cancel()


def run(service_url: str, args: argparse.Namespace) -> int:
    topic = f"persistent://public/default/orders-{uuid.uuid4().hex[:8]}"
    client = pulsar_nack.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    payments = Payments()
    try:
        consumer = client.subscribe(
            topic,
            "order-timeouts",
            consumer_type=pulsar.ConsumerType.Shared,
            negative_ack_rounding="ceil",  # an order must never be closed before its deadline,
            negative_ack_precision_bit_cnt=4,  # and at most one 16 ms bucket after it (default: 256 ms)
        )
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(args.orders):
            order_id = f"order-{i}"
            producer.send(json.dumps({"id": order_id, "created_ms": now_ms(), "amount": 10 + i}).encode())
            if i % args.pay_every == 0:
                payments.pay_later(order_id, args.timeout_ms / 2)
        print(f"placed {args.orders} orders; each must be paid within {args.timeout_ms} ms", flush=True)

        closed: dict[str, float] = {}  # order id → ms after its deadline when it was closed
        paid: list[str] = []
        deadline = time.monotonic() + args.max_seconds
        while len(closed) + len(paid) < args.orders and time.monotonic() < deadline:
            try:
                message = consumer.receive(200)
            except pulsar.Timeout:
                continue
            order = json.loads(message.data())
            order_id = order["id"]
            left_ms = order["created_ms"] + args.timeout_ms - now_ms()
            if payments.is_paid(order_id):
                print(f"{order_id}: paid -> nothing to do", flush=True)
                paid.append(order_id)
                consumer.acknowledge(message)
            elif left_ms > 0:
                print(f"{order_id}: unpaid, check again in {left_ms:.0f} ms", flush=True)
                consumer.negative_acknowledge(message, delay_ms=left_ms)
            else:
                print(f"closed {order_id}: unpaid {-left_ms:.0f} ms after its deadline", flush=True)
                closed[order_id] = -left_ms
                consumer.acknowledge(message)

        if len(closed) + len(paid) < args.orders:
            print(f"error: only {len(closed) + len(paid)} of {args.orders} orders settled", file=sys.stderr)
            return 1
        worst = max(closed.values(), default=0.0)
        print(f"summary: {len(closed)} closed, {len(paid)} paid; latest close {worst:.0f} ms after deadline")
        stats = consumer.nack_stats()
        print(f"tracker: {stats.nacked} nacked, {stats.redelivered} redelivered, {stats.pending} pending")
        consumer.close()
        producer.close()
        return 0
    finally:
        payments.cancel()
        client.close()


def main() -> int:
    args = parse_args()
    with broker_url(args.service_url) as service_url:
        return run(service_url, args)


if __name__ == "__main__":
    sys.exit(main())
