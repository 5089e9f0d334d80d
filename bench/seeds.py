"""Benchmark: every figure the published sources claim, with ours and the Java structure measured beside
it.

Sources: the TimeBucket blog (PIP-393's analysis, "原理分析": the memory of delayed messages), PIP-393
(the nack tracker's redesign), PIP-195 (the bucket based delayed-delivery tracker) with the figures of
"New Delayed Message In Pulsar 3.0" (the Pulsar 3.0 delayed-message article). For each figure: the
source's value, pulsar-nack's measured on the same workload, the Java PIP-393 structure measured here
(``bench/java``, a fresh JVM), the ratio, and one line on the difference — the line is derived from the
figures, not typed.

Ours is measured in a fresh interpreter per (case, measure), the ids generated before the baseline
(``pulsar_nack.sweep.workloads``, the blog's stream, which the Java module replays exactly):

* ``malloc`` — ``PYTHONMALLOC=malloc`` + glibc ``mallinfo2`` (tcache off): every byte from one allocator;
* ``tracemalloc`` — Python allocations traced (blind to CRoaring's C heap);
* ``rss`` — resident set delta, default allocator;
* ``heap`` — the benches' usual figure: pymalloc's allocated blocks + glibc's in-use chunks.

The index is built with ``add_many`` and then ``compact()``-ed (what the tracker's timer does ~1 s after
nacks move on from a bucket; Java's equivalent is ``runOptimize``); "before compact" is also recorded.

    python bench/seeds.py [--n 10000000] [--formula-n 1000000] [--no-java] [--from-results]

A full run re-measures every 10M-id row (≈ 9 min on 2 cores). ``--from-results`` (alias ``--reuse``)
measures nothing: it keeps the measured rows of ``bench/results/seeds.json`` and redoes the estimates,
the PIP-195 section (from ``bench/results/broker_trackers.json``, the tracker models'
measurements) and the document, which then says which run each part comes from.

Writes ``bench/results/seeds.json`` and ``docs/seeds.md``.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import report
from delayed_trackers import ArticleWorkload
from tqdm import tqdm

SCRIPT = Path(__file__).resolve()
SEEDS_MD = report.ROOT / "docs" / "seeds.md"
MEASURES = ("malloc", "tracemalloc", "rss", "heap")
MIB = 1024 * 1024
#: The blog's rows: (x, k) → its figure in MiB ("MB" in the blog is bytes / 1024 / 1024).
BLOG_BITMAP_MIB = {(1, 10): 25.0, (4, 10): 20.48, (8, 10): 11.0, (8, 15): 2.25}
BLOG_HEAP_MIB = 240.0
#: PIP-393's formula checked at these (x, k): M = x·2^k ids per bucket.
FORMULA_POINTS = [(1, 8), (1, 10), (2, 11), (8, 10), (4, 12), (8, 12), (8, 15)]
#: PIP-393's old map (ConcurrentLongLongPairHashMap): 1M → 64 MB, 10M → 512 MB, 53 B/entry.
PIP393_OLD_MAP = {1_000_000: 64.0, 10_000_000: 512.0}


# -- probe (a fresh interpreter) --------------------------------------------------------------------------


def probe(payload: dict[str, Any]) -> dict[str, Any]:
    import tracemalloc

    from pulsar_nack.lowlevel import TimeBucketIndex
    from pulsar_nack.memory import heap_in_use, release_free_heap, rss_bytes
    from pulsar_nack.sweep.baselines import HashMapTracker, TripleLongHeap
    from pulsar_nack.sweep.workloads import Workload

    kind, measure = payload["kind"], payload["measure"]
    due, ledgers, entries = Workload(x=payload["x"], n=payload["n"]).generate()

    def build() -> Any:
        if kind == "index":
            return TimeBucketIndex(payload["k"])
        return TripleLongHeap() if kind == "heap" else HashMapTracker()

    warm = build()  # first-use allocations are not the structure's
    warm.add_many(due[:2000], ledgers[:2000], entries[:2000])
    warm.pop_due(2**62)
    del warm
    gc.collect()

    def now() -> int:
        if measure == "tracemalloc":
            return int(tracemalloc.get_traced_memory()[0])
        return rss_bytes() if measure == "rss" else heap_in_use()

    if measure == "tracemalloc":
        tracemalloc.start()
    if measure == "rss":
        # the index's compact() trims glibc's heap (``release_free_heap``): trim before the baseline too,
        # or pages freed earlier (the workload's generation, the warm-up) are credited to the structure
        release_free_heap()
    before = now()
    structure = build()
    structure.add_many(due, ledgers, entries)
    gc.collect()
    out: dict[str, Any] = {"bytes": now() - before, "ids": len(structure)}
    if kind == "index":
        out["buckets"] = structure.bucket_count
        structure.compact()
        gc.collect()
        out["bytes_before_compact"], out["bytes"] = out["bytes"], now() - before
        out["structure"] = structure.structure()
    return out


def run_probe(payload: dict[str, Any]) -> dict[str, Any]:
    """``probe`` in a fresh interpreter, with the allocator the measure needs."""
    allocator = "malloc" if payload["measure"] == "malloc" else None
    return report.run_probe(SCRIPT, payload, timeout=1800, env={"PYTHONMALLOC": allocator})


# -- the run ---------------------------------------------------------------------------------------------


def measure_all(n: int, formula_n: int, java: Any, bar: Any) -> dict[str, Any]:
    results: dict[str, Any] = {"n": n, "formula_n": formula_n, "blog": {}, "formula": {}, "old": {}}

    def ours(kind: str, x: int, k: int, count: int, measures: tuple[str, ...] = MEASURES) -> dict[str, Any]:
        figures: dict[str, Any] = {}
        for measure in measures:
            bar.set_description(f"{kind} x={x} k={k} n={count:,} {measure}")
            figures[measure] = run_probe({"kind": kind, "x": x, "k": k, "n": count, "measure": measure})
            bar.update()
        return figures

    def java_case(x: int, k: int, count: int) -> dict[str, Any] | None:
        if java is None:
            return None
        bar.set_description(f"java x={x} k={k} n={count:,}")
        case: dict[str, Any] = java.run_case(x, k, n=count)
        case.pop("checksum", None)
        bar.update()
        return case

    for x, k in BLOG_BITMAP_MIB:
        results["blog"][f"{x},{k}"] = {"ours": ours("index", x, k, n), "java": java_case(x, k, n)}
    results["blog"]["heap"] = {"ours": ours("heap", 1, 10, n, ("malloc", "tracemalloc", "heap"))}
    for x, k in FORMULA_POINTS:
        results["formula"][f"{x},{k}"] = {
            "ours": ours("index", x, k, formula_n, ("malloc", "tracemalloc")),
            "java": java_case(x, k, formula_n),
        }
    for count in PIP393_OLD_MAP:
        # PIP-393's example rate: 10k nacks/s = 10 per ms, default precision k = 8.
        results["old"][str(count)] = {
            "ours": ours("index", 10, 8, count, ("malloc", "tracemalloc", "rss")),
            "java": java_case(10, 8, count),
            "hashmap": ours("hashmap", 10, 8, min(count, 1_000_000), ("malloc",)),
        }
    return results


def jobs(java: bool) -> int:
    blog = len(BLOG_BITMAP_MIB) * (len(MEASURES) + java) + 3
    formula = len(FORMULA_POINTS) * (2 + java)
    return blog + formula + len(PIP393_OLD_MAP) * (3 + java + 1)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10_000_000, help="ids per blog row (the blog's: 10M)")
    parser.add_argument("--formula-n", type=int, default=1_000_000, help="ids per formula point")
    parser.add_argument("--no-java", action="store_true")
    parser.add_argument(
        "--from-results",
        "--reuse",
        action="store_true",
        help="no new measurements: keep the measured rows of bench/results/seeds.json, redo the estimates, "
        "the PIP-195 section and docs/seeds.md",
    )
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:
        print(json.dumps(probe(json.loads(args.probe))))
        return 0
    if args.from_results:
        results = json.loads((report.RESULTS / "seeds.json").read_text())
        results["rendered"] = report.machine()  # the measured rows keep their own "machine"
        return _write(results)
    java = None
    if not args.no_java:
        import java_reference

        if java_reference.available():
            java_reference.build()
            java = java_reference
        else:
            print("java/mvn not found: no Java column", file=sys.stderr)
    started = time.perf_counter()
    with tqdm(total=jobs(java is not None), unit="probe", file=sys.stderr) as bar:
        results = measure_all(args.n, args.formula_n, java, bar)
    results["machine"] = report.machine()
    results.pop("rendered", None)
    results["elapsed_s"] = time.perf_counter() - started
    report.save_json("seeds", results)  # the measurements first: the estimates below may fail
    return _write(results)


def _write(results: dict[str, Any]) -> int:
    results["estimate"] = _estimates()
    results["trackers"] = load_trackers()
    report.save_json("seeds", results)
    text = render(results)
    from pulsar_nack.profile import native_cost
    from pulsar_nack.sweep.plots import plot_seeds_bytes_per_id, plot_seeds_memory

    native = native_cost()["bytes_per_nack"]
    for name, figure in (("seeds-bytes-per-id.png", plot_seeds_bytes_per_id(results)),
                         ("seeds-memory-vs-pending.png", plot_seeds_memory(results, native))):  # fmt: skip
        figure.savefig(SEEDS_MD.parent / name, dpi=110, bbox_inches="tight")
    text += (
        "\n## Plots\n\n![bytes per id against M](seeds-bytes-per-id.png)\n\n"
        "![memory against pending nacks](seeds-memory-vs-pending.png)\n"
    )
    SEEDS_MD.write_text(text)
    print(text)
    return 0


def _estimates() -> dict[str, Any]:
    """PIP-393's 1 h and 5 h at 10k nacks/s, from ``pulsar-nack estimate``'s fitted model."""
    from pulsar_nack.estimate import Scenario, estimate

    out = {}
    for name, scenario in {
        "pip393_1h": Scenario(rate=10_000.0, delay_ms=3_600_000.0),
        "pip393_5h": Scenario(rate=10_000.0, delay_ms=5 * 3_600_000.0),
    }.items():
        result = estimate(scenario)
        out[name] = {
            "pending": result.pending,
            "pulsar_nack_bytes": result.pulsar_nack_bytes,
            "java_bytes": result.java_bytes,
            "native_bytes": result.native_bytes,
            "outside": result.outside,
        }
    return out


# -- the document ------------------------------------------------------------------------------------------


def _mib(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value / MIB:,.3f}" if value < 10 * MIB else f"{value / MIB:,.1f}"


def _ratio(ours: float | None, seed: float | None) -> str:
    if ours is None or seed is None or seed == 0:
        return "–"
    value = ours / seed
    return f"{value:.3f}" if value < 0.1 else f"{value:.2f}"


def render(results: dict[str, Any]) -> str:
    n = results["n"]
    scaled = n != 10_000_000
    blog_rows, notes = [], []
    for key, seed_mib in ((f"{x},{k}", v) for (x, k), v in BLOG_BITMAP_MIB.items()):
        row = results["blog"][key]
        ours, java = row["ours"], row["java"]
        seed = seed_mib * MIB * (n / 10_000_000)
        java_plain = java["retained_bytes"] if java else None
        java_opt = java["retained_bytes_run_optimized"] if java else None
        by = {m: ours[m]["bytes"] for m in MEASURES}
        verdict = (
            "–"
            if java_opt is None
            else " ".join(
                f"{m} {'✓' if by[m] <= java_opt else '✗'}" for m in ("malloc", "tracemalloc", "rss")
            )
        )
        blog_rows.append([
            f"bitmap (x,k) = ({key})", f"{seed_mib:g}" + (" (scaled)" if scaled else ""),
            _mib(by["malloc"]), _mib(by["tracemalloc"]), _mib(by["rss"]),
            _mib(ours["malloc"]["bytes_before_compact"]), _mib(java_plain), _mib(java_opt),
            _ratio(by["malloc"], seed), _ratio(java_plain, seed), verdict,
        ])  # fmt: skip
        notes.append(_blog_note(key, ours, java, seed))
    heap = results["blog"]["heap"]["ours"]
    heap_seed = BLOG_HEAP_MIB * MIB * (n / 10_000_000)
    heap_bytes = heap["malloc"]["bytes"]
    blog_rows.insert(0, [
        "TripleLongPriorityQueue, 10M ids", f"{BLOG_HEAP_MIB:g}" + (" (scaled)" if scaled else ""),
        _mib(heap_bytes), _mib(heap["tracemalloc"]["bytes"]), "–", "–", "–", "–",
        _ratio(heap_bytes, heap_seed), "–", "–",
    ])  # fmt: skip
    notes.insert(
        0,
        f"- TripleLongPriorityQueue: our stand-in (`sweep.baselines.TripleLongHeap`, numpy arrays of three "
        f"8-byte longs) holds {heap_bytes / n:.1f} B per id against the blog's bare 24 B × {n:,} = "
        f"{24 * n / MIB:.1f} MiB; the rest is the heap's spare capacity (it doubles). The Java module "
        "holds only the PIP-393 structure, so there is no Java figure for the old queue.",
    )

    formula_rows = []
    from pulsar_nack.sweep.measure import pip393_bytes_per_id

    formula_n = results["formula_n"]
    for key, row in results["formula"].items():
        x, k = (int(v) for v in key.split(","))
        m = x * 2**k
        theory = pip393_bytes_per_id(m)
        ours, java = row["ours"], row["java"]
        formula_rows.append([
            key, f"{m:,}", _regime(m), f"{theory:.3f}",
            f"{ours['malloc']['bytes_before_compact'] / formula_n:.3f}",
            f"{ours['malloc']['bytes'] / formula_n:.3f}", f"{ours['tracemalloc']['bytes'] / formula_n:.3f}",
            "–" if java is None else f"{java['retained_bytes'] / formula_n:.3f}",
            "–" if java is None else f"{java['retained_bytes_run_optimized'] / formula_n:.3f}",
        ])  # fmt: skip

    old_rows = []
    for count, seed_mb in PIP393_OLD_MAP.items():
        row = results["old"][str(count)]
        ours, java, hashmap = row["ours"], row["java"], row["hashmap"]["malloc"]
        seed = seed_mb * MIB
        old_rows.append([
            f"PIP-393 old map, {count:,} entries", f"{seed_mb:g} MiB ({seed / count:.0f} B/entry)",
            _mib(ours["malloc"]["bytes"]), _mib(ours["tracemalloc"]["bytes"]), _mib(ours["rss"]["bytes"]),
            "–" if java is None else _mib(java["retained_bytes"]),
            f"{hashmap['bytes'] / hashmap['ids']:.0f} B/entry at {hashmap['ids']:,}",
            _ratio(ours["malloc"]["bytes"], seed),
        ])  # fmt: skip
    estimates = results["estimate"]
    for name, hours, seed_gib in (("pip393_1h", 1, 1.77), ("pip393_5h", 5, 8.88)):
        e = estimates[name]
        old_rows.append([
            f"PIP-393: 10k nacks/s × {hours} h × 53 B (estimate)", f"{seed_gib:g} GiB",
            _mib(e["pulsar_nack_bytes"]) + " (model)", "–", "–",
            "–" if e["java_bytes"] is None else _mib(e["java_bytes"]) + " (model)",
            f"native {_mib(e['native_bytes'])} MiB (measured B/nack × pending)",
            _ratio(e["pulsar_nack_bytes"], seed_gib * 1024 * MIB),
        ])  # fmt: skip
    outside = estimates["pip393_1h"]["outside"]

    parts = [
        "# The published figures, checked",
        "",
        "Generated by `python bench/seeds.py` (results: `bench/results/seeds.json`); nothing here is typed "
        "in. MiB = 2^20 bytes (the blog's and PIP-393's \"MB\" are bytes / 1024 / 1024).",
        "",
        'Sources: the TimeBucket blog (PIP-393\'s analysis, "原理分析": the memory of delayed messages, '
        'in Chinese), PIP-393 ("Improve performance of Negative Acknowledgement"), PIP-195 ("New bucket '
        f'based delayed message tracker") with the figures of {ARTICLE} (the Pulsar 3.0 delayed-message '
        "article).",
        "",
        "Measured rows: " + report.machine_line(results["machine"]),
        *(
            [
                "",
                "This page was re-rendered with `python bench/seeds.py --from-results` "
                f"({results['rendered']['date']}, commit {results['rendered']['commit']}): the measured rows "
                "above are those of the run named on the line before (a full run re-measures every 10M-id "
                "row, ≈ 9 min); the estimates and the PIP-195 section were redone at this commit.",
            ]
            if "rendered" in results
            else []
        ),
        "",
        "Ours = pulsar-nack's `TimeBucketIndex` built with `add_many` from the blog's id stream "
        "(`pulsar_nack.sweep.workloads`, 50,000 entries per ledger) and compacted (what the tracker's timer "
        "does ~1 s after nacks leave a bucket), each measure in its own fresh interpreter: **malloc** = "
        "`PYTHONMALLOC=malloc` + glibc `mallinfo2`, **tracemalloc** = Python allocations only (CRoaring's "
        "C heap is invisible to it), **RSS** = resident set delta. Java = the PIP-393 structure "
        "(`Long2ObjectAVLTreeMap<Long2ObjectOpenHashMap<Roaring64Bitmap>>`, `bench/java`) on exactly the "
        "same ids, retained heap after GC, as built and after `runOptimize`. "
        + (
            f"**Scaled:** {n:,} ids per blog row instead of 10M; the blog's value is scaled by "
            f"{n / 10_000_000:g} in the ratio."
            if scaled
            else "Blog rows at the blog's 10M ids."
        ),
        "",
        "## The TimeBucket blog (PIP-393's analysis), 10M ids",
        "",
        report.table(
            [
                "figure",
                "blog MiB",
                "ours malloc",
                "ours tracemalloc",
                "ours RSS",
                "ours before compact",
                "Java as built",
                "Java runOptimize",
                "ours / blog",
                "Java / blog",
                "ours ≤ Java runOptimize",
            ],
            blog_rows,
        ),
        "",
        *notes,
        *_measure_notes(results),
        "",
        f"## PIP-393 — average entry size (B per id) against M = x·2^k ({formula_n:,} ids per point)",
        "",
        "Theory = PIP-393's formula (`sweep.measure.pip393_bytes_per_id`: 4 B below 4096 ids per bucket, "
        "8192/M up to 50,000, ≈ 0.163 B beyond). "
        + (
            f"Scaled: {formula_n:,} ids per point (10M would take minutes per point for no new information:"
            " the figure is per id)."
            if formula_n < 10_000_000
            else ""
        ),
        "",
        report.table(
            [
                "x,k",
                "M",
                "regime",
                "theory",
                "ours before compact (malloc)",
                "ours (malloc)",
                "ours (tracemalloc)",
                "Java as built",
                "Java runOptimize",
            ],
            formula_rows,
        ),
        "",
        *_formula_notes(results),
        "",
        "## PIP-393 — the old map: 53 B per entry, 1M → 64 MB, 10M → 512 MB",
        "",
        "Ours = the index holding the same number of nacks at PIP-393's example rate (10k nacks/s: x = 10 "
        "ids per ms, default k = 8); the old map's stand-in = `sweep.baselines.HashMapTracker` (a Python "
        "dict of (topic, ledger, entry) → due). The 1 h / 5 h rows come from `pulsar-nack estimate`'s "
        "fitted model (the full tracker, arrival filter included)"
        + (f"; outside its fitted range ({'; '.join(outside)}), so indicative." if outside else "."),
        "",
        report.table(
            [
                "figure",
                "PIP-393",
                "ours malloc MiB",
                "ours tracemalloc",
                "ours RSS",
                "Java MiB",
                "old map's Python stand-in",
                "ours / PIP-393",
            ],
            old_rows,
        ),
        "",
        "- The old map stores four longs per entry in an open-addressing table kept 15–66 % full (PIP-393: "
        "48–213 B per entry); the index stores one bit-ish per id and one key per bucket and ledger, so it "
        "is smaller by the ratio shown; Python's dict stand-in costs more per entry than Java's flat arrays.",
        "",
        *pip195_section(results.get("trackers")),
    ]
    return "\n".join(parts)


#: The article's source, named for readers (its text is not in this repository).
ARTICLE = "“New Delayed Message In Pulsar 3.0”"
#: The out-of-memory and recovery figures the article gives for its in-memory tracker: at 35M messages.
ARTICLE_IN_MEMORY_MESSAGES = 35_000_000


def load_trackers(path: Path | None = None) -> dict[str, Any] | None:
    """The tracker models' measurements (``bench/broker_trackers.py``'s results file), or None without
    one. Only what the PIP-195 section uses is kept: the article's figures, the rows and the run facts."""
    path = report.RESULTS / "broker_trackers.json" if path is None else path
    if not path.is_file():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return {
        "source": str(path.relative_to(report.ROOT)) if path.is_relative_to(report.ROOT) else str(path),
        "machine": data["machine"],
        "grid": data["grid"],
        "article": data["seed004"],
        "read_cost_us": data.get("read_cost_us"),
        "rows": data["rows"],
    }


