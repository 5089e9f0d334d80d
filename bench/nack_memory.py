"""Benchmark: memory per pending nack, everything the wrapper keeps included, in three workloads.

Each workload runs in a fresh process set up for heap measurement (``pulsar_nack.memory.MEASURING_ENV``)
and drives a real :class:`~pulsar_nack.tracker.NackTracker` — its TimeBucket index, timer wheel and
arrival filter — exactly as the consumer does: every arrival passes the filter, the application acks or
nacks, nacks are filed with their due times, and the timer compacts buckets left behind. No broker: the
ids are those a broker would deliver. Measured = retained heap from outside (pymalloc blocks + glibc
in-use chunks, CRoaring's heap included) after the nacks minus before; reported = ``nack_stats()``
(the index, the arrival filter and the tracker's timer wheel, as a consumer's tracker that owns its wheel
reports them). Before measuring, the same workload runs once and is dropped (first-use allocations).

* ``one topic, every message nacked`` — 200,000 non-batched messages, 50,000 entries per ledger, each
  nacked on arrival, due times in arrival order over 60 s (a steady stream);
* ``100 topics, due over 60 s`` — 200,000 non-batched messages over 100 topics, each nacked with a random
  delay, so due times are spread over 60 s in no order;
* ``one nack per 100-message batch`` — 20,000 entries of 100 batched messages: 99 acked, 1 nacked.

Goals (issue 9): ≤ 4, ≤ 12 and ≤ 24 B per pending nack; ``nack_stats().memory_bytes`` within ±10 % of
the measurement. The native client's bytes per pending nack are measured by ``bench/nack_lateness.py``.

    python bench/nack_memory.py

Writes ``bench/results/nack_memory.json`` and the ``nack-memory`` section of docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

import report

SCRIPT = Path(__file__).resolve()
WORKLOADS = {
    "one-topic": ("one topic, every message nacked", 4.0),
    "topics-100": ("100 topics, due over 60 s", 12.0),
    "batch-100": ("one nack per 100-message batch, rest acked", 24.0),
}
HEADERS = ["workload", "pending", "buckets", "measured B/nack", "goal", "reported B/nack", "reported error"]
SPREAD_MS = 60_000
DELAY_MS = 3_600_000


def probe(payload: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: build the workload and measure the retained heap."""
    import gc

    from pulsar_nack.memory import heap_in_use
    from pulsar_nack.timer import TimerWheel
    from pulsar_nack.tracker import NackTracker

    name = payload["workload"]
    if name not in WORKLOADS:
        raise SystemExit(f"unknown workload {name!r}")
    now = 1_000_000.0

    def build(wheel: TimerWheel) -> NackTracker:
        tracker = NackTracker(lambda _due: None, clock=lambda: now, wheel=wheel)
        _drive(name, tracker, now)
        tracker.index.compact()  # what the timer does ~1 s after nacks move on from a bucket
        return tracker

    # The same workload once before measuring, then dropped: first-use allocations are not per-nack cost
    # — among them numpy's cache of freed small data blocks (up to 7 per byte size below 1 KiB), which
    # compact()'s per-bucket numpy work fills to ~100 KB on its first run and reuses afterwards.
    warm = build(TimerWheel(clock=lambda: now, start=False))
    del warm
    gc.collect()
    before = heap_in_use()
    # A consumer's tracker owns its wheel and reports it; here the wheel is passed in (so that no timer
    # thread runs), and its bytes are added to the report as the owning tracker would add them.
    wheel = TimerWheel(clock=lambda: now, start=False)
    tracker = build(wheel)
    gc.collect()
    retained = heap_in_use() - before
    stats = tracker.stats(with_memory=True)
    assert stats.memory_bytes is not None, "measured: with_memory=True"
    reported = stats.memory_bytes + wheel.memory_bytes()
    return {
        "workload": name,
        "pending": stats.pending,
        "buckets": stats.buckets,
        "measured_bytes": retained,
        "reported_bytes": reported,
        "measured_per_nack": retained / stats.pending,
        "reported_per_nack": reported / stats.pending,
    }


def _drive(name: str, tracker: Any, now: float) -> None:
    """Admit and nack the workload's messages as the consumer does."""
    arrivals = tracker.arrivals
    rng = random.Random(7)
    if name == "one-topic":
        count = 200_000
        for i in range(count):
            ledger_id, entry_id = divmod(i, 50_000)
            arrivals.admit(ledger_id, entry_id, -1, "t", 0)
            tracker.schedule(now + DELAY_MS + i * SPREAD_MS / count, ledger_id, entry_id, -1, "t")
    elif name == "topics-100":
        count = 200_000
        for i in range(count):
            topic = f"persistent://public/default/topic-{i % 100}"
            ledger_id, entry_id = 1_000 + i % 100, i // 100
            arrivals.admit(ledger_id, entry_id, -1, topic, 0)
            tracker.schedule(now + DELAY_MS + rng.uniform(0, SPREAD_MS), ledger_id, entry_id, -1, topic)
    else:  # batch-100
        count = 20_000
        for entry_id in range(count):
            ledger_id = 5
            for index in range(100):
                arrivals.admit(ledger_id, entry_id, index, "t", 100)
            nacked = rng.randrange(100)
            for index in range(100):
                if index != nacked:
                    arrivals.acked(ledger_id, entry_id, index, "t")
            tracker.schedule(now + DELAY_MS + entry_id * SPREAD_MS / count, ledger_id, entry_id, nacked, "t")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    args = parser.parse_args(argv)
    if args.probe:
        print(json.dumps(probe(json.loads(args.probe))))
        return 0
    facts = report.machine()
    rows, results = [], []
    for name in args.workloads.split(","):
        result = report.run_probe(SCRIPT, {"workload": name})
        results.append(result)
        title, goal = WORKLOADS[name]
        error = result["reported_bytes"] / result["measured_bytes"] - 1
        rows.append(
            [
                title,
                f"{result['pending']:,}",
                f"{result['buckets']:,}",
                f"{result['measured_per_nack']:.1f}",
                f"≤ {goal:g} {'✓' if result['measured_per_nack'] <= goal else '✗'}",
                f"{result['reported_per_nack']:.1f}",
                f"{error:+.0%} {'✓' if abs(error) <= 0.10 else '✗'}",
            ]
        )
        print(rows[-1], flush=True)
    report.save_json("nack_memory", {"machine": facts, "results": results})
    text = "\n\n".join(
        [
            "## Memory per pending nack, everything the wrapper keeps",
            "`python bench/nack_memory.py` — a real `NackTracker` (index, timer wheel, arrival filter) "
            "driven as the consumer drives it, in a fresh process per workload; measured = retained heap "
            "from outside (pymalloc + glibc in use, CRoaring included), reported = "
            "`nack_stats().memory_bytes` (index, arrival filter and the tracker's timer wheel). The "
            "workload runs once before the measured run (first-use allocations, e.g. numpy's cache of "
            "small blocks, are not per-nack cost). Goals from issue 9. The native client's bytes per "
            "pending nack: `bench/nack_lateness.py` measures them (section broker-nacks).",
            report.machine_line(facts),
            report.table(HEADERS, rows),
        ]
    )
    report.write_section("nack-memory", text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
