"""Benchmark: memory per pending nack, everything the wrapper keeps included, over a grid of workloads.

Issue 23's grid: topics {1, 100, 1,000} × batching {none, batches of 10, batches of 100} × nack share
{1 %, 10 %, 100 %} × delay {10 s, 60 s, 1 h; fixed, or uniform from it to 60 s more} × k {0, 8, 12} —
486 points. Each point is a :class:`pulsar_nack.profile.Workload` whose messages arrive within the
shortest delay, so that at the end nothing has come due and at least ``--pending`` nacks (100,000 by
default) are pending (see :meth:`Point.workload`), through a real
:class:`~pulsar_nack.tracker.NackTracker` — its index, timer wheel and arrival filter — exactly as
``pulsar-nack profile`` drives it (every arrival passes the filter, the application acks or nacks, the
timer compacts buckets left behind), in a fresh process with
``PYTHONMALLOC=malloc`` and glibc's in-use bytes (tcache off): *measured* = the heap the process retains
after the run minus just after the tracker was built, divided by the pending nacks — an upper bound of the
marginal cost (the tracker's fixed cost is before the baseline). The process first runs the same workload
once through a tracker it then drops (the probe's ``malloc-warm`` mode): a process's first tracker leaves
heap behind that later ones do not add to (~330 KB at 100 topics, batches of 10, 1 h: 3 B a pending nack
there), so the second run measures what a tracker keeps; the first run's figure is kept as *cold*.
*reported* = ``nack_stats().memory_bytes`` of the same tracker. The native client's bytes per pending
nack come from ``bench/nack_lateness.py``'s measurement on a real broker
(``bench/results/nack_lateness.json``).

On a real broker (pulsar-lite, embedded; ``--broker apache``: Apache Pulsar standalone), a sample of the
grid runs through :func:`pulsar_nack.profile_broker.profile_broker`: the workload is produced, then
consumed in fresh processes by the wrapper and by the official consumer with its native tracker, each on
its own subscription, paced at the workload's rate; the consumer process's heap growth
(``PYTHONMALLOC=malloc``) divided by its pending nacks, for both in the same run. ``--no-broker`` skips
it.

The whole grid runs for hours (a 1 % point is 10 million messages), so by default a fixed sample of it
runs — the fleet shape of issue 23 (100 topics, batches of 10, 10 % nacked, 1 h, k = 8), points drawn
with a fixed seed, and the sparsest shapes (:data:`SPARSE`: 1,000 topics, 1 % nacked, 10 s, k = 0, each
batching), and two that forward during the run (:data:`FORWARDING`) — and ``--all`` runs all of it.
Goals (issue 23): ≤ 16 B per pending nack at every point,
``nack_stats`` within ±10 %.

    python bench/nack_memory.py [--all | --sample N] [--pending N] [--points SUBSTRING]

Writes ``bench/results/nack_memory.json`` and the ``nack-memory`` section of docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from typing import Any

import report

from pulsar_nack.native import NativeTiming
from pulsar_nack.profile import STEP_MS, Delay, Workload, run_probe

GOAL_BYTES = 16.0
GOAL_REPORT_ERROR = 0.10
GOAL_FIXED_BYTES = 16 * 1024  # what a tracker keeps whatever is pending (issue 23)
TOPICS = (1, 100, 1_000)
BATCHES = (1, 10, 100)
SHARES = (0.01, 0.10, 1.0)
DELAYS_S = (10, 60, 3_600)
SPREADS = ("fixed", "uniform")
PRECISION_BITS = (0, 8, 12)
SPREAD_S = 60  # a uniform delay runs from the delay to this much more
FLEET = (100, 10, 0.10, 3_600, "fixed", 8)  # issue 23's fleet-shaped workload
# The sparsest shapes — 1,000 topics, 1 % nacked, short delays, k = 0 — always run: there the per-ledger
# and per-forward state is spread over the fewest nacks, and a random sample of the grid may miss them.
SPARSE = (
    (1_000, 1, 0.01, 10, "fixed", 0),
    (1_000, 10, 0.01, 10, "fixed", 0),
    (1_000, 100, 0.01, 10, "fixed", 0),
)
# Shapes whose run forwards (floor rounding fires the first bucket up to 2^k ms early: at k = 12 over
# 10 s, a fifth of the nacks) — what the filter keeps of forwarded and redelivered messages counts too;
# the nothing-due-yet points above miss it.
FORWARDING = ((1_000, 1, 1.0, 10, "fixed", 12), (1_000, 10, 0.1, 10, "fixed", 12))
# The broker sample: delays short enough to consume in minutes (the consumer is paced at the rate).
BROKER_POINTS = (
    (100, 10, 0.10, 60, "fixed", 8),
    (1, 1, 1.0, 10, "fixed", 8),
    (100, 1, 0.10, 60, "uniform", 8),
)
BROKER_HEADERS = [
    "topics",
    "batch",
    "nacked",
    "delay",
    "k",
    "pending",
    "pulsar-nack: growth B/nack",
    "pulsar-nack: released B/nack",
    "reported",
    "native: growth B/nack",
    "native growth ÷ ours released",
    "pulsar-nack: fixed B (kept once dropped)",
]
HEADERS = [
    "topics",
    "batch",
    "nacked",
    "delay",
    "k",
    "pending",
    "buckets",
    "measured B/nack",
    "first run",
    "reported",
    "native B/nack",
    "native ÷ ours",
]


@dataclass(frozen=True)
class Point:
    topics: int
    batch: int
    share: float
    delay_s: int
    spread: str
    k: int

    @property
    def name(self) -> str:
        delay = f"{self.delay_s}s" if self.spread == "fixed" else f"{self.delay_s}s+U{SPREAD_S}s"
        return f"t{self.topics}-b{self.batch}-n{self.share:g}-d{delay}-k{self.k}"

    def delay_text(self) -> str:
        base = f"{self.delay_s // 3600} h" if self.delay_s >= 3600 else f"{self.delay_s} s"
        return base if self.spread == "fixed" else f"{base} + U(0, {SPREAD_S} s)"

    def fields(self) -> dict[str, Any]:
        """The point as a result row's fields (:meth:`of` reads them back)."""
        return {"point": self.name, **asdict(self)}

    @classmethod
    def of(cls, row: dict[str, Any]) -> Point:
        return cls(row["topics"], row["batch"], row["share"], row["delay_s"], row["spread"], row["k"])

    def cells(self) -> list[str]:
        """The point's columns of a table (topics, batch, nacked, delay, k)."""
        batch = "–" if self.batch == 1 else str(self.batch)
        return [f"{self.topics:,}", batch, f"{self.share:.0%}", self.delay_text(), str(self.k)]

    def workload(self, pending: int) -> Workload:
        """At least ``pending`` nacks, all still pending at the end: the messages arrive over the shortest
        delay less ``2**k`` ms, a native latency and a timer step (floor rounding files a nack up to
        ``2**k - 1`` ms early, and a flush takes what is due one latency ahead: over the whole delay, the
        first 17 % of the nacks at 10 s, k = 12 came due by the end). The nack share is drawn at random:
        4 standard deviations more are asked for."""
        low = self.delay_s * 1_000.0
        delay = (
            Delay("fixed", low, low)
            if self.spread == "fixed"
            else Delay("uniform", low, low + SPREAD_S * 1e3)
        )
        messages = math.ceil((pending + 4.0 * math.sqrt(pending)) / self.share)
        duration_s = (low - 2**self.k - NativeTiming().latency_ms - STEP_MS) / 1_000.0
        return Workload(
            rate=messages / duration_s,
            delay=delay,
            duration_s=duration_s,
            topics=self.topics,
            batch_size=self.batch,
            nack_share=self.share,
            precision_bits=self.k,
        )


