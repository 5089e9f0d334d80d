"""Benchmark: a million batched messages, one nack per batch — everything drains, nothing acked comes back.

PIP-393's use case at scale, through a real broker: 1,000,000 messages in batches of 10; the consumer
(the wrapper, 4 receiver threads) acks 9 messages of each batch and nacks 1 with a 1 s delay, and acks
it when it comes back. No bound on the tracker's state may turn acked messages into redelivered ones, so:
every message is handed out once, plus once more for each nack; none is handed out after the
application acked it; afterwards a fresh official consumer of the subscription receives nothing (backlog
0). Reported: drain time, peak pending nacks, peak ``nack_stats().memory_bytes``, peak RSS.

    python bench/batch_drain.py                       # both brokers, 1M messages
    python bench/batch_drain.py --brokers lite --messages 200000

Writes ``bench/results/batch_drain.json`` and the ``batch-drain`` section of docs/performance.md.
"""

from __future__ import annotations

import argparse
import resource
import sys
import threading
import time
import uuid
from typing import Any

import report

BATCH = 10
NACK_DELAY_MS = 1_000
RECEIVERS = 4


def drain(service_url: str, messages: int, timeout_s: float) -> dict[str, Any]:
    import pulsar

    import pulsar_nack

    topic = f"persistent://public/default/drain-{uuid.uuid4().hex[:8]}"
    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    client = pulsar_nack.Client(service_url, operation_timeout_seconds=30, logger=logger)
    consumer = client.subscribe(topic, "drain", consumer_type=pulsar.ConsumerType.Shared)
    producer = client.create_producer(
        topic, batching_enabled=True, batching_max_messages=BATCH, batching_max_publish_delay_ms=10,
        block_if_queue_full=True,
    )
    started = time.monotonic()
    for i in range(messages):
        producer.send_async(i.to_bytes(4, "big"), None)
    producer.flush()
    produced_s = time.monotonic() - started
    handouts = bytearray(messages)  # hand-outs per message (capped at 255)
    acked = bytearray(messages)
    late = []  # messages handed out after the application acked them
    lock = threading.Lock()
    done = threading.Event()
    remaining = [messages]
    peak = {"pending": 0, "memory_bytes": 0}

    def receive() -> None:
        while not done.is_set():
            try:
                message = consumer.receive(200)
            except pulsar.Timeout:
                continue
            i = int.from_bytes(message.data(), "big")
            with lock:
                if acked[i]:
                    late.append(i)
                seen = handouts[i] = min(handouts[i] + 1, 255)
            if i % BATCH == 3 and seen == 1:
                consumer.negative_acknowledge(message, delay_ms=NACK_DELAY_MS)
                continue
            consumer.acknowledge(message)
            with lock:
                if not acked[i]:
                    acked[i] = 1
                    remaining[0] -= 1
                    if not remaining[0]:
                        done.set()

    threads = [threading.Thread(target=receive, daemon=True) for _ in range(RECEIVERS)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    deadline = started + timeout_s
    while not done.wait(1.0) and time.monotonic() < deadline:
        stats = consumer.nack_stats(with_memory=True)
        assert stats.memory_bytes is not None, "measured: with_memory=True"
        peak["pending"] = max(peak["pending"], stats.pending)
        peak["memory_bytes"] = max(peak["memory_bytes"], stats.memory_bytes)
    drained = done.is_set()
    elapsed = time.monotonic() - started
    done.set()
    for thread in threads:
        thread.join()
    stats = consumer.nack_stats()
    consumer.close()
    check = pulsar.Client(service_url, operation_timeout_seconds=30, logger=logger)
    fresh = check.subscribe(topic, "drain", consumer_type=pulsar.ConsumerType.Shared)
    left: list[tuple[int, str, int]] = []  # (message, its id, how often it was handed out)
    try:
        while len(left) < 1000:
            message = fresh.receive(3000)
            i = int.from_bytes(message.data(), "big")
            left.append((i, str(message.message_id()), handouts[i]))
    except pulsar.Timeout:
        pass
    leftovers = len(left)
    check.close()
    producer.close()
    client.close()
    nacked = messages // BATCH
    wrong = sum(1 for i in range(messages) if handouts[i] != (2 if i % BATCH == 3 else 1))
    return {
        "messages": messages,
        "produce_s": produced_s,
        "drained": drained,
        "drain_s": elapsed,
        "handout_errors": wrong,
        "handed_out_after_ack": len(late),
        "leftovers_for_a_fresh_consumer": leftovers,
        "leftover_examples": left[:20],
        "nacked": nacked,
        "peak_pending": peak["pending"],
        "peak_memory_bytes": peak["memory_bytes"],
        "redelivered": stats.redelivered,
        "dropped_copies": stats.dropped,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--brokers", default="lite,apache")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per drain")
    args = parser.parse_args(argv)
    facts = report.machine()
    results: dict[str, Any] = {}
    rows = []
    for label, broker_type in report.brokers(args.brokers.split(",")):
        print(f"{label}: producing and draining {args.messages:,} messages ...", file=sys.stderr)
        with broker_type() as broker:
            result = results[label] = drain(broker.service_url, args.messages, args.timeout)
        print(result, file=sys.stderr)
        ok = (
            result["drained"]
            and not result["handout_errors"]
            and not result["handed_out_after_ack"]
            and not result["leftovers_for_a_fresh_consumer"]
        )
        rows.append([
            label,
            f"{result['messages']:,}",
            "yes" if result["drained"] else "NO",
            f"{result['drain_s']:.1f}",
            f"{result['handout_errors']:,}",
            f"{result['handed_out_after_ack']:,}",
            f"{result['leftovers_for_a_fresh_consumer']:,}",
            f"{result['peak_pending']:,}",
            f"{result['peak_memory_bytes'] / 1e6:.2f}",
            f"{result['peak_rss_mb']:.0f}",
            "✓" if ok else "✗",
        ])
    report.save_json("batch_drain", {"machine": facts, "results": results})
    headers = [
        "broker", "messages", "drained", "drain s", "wrong hand-out counts", "handed out after ack",
        "left for a fresh consumer", "peak pending", "peak tracker MB", "peak RSS MB", "ok",
    ]
    text = "\n\n".join([
        "## A million batched messages, one nack per batch",
        f"`python bench/batch_drain.py` — batches of {BATCH}; {RECEIVERS} receiver threads of one wrapper "
        f"consumer ack 9 messages of each batch and nack 1 ({NACK_DELAY_MS} ms), acked when it returns. "
        "Goal: every message handed out exactly once plus once per nack, none after its ack, nothing left "
        "for a fresh consumer of the subscription.",
        report.machine_line(facts),
        report.table(headers, rows),
    ])
    report.write_section("batch-drain", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
