"""The sweep report's plots (matplotlib, drawn off-screen): bytes/id against M = x·2^k with PIP-393's
curve, buckets against k, memory against precision, the index against the baselines and the Java
structure. Each plot function takes the measured rows and returns None when they lack its data; the
Java structure's bars come from a results file of the benchmark (:mod:`pulsar_nack.sweep.java_results`),
and are left out without one.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, TypeAlias

from matplotlib.figure import Figure

from pulsar_nack.shipped import repository_file
from pulsar_nack.sweep.grid import GridPoint
from pulsar_nack.sweep.java_results import JavaResults
from pulsar_nack.sweep.measure import Row, number, per_id, pip393_bytes_per_id, reference_rows

__all__ = [
    "DEFAULT_SEEDS_RESULTS",
    "PLOTS",
    "Plot",
    "contender_cases",
    "default_seeds_results",
    "figures",
    "plot_buckets",
    "plot_bytes_per_id",
    "plot_contenders",
    "plot_memory_vs_precision",
    "plot_seeds_bytes_per_id",
    "plot_seeds_memory",
]

_BEFORE, _AFTER, _THEORY = "#1f77b4", "#d62728", "#555555"
_VARIANT_COLOURS: Final = ("#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")


def _variants(rows: Sequence[Row]) -> list[Row]:
    """Index rows off the reference workload (sparse, batched, ceil) or measured without compaction."""
    reference = {id(row) for row in reference_rows(rows)}
    return [row for row in rows if row["contender"] == "index" and id(row) not in reference]


def plot_bytes_per_id(rows: Sequence[Row]) -> Figure | None:
    """Bytes per id against M = x·2^k (log-log): before and after compaction, PIP-393's curve, variants."""
    reference = reference_rows(rows)
    if not reference:
        return None
    figure = Figure(figsize=(10, 5), layout="constrained")
    axes = figure.add_subplot()
    m = [number(row["ids_per_bucket"]) for row in reference]
    axes.scatter(m, [per_id(r, "bytes_before_compact") for r in reference], c=_BEFORE, label="index, plain")
    compacted = [row for row in reference if row["compact"]]
    axes.scatter(
        [number(r["ids_per_bucket"]) for r in compacted],
        [number(r["bytes_per_id"]) for r in compacted],
        c=_AFTER,
        marker="s",
        label="index after compact()",
    )
    for ledger_size in sorted({int(number(r["entries_per_ledger"])) for r in reference}):
        low, high = math.floor(8 * math.log2(min(m))), math.ceil(8 * math.log2(max(m)))
        grid_m = [2 ** (e / 8) for e in range(low, high + 1)]
        axes.plot(
            grid_m,
            [pip393_bytes_per_id(value, ledger_size) for value in grid_m],
            c=_THEORY,
            ls="--",
            label=f"PIP-393 theory ({ledger_size:,} entries/ledger)",
        )
    axes.axhline(1 / 8, c=_THEORY, ls=":", lw=1, label="1 bit per id")
    for row, colour in zip(_variants(rows), itertools.cycle(_VARIANT_COLOURS)):
        axes.scatter(
            number(row["ids_per_bucket"]),
            number(row["bytes_per_id"]),
            c=colour,
            marker="^",
            label=GridPoint.from_row(row).label(),
        )
    axes.set(xscale="log", yscale="log", xlabel="M = x·2^k (ids per bucket)", ylabel="bytes per id")
    axes.set_title("Index memory per id against bucket size")
    axes.grid(True, which="major", alpha=0.3)
    axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    return figure


def plot_buckets(rows: Sequence[Row]) -> Figure | None:
    """Buckets against k, one line per rate x, with the expected ceil(n / x·2^k) dashed."""
    reference = reference_rows(rows)
    if not reference:
        return None
    figure = Figure(figsize=(8, 5), layout="constrained")
    axes = figure.add_subplot()
    for x, series in _by_rate(reference).items():
        ks = [number(r["k"]) for r in series]
        line = axes.plot(ks, [number(r["buckets"]) for r in series], marker="o", label=f"x = {x} ids/ms")[0]
        expected = [max(1.0, math.ceil(number(r["n"]) / number(r["ids_per_bucket"]))) for r in series]
        axes.plot(ks, expected, ls="--", c=line.get_color(), alpha=0.6)
    axes.set(yscale="log", xlabel="k (precision bits; buckets of 2^k ms)", ylabel="buckets")
    axes.set_title("Buckets against precision (dashed: n / x·2^k)")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")
    return figure