def grid() -> list[Point]:
    return [
        Point(t, b, n, d, s, k)
        for t in TOPICS
        for b in BATCHES
        for n in SHARES
        for d in DELAYS_S
        for s in SPREADS
        for k in PRECISION_BITS
    ]


def choose(points: list[Point], sample: int | None, pattern: str | None) -> list[Point]:
    """The fleet shape first, then ``sample`` more drawn with a fixed seed, then the sparse and forwarding
    shapes not drawn (all of the grid for None)."""
    fleet = Point(*FLEET)
    if pattern:  # (comma-separated substrings: a point matching any)
        return [p for p in points if any(part in p.name for part in pattern.split(","))]
    if sample is None:
        return points
    rest = [p for p in points if p != fleet]
    drawn = [fleet, *random.Random(23).sample(rest, min(sample, len(rest)))]
    always = [Point(*shape) for shape in (*SPARSE, *FORWARDING)]
    return drawn + [p for p in always if p not in drawn]


def native_bytes_per_nack() -> tuple[float | None, str]:
    """The native client's bytes per pending nack as bench/nack_lateness.py measured them (worst broker)."""
    path = report.RESULTS / "nack_lateness.json"
    if not path.exists():
        return None, "no bench/results/nack_lateness.json: run bench/nack_lateness.py"
    data = json.loads(path.read_text())
    value = max(b["memory"]["native"]["bytes_per_nack"] for b in data["brokers"].values())
    return value, f"bench/nack_lateness.py ({data['machine']['date']}, commit {data['machine']['commit']})"


