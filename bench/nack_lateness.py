"""Benchmark: redelivery lateness, nack call cost and memory per pending nack — wrapper vs native client.

Through a real broker (pulsar-lite, and Apache Pulsar standalone when Java is available), side by side in
one run:

* **Lateness** = arrival − (nack time + delay) for 200 messages in three patterns — one burst; 10 groups
  spaced delay/2; a steady stream for 2 × delay — at delays 1 s, 3 s, 9 s. The native consumer and the
  wrapper run the same pattern at the same time on two topics. Goal: wrapper p99 ≤ 2^k + 50 ms (k = 8,
  the default rounding: ceil, never early since issue 24; floor before, up to 2^k ms early).
* **Call cost** of ``negative_acknowledge(message)`` over 20,000 received messages. Goal: wrapper ≤ 1.0×.
* **Memory per pending nack**, from outside in a fresh process (heap delta; the native tracker's C++
  allocations included): 200,000 nacks of rebuilt ids, due over one minute. Goal: ≥ 100× less at k = 8.

    python bench/nack_lateness.py                     # both brokers, all delays (≈ 12 min)
    python bench/nack_lateness.py --brokers lite --delays 1000

Writes ``bench/results/nack_lateness.json``, the ``broker-nacks`` section of docs/performance.md and
``pulsar_nack/data/native_nack_cost.json`` (the native client's measured bytes per pending nack, with
date, machine, versions and commit: the figure ``pulsar-nack demo`` prints). ``--export-native-cost``
writes only that file, from the results file of an earlier run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import report
from tqdm import tqdm

SCRIPT = Path(__file__).resolve()
PATTERNS = ("burst", "groups", "steady")
PRECISION_BITS = 8
#: Package data of the demo: the native client's bytes per pending nack as this benchmark measured it.
NATIVE_COST = report.ROOT / "pulsar_nack" / "data" / "native_nack_cost.json"
#: The broker whose native figure the file carries first: the demo's (pulsar-lite), when it was measured.
NATIVE_COST_BROKER = "pulsar-lite"


def _subscribe(client: Any, topic: str, delay_ms: int) -> Any:
    import pulsar

    return client.subscribe(
        topic, "bench", consumer_type=pulsar.ConsumerType.Shared, negative_ack_redelivery_delay_ms=delay_ms
    )


def _produce(client: Any, topic: str, count: int, batching: bool) -> None:
    producer = client.create_producer(
        topic, batching_enabled=batching, batching_max_publish_delay_ms=5, block_if_queue_full=True
    )
    for i in range(count):
        producer.send_async(str(i).encode(), None)
    producer.flush()
    producer.close()


def _receive(consumer: Any, count: int, timeout_s: float = 60.0) -> list[Any]:
    import pulsar

    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        with contextlib.suppress(pulsar.Timeout):
            got.append(consumer.receive(500))
    if len(got) < count:
        raise RuntimeError(f"received {len(got)} of {count} messages")
    return got


# -- lateness -------------------------------------------------------------------------------------


def _plan(pattern: str, count: int, delay_ms: int) -> list[float]:
    """Seconds after the start at which message i is nacked."""
    if pattern == "burst":
        return [0.0] * count
    if pattern == "groups":
        return [(i * 10 // count) * delay_ms / 2000 for i in range(count)]
    return [i * 2 * delay_ms / count / 1000 for i in range(count)]


def lateness_run(service_url: str, kind: str, delay_ms: int, pattern: str, count: int) -> dict[str, Any]:
    """One consumer kind through one pattern; returns lateness figures (ms)."""
    import pulsar

    client = report.client(kind, service_url)
    topic = f"persistent://public/default/lateness-{kind}-{uuid.uuid4().hex[:8]}"
    try:
        consumer = _subscribe(client, topic, delay_ms)
        _produce(client, topic, count, batching=False)
        messages = _receive(consumer, count)
        nacked: dict[bytes, float] = {}
        arrived: dict[bytes, float] = {}
        duplicates = 0
        plan = _plan(pattern, count, delay_ms)
        deadline = time.monotonic() + plan[-1] + delay_ms / 1000 + max(15.0, 2 * delay_ms / 1000)
        done = threading.Event()

        def receive_redeliveries() -> None:
            nonlocal duplicates
            while len(arrived) < count and time.monotonic() < deadline:
                try:
                    message = consumer.receive(200)
                except pulsar.Timeout:
                    continue
                now = time.monotonic()
                key = message.data()
                if key in arrived:
                    duplicates += 1
                else:
                    arrived[key] = now
                consumer.acknowledge(message)
            done.set()

        receiver = threading.Thread(target=receive_redeliveries, daemon=True)
        receiver.start()
        start = time.monotonic()
        for message, offset in zip(messages, plan, strict=True):
            pause = start + offset - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            nacked[message.data()] = time.monotonic()
            consumer.negative_acknowledge(message)
        done.wait(deadline - time.monotonic() + 5)
        lateness = np.array([(arrived[k] - nacked[k]) * 1000 - delay_ms for k in arrived])
        consumer.close()
    finally:
        client.close()
    figures: dict[str, Any] = {"arrived": len(arrived), "expected": count, "duplicates": duplicates}
    if len(lateness):
        figures.update(
            min=float(lateness.min()),
            p50=float(np.percentile(lateness, 50)),
            p99=float(np.percentile(lateness, 99)),
            max=float(lateness.max()),
        )
    return figures


# -- call cost ------------------------------------------------------------------------------------


def call_cost(service_url: str, count: int, rounds: int = 5) -> dict[str, Any]:
    """µs per negative_acknowledge(message), each kind on received messages; median of ``rounds`` per
    kind, the kinds alternating (native first in even rounds) so that a shared machine's load falls on
    both alike; the 1-minute load average at the start of each round is recorded (``loadavg``)."""
    samples: dict[str, list[float]] = {kind: [] for kind in report.KINDS}
    loads: list[float] = []
    for number in range(rounds):
        loads.append(os.getloadavg()[0])
        for kind in report.KINDS if number % 2 == 0 else tuple(reversed(report.KINDS)):
            client = report.client(kind, service_url)
            topic = f"persistent://public/default/cost-{kind}-{uuid.uuid4().hex[:8]}"
            try:
                consumer = _subscribe(client, topic, 600_000)
                _produce(client, topic, count, batching=False)
                messages = _receive(consumer, count)
                nack = consumer.negative_acknowledge
                started = time.perf_counter()
                for message in messages:
                    nack(message)
                samples[kind].append((time.perf_counter() - started) / count * 1e6)
                consumer.close()
            finally:
                client.close()
    out: dict[str, Any] = {kind: statistics.median(values) for kind, values in samples.items()}
    out["ratio"] = out["wrapper"] / out["native"]
    out["samples"] = samples
    out["loadavg"] = loads
    return out


# -- memory per pending nack (fresh process) ------------------------------------------------------


def memory_probe(payload: dict[str, Any]) -> dict[str, Any]:
    import gc

    import _pulsar

    from pulsar_nack.memory import heap_in_use

    kind, count, service_url = payload["kind"], payload["count"], payload["service_url"]
    client = report.client(kind, service_url)
    topic = f"persistent://public/default/memory-{kind}-{uuid.uuid4().hex[:8]}"
    consumer = _subscribe(client, topic, 3_600_000)
    warm = [_pulsar.MessageId(-1, 1, i, -1) for i in range(1000)]
    for message_id in warm:  # first-use allocations are not per-nack cost
        consumer.negative_acknowledge(message_id)
    ids = [_pulsar.MessageId(-1, 2, i, -1) for i in range(count)]
    gc.collect()
    before = heap_in_use()
    spread_ms = 60_000  # due times spread over a minute, as a steady stream of nacks would
    if kind == "native":
        for message_id in ids:
            consumer.negative_acknowledge(message_id)
    else:
        for i, message_id in enumerate(ids):
            consumer.negative_acknowledge(message_id, delay_ms=3_600_000 + i * spread_ms // count)
        time.sleep(1.5)  # steady state: the tracker compacts buckets left behind after ~1 s
    gc.collect()
    retained = heap_in_use() - before
    out = {"bytes_per_nack": retained / count, "retained": retained}
    if kind == "wrapper":
        stats = consumer.nack_stats(with_memory=True)
        out.update(buckets=stats.buckets, index_bytes=stats.memory_bytes)
    consumer.close()
    client.close()
    return out


# -- the run --------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--brokers", default="lite,apache")
    parser.add_argument("--delays", default="1000,3000,9000", help="nack delays, ms")
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--cost-messages", type=int, default=20_000)
    parser.add_argument("--memory-nacks", type=int, default=200_000)
    parser.add_argument(
        "--export-native-cost",
        action="store_true",
        help=f"only write {NATIVE_COST.relative_to(report.ROOT)} from bench/results/nack_lateness.json",
    )
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:
        print(json.dumps(memory_probe(json.loads(args.probe))))
        return 0
    if args.export_native_cost:
        earlier = json.loads((report.RESULTS / "nack_lateness.json").read_text())
        print(f"wrote {export_native_cost(earlier)}")
        return 0
    delays = [int(d) for d in args.delays.split(",") if d]
    if not delays or min(delays) < 0:
        parser.error(f"--delays must be non-negative ms, got {args.delays!r}")
    from pulsar_nack import NackOptions

    results: dict[str, Any] = {
        "machine": report.machine(),
        "brokers": {},
        "precision_bits": PRECISION_BITS,
        "rounding": NackOptions().rounding,  # the wrapper's default, which the bench subscribes with
    }
    for label, broker_type in report.brokers(args.brokers.split(",")):
        print(f"starting {label} ...", file=sys.stderr)
        with broker_type() as broker:
            results["brokers"][label] = run_broker(broker.service_url, delays, args)
    report.save_json("nack_lateness", results)
    export_native_cost(results)
    markdown = render(results)
    report.write_section("broker-nacks", markdown)
    print(markdown)
    return 0


def export_native_cost(results: dict[str, Any], path: Path = NATIVE_COST) -> Path:
    """Write the native client's measured bytes per pending nack, with its provenance, to ``path`` (the
    demo's package data); the figures exactly as in ``results``. Raises ValueError if no broker run
    measured memory."""
    measured = {
        label: figures["memory"] for label, figures in results["brokers"].items() if "memory" in figures
    }
    if not measured:
        raise ValueError("the results hold no memory measurement of the native client")
    broker = NATIVE_COST_BROKER if NATIVE_COST_BROKER in measured else next(iter(measured))
    machine = results["machine"]
    payload = {
        "bytes_per_nack": measured[broker]["native"]["bytes_per_nack"],
        "broker": broker,
        "pending": measured[broker]["count"],
        "by_broker": {label: memory["native"]["bytes_per_nack"] for label, memory in measured.items()},
        "date": machine["date"],
        "machine": f"{machine['cpu']} ({machine['cores']} cores)",
        "versions": {"python": machine["python"], **machine["libraries"]},
        "commit": machine["commit"],
        "source": "bench/nack_lateness.py",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    return path


def run_broker(service_url: str, delays: list[int], args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"lateness": []}
    jobs = [(delay, pattern) for delay in delays for pattern in PATTERNS]
    with tqdm(total=len(jobs) + 1 + len(report.KINDS), unit="run", file=sys.stderr) as bar:
        for delay, pattern in jobs:
            bar.set_description(f"lateness {pattern} {delay} ms")
            with ThreadPoolExecutor(len(report.KINDS)) as pool:  # native and wrapper side by side
                futures = {
                    kind: pool.submit(lateness_run, service_url, kind, delay, pattern, args.messages)
                    for kind in report.KINDS
                }
                row = {"delay_ms": delay, "pattern": pattern, **{k: f.result() for k, f in futures.items()}}
            out["lateness"].append(row)
            bar.update()
        bar.set_description("call cost")
        out["call_cost_us"] = call_cost(service_url, args.cost_messages)
        bar.update()
        out["memory"] = {}
        for kind in report.KINDS:
            bar.set_description(f"memory {kind}")
            payload = {"kind": kind, "count": args.memory_nacks, "service_url": service_url}
            out["memory"][kind] = report.run_probe(SCRIPT, payload)
            bar.update()
    out["memory"]["count"] = args.memory_nacks
    native_bytes = out["memory"]["native"]["bytes_per_nack"]
    out["memory"]["ratio"] = native_bytes / max(out["memory"]["wrapper"]["bytes_per_nack"], 1e-9)
    return out


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f}" if abs(value) >= 10 else f"{value:.1f}"


_LATENESS_HEADERS = [
    "delay",
    "pattern",
    "native min / p50 / p99 / max",
    "native back",
    "wrapper min / p50 / p99 / max",
    "wrapper back",
]


def _spread(figures: dict[str, Any]) -> str:
    return " / ".join(_ms(figures.get(name)) for name in ("min", "p50", "p99", "max"))


def _back(figures: dict[str, Any]) -> str:
    extra = f" (+{figures['duplicates']} dup)" if figures["duplicates"] else ""
    return f"{figures['arrived']}/{figures['expected']}{extra}"


def _lateness_row(row: dict[str, Any], goal: float) -> list[str]:
    native, wrapper = row["native"], row["wrapper"]
    complete = wrapper["arrived"] == wrapper["expected"] and not wrapper["duplicates"]
    ok = complete and wrapper.get("p99") is not None and wrapper["p99"] <= goal
    return [
        f"{row['delay_ms']} ms",
        row["pattern"],
        _spread(native),
        _back(native),
        _spread(wrapper),
        _back(wrapper),
        "✓" if ok else "✗",
    ]


def _mark(ok: bool) -> str:
    return "✓" if ok else "✗"


def render(results: dict[str, Any]) -> str:
    goal = 2**PRECISION_BITS + 50
    parts = [
        "## Redelivery through a broker: pulsar-nack vs the native client",
        "",
        "`python bench/nack_lateness.py` — lateness = arrival − (nack time + delay), ms, over 200 "
        f"messages; the wrapper at k = {PRECISION_BITS}, {report.rounding_note(results, PRECISION_BITS)}. "
        "Native and wrapper ran each pattern at the same time, on two topics. "
        f"Goal: wrapper p99 ≤ 2^k + 50 = {goal} ms.",
        "",
        report.machine_line(results["machine"]),
    ]
    for label, figures in results["brokers"].items():
        rows = [_lateness_row(row, goal) for row in figures["lateness"]]
        cost, memory = figures["call_cost_us"], figures["memory"]
        native_b, wrapper_b = memory["native"]["bytes_per_nack"], memory["wrapper"]["bytes_per_nack"]
        parts += [
            "",
            f"### {label}",
            "",
            report.table([*_LATENESS_HEADERS, f"wrapper p99 ≤ {goal}"], rows),
            "",
            f"- `negative_acknowledge` call: native {cost['native']:.2f} µs, wrapper "
            f"{cost['wrapper']:.2f} µs — {cost['ratio']:.2f}× (goal ≤ 1.0×: {_mark(cost['ratio'] <= 1.0)})"
            + (
                f"; medians of {len(cost['samples']['native'])} rounds a kind, kinds alternating, load "
                f"average (1 min) {min(cost['loadavg']):.1f}–{max(cost['loadavg']):.1f} on 2 cores."
                if "loadavg" in cost
                else "."
            ),
            f"- Memory per pending nack ({memory['count']:,} pending, due over a minute): native "
            f"{native_b:.0f} B, wrapper {wrapper_b:.2f} B ({memory['wrapper']['buckets']} buckets) — "
            f"{memory['ratio']:.0f}× less (goal ≥ 100×: {_mark(memory['ratio'] >= 100)}).",
        ]
    return "\n".join(parts)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
