"""Java reference measurement of the PIP-393 nack structure, run from the Python benchmarks.

Builds ``bench/java`` (a Maven project: fastutil 8.5.11 + RoaringBitmap 1.6.19) into a runnable
jar and runs one fresh JVM per case. The JVM fills
``Long2ObjectAVLTreeMap<Long2ObjectOpenHashMap<Roaring64Bitmap>>`` with the ids of
``pulsar_nack.sweep.workloads.Workload(x, n, entries_per_ledger, nack_share)`` (bucket key
``due & (-1 << k)``) and reports retained heap before/after ``runOptimize()`` and insert and drain
ns per id as one JSON object (see ``bench/java/README.md``).

Only the standard library is needed, except by :func:`self_check` / :func:`python_checksum`, which
import ``pulsar_nack.sweep.workloads`` (numpy) to compare the Java generator with the Python one.

Usage: ``python bench/java_reference.py [--check] [--quick]`` prints the blog's grid as a table.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

JAVA_DIR = Path(__file__).resolve().parent / "java"
JAR = JAVA_DIR / "target" / "pip393-memory.jar"
LIB_DIR = JAVA_DIR / "target" / "lib"
#: JVM flags of every case: with the serial collector System.gc() is a full stop-the-world
#: compaction, so "heap used after GC" is the retained size.
JVM_FLAGS: tuple[str, ...] = ("-XX:+UseSerialGC", "-Xms512m", "-Xmx4g")
ROUNDINGS = ("floor", "ceil")
#: The blog's dense grid (x ids per ms, k trimmed bits) at 10M ids and 50k entries per ledger.
DENSE_GRID: tuple[tuple[int, int], ...] = ((1, 10), (4, 10), (8, 10), (8, 15), (1, 8), (8, 8))

_BUILD_TIMEOUT_S = 900.0
_CASE_TIMEOUT_S = 300.0


def available() -> bool:
    """True when both ``java`` and ``mvn`` are on PATH."""
    return shutil.which("java") is not None and shutil.which("mvn") is not None


def _sources() -> Iterable[Path]:
    yield JAVA_DIR / "pom.xml"
    yield from (JAVA_DIR / "src").rglob("*")


def _jar_is_current() -> bool:
    if not JAR.is_file() or not LIB_DIR.is_dir():
        return False
    jar_mtime = JAR.stat().st_mtime
    return all(p.stat().st_mtime <= jar_mtime for p in _sources() if p.is_file())


def build() -> Path:
    """Build the jar with ``mvn -q package`` unless it is present and newer than its sources.

    Returns the jar path. The first build downloads the plugins and the two libraries into
    ``~/.m2``. Raises RuntimeError (with the tail of Maven's output) if Maven is missing or the
    build fails.
    """
    if _jar_is_current():
        return JAR
    mvn = shutil.which("mvn")
    if mvn is None or shutil.which("java") is None:
        raise RuntimeError("java reference: `java` and `mvn` must be on PATH")
    proc = subprocess.run(
        [mvn, "-B", "-q", "-f", str(JAVA_DIR / "pom.xml"), "package"],
        cwd=JAVA_DIR,
        capture_output=True,
        text=True,
        timeout=_BUILD_TIMEOUT_S,
        check=False,
    )
    if proc.returncode != 0 or not JAR.is_file():
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        raise RuntimeError(f"java reference: `mvn -q package` failed (exit {proc.returncode}):\n{tail}")
    # Touch the jar: a build that changed nothing (Maven keeps the old jar) still makes it current.
    os.utime(JAR)
    return JAR


def run_case(
    x: int,
    k: int,
    n: int = 10_000_000,
    entries_per_ledger: int = 50_000,
    nack_share: float = 1.0,
    rounding: str = "floor",
) -> dict[str, Any]:
    """Run one case in a fresh JVM and return the JSON object it prints.

    Keys: x, k, n, entries_per_ledger, nack_share, rounding, buckets, bitmaps, retained_bytes,
    retained_bytes_run_optimized, roaring_estimate_bytes, roaring_estimate_bytes_run_optimized,
    insert_ns_per_id, drain_ns_per_id, drain_after, heap_before_bytes, java_version, vm, gc,
    max_heap_bytes, checksum (count, threshold, last_position, sum_ledger, sum_entry, sum_due,
    weighted_entry as decimal strings of unsigned 64-bit sums, first/last as [ledger, entry, due]).

    ``rounding``: "floor" = ``due & (-1 << k)`` (Pulsar's); "ceil" = the next multiple of 2^k.
    """
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    if x < 1 or not 0 <= k <= 62 or not 0 <= n < 2**31 or entries_per_ledger < 1:
        raise ValueError(f"bad case x={x} k={k} n={n} entries_per_ledger={entries_per_ledger}")
    if not 0.0 < nack_share <= 1.0:
        raise ValueError(f"nack_share must be in (0, 1], got {nack_share}")
    jar = build()
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("java reference: `java` is not on PATH")
    # repr() of a float round-trips exactly through Double.parseDouble.
    args = [str(x), str(k), str(n), str(entries_per_ledger), repr(float(nack_share)), rounding]
    proc = subprocess.run(
        [java, *JVM_FLAGS, "-jar", str(jar), *args],
        capture_output=True,
        text=True,
        timeout=_CASE_TIMEOUT_S,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
        raise RuntimeError(f"java reference case {args} failed (exit {proc.returncode}):\n{tail}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def python_checksum(
    x: int, n: int, entries_per_ledger: int = 50_000, nack_share: float = 1.0
) -> dict[str, Any]:
    """The checksum the Java program prints, computed with ``pulsar_nack.sweep.workloads`` (numpy)."""
    repo_root = str(JAVA_DIR.parent.parent)
    if repo_root not in sys.path:
        sys.path.insert(0, repo_root)
    import numpy as np

    from pulsar_nack.sweep.workloads import Workload

    w = Workload(x=x, n=n, entries_per_ledger=entries_per_ledger, nack_share=nack_share)
    due, ledgers, entries = w.generate()
    u64 = np.uint64
    with np.errstate(over="ignore"):
        weights = np.arange(1, n + 1, dtype=u64)
        weighted = int(np.sum(weights * entries.astype(u64), dtype=u64))

    def triples(sl: slice) -> list[list[int]]:
        return [[int(a), int(b), int(c)] for a, b, c in zip(ledgers[sl], entries[sl], due[sl], strict=True)]

    threshold = "dense" if nack_share >= 1.0 else str(min(int(nack_share * 2.0**64), 2**64 - 1))
    return {
        "count": n,
        "threshold": threshold,
        "last_position": int(w.stream_positions()[-1]) if n else -1,
        "sum_ledger": str(int(np.sum(ledgers.astype(u64), dtype=u64))),
        "sum_entry": str(int(np.sum(entries.astype(u64), dtype=u64))),
        "sum_due": str(int(np.sum(due.astype(u64), dtype=u64))),
        "weighted_entry": str(weighted),
        "first": triples(slice(0, 3)),
        "last": triples(slice(max(n - 3, 0), n)),
    }


def self_check(
    cases: Iterable[tuple[int, int, int, float]] = (
        (1, 1_000_000, 50_000, 1.0),
        (3, 1_000_003, 7_777, 1.0),
        (8, 1_000_000, 50_000, 0.1),
        (5, 300_001, 1_000, 0.37),
    ),
) -> None:
    """Check that the Java generator yields exactly the ids of ``Workload.generate()``.

    ``cases``: (x, n, entries_per_ledger, nack_share). Raises AssertionError on any difference.
    """
    for x, n, epl, share in cases:
        java = run_case(x, 10, n, epl, share)["checksum"]
        python = python_checksum(x, n, epl, share)
        if java != python:
            raise AssertionError(f"java/python ids differ for {(x, n, epl, share)}:\n{java}\n{python}")


def _row(r: dict[str, Any]) -> str:
    mb = 1e6
    return (
        f"| {r['x']},{r['k']} | {r['nack_share']:g} | {r['buckets']} | {r['bitmaps']} "
        f"| {r['retained_bytes'] / mb:.2f} | {r['retained_bytes'] / r['n']:.2f} "
        f"| {r['retained_bytes_run_optimized'] / mb:.2f} | {r['roaring_estimate_bytes'] / mb:.2f} "
        f"| {r['roaring_estimate_bytes_run_optimized'] / mb:.2f} "
        f"| {r['insert_ns_per_id']:.0f} | {r['drain_ns_per_id']:.1f} |"
    )


def main(argv: list[str]) -> int:
    if not available():
        print("java and mvn are not on PATH", file=sys.stderr)
        return 1
    build()
    if "--check" in argv:
        self_check()
        print("self_check: Java ids == pulsar_nack.sweep.workloads ids")
    n = 1_000_000 if "--quick" in argv else 10_000_000
    print(
        "| x,k | share | buckets | bitmaps | retained MB | B/id | runOptimize MB | roaring est MB "
        "| est. optimized MB | insert ns/id | drain ns/id |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for x, k in DENSE_GRID:
        print(_row(run_case(x, k, n)), flush=True)
    print(_row(run_case(8, 10, n, nack_share=0.1)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