def measure(point: Point, pending: int) -> dict[str, Any]:
    started = time.perf_counter()
    workload = point.workload(pending)
    result = run_probe("malloc-warm", workload, lambda _done: None)
    per_nack = result["bytes"] / result["pending"]
    return {
        **point.fields(),
        "rate": workload.rate,  # (the workload measured: the estimate's fit reads it)
        "duration_s": workload.duration_s,
        "pending": result["pending"],
        "buckets": result["buckets"],
        "measured_bytes": result["bytes"],
        "reported_bytes": result["reported"],
        "measured_per_nack": per_nack,
        "cold_bytes": result["cold_bytes"],
        "cold_per_nack": result["cold_bytes"] / result["pending"],
        "reported_error": result["reported"] / result["bytes"] - 1 if result["bytes"] > 0 else 0.0,
        "seconds": time.perf_counter() - started,
    }


def measure_on_broker(point: Point, pending: int, service_url: str) -> dict[str, Any]:
    """The wrapper and the official consumer on the same produced messages, in fresh processes."""
    from pulsar_nack.profile_broker import profile_broker

    started = time.perf_counter()
    # Produced and consumed in half the delay: no nack falls due before the run ends (copies then coming
    # into the receiver queues move the heap between the reads).
    workload = point.workload(pending)
    workload = replace(workload, rate=2 * workload.rate, duration_s=workload.duration_s / 2)
    result = profile_broker(workload, service_url, java=False, timeout_s=900.0)
    native = result.native or {}
    return {
        **point.fields(),
        "pending": result.pending,
        "wrapper_bytes": result.memory["malloc"],
        "wrapper_per_nack": result.per_pending("malloc"),
        "released_bytes": result.memory["released"],
        "released_per_nack": result.per_pending("released"),
        "reported_bytes": result.memory["reported"],
        "dropped_bytes": result.memory["dropped"],
        "kept_bytes": result.memory["kept"],
        "native_pending": native.get("pending"),
        "native_bytes": native.get("bytes"),
        "native_per_nack": native.get("bytes_per_nack"),
        "broker": result.broker,
        "seconds": time.perf_counter() - started,
    }


_BROKER_NAMES = {"lite": "pulsar-lite", "apache": "Apache Pulsar standalone"}
#: Why a sample ran on Apache Pulsar: said beside its table.
_APACHE_WHY = (
    "On Apache Pulsar, because pulsar-lite stops dispatching to subscriptions read at the same time at 100 "
    "topics not batched (each stalled at 20,000-48,000 of 50,100 messages with permits flowed), and once "
    "with one read at a time (the third point, in its native probe)."
)