def _tracker_row(rows: list[dict[str, Any]], near: int, **match: Any) -> dict[str, Any] | None:
    """Among rows whose columns equal ``match``, the one holding the number of messages nearest ``near``
    (log scale)."""
    chosen = [r for r in rows if all(r[name] == value for name, value in match.items())]
    return min(chosen, key=lambda r: abs(math.log(r["held"] / near))) if chosen else None


def pip195_section(trackers: dict[str, Any] | None) -> list[str]:
    """The PIP-195 table: the article's figures, ours from the tracker models' results file. Without the
    file, a sentence saying how to produce it (nothing is made up)."""
    parts = [f"## PIP-195 — the bucket-based delayed-delivery tracker ({ARTICLE})", ""]
    if trackers is None:
        return [
            *parts,
            "No results of the tracker models yet (`bench/results/broker_trackers.json`): run "
            "`python bench/broker_trackers.py`, then `python bench/seeds.py --from-results`.",
            "",
        ]
    rows, article = trackers["rows"], trackers["article"]
    machine = trackers["machine"]
    oom_messages = article["in_memory_oom_messages"]
    oom_mb = article["in_memory_direct_memory_mb"]
    per_message_us = article["in_memory_recovery_s"] / article["in_memory_recovery_messages"] * 1e6
    no_java = "– (a)"
    table: list[list[str]] = []
    notes: list[str] = []

    # 1. memory at the article's out-of-memory point: the limited heap below its limit, per id × 35M
    limited = [r for r in rows if r["model"] == "heap" and r["memory_limit_bytes"]]
    fitting = _tracker_row(limited, oom_messages, oom_at=None)
    if fitting is not None:
        per_id = fitting["heap_bytes"] / fitting["held"]
        ours = per_id * oom_messages
        table.append([
            f"in-memory tracker, memory at {oom_messages:,} delayed messages",
            f"{oom_mb} MB of direct memory",
            f"{ours / 1e6:,.0f} MB ({per_id:.2f} B/message measured at {fitting['held']:,}, × "
            f"{oom_messages / 1e6:g}M)",
            no_java, f"{ours / (oom_mb * 1e6):.2f}",
            f"{oom_mb} MB / {oom_messages / 1e6:g}M = {oom_mb * 1e6 / oom_messages:.1f} B per message "
            f"(MB = 10^6 B; {oom_mb * MIB / oom_messages:.1f} B if MiB): the queue's 24 B per index "
            "(three longs) plus its spare capacity, as ours",
        ])  # fmt: skip
    # 2. where the in-memory tracker runs out of memory
    oom = min((r for r in limited if r["oom_at"] is not None), key=lambda r: r["oom_at"], default=None)
    if oom is not None:
        limit = oom["memory_limit_bytes"]
        table.append([
            "in-memory tracker, out of memory at",
            f"{oom_messages:,} messages",
            f"{oom['oom_at']:,} messages, {oom['heap_bytes'] / MIB:,.0f} MiB held (limit {limit / MIB:,.0f} "
            "MiB, ours)",
            no_java, f"{oom['oom_at'] / oom_messages:.2f}",
            "the article does not give its broker's direct-memory limit; ours is 1 GiB, which holds "
            f"{limit / 24 / 1e6:.1f}M indexes of 24 B (growth by 1M-index segments stops at "
            f"{oom['oom_at'] / 1e6:.1f}M). The article's {oom_mb} MB at the failure says only that its next "
            "growth did not fit; the broker shares direct memory with its caches",
        ])  # fmt: skip
    # 3. recovery of the in-memory tracker at 35M
    heap = _tracker_row(limited, oom_messages, oom_at=None)
    timebucket = _tracker_row(rows, oom_messages, model="timebucket", rounding="floor")
    if heap is not None:
        read_s = heap["replayed"] * per_message_us / 1e6
        extra = (
            f"; the TimeBucket variant (apache/pulsar PR #23611) rebuilds {timebucket['held']:,} in "
            f"{timebucket['recovery_s']:,.0f} s (one Python call per id)"
            if timebucket is not None
            else ""
        )
        table.append([
            f"in-memory tracker, recovery of {article['in_memory_recovery_messages'] / 1e6:g}M",
            f"{article['in_memory_recovery_s']:,} s",
            f"{heap['recovery_s']:,.1f} s index rebuild of {heap['held']:,} (measured); + {read_s:,.0f} s "
            f"modelled read at {per_message_us:.0f} µs per replayed message",
            no_java, f"{heap['recovery_s'] / article['in_memory_recovery_s']:.4f} (rebuild only)",
            "the article's time is reading every message back from BookKeeper "
            f"({per_message_us:.0f} µs each); the model rebuilds from messages in memory, so only the "
            "rebuild is measured and the read is modelled with the article's own per-message cost" + extra,
        ])  # fmt: skip
    # 4, 5. the bucket tracker at the article's 100M
    buckets = _tracker_row(rows, article["bucket_messages"], model="buckets")
    if buckets is not None:
        table.append([
            f"bucket tracker, {article['bucket_messages'] / 1e6:g}M delayed messages",
            "all held, direct memory low and flat",
            f"{buckets['held']:,} held: {buckets['heap_bytes'] / MIB:,.1f} MiB "
            f"({buckets['bytes_per_id']:.2f} B/message), {buckets['ids_in_memory']:,} ids in memory, "
            f"{buckets['segments']:,} segments ({buckets['snapshot_bytes'] / MIB:,.0f} MiB of files)",
            no_java, f"{buckets['held'] / article['bucket_messages']:.2f} (held)",
            "the article gives no figure for the bucket tracker's memory; ours grows by each segment's "
            "membership bitmap and metadata "
            f"({buckets['heap_bytes'] / buckets['segments'] / 1024:.1f} KiB per segment), not by the ids",
        ])  # fmt: skip
        read_s = buckets["replayed"] * per_message_us / 1e6
        heap_total = None if heap is None else heap["recovery_s"] + heap["replayed"] * per_message_us / 1e6
        table.append([
            f"bucket tracker, recovery of {article['bucket_messages'] / 1e6:g}M",
            f"{article['bucket_recovery_s']} s",
            f"{buckets['recovery_s']:,.1f} s ({buckets['restored']:,} restored from the segment files, "
            f"{buckets['replayed']:,} replayed); + {read_s:,.1f} s modelled read",
            no_java, f"{buckets['recovery_s'] / article['bucket_recovery_s']:.2f}",
            "ours restores segment files from a local disk; the article's broker reads its bucket "
            "snapshots from BookKeeper on a cloud cluster. The shape holds: "
            f"{article['in_memory_recovery_s'] / article['bucket_recovery_s']:.0f}× faster than the "
            "in-memory recovery there; here, with the modelled reads, "
            + (
                f"{heap_total / (buckets['recovery_s'] + read_s):.0f}× "
                f"({heap['held'] / 1e6:g}M in memory against {buckets['held'] / 1e6:g}M in buckets)"
                if heap is not None and heap_total is not None
                else "–"
            ),
        ])  # fmt: skip
    notes.append(
        "- (a) No Java figure: the Java module here (`bench/java`) builds PIP-393's nack structure only; "
        "neither the broker's `TripleLongPriorityQueue` nor its bucket tracker is built there. Our models "
        "follow their layouts (`bench/delayed_trackers.py`)."
    )
    if timebucket is not None:
        largest = max((r for r in rows if r["model"] == "timebucket"), key=lambda r: r["held"])
        workload = ArticleWorkload(1)  # the article's delays, as the sweep generated them
        spread_s = workload.max_delay_s - workload.min_delay_s
        notes.append(
            "- Not in the article: the in-memory tracker on the TimeBucket index (apache/pulsar PR #23611, "
            f"tick 1 s → 2^{largest['precision_bits']} ms buckets) holds {largest['held']:,} messages in "
            f"{largest['heap_bytes'] / MIB:,.0f} MiB ({largest['bytes_per_id']:.1f} B/message, against the "
            f"queue's 24): random delays spread over {spread_s:,} s scatter every ledger over "
            f"≈ {spread_s * 1000 // 2 ** largest['precision_bits']:,} buckets, so few ids share a bitmap."
        )
    return [
        *parts,
        f"The article ran Apache Pulsar 3.0.4 with 100M messages at 1,000/s, delays of 48 h to 48 h 10 min. "
        f"Ours: the tracker models (`bench/delayed_trackers.py`) fed the same workload, measured by "
        f"`python bench/broker_trackers.py` (grid `{trackers['grid']}`, read from `{trackers['source']}`: "
        f"{machine['date']}, commit {machine['commit']}); memory is the process heap around the tracker, "
        "recovery the measured rebuild or restore after a restart (see docs/sweep.md).",
        "",
        report.table(["figure", "the article", "ours", "Java", "ours / article", "note"], table),
        "",
        *notes,
        "",
    ]


