"""Benchmark: the redelivery timer's CPU per forwarded id and its forward lateness, at precision k = 0, 4, 8.

A real :class:`~pulsar_nack.tracker.NackTracker` (its own timer thread, the real clock, the arrival filter;
the native client replaced by a recorder) holds nacks due 1 or 10 per millisecond over 100 s — at k = 0
that is 100,000 one-ms buckets, due faster than the native timer lets forwards go (every 68 ms). For a
window of 15 s of forwarding the process's CPU time is measured (the main thread sleeps), and for each id
forwarded in it:

* **lateness vs bucket** = forward time + lead (102 ms) − its bucket time: how late the timer forwards a
  bucket (0 is exact; at k = 0 the buckets between two native-grid slots wait up to 68 ms, by design);
* **lateness vs due** = forward time + lead − its own due time (floor rounding: up to 2^k − 1 ms early).

Each row runs in a fresh process. Goal (issue 10): CPU proportional to the buckets that fall due; k = 0 costs
≤ 2× the CPU per forwarded id of k = 8 (before: 1,000 ms CPU per second and 4.3M callbacks at k = 0).

The CPU per *forward* is reported too, and a second probe measures what one forward's pop of the index
(``pop_due_by_bucket``) costs back to back and after the timer has slept (``IDLE_MS``): a forward's CPU is
mostly a fixed cost paid with cold caches, the same at every k, so at 1 id per ms the CPU per id follows
the forward rate (one per 68 ms at k ≤ 6, set by the native timer's grid, against one per 256 ms at k = 8).

    python bench/timer_cost.py                 # ≈ 3 min

Writes ``bench/results/timer_cost.json`` and the ``timer-cost`` section of docs/performance.md.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import report

SCRIPT = Path(__file__).resolve()
PRECISIONS = (0, 4, 8)
PER_MS = (1, 10)  # ids due per ms
SPAN_MS = 100_000  # due times one ms apart: 100,000 one-ms buckets at k = 0
WINDOW_MS = 15_000.0
IDLE_MS = (0, 1, 10, 68, 256)  # pauses before a pop in the cold probe (the timer sleeps 68 / 256 ms)


def probe(precision_bits: int, per_ms: int) -> dict[str, Any]:
    """One k and density, in this (fresh) process: file the nacks, measure CPU and lateness over the
    window (which starts after filing and the compaction that follows it)."""
    from pulsar_nack.tracker import NackTracker

    forwards: list[tuple[float, Any]] = []  # (forward time, entry ids)
    calls = [0]

    def record(due: Any) -> None:
        calls[0] += 1
        now = time.monotonic() * 1000.0
        for ids in due:
            forwards.append((now, ids.entry_ids))

    tracker = NackTracker(record, precision_bits=precision_bits)
    ids = SPAN_MS * per_ms
    start = tracker.clock() + 3_000.0 + 0.007 * ids  # filing takes ~4 µs a nack, then one compaction
    for entry_id in range(ids):
        tracker.schedule(start + entry_id // per_ms, 1, entry_id)
    buckets = tracker.index.bucket_count
    lead = tracker.lead_ms
    window_start = start - lead  # the first bucket's forward time
    time.sleep(max(0.0, (window_start - tracker.clock()) / 1000.0))
    cpu_before, calls_before = time.process_time(), calls[0]
    time.sleep(WINDOW_MS / 1000.0)
    cpu_ms = (time.process_time() - cpu_before) * 1000.0
    callbacks = calls[0] - calls_before
    window_end = window_start + WINDOW_MS
    pending_after = len(tracker.index)
    tracker.close()
    in_window = [(at, entries) for at, entries in forwards if window_start <= at < window_end]
    entry_ids = np.concatenate([entries for _, entries in in_window]).astype(np.int64)
    at = np.concatenate([np.full(len(entries), t) for t, entries in in_window])
    due = start + entry_ids // per_ms
    bucket_time = np.floor(due).astype(np.int64) & (-1 << precision_bits)  # as the index files them
    forwarded = len(entry_ids)

    def pct(values: Any) -> dict[str, float]:
        p50, p99 = np.percentile(values, [50, 99])
        return {"p50": float(p50), "p99": float(p99), "max": float(values.max())}

    return {
        "precision_bits": precision_bits,
        "ids_per_ms": per_ms,
        "buckets_at_start": buckets,
        "forwarded_ids": forwarded,
        "forwards": callbacks,
        "pending_after": pending_after,
        "cpu_ms": cpu_ms,
        "cpu_ms_per_s": cpu_ms / (WINDOW_MS / 1000.0),
        "cpu_us_per_id": cpu_ms * 1000.0 / forwarded,
        "cpu_us_per_forward": cpu_ms * 1000.0 / max(callbacks, 1),
        "lateness_vs_bucket_ms": pct(at + lead - bucket_time),
        "lateness_vs_due_ms": pct(at + lead - due),
    }


def cold_probe(precision_bits: int, repeats: int = 60) -> dict[str, Any]:
    """CPU (thread time) of one forward's pop (``pop_due_by_bucket``) — 68 one-id buckets at k = 0, one
    256-id bucket at k = 8, as in the 1-id-per-ms rows — called back to back or after sleeping each of
    ``IDLE_MS``: how much of a forward's cost is the caches gone cold while the timer slept. Medians over
    ``repeats`` pops."""
    from pulsar_nack.index import TimeBucketIndex

    index = TimeBucketIndex(precision_bits)
    ids = 2 * repeats * len(IDLE_MS) * 256
    for entry_id in range(ids):
        index.add(1_000 + entry_id, 1, entry_id)
    index.compact()
    step = 68 if precision_bits < 8 else 256  # ms of buckets per forward (the native grid at k <= 6)
    now = 1_000
    medians = {}
    for idle_ms in IDLE_MS:
        times = []
        for _ in range(repeats):
            now += step
            if idle_ms:
                time.sleep(idle_ms / 1000.0)
            before = time.thread_time_ns()
            index.pop_due_by_bucket(now)
            times.append(time.thread_time_ns() - before)
        medians[str(idle_ms)] = float(np.median(times)) / 1000.0
    return {"precision_bits": precision_bits, "ms_per_forward": step, "pop_us_after_idle_ms": medians}


def run_probe(precision_bits: int, per_ms: int, kind: str = "--probe") -> dict[str, Any]:
    return report.run_probe(SCRIPT, [precision_bits, per_ms], timeout=600, measuring=False, flag=kind)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--probe"]:
        print(json.dumps(probe(*json.loads(argv[1]))))
        return 0
    if argv[:1] == ["--cold"]:
        print(json.dumps(cold_probe(json.loads(argv[1])[0])))
        return 0
    facts = report.machine()
    rows = []
    for per_ms in PER_MS:
        for precision_bits in PRECISIONS:
            rows.append(run_probe(precision_bits, per_ms))
            print(rows[-1], file=sys.stderr)
    cold = [run_probe(precision_bits, 1, "--cold") for precision_bits in (0, 8)]
    for row in cold:
        print(row, file=sys.stderr)
    report.save_json(
        "timer_cost",
        {"machine": facts, "span_ms": SPAN_MS, "window_ms": WINDOW_MS, "rows": rows, "cold_pop": cold},
    )
    reference = {r["ids_per_ms"]: r["cpu_us_per_id"] for r in rows if r["precision_bits"] == 8}

    def lateness(r: dict[str, float]) -> str:
        return f"{r['p50']:.1f} / {r['p99']:.1f} / {r['max']:.1f}"

    table = report.table(
        [
            "ids due per ms",
            "k",
            "buckets pending",
            "ids forwarded",
            "forwards",
            "CPU ms per s",
            "CPU µs per id",
            "÷ k = 8",
            "CPU µs per forward",
            "late vs bucket ms p50 / p99 / max",
            "late vs due ms p50 / p99 / max",
        ],
        [
            [
                r["ids_per_ms"],
                r["precision_bits"],
                f"{r['buckets_at_start']:,}",
                f"{r['forwarded_ids']:,}",
                f"{r['forwards']:,}",
                f"{r['cpu_ms_per_s']:.1f}",
                f"{r['cpu_us_per_id']:.2f}",
                f"{r['cpu_us_per_id'] / reference[r['ids_per_ms']]:.2f}× (≤ 2)",
                f"{r['cpu_us_per_forward']:.0f}",
                lateness(r["lateness_vs_bucket_ms"]),
                lateness(r["lateness_vs_due_ms"]),
            ]
            for r in rows
        ],
    )
    cold_table = report.table(
        ["k", "buckets per forward", *(f"after {idle} ms idle" for idle in IDLE_MS)],
        [
            [
                c["precision_bits"],
                c["ms_per_forward"] >> c["precision_bits"],
                *(f"{c['pop_us_after_idle_ms'][str(idle)]:.0f} µs" for idle in IDLE_MS),
            ]
            for c in cold
        ],
    )
    text = "\n\n".join(
        [
            "## The redelivery timer: CPU and lateness against precision",
            "`python bench/timer_cost.py` (`make bench-timer`) — a real `NackTracker` (own timer thread, "
            "real clock, arrival filter; forwards recorded instead of sent) with nacks due 1 or 10 per ms "
            f"over {SPAN_MS / 1000:.0f} s (100,000 one-ms buckets at k = 0); process CPU and the forwards "
            f"of a {WINDOW_MS / 1000:.0f}-s window, each row in a fresh process. "
            "Lateness = forward time + the 102-ms native lead − the id's bucket time (the timer's own "
            "lateness; at k = 0 a bucket between two native-grid slots waits for the next, up to 68 ms) or "
            "its due time (floor rounding forwards up to 2^k − 1 ms early). Goal (issue 10): k = 0 ≤ 2× "
            "k = 8's CPU per id; before: 1,000 ms CPU per s and 4.3M callbacks for 100k buckets at k = 0. "
            "A forward costs about the same at every k (a timer wake-up and one pop of the due buckets); "
            "at k = 0 one goes every 68 ms (the native grid) against every 256 ms at k = 8, so with 1 id "
            "per ms that fixed cost is shared by 3.8× fewer ids.",
            report.machine_line(facts),
            table,
            "Where a forward's CPU goes: one forward's pop (`pop_due_by_bucket`, the 1-id-per-ms case) "
            "called back to back (0 ms idle) or after the thread slept as long as the timer does between "
            "forwards (thread CPU, median of 60). The cost after a sleep is mostly the caches gone cold, "
            "whatever the work: it grows with the idle time and levels off by 68 ms, so k = 0 (68-ms "
            "gaps) pays it as fully as k = 8 (256-ms gaps), and the rest of a forward (the wake-up, re-"
            "arming the timer, the arrival filter, the forward hook) pays it too. With a fixed cost F per"
            " forward and c per id, k = 0 is within 2× of k = 8 per id only if F ≤ ~148 c (1 id per ms: "
            "68.7 ids per forward against 256).",
            cold_table,
        ]
    )
    report.write_section("timer-cost", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