def plot_memory_vs_precision(rows: Sequence[Row], rates: int = 4) -> Figure | None:
    """Retained MB against k for up to ``rates`` rates x (spread over the grid's); dashed: not compacted."""
    by_rate = _by_rate(reference_rows(rows))
    if not by_rate:
        return None
    chosen = sorted(by_rate)
    if len(chosen) > rates:
        chosen = [chosen[round(i * (len(chosen) - 1) / (rates - 1))] for i in range(rates)]
    figure = Figure(figsize=(8, 5), layout="constrained")
    axes = figure.add_subplot()
    for x in chosen:
        series = by_rate[x]
        plain = axes.plot(
            [number(r["k"]) for r in series],
            [number(r["bytes_before_compact"]) / 1e6 for r in series],
            ls="--",
            alpha=0.6,
        )[0]
        compacted = [r for r in series if r["compact"]]
        axes.plot(
            [number(r["k"]) for r in compacted],
            [number(r["retained_bytes"]) / 1e6 for r in compacted],
            marker="o",
            c=plain.get_color(),
            label=f"x = {x}",
        )
    n = sorted({int(number(r["n"])) for r in reference_rows(rows)})
    axes.set(
        yscale="log",
        xlabel="k (precision bits)",
        ylabel=f"retained MB ({', '.join(f'{v:,}' for v in n)} ids)",
    )
    axes.set_title("Index memory against precision (solid: compacted, dashed: plain)")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")
    return figure


def _by_rate(reference: Sequence[Row]) -> dict[int, list[Row]]:
    series: dict[int, list[Row]] = {}
    for row in reference:
        series.setdefault(int(number(row["x"])), []).append(row)
    return {x: sorted(rows, key=lambda r: number(r["k"])) for x, rows in sorted(series.items())}


def contender_cases(rows: Sequence[Row], java: JavaResults | None = None) -> list[Row]:
    """The reference rows the contenders plot shows: those whose workload ``java`` measured; if none
    match (or there are no Java results), up to ``_MAX_CASES`` reference rows spread over M."""
    reference = reference_rows(rows)
    covered = [row for row in reference if java is not None and java.case_for(row) is not None]
    if covered or len(reference) <= _MAX_CASES:
        return covered or reference
    step = (len(reference) - 1) / (_MAX_CASES - 1)
    return [reference[round(i * step)] for i in range(_MAX_CASES)]


_MAX_CASES: Final = 8


