"""Benchmark: the broker's delayed-delivery trackers as measured models, beside the figures of the Pulsar
3.0 delayed-message article (“New Delayed Message In Pulsar 3.0”).

Runs the tracker sweep (:func:`delayed_tracker_sweep.run_trackers`) on Spark: the article's workload
(1,000 messages/s, delays of 48 h to 48 h 10 min, 50,000 entries per ledger) fed to the in-memory
triple-long heap (doubling with no limit; by segments under a 1 GiB direct-memory limit), the TimeBucket
variant and PIP-195's bucket tracker on our segment store, at 1M to 100M messages; each point measures
the tracker's memory (process heap) and a recovery after a restart.

    python bench/broker_trackers.py                  # grid seed004, up to 100M messages (≈20 min, 2 cores)
    python bench/broker_trackers.py --grid small     # seconds
    python bench/broker_trackers.py --render         # rewrite the docs section from the results file

Writes ``bench/results/broker_trackers.json``, ``bench/results/broker_trackers.png`` and the
``broker-trackers`` section of docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from typing import Any

import report
from delayed_tracker_sweep import (
    ARTICLE,
    article_comparison,
    load_tracker_grid,
    plot_trackers,
    run_trackers,
    tracker_findings,
    tracker_table,
)
from delayed_trackers import ARTICLE_FIGURES

from pulsar_nack.sweep.grid import GridError

NAME = "broker_trackers"
PLOT = report.RESULTS / f"{NAME}.png"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--grid", default="seed004", help="tracker grid (default: %(default)s)")
    parser.add_argument("--master", default="local[2]", help="Spark master (default: %(default)s)")
    parser.add_argument("--render", action="store_true", help="only rewrite the docs from the results file")
    parser.add_argument(
        "--read-cost-us",
        type=float,
        default=ARTICLE_FIGURES.recovery_us_per_message,
        help="modelled cost of reading one replayed message, shown beside the measured recoveries "
        "(default: the seed's in-memory recovery per message, 6,120 s / 35M = %(default).1f)",
    )
    args = parser.parse_args(argv)
    if not args.read_cost_us >= 0:
        parser.error(f"--read-cost-us must be >= 0, got {args.read_cost_us}")
    if args.render:
        results = json.loads((report.RESULTS / f"{NAME}.json").read_text())
    else:
        try:
            points = load_tracker_grid(args.grid)
        except GridError as error:
            parser.error(f"--grid: {error}")
        from pulsar_nack.memory import MEASURING_ENV

        os.environ.update(MEASURING_ENV)  # inherited by Spark's Python workers: no glibc tcache
        rows, info = run_trackers(args.grid, points, master=args.master)
        results = {
            "machine": report.machine(),
            "grid": args.grid,
            "run": asdict(info),
            "seed004": asdict(ARTICLE_FIGURES),
            "rows": rows,
        }
    results["read_cost_us"] = args.read_cost_us  # a modelled figure: stored, and re-chosen by --render
    report.save_json(NAME, results)
    figure = plot_trackers(results["rows"], read_cost_us=args.read_cost_us)
    if figure is not None:
        report.RESULTS.mkdir(parents=True, exist_ok=True)
        figure.savefig(PLOT, dpi=110)
    markdown = render(results)
    report.write_section("broker-trackers", markdown)
    print(markdown)
    return 0


def render(results: dict[str, Any]) -> str:
    rows, run = results["rows"], results["run"]
    headers, cells = tracker_table(rows)
    read_cost_us = results["read_cost_us"]
    comparison = article_comparison(rows, read_cost_us=read_cost_us)
    parts = [
        f"## The broker's delayed-delivery trackers, measured (the Pulsar 3.0 article, {ARTICLE})",
        "",
        f"`python bench/broker_trackers.py` — the tracker sweep, grid `{results['grid']}`: {run['points']} "
        f"points, {run['ids']:,} delayed messages in all, on Spark `{run['master']}` "
        f"({run['sweep_s']:.0f} s). The article's workload (`pulsar-perf produce -dr 172800,173400 -r 1000`: "
        "1,000 messages/s, delays of 48 h to 48 h 10 min; 50,000 entries per ledger) fed in publish order to "
        "three models (`bench/delayed_trackers.py`): the in-memory `TripleLongPriorityQueue` (24 B per "
        "index; buffers doubling with no limit, or growing by 1M-index segments under a 1 GiB direct-memory "
        "limit — the limit is ours, the article does not give its broker's), the TimeBucket variant of "
        "apache/pulsar PR #23611 (tick 1,000 ms → 2^9 ms buckets; `strict` rounds up) and PIP-195's bucket "
        "tracker on our `SegmentStore` with the broker's defaults (seal at a ledger boundary after 50,000 "
        "indexes, segments of 5,000 indexes / 300 s, no merging), segment files fsync-ed into a local "
        "directory.",
        "",
        "*Memory* is measured: the process heap (pymalloc blocks + glibc in-use chunks, numpy buffers and "
        "CRoaring included) around the tracker, no workload array alive at either reading. *Recovery* is "
        "measured: for the in-memory models the rebuild of the index from every message of the backlog "
        "(regenerated in memory: reading it from BookKeeper is **not** measured, the sweep's `read_cost_us` "
        "is 0), for the bucket tracker the restore of every segment file plus the replay of the open "
        "bucket's ledger. The restart happens when the producer stops; with 48 h delays nothing is due, so "
        "every held message must come back, and does (the sweep fails otherwise).",
        "",
        "Reading the replayed messages is what the article's in-memory recovery mostly is, so its table "
        f"and the plot (dotted) add a **modelled** read of {read_cost_us:.0f} µs per replayed message "
        "(`--read-cost-us`; by default the article's own in-memory recovery per message, 6,120 s / 35M). The "
        "in-memory rows then match the article by construction; the bucket tracker's row is the prediction: "
        "it replays only its open bucket. Timings are Python's, on 2 cores shared with other work during "
        "the run (the TimeBucket rows add ids one by one in Python); memory and counts are unaffected.",
        "",
        report.machine_line(results["machine"]),
        "",
        f"![memory and recovery against delayed messages](../bench/results/{PLOT.name})",
        "",
    ]
    if comparison:
        parts += [
            "The article's figures (quoted) beside ours (measured here):",
            "",
            report.table(["figure", "Pulsar 3.0 article", "ours", "our model"], comparison),
            "",
        ]
    parts += ["What the rows show:", "", *[f"- {note}" for note in tracker_findings(rows)], ""]
    parts += [report.table(headers, cells)]
    return "\n".join(parts)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
