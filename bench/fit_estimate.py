"""Fit ``pulsar-nack estimate``'s models to measurements, and write them with the range they hold for.

* **pulsar-nack** — ``pulsar_nack.profile.profile`` (fresh processes, the real tracker) on a grid of
  workloads, half in steady state (duration = delay + the arrival filter's linger + 5 s), half with a 1 h
  delay counted after 20 or 60 s (nothing due yet): rate, delay, precision
  bits, batch size, nack share, topics and entries per ledger varied over seeded picks of a grid plus its
  corners; target = the process-level measure (``PYTHONMALLOC=malloc`` + mallinfo2).
* **Java** — the PIP-393 structure (``bench/java``, a fresh JVM per case) on the blog's workload over x,
  k, nack share, ids and entries per ledger; target = retained heap as built (no runOptimize: the Java
  client does not run it).
* **native** — the native client's bytes per pending nack as ``bench/nack_lateness.py`` measured them
  (``pulsar_nack/data/native_nack_cost.json``, read at estimate time, not copied into the fit; every
  native nack is its own node).

Coefficients come from non-negative least squares on relative errors (``pulsar_nack.estimate``); the
in-sample errors are written beside them.

    python bench/fit_estimate.py [--points 36] [--no-java]

Writes ``pulsar_nack/data/estimate_fit.json`` (the package's model), ``bench/results/estimate_fit.json``
(the same plus every measured point) and the ``estimate-fit`` section of docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from typing import Any

import report
from tqdm import tqdm

from pulsar_nack.estimate import (
    FEATURES,
    JAVA_FEATURES,
    Scenario,
    features,
    fit_linear,
    java_features,
    predict,
    range_key,
)
from pulsar_nack.profile import Delay, Workload, profile

PACKAGE_FIT = report.ROOT / "pulsar_nack" / "data" / "estimate_fit.json"
GRID: dict[str, list[Any]] = {
    "rate": [500.0, 2_000.0, 6_000.0, 12_000.0],
    "delay_ms": [5_000.0, 20_000.0],
    "precision_bits": [4, 8, 12],
    "batch_size": [1, 1, 10, 100],
    "nack_share": [1.0, 0.3, 0.02],
    "topics": [1, 1, 10, 50],
    "entries_per_ledger": [50_000, 50_000, 5_000],
}
CORNERS: list[dict[str, Any]] = [
    {"rate": 6_000.0, "delay_ms": 20_000.0, "precision_bits": 8, "batch_size": 1, "nack_share": 1.0,
     "topics": 1, "entries_per_ledger": 50_000},
    {"rate": 500.0, "delay_ms": 5_000.0, "precision_bits": 4, "batch_size": 1, "nack_share": 1.0,
     "topics": 1, "entries_per_ledger": 50_000},
    {"rate": 6_000.0, "delay_ms": 20_000.0, "precision_bits": 12, "batch_size": 100, "nack_share": 0.02,
     "topics": 50, "entries_per_ledger": 5_000},
    {"rate": 2_000.0, "delay_ms": 20_000.0, "precision_bits": 8, "batch_size": 1, "nack_share": 0.3,
     "topics": 10, "entries_per_ledger": 50_000},
    {"rate": 20_000.0, "delay_ms": 10_000.0, "precision_bits": 8, "batch_size": 1, "nack_share": 1.0,
     "topics": 1, "entries_per_ledger": 50_000},
    {"rate": 20_000.0, "delay_ms": 10_000.0, "precision_bits": 10, "batch_size": 10, "nack_share": 0.1,
     "topics": 10, "entries_per_ledger": 50_000},
    # long delays, counted before anything falls due (pending = rate × share × duration)
    {"rate": 10_000.0, "delay_ms": 3_600_000.0, "precision_bits": 8, "batch_size": 1, "nack_share": 1.0,
     "topics": 1, "entries_per_ledger": 50_000, "duration_ms": 60_000.0},
    {"rate": 10_000.0, "delay_ms": 3_600_000.0, "precision_bits": 8, "batch_size": 100, "nack_share": 0.01,
     "topics": 1, "entries_per_ledger": 50_000, "duration_ms": 60_000.0},
    {"rate": 5_000.0, "delay_ms": 3_600_000.0, "precision_bits": 10, "batch_size": 1, "nack_share": 1.0,
     "topics": 100, "entries_per_ledger": 50_000, "duration_ms": 60_000.0},
    {"rate": 5_000.0, "delay_ms": 3_600_000.0, "precision_bits": 15, "batch_size": 1, "nack_share": 0.2,
     "topics": 1, "entries_per_ledger": 50_000, "duration_ms": 60_000.0},
]  # fmt: skip
JAVA_GRID: list[tuple[int, int, float, int, int]] = [  # x, k, share, n, entries per ledger
    (x, k, share, n, epl)
    for x, k in ((1, 4), (1, 10), (4, 8), (8, 10), (8, 15), (1, 8), (8, 4))
    for share, n, epl in ((1.0, 200_000, 50_000), (0.3, 100_000, 50_000), (1.0, 60_000, 5_000))
]


def linger_s() -> float:
    from pulsar_nack.estimate import tracker_default

    return tracker_default("linger_ms") / 1_000


def points(count: int, seed: int = 13) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    picked = list(CORNERS)
    while len(picked) < count:
        point = {name: rng.choice(values) for name, values in GRID.items()}
        if rng.random() < 0.5:  # a long delay, counted before anything falls due: the planner's usual case
            point |= {"delay_ms": 3_600_000.0, "duration_ms": rng.choice([20_000.0, 60_000.0])}
        if point not in picked:
            picked.append(point)
    return picked


def _duration_ms(point: dict[str, Any]) -> float:
    """The point's own duration, else steady state: the delay, the linger and 5 s more."""
    duration: float = point.get("duration_ms", point["delay_ms"] + (linger_s() + 5) * 1_000)
    return duration


