"""The sweep's report: a table of every point, findings computed from the rows, and ``report.md`` /
``report.html`` around the plots of :mod:`pulsar_nack.sweep.plots`.
"""

from __future__ import annotations

import html
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeAlias

from pulsar_nack.sweep.grid import GridPoint
from pulsar_nack.sweep.java_results import HOW_TO_PRODUCE, JavaResults
from pulsar_nack.sweep.measure import Row, number, per_id, reference_rows
from pulsar_nack.sweep.plots import PLOTS, contender_cases, figures

__all__ = [
    "RunInfo",
    "findings",
    "java_note",
    "summary_table",
    "write_report",
]


@dataclass(frozen=True)
class RunInfo:
    """What was run, where, and how long each phase took (seconds): starting Spark, the sweep, stopping
    Spark (and its JVM), writing Parquet, the report, and all of it; the Java results file the report
    drew its Java bars from (None: none)."""

    grid: str
    master: str
    points: int
    ids: int
    spark_version: str
    python: str
    date: str
    start_s: float
    sweep_s: float
    stop_s: float
    parquet_s: float
    report_s: float
    total_s: float
    java_results: str | None = None


#: Columns of the report's table of all points: header → cell of a row.
_SUMMARY: Final[dict[str, Callable[[Row], str]]] = {
    "point": lambda r: GridPoint.from_row(r).label(),
    "M": lambda r: f"{r['ids_per_bucket']:,}",
    "buckets": lambda r: _int(r["buckets"]),
    "slots": lambda r: _int(r["slots"]),
    "containers a/b/r + runs": lambda r: (
        "–"
        if r["slots"] is None
        else f"{r['array_containers']}/{r['bitset_containers']}/{r['run_containers']} + {r['packed_runs']}"
    ),
    "B/id plain": lambda r: (
        "–" if r["bytes_before_compact"] is None else f"{per_id(r, 'bytes_before_compact'):.3g}"
    ),
    "B/id": lambda r: f"{number(r['bytes_per_id']):.3g}",
    "PIP-393 B/id": lambda r: (
        "–" if r["theory_bytes_per_id"] is None else f"{number(r['theory_bytes_per_id']):.3g}"
    ),
    "retained KB": lambda r: f"{number(r['retained_bytes']) / 1e3:,.1f}",
    "build ns/id": lambda r: f"{number(r['build_ns_per_id']):.0f}",
    "drain ns/id": lambda r: f"{number(r['drain_ns_per_id']):.0f}",
    "task s": lambda r: f"{number(r['measure_s']):.2f}",
}


def _int(value: object) -> str:
    return "–" if value is None else f"{int(number(value)):,}"


def summary_table(rows: Sequence[Row]) -> tuple[list[str], list[list[str]]]:
    """The report's table of all points: (headers, rows of formatted cells), in grid order."""
    return list(_SUMMARY), [[cell(row) for cell in _SUMMARY.values()] for row in rows]


def findings(rows: Sequence[Row]) -> list[str]:
    """Plain sentences on what the rows show, computed from them (none when the rows lack the data)."""
    out: list[str] = []
    reference = reference_rows(rows)
    if reference:
        ratios = [
            (per_id(r, "bytes_before_compact") / number(r["theory_bytes_per_id"]), r) for r in reference
        ]
        close = [r for ratio, r in ratios if 0.5 <= ratio <= 2]
        worst_ratio, worst = max(ratios, key=lambda pair: pair[0])
        if close:
            low, high = (
                min(number(r["ids_per_bucket"]) for r in close),
                max(number(r["ids_per_bucket"]) for r in close),
            )
            out.append(
                f"Before compaction the index is within 2× of PIP-393's curve for {len(close)} of "
                f"{len(ratios)} points (M from {low:,.0f} to {high:,.0f})."
            )
        m, plain = number(worst["ids_per_bucket"]), per_id(worst, "bytes_before_compact")
        out.append(
            f"The largest excess is at M = {m:,.0f} (x={worst['x']}, k={worst['k']}): {plain:,.1f} B/id "
            f"against {number(worst['theory_bytes_per_id']):.3g} in theory ({worst_ratio:,.0f}×) — "
            f"{number(worst['buckets']):,.0f} buckets, each paying for its own Python objects, which the "
            "theory leaves out."
        )
        compacted = [r for r in reference if r["compact"]]
        if compacted:
            gains = [number(r["bytes_before_compact"]) / number(r["retained_bytes"]) for r in compacted]
            runs = sum(number(r["packed_runs"]) for r in compacted)
            slots = sum(number(r["slots"]) for r in compacted)
            out.append(
                f"compact() shrinks these structures {min(gains):.1f}–{max(gains):.1f}× (median "
                f"{statistics.median(gains):.1f}×); {runs:,.0f} of {slots:,.0f} (bucket, ledger) slots "
                "became a single packed run, because dense nacks are consecutive entry ids."
            )
    index = [r for r in reference if r["compact"]] or reference
    for baseline in (r for r in rows if r["contender"] != "index"):
        if index:
            median = statistics.median(number(r["bytes_per_id"]) for r in index)
            out.append(
                f"The {baseline['contender']} baseline holds {number(baseline['bytes_per_id']):.1f} B/id, "
                f"{number(baseline['bytes_per_id']) / median:,.0f}× the index's median {median:.3g} B/id."
            )
    return out


