"""Benchmark: the TimeBucket index alone across a sample of issue 23's grid — bytes per pending nack
measured from outside, ``memory_usage()`` against it, µs per add.

A grid point is (topics, batch size, nack share, delay, k). Its workload: ``pending`` nacks (100,000 by
default) spread evenly over the nacks' window — the delay when it is fixed, 60 s when it is uniform over
0–60 s — so that all of them are pending at the end (the steady state of a consumer nacking at that rate).
Messages arrive round-robin over the topics (one ledger each, entry ids counting up; a batch of ``batch``
messages is one entry), each nacked with probability ``share``; a batched message is nacked with its batch
index. Ids are added one by one as the tracker files them (``add(..., fresh=True)``, the topic in the key),
and ``compact()`` runs every 4,096 adds (the timer compacts buckets left behind) and once at the end.

Each point runs in a fresh interpreter with ``PYTHONMALLOC=malloc`` and glibc's tcache off
(``pulsar_nack.memory.MEASURING_ENV``): measured = ``heap_in_use()`` after minus before (the workload's
arrays are built before), reported = ``memory_usage().total_bytes``; ``leak`` = what reading
``memory_usage()`` twice leaves allocated. A small build of the same workload runs first and is dropped
(first-use allocations are not the index's).

    python bench/index_grid.py                 # the sample below, prints a table
    python bench/index_grid.py --all           # the whole grid (324 points)
    python bench/index_grid.py --json out.json
    python bench/index_grid.py --save          # results file + docs/performance.md section

Writes nothing unless ``--json`` (the rows) or ``--save`` (bench/results/index_grid.json and the
index-grid section of docs/performance.md) is given.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path
from typing import Any

import report

SCRIPT = Path(__file__).resolve()
DELAYS = ("10s", "60s", "1h", "u60")  # fixed 10 s, 60 s, 1 h; uniform over 0-60 s
_DELAY_MS = {"10s": 10_000, "60s": 60_000, "1h": 3_600_000, "u60": 60_000}
#: (topics, batch size, nack share, delay, k): a sample of the grid, sparse shapes first.
SAMPLE: list[tuple[int, int, float, str, int]] = [
    (100, 10, 0.1, "1h", 8),  # the issue's `profile` shape
    (100, 1, 0.1, "1h", 8),
    (1000, 1, 0.01, "60s", 8),
    (1000, 100, 0.01, "1h", 12),
    (1000, 10, 0.1, "10s", 8),
    (1000, 1, 0.1, "1h", 0),
    (100, 10, 0.1, "u60", 0),
    (100, 100, 0.01, "u60", 8),
    (100, 100, 0.1, "60s", 0),
    (1, 100, 0.01, "1h", 0),
    (1, 10, 0.1, "60s", 12),
    (1, 1, 0.1, "u60", 8),
    (1, 1, 1.0, "1h", 0),
    (1, 1, 1.0, "10s", 0),
    (100, 1, 1.0, "u60", 12),
    (1000, 100, 1.0, "10s", 0),
]
T0_MS = 1_735_689_600_000
COMPACT_EVERY = 4096


def workload(
    topics: int, batch: int, share: float, delay: str, pending: int, seed: int = 1
) -> tuple[list[int], list[int], list[int], list[int], list[str]]:
    """(due ms, ledger ids, entry ids, batch indexes, topics) of ``pending`` nacks in filing order."""
    import numpy as np

    rng = np.random.default_rng(seed)
    window = _DELAY_MS[delay]
    # Message positions of the nacked ones: each message is nacked with probability `share`.
    gaps = rng.geometric(share, pending) if share < 1 else np.ones(pending, dtype=np.int64)
    positions = np.cumsum(gaps) - 1
    topic = positions % topics
    sequence = positions // topics  # the message's number within its topic
    entries = sequence // batch
    indexes = sequence % batch if batch > 1 else np.full(pending, -1)
    nacked_at = T0_MS + np.arange(pending, dtype=np.int64) * window // pending
    delays = rng.integers(0, window, pending) if delay == "u60" else np.full(pending, window)
    names = [f"persistent://tenant/ns/topic-{t}" for t in range(topics)]
    return (
        (nacked_at + delays).tolist(),
        (10_000 + topic).tolist(),
        entries.tolist(),
        indexes.tolist(),
        [names[t] for t in topic.tolist()],
    )


def probe(payload: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: build one grid point's index and measure it."""
    import gc
    import time

    from pulsar_nack.index import TimeBucketIndex
    from pulsar_nack.memory import heap_in_use

    topics, batch, share, delay, k = payload["point"]
    pending = payload["pending"]

    def build(ids: tuple[list[Any], ...], timed: bool) -> tuple[TimeBucketIndex, float, float]:
        index = TimeBucketIndex(k)
        add, compact = index.add, index.compact
        spent = compacting = 0.0
        n = len(ids[0])
        for start in range(0, n, COMPACT_EVERY):
            end = min(start + COMPACT_EVERY, n)
            began = time.perf_counter()
            for due, ledger, entry, bi, name in zip(*(column[start:end] for column in ids), strict=True):
                add(due, ledger, entry, bi, name, True)
            spent += time.perf_counter() - began
            began = time.perf_counter()
            compact()
            compacting += time.perf_counter() - began
        compact()
        return index, spent / n * 1e6 if timed else 0.0, compacting / n * 1e6 if timed else 0.0

    warm_index, _, _ = build(workload(topics, batch, share, delay, 2000, seed=2), False)
    warm_index.memory_usage()
    del warm_index
    ids = workload(topics, batch, share, delay, pending)
    gc.collect()
    before = heap_in_use()
    index, us_per_add, us_compact = build(ids, True)
    gc.collect()
    measured = heap_in_use() - before
    usage = index.memory_usage()
    reported, parts = usage.total_bytes, dict(usage.breakdown, roaring=usage.roaring_bytes)
    del usage
    gc.collect()
    after_first = heap_in_use()
    for _ in range(3):
        index.memory_usage()
    gc.collect()
    leak = heap_in_use() - after_first
    n = len(index)
    return {
        "point": payload["point"],
        "pending": n,
        "measured": measured,
        "reported": reported,
        "b_per_nack": measured / n,
        "reported_ratio": reported / measured if measured else 0.0,
        "us_per_add": us_per_add,
        "us_compact_per_add": us_compact,
        "leak": leak,
        "parts": parts,
        "structure": index.structure(),
    }