def _measure_notes(results: dict[str, Any]) -> list[str]:
    """Why the three measures differ, and the (8, 15) row against Java, from the figures."""
    rows = {key: row for key, row in results["blog"].items() if key != "heap"}
    out = []
    worst = max(rows, key=lambda key: rows[key]["ours"]["malloc"]["bytes_before_compact"])
    ours = rows[worst]["ours"]
    out.append(
        f"- Before compaction at ({worst}) tracemalloc sees "
        f"{ours['tracemalloc']['bytes_before_compact'] / MIB:.2f} MiB where malloc sees "
        f"{ours['malloc']['bytes_before_compact'] / MIB:.2f} MiB: CRoaring allocates its containers with "
        "`malloc` directly, which tracemalloc does not trace — a tracemalloc figure of a structure holding "
        "bitmaps is a lower bound. After compaction dense slots hold no bitmap, and the two measures "
        "differ only by the system allocator's per-object overhead."
    )
    row = rows.get("8,15")
    if row is not None and row["java"] is not None:
        malloc, java = row["ours"]["malloc"]["bytes"], row["java"]["retained_bytes_run_optimized"]
        verdict = "at or below" if malloc <= java else "above"
        out.append(
            f"- (8,15), the row where the process-level measure once put the index above Java with "
            f"runOptimize: ours {malloc:,} B by malloc ({row['ours']['tracemalloc']['bytes']:,} B by "
            f"tracemalloc) against Java's {java:,} B — {verdict} Java by {abs(java - malloc):,} B. With "
            f"{row['ours']['malloc']['structure']['slots']} slots packed into one int each, what is left is "
            "the index's fixed objects (sorted map, dicts, per-slot keys)."
        )
    return out