_TEXTS: Final = {
    "bytes_per_id": "Dots: the index as built (plain Roaring bitmaps, what PIP-393's formula describes); "
    "squares: after `compact()`; dashed: PIP-393's average entry size (4 B below 4096 ids per bucket, "
    "8192/M B up to a ledger, ≈0.163 B beyond); dotted: one bit per id. Triangles are the other workloads "
    "of the grid.",
    "buckets": "Each bucket spans 2^k ms, so buckets fall by half with every bit until one holds all ids.",
    "memory_vs_precision": "Retained memory of the whole index; every extra bit of imprecision halves the "
    "buckets and the per-bucket overhead with them.",
    "contenders": "Bars: bytes per id of the index, as built and after `compact()`, and of the Java "
    "PIP-393 structure (fastutil AVL map → open hash map → Roaring64Bitmap, before and after "
    "`runOptimize`) where a results file of the Java reference measured the same workload; lines: the "
    "hash map and the triple-long heap measured in this sweep.",
}


def java_note(rows: Sequence[Row], java: JavaResults | None) -> str:
    """What the contenders plot shows of the Java structure: the results file, its date and machine and
    the (x, k) it covers — or why there are no Java bars and how to produce them."""
    if java is None:
        return (
            f"No Java bars: no results file of the Java reference was given; to draw them, {HOW_TO_PRODUCE}."
        )
    covered = [row for row in contender_cases(rows, java) if java.case_for(row) is not None]
    if not covered:
        measured = ", ".join(f"({case.x}, {case.k})" for case in java.cases)
        return (
            f"No Java bars: {java.provenance()} — its cases (x, k) = {measured} match no dense, unbatched "
            "point of this grid (same x, k, entries per ledger and rounding)."
        )
    shown = ", ".join(f"({row['x']}, {row['k']})" for row in covered)
    return f"{java.provenance()}; Java bars at (x, k) = {shown}."


Block: TypeAlias = tuple[str, Any]


def _blocks(
    rows: Sequence[Row], info: RunInfo, images: dict[str, str], java: JavaResults | None
) -> list[Block]:
    blocks: list[Block] = [
        ("h1", f"Memory sweep: grid {info.grid}, {info.points} points"),
        (
            "p",
            f"{info.ids:,} ids in all on `{info.master}` (Spark {info.spark_version}, Python {info.python}), "
            f"{info.date}. Spark start {info.start_s:.1f} s, sweep {info.sweep_s:.1f} s, Spark stop "
            f"{info.stop_s:.1f} s. Memory: the index's `memory_usage()` (Python objects at allocator "
            "sizes + CRoaring's C heap); baselines: `heap_in_use()` delta around building them.",
        ),
    ]
    notes = findings(rows)
    if notes:
        blocks += [("h2", "Findings"), ("ul", notes)]
    for name, (title, _) in PLOTS.items():
        if name in images:
            blocks += [("h2", title), ("img", (images[name], title)), ("p", _TEXTS[name])]
            if name == "contenders":
                blocks.append(("p", java_note(rows, java)))
    blocks += [("h2", "All points"), ("table", summary_table(rows))]
    return blocks


def write_report(rows: Sequence[Row], out: Path, info: RunInfo, java: JavaResults | None = None) -> Path:
    """Write the plots as PNG, ``report.md`` and ``report.html`` into ``out``; returns the Markdown path.

    The Java structure's bars come from ``java`` (:func:`~pulsar_nack.sweep.java_results.load_java_results`)
    and the report names its file, date and machine next to them; without it they are left out, and the
    report says how to produce them.
    """
    images: dict[str, str] = {}
    for name, figure in figures(rows, java).items():
        figure.savefig(out / f"{name}.png", dpi=110)
        images[name] = f"{name}.png"
    blocks = _blocks(rows, info, images, java)
    (out / "report.md").write_text(_markdown(blocks))
    (out / "report.html").write_text(_html(blocks, f"pulsar-nack sweep: {info.grid}"))
    return out / "report.md"


def _markdown(blocks: Sequence[Block]) -> str:
    lines: list[str] = []
    for kind, content in blocks:
        if kind in ("h1", "h2"):
            lines.append(f"{'#' * int(kind[1])} {content}")
        elif kind == "p":
            lines.append(content)
        elif kind == "ul":
            lines.extend(f"- {item}" for item in content)
        elif kind == "img":
            lines.append(f"![{content[1]}]({content[0]})")
        else:
            headers, cells = content
            lines.append("| " + " | ".join(headers) + " |")
            lines.append("|" + "---|" * len(headers))
            lines.extend("| " + " | ".join(row) + " |" for row in cells)
        lines.append("")
    return "\n".join(lines)


def _html(blocks: Sequence[Block], title: str) -> str:
    def inline(text: str) -> str:
        return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))

    body: list[str] = []
    for kind, content in blocks:
        if kind in ("h1", "h2", "p"):
            body.append(f"<{kind}>{inline(content)}</{kind}>")
        elif kind == "ul":
            body.append("<ul>" + "".join(f"<li>{inline(item)}</li>" for item in content) + "</ul>")
        elif kind == "img":
            body.append(f'<img src="{html.escape(content[0])}" alt="{html.escape(content[1])}">')
        else:
            headers, cells = content
            head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
            rows = "".join(
                "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in cells
            )
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
    style = (
        "body{font-family:sans-serif;max-width:70em;margin:2em auto}table{border-collapse:collapse;"
        "font-size:90%}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}img{max-width:100%}"
    )
    return (
        f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