def plot_contenders(rows: Sequence[Row], java: JavaResults | None = None) -> Figure | None:
    """Bytes per id of the index (plain and compacted) and, with ``java``, of the Java structure at the
    cases it measured (:func:`contender_cases`); the baselines (which do not depend on x or k) as
    horizontal lines."""
    cases = contender_cases(rows, java)
    baselines = [row for row in rows if row["contender"] != "index"]
    if not cases:
        return None
    figure = Figure(figsize=(9, 5), layout="constrained")
    axes = figure.add_subplot()
    # Like for like, side by side: as built with as built, compacted with runOptimize; each bar's label
    # says how many ids its structure held (bytes per id fall as more ids share the fixed overhead).
    ours = theirs = _ids_label(int(number(row["n"])) for row in cases)
    series: list[tuple[str, Callable[[Row], float | None]]] = [
        (f"index as built, {ours} ids", lambda r: per_id(r, "bytes_before_compact"))
    ]
    if java is not None:
        theirs = _ids_label(case.n for case in java.cases)
        series.append(
            (f"Java PIP-393 as built, {theirs} ids", lambda r: _java_per_id(java, r, run_optimized=False))
        )
    series.append(
        (f"index compacted, {ours} ids", lambda r: number(r["bytes_per_id"]) if r["compact"] else None)
    )
    if java is not None:
        series.append(
            (f"Java + runOptimize, {theirs} ids", lambda r: _java_per_id(java, r, run_optimized=True))
        )
    width = 0.8 / len(series)
    for i, (label, value) in enumerate(series):
        points = [(j, value(row)) for j, row in enumerate(cases)]
        shown = [(j, v) for j, v in points if v is not None]
        if shown:
            offset = (i - (len(series) - 1) / 2) * width
            axes.bar([j + offset for j, _ in shown], [v for _, v in shown], width, label=label)
    for row, style in zip(baselines, ("-", "-.", ":"), strict=False):
        axes.axhline(
            number(row["bytes_per_id"]), c="black", ls=style, lw=1, label=f"{row['contender']} (measured)"
        )
    axes.set_xticks(range(len(cases)), [f"x={r['x']}\nk={r['k']}" for r in cases])
    axes.set(yscale="log", ylabel="bytes per id")
    against = "the Java PIP-393 structure and the old designs" if java is not None else "the old designs"
    title = f"Index against {against}"
    if java is not None and theirs != ours:
        title += f"\n(ids per point differ: index {ours}, Java {theirs})"
    axes.set_title(title)
    axes.grid(True, axis="y", alpha=0.3)
    axes.legend(fontsize="small")
    return figure


def _ids_label(counts: Iterable[int]) -> str:
    """``200,000`` or ``1,000,000/10,000,000``: the distinct id counts, ascending."""
    return "/".join(f"{n:,}" for n in sorted(set(counts)))


def _java_per_id(java: JavaResults, row: Row, run_optimized: bool) -> float | None:
    case = java.case_for(row)
    return None if case is None else case.per_id(run_optimized)


#: A plot: the rows and the Java results (None: none given) → a figure, or None without its data.
Plot: TypeAlias = Callable[[Sequence[Row], JavaResults | None], Figure | None]

#: Plot file stem → (title in the report, plot function).
PLOTS: Final[dict[str, tuple[str, Plot]]] = {
    "bytes_per_id": ("Bytes per id against M = x·2^k", lambda rows, _: plot_bytes_per_id(rows)),
    "buckets": ("Buckets against k", lambda rows, _: plot_buckets(rows)),
    "memory_vs_precision": ("Memory against precision", lambda rows, _: plot_memory_vs_precision(rows)),
    "contenders": ("The index against the baselines and the Java structure", plot_contenders),
}


def figures(rows: Sequence[Row], java: JavaResults | None = None) -> dict[str, Figure]:
    """Every plot the rows allow, by file stem (a grid without index rows, say, has no bytes/id plot);
    the Java bars only with ``java``."""
    drawn = {name: plot(rows, java) for name, (_, plot) in PLOTS.items()}
    return {name: figure for name, figure in drawn.items() if figure is not None}


# -- the published figures, checked (bench/seeds.py's results) ------------------------------------------

#: The results file of ``bench/seeds.py`` in a source checkout (an installed package carries a copy:
#: :func:`default_seeds_results`).
DEFAULT_SEEDS_RESULTS: Final = Path(__file__).resolve().parents[2] / "bench" / "results" / "seeds.json"
_MIB: Final = 2**20


def default_seeds_results() -> Path | None:
    """:data:`DEFAULT_SEEDS_RESULTS` if it exists, else the copy the wheel and sdist carry
    (:mod:`pulsar_nack.shipped`), else None."""
    return repository_file("bench/results/seeds.json")


