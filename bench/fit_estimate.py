"""Fit ``pulsar-nack estimate``'s models to measurements, and write them with the range they hold for.

* **pulsar-nack** — issue 23's grid points (``bench/nack_memory.py``'s :class:`Point`), each measured
  exactly as that bench measures it: the real tracker driven as ``pulsar-nack profile`` drives it, in a
  fresh process, messages over the shortest delay so that every nack is still pending at the end, target =
  the heap the process retains (``PYTHONMALLOC=malloc`` + glibc in-use bytes) in its second run of the
  workload (probe mode ``malloc-warm``; the first run's figure is kept as ``cold_bytes``). The points
  measured here: the fleet shape, three of the last grid run's, and seeded samples of the fixed-delay
  points (1 % nacked only with batches: a non-batched 1 % point is 10 million messages), 47 in all; with
  ``--rows``, the rows bench/nack_memory.py wrote (its whole-grid run: ``--extra grid --all --resume``),
  uniform delays among them (``Scenario.delay_spread_ms``).
* **Java** — the PIP-393 structure (``bench/java``, a fresh JVM per case) on the blog's workload over x,
  k, nack share, ids and entries per ledger; target = retained heap as built (no runOptimize: the Java
  client does not run it).
* **native** — the native client's bytes per pending nack as ``bench/nack_lateness.py`` measured them
  (``pulsar_nack/data/native_nack_cost.json``, read at estimate time, not copied into the fit; every
  native nack is its own node).

Coefficients come from non-negative least squares on relative errors (:func:`fit_linear`); the
in-sample errors are written beside them, per point too, and the leave-one-out errors (each point
predicted by the model fitted to the others).

    python bench/fit_estimate.py [--pending 100000] [--no-java] [--refit | --rows FILE...]

``--rows``: fit to measurement rows already taken (JSON lines of ``nack_memory.measure``), no new runs.
Writes ``pulsar_nack/data/estimate_fit.json`` (the package's model), ``bench/results/estimate_fit.json``
(the same plus every measured point) and the ``estimate-fit`` section of docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import report
from nack_memory import Point, grid, measure
from tqdm import tqdm

from pulsar_nack.estimate import (
    FEATURES,
    JAVA_FEATURES,
    Scenario,
    features,
    java_features,
    predict,
    range_key,
)

MAX_POINT_ROWS = 40  # a fit to more points shows the worst predicted when left out
PACKAGE_FIT = report.ROOT / "pulsar_nack" / "data" / "estimate_fit.json"
#: Besides the seeded sample: the fleet shape and three shapes of the last grid run.
NAMED = ("t100-b10-n0.1-d3600s-k8", "t1-b1-n1-d60s-k0", "t1-b100-n1-d3600s-k8", "t1000-b100-n1-d60s-k0")
JAVA_GRID: list[tuple[int, int, float, int, int]] = [  # x, k, share, n, entries per ledger
    (x, k, share, n, epl)
    for x, k in ((1, 4), (1, 10), (4, 8), (8, 10), (8, 15), (1, 8), (8, 4))
    for share, n, epl in ((1.0, 200_000, 50_000), (0.3, 100_000, 50_000), (1.0, 60_000, 5_000))
]


def nnls(
    a: npt.NDArray[np.float64], b: npt.NDArray[np.float64], max_iter: int = 500
) -> npt.NDArray[np.float64]:
    """Non-negative least squares (Lawson–Hanson): argmin ‖a·x − b‖ with x ≥ 0. O(iterations × n·m²)."""
    cols = a.shape[1]
    x = np.zeros(cols)
    passive = np.zeros(cols, dtype=bool)
    for _ in range(max_iter):
        gradient = a.T @ (b - a @ x)
        candidates = ~passive & (gradient > 1e-10 * max(1.0, float(np.abs(gradient).max(initial=0))))
        if not candidates.any():
            break
        passive[int(np.argmax(np.where(candidates, gradient, -np.inf)))] = True
        while True:
            z = np.zeros(cols)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            negative = passive & (z <= 0)
            step = np.min(x[negative] / (x[negative] - z[negative]))
            x = x + step * (z - x)
            passive &= x > 1e-12
    return x


def fit_linear(
    rows: Sequence[Mapping[str, float]], measured: Sequence[float], names: Sequence[str]
) -> dict[str, float]:
    """Coefficients (≥ 0) of ``names`` minimising the squared *relative* error against ``measured``."""
    a = np.array([[row[name] for name in names] for row in rows], dtype=float)
    b = np.array(measured, dtype=float)
    weights = 1 / b  # relative error: small workloads count as much as large ones
    scale = np.abs(a * weights[:, None]).max(axis=0)
    scale[scale == 0] = 1.0
    x = nnls(a * weights[:, None] / scale, np.ones(len(b))) / scale
    return {name: float(value) for name, value in zip(names, x, strict=True)}


def points() -> list[Point]:
    """The named points, 28 fixed-delay points nacking 10 % or 100 % and 3 batched ones nacking 1 %
    (seeded)."""
    every = grid()
    by_name = {p.name: p for p in every}
    fixed = [p for p in every if p.spread == "fixed"]
    common = [p for p in fixed if p.share != 0.01]
    rare = [p for p in fixed if p.share == 0.01 and p.batch >= 10]
    picked = [by_name[name] for name in NAMED]
    for p in [*random.Random(5).sample(common, 28), *random.Random(5).sample(rare, 3)]:
        if p not in picked:
            picked.append(p)
    return picked


def validation_points(count: int = 12) -> list[Point]:
    """More fixed-delay points nacking 10 % or 100 % (seeded apart from :func:`points`, with which they
    were first checked out of sample)."""
    fitted = set(points())
    pool = [p for p in grid() if p.spread == "fixed" and p.share != 0.01 and p not in fitted]
    return random.Random(7).sample(pool, count)


def scenario(row: dict[str, Any], pending: int) -> Scenario:
    """The estimate's view of a measured grid point (a row of ``nack_memory.measure``): the workload it
    ran, counted when its messages have arrived (see :meth:`Point.workload`). A row of before f9bf8f5
    does not name it: those ran ``pending / share`` messages over the whole shortest delay (the first
    ``2**k`` ms of nacks came due by the end; the estimate counts them in flight)."""
    point = Point.of(row)
    workload = point.workload(1)  # (the point's delays and ledgers; the rate and duration are the row's)
    if "duration_s" not in row:
        row = {**row, "rate": round(pending / point.share) / point.delay_s, "duration_s": point.delay_s}
    return Scenario(
        rate=row["rate"],
        delay_ms=point.delay_s * 1_000.0,
        delay_spread_ms=workload.delay.high_ms - workload.delay.low_ms,
        precision_bits=point.k,
        batch_size=point.batch,
        nack_share=point.share,
        topics=point.topics,
        entries_per_ledger=workload.entries_per_ledger,
        duration_ms=row["duration_s"] * 1_000.0,
    )


def java_scenario(x: int, k: int, share: float, n: int, epl: int) -> Scenario:
    """The blog's workload as a steady state: x nacked ids per ms from a stream 1/share as dense, over n/x
    ms."""
    return Scenario(
        rate=1_000 * x / share, delay_ms=n / x, precision_bits=k, entries_per_ledger=epl, nack_share=share
    )


def _errors(predicted: list[float], measured: list[float]) -> dict[str, float]:
    relative = [abs(p / m - 1) for p, m in zip(predicted, measured, strict=True)]
    return {"median": statistics.median(relative), "max": max(relative), "points": len(relative)}


def _fit_java(java_points: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("x", "k", "nack_share", "n", "entries_per_ledger")
    java_rows = [java_features(java_scenario(*(p[key] for key in keys))) for p in java_points]
    java_targets = [float(p["retained_bytes"]) for p in java_points]
    java_coefficients = fit_linear(java_rows, java_targets, JAVA_FEATURES)
    java_predicted = [predict(java_coefficients, row) for row in java_rows]
    for p, value in zip(java_points, java_predicted, strict=True):
        p["predicted_bytes"] = value
    return {
        "coefficients": java_coefficients,
        "error": _errors(java_predicted, java_targets),
        "target": "retained heap as built (no runOptimize), fresh JVM, bench/java",
        "points": java_points,
    }


def _rows(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """Measurement rows: JSON lines of ``nack_memory.measure``, or a results file of bench/nack_memory.py
    (its ``results``); a point measured twice counts once, the later file's."""
    by_point: dict[str, dict[str, Any]] = {}
    for path in paths:
        text = path.read_text()
        try:
            data = json.loads(text)  # a results file: its rows stamped with its commit unless they are
            rows = [{"commit": data["machine"]["commit"], **row} for row in data["results"]]
        except ValueError:  # (several JSON documents: lines)
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        by_point.update((row["point"], row) for row in rows)
    return list(by_point.values())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--pending", type=int, default=100_000, help="pending nacks a point (default 100,000)"
    )
    parser.add_argument("--no-java", action="store_true", help="keep the Java model of the last fit")
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--refit",
        action="store_true",
        help="fit again to the measurements in bench/results/estimate_fit.json (no new runs)",
    )
    which.add_argument(
        "--rows",
        type=Path,
        nargs="+",
        help="fit to these nack_memory.measure rows (JSON lines files, or bench/nack_memory.py results "
        "files such as bench/results/nack_memory_grid.json)",
    )
    args = parser.parse_args(argv)
    earlier = json.loads((report.RESULTS / "estimate_fit.json").read_text()) if args.refit else None
    facts = earlier["machine"] if earlier else report.machine()  # when the measurements were taken
    pending: int = earlier["pending_target"] if earlier else args.pending
    measured: list[dict[str, Any]] = earlier["measured"] if earlier else []
    if args.rows:
        measured = _rows(args.rows)
    elif not earlier:
        for point in tqdm(
            [*points(), *validation_points()], unit="point", file=sys.stderr, desc="pulsar-nack"
        ):
            measured.append(measure(point, pending))
    rows = [features(scenario(m, pending)) for m in measured]
    targets = [float(m["measured_bytes"]) for m in measured]
    coefficients = fit_linear(rows, targets, FEATURES)
    predicted = [predict(coefficients, row) for row in rows]
    for m, p, row in zip(measured, predicted, rows, strict=True):
        m["predicted_bytes"], m["features"], m["error"] = p, row, p / m["measured_bytes"] - 1
    # Out of sample: each point predicted by the model fitted to the others (leave one out).
    for index, m in enumerate(measured):
        others = [i for i in range(len(measured)) if i != index]
        held = fit_linear([rows[i] for i in others], [targets[i] for i in others], FEATURES)
        m["loo_predicted_bytes"] = predict(held, rows[index])
        m["loo_error"] = m["loo_predicted_bytes"] / m["measured_bytes"] - 1
    left_out = _errors([m["loo_predicted_bytes"] for m in measured], targets)
    keys = [range_key(scenario(m, pending)) for m in measured]
    ranges = {name: [min(k[name] for k in keys), max(k[name] for k in keys)] for name in keys[0]}

    java: dict[str, Any] = {}
    if earlier and earlier["java_points"]:
        java = _fit_java(earlier["java_points"])
    elif earlier or args.no_java:  # (a fit run with --no-java kept no Java points: keep its model too)
        java = json.loads(PACKAGE_FIT.read_text())["java"] if PACKAGE_FIT.exists() else {}
    else:
        import java_reference

        if java_reference.available():
            java_reference.build()
            java_points = []
            for x, k, share, n, epl in tqdm(JAVA_GRID, unit="case", file=sys.stderr, desc="Java"):
                case = java_reference.run_case(x, k, n=n, entries_per_ledger=epl, nack_share=share)
                java_points.append({
                    "x": x, "k": k, "nack_share": share, "n": n, "entries_per_ledger": epl,
                    "retained_bytes": case["retained_bytes"], "buckets": case["buckets"],
                    "bitmaps": case["bitmaps"], "java_version": case["java_version"],
                })  # fmt: skip
            java = _fit_java(java_points)
        else:
            print("java/mvn not found: no Java model", file=sys.stderr)
    now = report.machine()
    model = {
        "machine": facts,
        "fitted": {"date": now["date"], "commit": now["commit"]},
        "range": ranges,
        "pulsar_nack": {
            "coefficients": coefficients,
            "error": _errors(predicted, targets),
            "leave_one_out_error": left_out,
            "target": "bench/nack_memory.py's measure (malloc-warm: PYTHONMALLOC=malloc + glibc in-use, "
            "the process's second run of the workload), every nack still pending",
        },
        "java": {k: v for k, v in java.items() if k != "points"},
    }
    PACKAGE_FIT.write_text(json.dumps(model, indent=2, sort_keys=True) + "\n")
    report.save_json(
        "estimate_fit",
        {
            **model,
            "pending_target": pending,
            "measured": measured,
            "java_points": java.get("points", []),
        },
    )
    text = render(model, measured)
    report.write_section("estimate-fit", text)
    print(text)
    return 0