def run_point(point: tuple[int, int, float, str, int], pending: int) -> dict[str, Any]:
    payload = {"point": point, "pending": pending}
    return report.run_probe(SCRIPT, payload, env={"PYTHONMALLOC": "malloc"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    parser.add_argument("--pending", type=int, default=100_000, help="nacks pending per point")
    parser.add_argument("--all", action="store_true", help="the whole grid, not the sample")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument(
        "--save",
        action="store_true",
        help="write bench/results/index_grid.json and the index-grid section of docs/performance.md",
    )
    args = parser.parse_args()
    if args.probe:
        print(json.dumps(probe(json.loads(args.probe))))
        return
    points = (
        list(itertools.product((1, 100, 1000), (1, 10, 100), (0.01, 0.1, 1.0), DELAYS, (0, 8, 12)))
        if args.all
        else SAMPLE
    )
    rows = []
    print(
        f"{'topics':>6} {'batch':>5} {'share':>5} {'delay':>5} {'k':>3} {'pending':>8} {'buckets':>7} "
        f"{'slots':>7} {'packed':>7} {'B/nack':>7} {'rep/meas':>8} {'us/add':>6} {'us/cpt':>6} {'leak':>6}"
    )
    for point in points:
        row = run_point(point, args.pending)
        rows.append(row)
        s = row["structure"]
        print(
            f"{point[0]:>6} {point[1]:>5} {point[2]:>5} {point[3]:>5} {point[4]:>3} {row['pending']:>8} "
            f"{s['buckets']:>7} {s['slots']:>7} {s['tier_ids']:>7} {row['b_per_nack']:>7.1f} "
            f"{row['reported_ratio']:>8.2f} {row['us_per_add']:>6.2f} {row['us_compact_per_add']:>6.2f} "
            f"{row['leak']:>6}",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.save:
        save(rows, args.pending, args.all)


def save(rows: list[dict[str, Any]], pending: int, whole: bool) -> None:
    """bench/results/index_grid.json and docs/performance.md's index-grid section, from this run."""
    facts = report.machine()
    per_nack = sorted(row["b_per_nack"] for row in rows)
    ratios = [row["reported_ratio"] for row in rows]
    summary = {
        "points": len(rows),
        "worst_b_per_nack": per_nack[-1],
        "median_b_per_nack": statistics.median(per_nack),
        "best_b_per_nack": per_nack[0],
        "within_10_b": sum(1 for value in per_nack if value <= 10),
        "reported_ratio_range": [min(ratios), max(ratios)],
        "reported_within_10_percent": sum(1 for ratio in ratios if abs(ratio - 1) <= 0.10),
        "median_us_per_add": statistics.median(row["us_per_add"] for row in rows),
        "median_us_compact_per_add": statistics.median(row["us_compact_per_add"] for row in rows),
    }
    report.save_json(
        "index_grid", {"machine": facts, "pending": pending, "all": whole, "summary": summary, "rows": rows}
    )
    headers = [
        "topics",
        "batch",
        "nack share",
        "delay",
        "k",
        "pending",
        "live buckets",
        "packed ids",
        "B per pending nack",
        "reported / measured",
        "µs per add",
        "µs compact per add",
    ]
    table = [
        [
            *row["point"],
            f"{row['pending']:,}",
            row["structure"]["buckets"],
            f"{row['structure']['tier_ids']:,}",
            f"{row['b_per_nack']:.1f}",
            f"{row['reported_ratio']:.2f}",
            f"{row['us_per_add']:.2f}",
            f"{row['us_compact_per_add']:.2f}",
        ]
        for row in rows
    ]
    text = "\n\n".join(
        [
            "## The TimeBucket index alone over issue 23's grid",
            f"`python bench/index_grid.py --save{' --all' if whole else ''}` — the index alone (no tracker), "
            f"{pending:,} pending nacks a point, filed one by one with `add(..., fresh=True)` as the tracker "
            f"does, `compact()` every {COMPACT_EVERY:,} adds and at the end; each point in a fresh process "
            "(`PYTHONMALLOC=malloc`, glibc tcache off): B per pending nack = heap retained from outside / "
            "`len(index)` ((bucket, entry) pairs: batch messages of one entry in one bucket count once); "
            "reported = `memory_usage()`; µs per add: the add loop alone (Python loop included), "
            "µs compact: the `compact()` calls, per add. Packed ids: (bucket, entry) pairs in the packed "
            "tier (`pulsar_nack/packed.py`).",
            report.machine_line(facts),
            f"Worst {summary['worst_b_per_nack']:.1f} B, median {summary['median_b_per_nack']:.1f} B, best "
            f"{summary['best_b_per_nack']:.1f} B per pending nack; {summary['within_10_b']} of {len(rows)} "
            f"points within 10 B. Reported / measured {min(ratios):.2f}–{max(ratios):.2f} "
            f"({summary['reported_within_10_percent']} of {len(rows)} within ±10 %). Median "
            f"{summary['median_us_per_add']:.2f} µs per add, {summary['median_us_compact_per_add']:.2f} µs "
            "of compaction per add.",
            report.table(headers, table),
        ]
    )
    report.write_section("index-grid", text)


if __name__ == "__main__":
    main()