def _regime(m: int) -> str:
    return "M < 4096" if m < 4096 else "4096 < M < 50,000" if m < 50_000 else "M > 50,000"


def _blog_note(key: str, ours: dict[str, Any], java: dict[str, Any] | None, seed: float) -> str:
    malloc, traced = ours["malloc"]["bytes"], ours["tracemalloc"]["bytes"]
    before = ours["malloc"]["bytes_before_compact"]
    structure = ours["malloc"]["structure"]
    text = (
        f"- ({key}): {structure['buckets']:,} buckets, {structure['slots']:,} (bucket, ledger) slots, "
        f"{structure['packed_runs']:,} packed into one int each by compaction, {structure['bitmaps']:,} "
        f"left as bitmaps. Before compaction ours is {before / seed:.2f}× the blog's figure (uncompacted "
        f"bitmaps, like the blog's)"
    )
    if malloc > traced * 1.2:
        per_object = (malloc - traced) / max(structure["slots"] + structure["buckets"], 1)
        text += (
            f"; malloc counts {malloc / traced:.1f}× tracemalloc: with PYTHONMALLOC=malloc every small "
            f"Python object is a glibc chunk (8 B header, 16 B alignment, 32 B minimum) — "
            f"{per_object:.0f} B more per bucket or slot here"
        )
    rss, rss_before = ours["rss"]["bytes"], ours["rss"]["bytes_before_compact"]
    if rss > 2 * malloc:
        text += (
            f"; RSS stays at {rss / MIB:.2f} MiB after compaction ({rss_before / MIB:.2f} MiB before): "
            "pages the allocators took while the bitmaps were built are kept after compaction frees them, "
            "and RSS counts whole pages"
        )
    if java is not None:
        optimized = java["retained_bytes_run_optimized"]
        text += (
            f"; Java after runOptimize {optimized / MIB:.3f} MiB, ours/Java = {malloc / optimized:.2f} "
            "by the malloc measure"
        )
    return text + "."


def _formula_notes(results: dict[str, Any]) -> list[str]:
    from pulsar_nack.sweep.measure import pip393_bytes_per_id

    n = results["formula_n"]
    out = []
    for key, row in results["formula"].items():
        x, k = (int(v) for v in key.split(","))
        m = x * 2**k
        before = row["ours"]["malloc"]["bytes_before_compact"] / n
        theory = pip393_bytes_per_id(m)
        out.append(
            f"- ({key}), M = {m:,}: before compaction {before:.3f} B/id = {before / theory:.2f}× the formula "
            + ("(the formula counts 4 B per array value, CRoaring 2 B plus growth headroom; per-bucket "
               "objects add the rest)" if m < 4096 else
               "(one 8 KiB bitset per bucket and ledger, plus the bucket's objects)")
            + "; after compaction consecutive ids are one packed int per slot, far below the formula."
        )  # fmt: skip
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