def render(model: dict[str, Any], measured: list[dict[str, Any]]) -> str:
    ours = model["pulsar_nack"]
    left_out = ours["leave_one_out_error"]
    rows = [[name, f"{value:.4g}"] for name, value in ours["coefficients"].items()]
    java = model["java"]
    java_rows = [[name, f"{value:.4g}"] for name, value in java.get("coefficients", {}).items()]

    shown = measured
    if len(measured) > MAX_POINT_ROWS:  # the worst out of sample
        shown = sorted(measured, key=lambda m: -abs(m["loo_error"]))[:MAX_POINT_ROWS]
    commits: dict[str, int] = {}
    for m in measured:
        commits[m.get("commit", "?")] = commits.get(m.get("commit", "?"), 0) + 1
    point_rows = [
        [
            m["point"],
            f"{m['pending']:,}",
            f"{m['measured_bytes'] / m['pending']:.2f}",
            f"{m['predicted_bytes'] / m['pending']:.2f}",
            f"{m['error']:+.0%}",
            f"{m['loo_error']:+.0%}",
        ]
        for m in shown
    ]
    return "\n\n".join(
        [
            "## The estimate's fitted models",
            "`python bench/fit_estimate.py` — `pulsar-nack estimate` predicts memory from structural "
            "features of the workload (hot, live and packed buckets, slots, ids and rows, batch members, "
            "ledgers, the arrival filter's bitmaps and batch records) with bytes-per-feature coefficients "
            "fitted (non-negative least squares, relative error) to issue 23's grid points measured as "
            "`bench/nack_memory.py` measures them (the real tracker, every nack still pending, process heap "
            "in the process's second run) and to the Java structure in fresh JVMs.",
            report.machine_line(model["machine"]),
            f"The {len(measured)} workloads' measurements, by the commit measured: "
            + ", ".join(f"{count} at {commit}" for commit, count in sorted(commits.items()))
            + " (grid points of uniform delays: due times drawn from the delay to 60 s more).",
            f"pulsar-nack: in-sample error median {ours['error']['median']:.1%}, "
            f"max {ours['error']['max']:.1%} over {ours['error']['points']} workloads. Java: "
            + (
                f"median {java['error']['median']:.1%}, max {java['error']['max']:.1%} over "
                f"{java['error']['points']} cases."
                if java.get("error")
                else "no model (no Java here)."
            ),
            report.table(["pulsar-nack feature", "bytes each"], rows),
            report.table(["Java feature", "bytes each"], java_rows) if java_rows else "",
            "Valid range: "
            + ", ".join(f"{name} {low:g}..{high:g}" for name, (low, high) in model["range"].items()),
            f"Out of sample (each point predicted by the model fitted to the others): error median "
            f"{left_out['median']:.1%}, max {left_out['max']:.1%}.",
            ("" if shown is measured else f"The {len(shown)} points predicted worst when left out:"),
            report.table(
                ["grid point", "pending", "measured B/nack", "model B/nack", "error", "left out"], point_rows
            ),
        ]
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