def _broker_row(result: dict[str, Any]) -> list[str]:
    point = Point.of(result)
    if "error" in result:
        return [*point.cells(), "failed", "–", "–", "–", "–", result["error"].splitlines()[-1][:120], "–"]
    grown, native = result["wrapper_per_nack"], result["native_per_nack"]
    released, kept = result.get("released_per_nack"), result.get("kept_bytes")
    reported = result["reported_bytes"] / result["pending"] if result["pending"] else 0.0
    return [
        *point.cells(),
        f"{result['pending']:,}",
        f"{grown:.1f}",
        "–" if released is None else f"{released:.1f} {'✓' if released <= GOAL_BYTES else '✗'}",
        f"{reported:.1f}",
        "–" if native is None else f"{native:.1f}",
        "–" if not native or not released or released <= 0 else f"{native / released:.1f}×",
        "–" if kept is None else f"{kept:,} {'✓' if kept <= GOAL_FIXED_BYTES else '✗'}",
    ]


def _row(result: dict[str, Any], native: float | None) -> list[str]:
    ours, error = result["measured_per_nack"], result["reported_error"]
    point = Point.of(result)
    return [
        *point.cells(),
        f"{result['pending']:,}",
        f"{result['buckets']:,}",
        f"{ours:.1f} {'✓' if ours <= GOAL_BYTES else '✗'}",
        f"{result['cold_per_nack']:.1f}" if "cold_per_nack" in result else "–",
        f"{error:+.0%} {'✓' if abs(error) <= GOAL_REPORT_ERROR else '✗'}",
        "–" if native is None else f"{native:.0f}",
        "–" if native is None or ours <= 0 else f"{native / ours:.2f}×",
    ]


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Worst, median and best measured bytes per pending nack of a run, with their points."""
    ordered = sorted(results, key=lambda r: r["measured_per_nack"])
    median = statistics.median(r["measured_per_nack"] for r in ordered)
    return {
        "points": len(ordered),
        "best": ordered[0],
        "median_per_nack": median,
        "worst": ordered[-1],
        "within_goal": sum(r["measured_per_nack"] <= GOAL_BYTES for r in ordered),
        "reported_within": sum(abs(r["reported_error"]) <= GOAL_REPORT_ERROR for r in ordered),
    }


def _measured(points: list[Point], pending: int, jobs: int) -> Iterator[dict[str, Any]]:
    """Each point's result as it is measured, ``jobs`` at once (each point is its own process already:
    the threads only wait for them)."""
    if jobs == 1:
        yield from (measure(point, pending) for point in points)
        return
    with ThreadPoolExecutor(jobs) as pool:
        running = [pool.submit(measure, point, pending) for point in points]
        yield from (future.result() for future in as_completed(running))


def _save_grid(
    name: str,
    facts: dict[str, Any],
    pending: int,
    native: float | None,
    native_source: str,
    results: list[dict[str, Any]],
) -> None:
    """A resumed run's file: the points measured so far (no broker sample)."""
    report.save_json(
        name,
        {
            "machine": facts,
            "pending_target": pending,
            "grid_points": len(grid()),
            "native_bytes_per_nack": native,
            "native_source": native_source,
            "summary": summary(results),
            "results": results,
            "broker": [],
        },
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true", help="every point of the grid (hours)")
    which.add_argument(
        "--sample", type=int, default=12, help="points drawn besides the fleet and sparse shapes (default 12)"
    )
    which.add_argument(
        "--points",
        help="only points whose name contains this (or one of these, comma-separated), e.g. t100-b10",
    )
    parser.add_argument(
        "--pending", type=int, default=100_000, help="pending nacks per point (default 100,000)"
    )
    parser.add_argument("--no-broker", action="store_true", help="skip the sample on a real broker")
    parser.add_argument(
        "--broker",
        choices=("lite", "apache"),
        default="lite",
        help="the broker of the sample: pulsar-lite (default) or Apache Pulsar standalone",
    )
    parser.add_argument(
        "--broker-pending", type=int, default=20_000, help="pending nacks per broker point (default 20,000)"
    )
    parser.add_argument(
        "--render", action="store_true", help="rewrite the docs section from the results file"
    )
    parser.add_argument(
        "--extra",
        metavar="NAME",
        help="a run of points besides the sample: results in bench/results/nack_memory_NAME.json and the "
        "docs section nack-memory-NAME (the sample's file and section untouched; no broker sample)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="with --extra: keep the points its results file already holds, measure the rest (in a shuffled "
        "order, so that a run stopped midway is a random sample of what it was given) and save after each "
        "point — the whole grid takes longer than a session",
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="points measured at once, each in its own process (default 1)"
    )
    parser.add_argument(
        "--broker-only",
        action="store_true",
        help="run only the broker sample; the grid's results are kept from the last run",
    )
    args = parser.parse_args(argv)
    name = "nack_memory" if args.extra is None else f"nack_memory_{args.extra}"
    section = name.replace("_", "-")
    if args.extra is not None:
        args.no_broker = True
    if args.broker_only and args.no_broker:
        parser.error("--broker-only: not with --no-broker or --extra")
    if args.render:
        data = json.loads((report.RESULTS / f"{name}.json").read_text())
        report.write_section(section, render(data, args.extra))
        return 0
    if args.pending < 1_000:
        parser.error(f"--pending: at least 1,000, got {args.pending}")
    if args.sample is not None and args.sample < 0:
        parser.error(f"--sample: at least 0, got {args.sample}")
    if args.resume and args.extra is None:
        parser.error("--resume: only with --extra NAME (the sample's file is rewritten whole)")
    if args.jobs < 1:
        parser.error(f"--jobs: at least 1, got {args.jobs}")
    facts = report.machine()
    points = [] if args.broker_only else choose(grid(), None if args.all else args.sample, args.points)
    if not points and not args.broker_only:
        parser.error(f"--points: no point's name contains {args.points!r}")
    native, native_source = native_bytes_per_nack()
    previous = report.RESULTS / f"{name}.json"
    results: list[dict[str, Any]] = []
    if args.resume and previous.exists():
        old = json.loads(previous.read_text())
        if old["pending_target"] != args.pending:
            parser.error(f"--resume: {previous.name} was run at --pending {old['pending_target']:,}")
        wanted = {p.name for p in points}
        # (a point measured with fewer nacks pending than asked for, or before rows named their workload,
        # is measured again)
        results = [
            r
            for r in old["results"]
            if r["point"] in wanted and r["pending"] >= args.pending and "duration_s" in r
        ]
        done = {r["point"] for r in results}
        points = [p for p in points if p.name not in done]
        print(f"resuming: {len(done)} points kept, {len(points)} to measure", flush=True)
    if args.resume:  # a random order, but the larger nack shares first (fewer messages: a 1 % point
        # takes ~170 s, a 100 % one ~8 s), so that a run stopped early has measured the most points
        random.Random(486).shuffle(points)
        points.sort(key=lambda point: -point.share)
    for number, result in enumerate(_measured(points, args.pending, args.jobs), 1):
        results.append({**result, "commit": facts["commit"]})
        print(
            f"[{number}/{len(points)}] {result['point']}: {result['measured_per_nack']:.1f} B/nack "
            f"(reported {result['reported_error']:+.0%}, {result['seconds']:.0f} s)",
            flush=True,
        )
        if args.resume:  # what a stopped run measured is kept
            _save_grid(name, facts, args.pending, native, native_source, results)
    if args.broker_only:  # the grid as the last run measured it
        old = json.loads(previous.read_text())
        facts, results, args.pending = old["machine"], old["results"], old["pending_target"]
    totals = summary(results)
    on_broker: list[dict[str, Any]] = []
    if not args.no_broker:
        from harness.standalone import start_broker

        with start_broker(args.broker) as broker:
            for point in (Point(*shape) for shape in BROKER_POINTS):
                try:
                    on_broker.append(measure_on_broker(point, args.broker_pending, broker.service_url))
                except RuntimeError as error:  # recorded, and the rest of the sample runs
                    on_broker.append({**point.fields(), "error": str(error)[-400:]})
                    print(f"[broker] {point.name}: FAILED {str(error)[-200:]}", flush=True)
                    continue
                print(
                    f"[broker] {point.name}: pulsar-nack growth {on_broker[-1]['wrapper_per_nack']:.1f}, "
                    f"released {on_broker[-1]['released_per_nack']:.1f} B/nack, "
                    f"native {on_broker[-1]['native_per_nack']:.1f} B/nack",
                    flush=True,
                )
    broker_machine = report.machine() if args.broker_only else facts
    broker_pending, broker_kind = args.broker_pending, args.broker
    if args.no_broker and previous.exists():  # keep the last broker sample, with its own stamp
        old = json.loads(previous.read_text())
        on_broker = old.get("broker", [])
        broker_machine = old.get("broker_machine", old["machine"])
        broker_pending = old.get("broker_pending_target", broker_pending)
        broker_kind = old.get("broker_kind", "lite")
    data = {
        "machine": facts,
        "broker_machine": broker_machine,
        "pending_target": args.pending,
        "broker_pending_target": broker_pending,
        "broker_kind": broker_kind,
        "grid_points": len(grid()),
        "native_bytes_per_nack": native,
        "native_source": native_source,
        "summary": totals,
        "results": results,
        "broker": on_broker,
    }
    report.save_json(name, data)
    report.write_section(section, render(data, args.extra))
    return 0


MAX_TABLE_ROWS = 40  # a run of more points is shown by dimension and its worst points


def _grid_tables(results: list[dict[str, Any]], native: float | None) -> list[str]:
    """Many points at a glance: for each dimension of the grid, each value's points, worst, median and
    best bytes per pending nack and worst report error; then the worst points whole."""
    labels: list[Callable[[Point], str]] = [
        lambda p: f"{p.topics:,} topic{'s' if p.topics > 1 else ''}",
        lambda p: "not batched" if p.batch == 1 else f"batches of {p.batch}",
        lambda p: f"{p.share:.0%} nacked",
        Point.delay_text,
        lambda p: f"k = {p.k}",
    ]
    rows = []
    for label in labels:
        groups: dict[str, list[dict[str, Any]]] = {}
        for result in results:
            groups.setdefault(label(Point.of(result)), []).append(result)
        for value, group in groups.items():
            per_nack = sorted(r["measured_per_nack"] for r in group)
            error = max(abs(r["reported_error"]) for r in group)
            rows.append(
                [
                    value,
                    str(len(group)),
                    f"{per_nack[-1]:.1f} {'✓' if per_nack[-1] <= GOAL_BYTES else '✗'}",
                    f"{statistics.median(per_nack):.1f}",
                    f"{per_nack[0]:.1f}",
                    f"{error:.0%} {'✓' if error <= GOAL_REPORT_ERROR else '✗'}",
                ]
            )
    worst = sorted(results, key=lambda r: r["measured_per_nack"], reverse=True)[:15]
    return [
        report.table(["points with", "points", "worst B/nack", "median", "best", "worst report error"], rows),
        "The 15 points that cost the most:",
        report.table(HEADERS, [_row(r, native) for r in worst]),
    ]


def _commits_line(results: list[dict[str, Any]]) -> str:
    """Which commits a resumed run's points were measured at (empty for a run in one go)."""
    counts: dict[str, int] = {}
    for result in results:
        if "commit" in result:
            counts[result["commit"]] = counts.get(result["commit"], 0) + 1
    if len(counts) < 2:
        return ""
    return "Points by the commit measured: " + ", ".join(f"{n} at {c}" for c, n in counts.items()) + "."


def render(data: dict[str, Any], extra: str | None = None) -> str:
    """The docs/performance.md section of a results file (``extra``: the name of a run besides the
    sample, under its own heading)."""
    results, totals, native = data["results"], data["summary"], data["native_bytes_per_nack"]
    best, worst = totals["best"], totals["worst"]
    text = "\n\n".join(
        [
            "## Memory per pending nack, everything the wrapper keeps, over a grid of workloads"
            if extra is None
            else (
                f"### The whole grid, measured across sessions: `--extra {extra} --all --resume`"
                if len(results) > MAX_TABLE_ROWS
                else f"### More points of the grid: `--extra {extra}`"
            ),
            "`python bench/nack_memory.py` — issue 23's grid (topics × batching × nack share × delay × k, "
            f"{data['grid_points']} points; this run: {len(results)} of them, at least "
            f"{data['pending_target']:,} pending nacks asked of each, fewest measured "
            f"{min(r['pending'] for r in results):,}). Each point runs a real `NackTracker` (index, timer "
            "wheel, arrival filter) as `pulsar-nack profile` drives it, in a fresh process: measured = heap "
            "retained from outside "
            "(`PYTHONMALLOC=malloc`, glibc in-use bytes, CRoaring included) after the run minus after the "
            "tracker was built, per pending nack, in the process's second run of the workload (its first "
            "tracker, dropped before, leaves process heap that later ones do not add to: *first run* is "
            "that tracker's figure); reported = `nack_stats().memory_bytes`, its error "
            f"against the measurement. Native: {data['native_source']}. Goals: ≤ {GOAL_BYTES:g} B per "
            f"pending nack, report within ±{GOAL_REPORT_ERROR:.0%}.",
            report.machine_line(data["machine"]),
            *[line for line in (_commits_line(results),) if line],
            f"Within the goal: {totals['within_goal']} of {totals['points']} points; report within "
            f"±{GOAL_REPORT_ERROR:.0%}: {totals['reported_within']}. "
            f"Worst {worst['measured_per_nack']:.1f} B ({worst['point']}), "
            f"median {totals['median_per_nack']:.1f} B, best "
            f"{best['measured_per_nack']:.1f} B ({best['point']}).",
            *(
                [report.table(HEADERS, [_row(r, native) for r in results])]
                if len(results) <= MAX_TABLE_ROWS
                else _grid_tables(results, native)
            ),
        ]
    )
    if data["broker"]:
        broker = data.get("broker_machine", data["machine"])
        text += "\n\n" + "\n\n".join(
            [
                "### On a real broker, beside the official consumer",
                f"The same workloads produced to {_BROKER_NAMES[data.get('broker_kind', 'lite')]} and "
                "consumed by the wrapper and by the official "
                "consumer (its native tracker, one delay: the workload's mean) in fresh processes, each on "
                "its own subscription, paced to take half the delay, so that no nack falls due before the "
                "end (`pulsar_nack.profile_broker`, both in one run; "
                f"{data['broker_pending_target']:,} pending nacks a point; "
                f"measured {broker['date']} at commit {broker['commit']}). *Growth*: the consumer "
                "process's heap (`PYTHONMALLOC=malloc`, glibc in-use bytes) from a baseline read after "
                "subscribing and consuming a warm-up, with the receiver queues empty, to the end of the run, "
                "queues empty again, per pending nack — the client library's own state included for both "
                "(for batches, what it keeps per batch with an unsettled message). *Released*: what the "
                "wrapper's heap gives back when its tracker then drops its pending nacks (index and arrival "
                "filter), the goal's measure: the client library's churn moves the growth by a few hundred "
                "KB either way even at one topic (tens of bytes a nack here), not this. *Reported*: "
                "`nack_stats().memory_bytes` per pending nack. *Fixed*: what the tracker's own walk reads "
                f"once it dropped them (goal ≤ {GOAL_FIXED_BYTES:,} B): timer, lateness estimator, empty "
                "tables." + (" " + _APACHE_WHY if data.get("broker_kind") == "apache" else ""),
                report.table(BROKER_HEADERS, [_broker_row(r) for r in data["broker"]]),
            ]
        )
    return text


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