def _workload(point: dict[str, Any]) -> Workload:
    delay = point["delay_ms"]
    return Workload(
        rate=point["rate"],
        delay=Delay("fixed", delay, delay),
        duration_s=_duration_ms(point) / 1_000,
        topics=point["topics"],
        batch_size=point["batch_size"],
        nack_share=point["nack_share"],
        precision_bits=point["precision_bits"],
        entries_per_ledger=point["entries_per_ledger"],
    )


def scenario(point: dict[str, Any]) -> Scenario:
    """The estimate's view of a grid point: the same workload, run for as long as the profile ran it."""
    return Scenario(**{**point, "duration_ms": _duration_ms(point)})


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


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=36, help="pulsar-nack workloads (default: 36)")
    parser.add_argument("--no-java", action="store_true", help="keep the Java model of the last fit")
    parser.add_argument(
        "--refit",
        action="store_true",
        help="fit again to the measurements in bench/results/estimate_fit.json (no new runs)",
    )
    args = parser.parse_args(argv)
    if args.points < len(CORNERS):
        parser.error(f"--points: at least {len(CORNERS)}")
    earlier = json.loads((report.RESULTS / "estimate_fit.json").read_text()) if args.refit else None
    grid = [] if earlier else points(args.points)
    measured: list[dict[str, Any]] = earlier["measured"] if earlier else []
    for point in tqdm(grid, unit="workload", file=sys.stderr, desc="pulsar-nack"):
        result = profile(_workload(point), java=False, measures=("malloc",))
        measured.append({
            "point": point,
            "malloc_bytes": result.memory["malloc"],
            "reported_bytes": result.memory["reported"],
            "pending": result.pending,
            "buckets": result.buckets,
            "slots": result.slots,
            "ledgers": result.ledgers,
        })  # fmt: skip
    rows = [features(scenario(m["point"])) for m in measured]
    targets = [float(m["malloc_bytes"]) for m in measured]
    coefficients = fit_linear(rows, targets, FEATURES)
    predicted = [predict(coefficients, row) for row in rows]
    for m, p, row in zip(measured, predicted, rows, strict=True):
        m["predicted_bytes"], m["features"] = p, row
    keys = [range_key(scenario(m["point"])) for m in measured]
    ranges = {name: [min(k[name] for k in keys), max(k[name] for k in keys)] for name in keys[0]}

    java: dict[str, Any] = {}
    if earlier:
        java_points = earlier["java_points"]
        java = _fit_java(java_points) if java_points else {}
    elif args.no_java:
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
    facts = earlier["machine"] if earlier else report.machine()  # when the measurements were taken
    now = report.machine()
    model = {
        "machine": facts,
        "fitted": {"date": now["date"], "commit": now["commit"]},
        "range": ranges,
        "pulsar_nack": {
            "coefficients": coefficients,
            "error": _errors(predicted, targets),
            "target": "profile's process-level measure (PYTHONMALLOC=malloc + mallinfo2), steady state",
        },
        "java": {k: v for k, v in java.items() if k != "points"},
    }
    PACKAGE_FIT.write_text(json.dumps(model, indent=2, sort_keys=True) + "\n")
    report.save_json("estimate_fit", {**model, "measured": measured, "java_points": java.get("points", [])})
    text = render(model, measured)
    report.write_section("estimate-fit", text)
    print(text)
    return 0


def render(model: dict[str, Any], measured: list[dict[str, Any]]) -> str:
    ours = model["pulsar_nack"]
    rows = [[name, f"{value:.4g}"] for name, value in ours["coefficients"].items()]
    java = model["java"]
    java_rows = [[name, f"{value:.4g}"] for name, value in java.get("coefficients", {}).items()]
    point_rows = [
        [
            f"{m['point']['rate']:g}/s, {m['point']['delay_ms'] / 1000:g} s"
            + (f" (for {m['point']['duration_ms'] / 1000:g} s)" if "duration_ms" in m["point"] else "")
            + f", k={m['point']['precision_bits']}, "
            f"b={m['point']['batch_size']}, share={m['point']['nack_share']:g}, T={m['point']['topics']}, "
            f"epl={m['point']['entries_per_ledger']:,}",
            f"{m['pending']:,}",
            f"{m['malloc_bytes'] / 1e6:.3f}",
            f"{m['predicted_bytes'] / 1e6:.3f}",
            f"{m['predicted_bytes'] / m['malloc_bytes'] - 1:+.0%}",
        ]
        for m in measured
    ]
    return "\n\n".join(
        [
            "## The estimate's fitted models",
            "`python bench/fit_estimate.py` — `pulsar-nack estimate` predicts steady-state memory from "
            "structural features of the workload (buckets, slots, Roaring containers and payload, ledgers, "
            "batch entries, forwards remembered for the linger) with bytes-per-feature coefficients fitted "
            "(non-negative least squares, relative error) to `pulsar-nack profile` runs (process-level, "
            "system allocator) and to the Java structure in fresh JVMs.",
            report.machine_line(model["machine"]),
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
            report.table(["workload", "pending", "measured MB", "model MB", "error"], point_rows),
        ]
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