def plot_seeds_bytes_per_id(results: Mapping[str, Any]) -> Figure:
    """Bytes per id against M = x·2^k as ``bench/seeds.py`` measured them (``results``: its JSON), with
    PIP-393's formula: the index before and after compaction and the Java structure as built and after
    ``runOptimize`` (malloc measure), one point per formula case. O(cases)."""
    n = number(results["formula_n"])
    points = sorted(
        (
            (int(x) * 2 ** int(k), row)
            for (x, k), row in ((key.split(","), row) for key, row in results["formula"].items())
        ),
        key=lambda item: item[0],
    )
    ms = [m for m, _ in points]
    figure = Figure(figsize=(7, 4.2), layout="constrained")
    axes = figure.subplots()
    low, high = math.log10(min(ms) / 2), math.log10(max(ms) * 2)
    grid = [10 ** (low + (high - low) * i / 199) for i in range(200)]
    axes.plot(grid, [pip393_bytes_per_id(m) for m in grid], "k--", label="PIP-393 formula")
    series: list[tuple[str, Callable[[Mapping[str, Any]], object]]] = [
        ("ours before compaction", lambda r: r["ours"]["malloc"]["bytes_before_compact"]),
        ("ours (compacted)", lambda r: r["ours"]["malloc"]["bytes"]),
        ("Java as built", lambda r: r["java"]["retained_bytes"] if r["java"] else None),
        ("Java runOptimize", lambda r: r["java"]["retained_bytes_run_optimized"] if r["java"] else None),
    ]
    for label, value in series:
        ys = [value(row) for _, row in points]
        if all(y is not None for y in ys):
            axes.plot(ms, [number(y) / n for y in ys], "o-", label=label)
    axes.set(xscale="log", yscale="log", xlabel="M = ids per bucket (x·2^k)")
    axes.set_ylabel("bytes per id (malloc measure)")
    axes.set_title(f"Bytes per id against M ({n:,.0f} ids per point)")
    axes.legend(fontsize=8)
    return figure


def plot_seeds_memory(results: Mapping[str, Any], native_bytes_per_nack: float) -> Figure:
    """Memory against pending nacks at PIP-393's example rate (``results``: ``bench/seeds.py``'s JSON):
    pulsar-nack's index and the Java structure measured at 1M and 10M ids, like for like — both as built,
    and compacted beside ``runOptimize`` —, pulsar-nack's tracker estimated at 1 h and 5 h of nacks, and the
    native client at ``native_bytes_per_nack`` (its measured cost). O(cases)."""
    measured = sorted(int(count) for count in results["old"])
    rows = [results["old"][str(c)] for c in measured]
    estimates = [results["estimate"][name] for name in ("pip393_1h", "pip393_5h")]
    figure = Figure(figsize=(7, 4.2), layout="constrained")
    axes = figure.subplots()
    later = [number(e["pending"]) for e in estimates]
    pairs: list[tuple[str, str, str, str]] = [  # (ours' label, field, Java's label, field), like for like
        ("pulsar-nack as built", "bytes_before_compact", "Java PIP-393 as built", "retained_bytes"),
        ("pulsar-nack compacted", "bytes", "Java + runOptimize", "retained_bytes_run_optimized"),
    ]
    for (ours, field, java, java_field), color in zip(pairs, ("tab:blue", "tab:green"), strict=True):
        axes.plot(
            measured,
            [number(r["ours"]["malloc"][field]) / _MIB for r in rows],
            "o-",
            color=color,
            label=f"{ours} (measured)",
        )
        if all(r["java"] is not None for r in rows):
            axes.plot(
                measured,
                [number(r["java"][java_field]) / _MIB for r in rows],
                "s--",
                color=color,
                label=f"{java} (measured)",
            )
    axes.plot(
        later,
        [number(e["pulsar_nack_bytes"]) / _MIB for e in estimates],
        "o:",
        color="tab:purple",
        label="pulsar-nack tracker (estimate)",
    )
    pending = [*measured, *later]
    axes.plot(
        pending,
        [native_bytes_per_nack * p / _MIB for p in pending],
        "^-",
        color="tab:red",
        label=f"native client ({native_bytes_per_nack:.0f} B/nack)",
    )
    axes.set(xscale="log", yscale="log", xlabel="pending nacks (10k nacks/s, k = 8)", ylabel="MiB")
    axes.set_title("Memory against pending nacks")
    axes.legend(fontsize=8)
    return figure
