"""Benchmark: a million batched messages, one nack per batch — everything drains, nothing acked comes back.

PIP-393's use case at scale, through a real broker: 1,000,000 messages in batches of 10; the consumer
(the wrapper, 4 receiver threads) acks 9 messages of each batch and nacks 1 with a 1 s delay, and acks
it when it comes back. No bound on the tracker's state may turn acked messages into redelivered ones, so:
every message is handed out once, plus once more for each nack; none is handed out after the
application acked it; afterwards a fresh official consumer of the subscription receives nothing (backlog
0). Reported: drain time, peak pending nacks, peak ``nack_stats().memory_bytes``, peak RSS.

    python bench/batch_drain.py                       # both brokers, 1M messages
    python bench/batch_drain.py --brokers lite --messages 200000
    python bench/batch_drain.py --shape held --runs 3  # issue 27 item 3 on Apache (batch_drain_held.json)

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


def produce(client: Any, topic: str, messages: int) -> float:
    """Send messages 0 .. ``messages`` - 1 (4-byte big-endian) to ``topic`` in batches of :data:`BATCH`,
    as both shapes do; returns the seconds it took (send to flush). The producer is closed."""
    producer = client.create_producer(
        topic, batching_enabled=True, batching_max_messages=BATCH, batching_max_publish_delay_ms=10,
        block_if_queue_full=True,
    )  # fmt: skip
    started = time.monotonic()
    for i in range(messages):
        producer.send_async(i.to_bytes(4, "big"), None)
    producer.flush()
    elapsed = time.monotonic() - started
    producer.close()
    return elapsed


def drain(service_url: str, messages: int, timeout_s: float) -> dict[str, Any]:
    import pulsar

    import pulsar_nack

    topic = f"persistent://public/default/drain-{uuid.uuid4().hex[:8]}"
    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    client = pulsar_nack.Client(service_url, operation_timeout_seconds=30, logger=logger)
    consumer = client.subscribe(topic, "drain", consumer_type=pulsar.ConsumerType.Shared)
    produced_s = produce(client, topic, messages)
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


#: The held shape's broker settings on Apache: no cap on a consumer's or subscription's unacked messages
#: (each of the ~110,000 held messages is one; the default caps of 50,000 / 200,000 stall dispatch).
HELD_MESSAGES = 1_100_000
HELD_SETTINGS = {"maxUnackedMessagesPerConsumer": 0, "maxUnackedMessagesPerSubscription": 0}


def held_drain(service_url: str, messages: int, timeout_s: float) -> dict[str, Any]:
    """Issue 27 item 3's shape: ``messages`` in batches of 10 with batch-index acks, consumed side by side
    by the wrapper and the official consumer (one subscription each, at the same time): 4 receivers each
    ack 9 messages of each 10 and hold the 10th (``i % 10 == 9``) unacked; once every message was handed
    out, every held one is nacked with a 1 s delay, and acked when it comes back. Counts messages handed
    out after the application acked them, per phase, for each consumer."""
    import pulsar

    import pulsar_nack

    topic = f"persistent://public/default/held-drain-{uuid.uuid4().hex[:8]}"
    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    clients = {
        "wrapper": pulsar_nack.Client(service_url, operation_timeout_seconds=30, logger=logger),
        "official": pulsar.Client(service_url, operation_timeout_seconds=30, logger=logger),
    }
    consumers = {
        name: client.subscribe(
            topic, name, consumer_type=pulsar.ConsumerType.Shared, batch_index_ack_enabled=True,
            negative_ack_redelivery_delay_ms=NACK_DELAY_MS,
        )
        for name, client in clients.items()
    }  # fmt: skip
    produced_s = produce(clients["official"], topic, messages)
    results: dict[str, Any] = {}

    def run_one(name: str) -> None:
        results[name] = _held_run(consumers[name], messages, timeout_s)

    runs = [threading.Thread(target=run_one, args=(name,)) for name in consumers]
    for run in runs:
        run.start()
    for run in runs:
        run.join()
    for name, consumer in consumers.items():
        if name == "wrapper":
            stats = consumer.nack_stats()
            results[name].update(
                redelivered=stats.redelivered, dropped_copies=stats.dropped, reforwarded=stats.reforwarded,
                abandoned=stats.abandoned,
            )  # fmt: skip
        consumer.close()
    check = pulsar.Client(service_url, operation_timeout_seconds=30, logger=logger)
    for name in consumers:
        fresh = check.subscribe(topic, name, consumer_type=pulsar.ConsumerType.Shared)
        leftovers = 0
        try:
            while leftovers < 1000:
                fresh.receive(3000)
                leftovers += 1
        except pulsar.Timeout:
            pass
        results[name]["leftovers_for_a_fresh_consumer"] = leftovers
        fresh.close()
    check.close()
    for client in clients.values():
        client.close()
    return {
        "messages": messages,
        "produce_s": produced_s,
        **results,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def held_main(messages: int, args: argparse.Namespace) -> int:
    """``--shape held``: ``args.runs`` runs on one Apache standalone; writes
    ``bench/results/batch_drain_held.json`` and the ``batch-drain-held`` section of docs/performance.md."""
    from harness.standalone import PulsarStandalone

    if not report.brokers(["apache"]):
        return 1
    facts = report.machine()
    runs: list[dict[str, Any]] = []
    rows = []
    with PulsarStandalone(settings=HELD_SETTINGS) as broker:
        for number in range(1, args.runs + 1):
            print(f"run {number}: {messages:,} messages, held shape ...", file=sys.stderr)
            result = held_drain(broker.service_url, messages, args.timeout)
            print(result, file=sys.stderr)
            runs.append(result)
            report.save_json("batch_drain_held", {"machine": facts, "settings": HELD_SETTINGS, "runs": runs})
            for name in ("wrapper", "official"):
                side = result[name]
                first, second = side["handed_out_after_ack_by_phase"]
                left = side["leftovers_for_a_fresh_consumer"]
                rows.append([
                    number, name, f"{messages:,}", f"{side['held']:,}", "yes" if side["drained"] else "NO",
                    f"{side['first_phase_s']:.0f} / {side['second_phase_s']:.0f}",
                    f"{first:,}", f"{second:,}", f"{left:,}",
                    "✓" if side["drained"] and not first + second + left else "✗",
                ])  # fmt: skip
    headers = [
        "run", "consumer", "messages", "held", "drained", "phase 1 / 2 s", "handed out after ack: phase 1",
        "phase 2", "left for a fresh consumer", "ok",
    ]  # fmt: skip
    text = "\n\n".join([
        "## Held batch messages nacked at scale, batch-index acks (Apache)",
        f"`python bench/batch_drain.py --shape held --runs {args.runs}"
        + (f" --messages {messages}" if messages != HELD_MESSAGES else "")
        + f"` — issue 27 item 3: Apache standalone with `acknowledgmentAtBatchIndexLevelEnabled` (no unacked "
        f"caps), {messages:,} messages in batches of {BATCH}, consumers with `batch_index_ack_enabled`; "
        f"{RECEIVERS} receiver threads per consumer ack 9 messages of each 10 and hold the 10th; then every "
        f"held one is nacked ({NACK_DELAY_MS} ms) and acked when it comes back. The wrapper and the official "
        "consumer run at the same time, one subscription each. Goal: nothing handed out after its ack.",
        report.machine_line(facts),
        report.table(headers, rows),
    ])  # fmt: skip
    report.write_section("batch-drain-held", text)
    print(text)
    return 0


def _held_run(consumer: Any, messages: int, timeout_s: float) -> dict[str, Any]:
    """:func:`held_drain`'s two phases on one consumer (its ``negative_acknowledge`` takes no delay: both
    consumers were subscribed with the 1 s delay)."""
    import pulsar

    handouts = bytearray(messages)  # hand-outs per message (capped at 255)
    acked = bytearray(messages)
    late: list[list[int]] = [[], []]  # messages handed out after the application acked them, by phase
    held: list[Any] = []
    entries: set[tuple[int, int]] = set()  # entries of the held messages
    lock = threading.Lock()
    phase = [0]
    done = threading.Event()
    wanted = [messages]  # phase 0: first hand-outs still to come; phase 1: held messages still unacked

    def receive() -> None:
        while not done.is_set():
            try:
                message = consumer.receive(200)
            except pulsar.Timeout:
                continue
            i = int.from_bytes(message.data(), "big")
            hold = False
            with lock:
                now = phase[0]
                if acked[i]:
                    late[now].append(i)
                first = handouts[i] == 0
                handouts[i] = min(handouts[i] + 1, 255)
                if now == 0 and first:
                    wanted[0] -= 1
                    if i % BATCH == BATCH - 1:
                        hold = True
                        held.append(message)
                        mid = message.message_id()
                        entries.add((mid.ledger_id(), mid.entry_id()))
                    if not wanted[0]:
                        done.set()
            if hold:
                continue
            consumer.acknowledge(message)
            with lock:
                if not acked[i]:
                    acked[i] = 1
                    if now == 1 and i % BATCH == BATCH - 1:
                        wanted[0] -= 1
                        if not wanted[0]:
                            done.set()

    def run_phase(deadline: float) -> bool:
        threads = [threading.Thread(target=receive, daemon=True) for _ in range(RECEIVERS)]
        for thread in threads:
            thread.start()
        while not done.wait(1.0) and time.monotonic() < deadline:
            pass
        ok = done.is_set()
        done.set()
        for thread in threads:
            thread.join()
        return ok

    started = time.monotonic()
    first_ok = run_phase(started + timeout_s)
    first_s = time.monotonic() - started
    phase[0] = 1
    done.clear()
    with lock:
        wanted[0] = len(held)
    started = time.monotonic()
    for message in held:
        consumer.negative_acknowledge(message)
    nacked_s = time.monotonic() - started
    held_count = len(held)
    held.clear()
    second_ok = run_phase(started + timeout_s)
    second_s = time.monotonic() - started
    done.clear()  # copies still on their way: received for 5 s more, counted if handed out after the ack
    quiet = [threading.Thread(target=receive, daemon=True) for _ in range(RECEIVERS)]
    for thread in quiet:
        thread.start()
    time.sleep(5.0)
    done.set()
    for thread in quiet:
        thread.join()
    return {
        "held": held_count,
        "held_entries": len(entries),
        "drained": first_ok and second_ok,
        "first_phase_s": first_s,
        "nack_s": nacked_s,
        "second_phase_s": second_s,
        "handed_out_after_ack": len(late[0]) + len(late[1]),
        "handed_out_after_ack_by_phase": [len(late[0]), len(late[1])],
        "after_ack_examples": sorted(set(late[0] + late[1]))[:20],
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--brokers", default="lite,apache")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per drain")
    parser.add_argument(
        "--shape", choices=("nack", "held"), default="nack",
        help="nack: one nack per batch while draining; held: issue 27 item 3's shape (Apache only, "
        "1,100,000 messages by default, beside the official consumer)",
    )  # fmt: skip
    parser.add_argument("--runs", type=int, default=3, help="runs of the held shape, on one broker")
    args = parser.parse_args(argv)
    if args.shape == "held":
        return held_main(args.messages if "--messages" in " ".join(argv) else HELD_MESSAGES, args)
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
