"""The Java PIP-393 structure's memory, read from the results file the benchmark wrote.

``bench/index_memory.py`` runs the Java reference (``bench/java_reference.py``: fastutil AVL map → open
hash map → ``Roaring64Bitmap`` in a fresh JVM per case) on the blog's workload and writes
``bench/results/index_memory.json``: a ``machine`` block (date, CPU, cores, commit, versions) and, per case,
a ``java`` object with the workload (``x``, ``k``, ``n``, ``entries_per_ledger``, ``nack_share``,
``rounding``) and the retained heap without and with ``runOptimize`` (``retained_bytes``,
``retained_bytes_run_optimized``). :func:`load_java_results` reads those figures — and nothing else:
the sweep draws no Java figure that is not in such a file. Runs on the driver only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pulsar_nack.shipped import repository_file
from pulsar_nack.sweep.measure import Row, number

__all__ = [
    "DEFAULT_JAVA_RESULTS",
    "HOW_TO_PRODUCE",
    "JavaCase",
    "JavaResults",
    "JavaResultsError",
    "default_java_results",
    "load_java_results",
]

#: Where ``bench/index_memory.py`` writes its results, in a source checkout of this repository (the
#: package's grandparent folder); an installed package carries a copy (:func:`default_java_results`).
DEFAULT_JAVA_RESULTS: Final = Path(__file__).resolve().parents[2] / "bench" / "results" / "index_memory.json"

#: How to produce the file, for reports drawn without one.
HOW_TO_PRODUCE: Final = (
    "run `python bench/index_memory.py` in a checkout of the repository (needs Java 17 and Maven; writes "
    "`bench/results/index_memory.json`) and pass that file with `--java-results`"
)


class JavaResultsError(ValueError):
    """A Java results file that cannot be read or lacks the figures; the message names the file."""


@dataclass(frozen=True)
class JavaCase:
    """One workload the Java structure was measured on, and its retained heap (bytes)."""

    x: int
    k: int
    n: int
    entries_per_ledger: int
    nack_share: float
    rounding: str
    retained_bytes: int
    retained_bytes_run_optimized: int

    def per_id(self, run_optimized: bool) -> float:
        """Retained bytes per id, without or with ``runOptimize``."""
        retained = self.retained_bytes_run_optimized if run_optimized else self.retained_bytes
        return retained / self.n


@dataclass(frozen=True)
class JavaResults:
    """The Java cases of one results file, with where and when they were measured."""

    path: Path
    date: str
    machine: str
    commit: str
    jvm: str
    cases: tuple[JavaCase, ...]

    def case_for(self, row: Row) -> JavaCase | None:
        """The case measured on ``row``'s workload (same x, k, entries per ledger, nack share and
        rounding, unbatched), or None. O(cases)."""
        if row.get("batch", 1) != 1:
            return None
        for case in self.cases:
            same = (case.x, case.k) == (int(number(row["x"])), int(number(row["k"])))
            same = same and case.entries_per_ledger == int(number(row["entries_per_ledger"]))
            same = same and case.nack_share == number(row["nack_share"]) and case.rounding == row["rounding"]
            if same:
                return case
        return None

    def provenance(self) -> str:
        """One sentence: the file, its date, machine, JVM and commit, the ids per case."""
        sizes = sorted({case.n for case in self.cases})
        ids = " / ".join(f"{n:,}" for n in sizes)
        return (
            f"Java figures from `{self.path}`, measured {self.date} on {self.machine} ({self.jvm}, commit "
            f"{self.commit}), {ids} ids per case"
        )


def default_java_results() -> Path | None:
    """:data:`DEFAULT_JAVA_RESULTS` if it exists (a source checkout that ran the benchmark), else the copy
    the wheel and sdist carry (:mod:`pulsar_nack.shipped`), else None."""
    return repository_file("bench/results/index_memory.json")


def load_java_results(path: Path) -> JavaResults:
    """The Java cases of a results file of ``bench/index_memory.py``. O(file).

    Cases the benchmark ran without Java (``--no-java``) have no ``java`` object and are skipped; a file
    with none at all, unreadable JSON or a case missing a figure raises :class:`JavaResultsError`.
    """
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise JavaResultsError(f"Java results {path}: cannot read it: {error}") from None
    try:
        machine = data["machine"]
        java = [case["java"] for case in data["cases"].values() if "java" in case]
        cases = [_case(figures) for figures in java]
        described = f"{machine['cpu']} ({machine['cores']} cores)"
        date, commit = str(machine["date"]), str(machine["commit"])
        jvms = ", ".join(sorted({str(figures.get("vm", "JVM")) for figures in java}))
    except (KeyError, TypeError, AttributeError, ValueError) as error:
        raise JavaResultsError(
            f"Java results {path}: not a results file of bench/index_memory.py ({error!r})"
        ) from None
    if not cases:
        raise JavaResultsError(f"Java results {path}: no case has Java figures (was it run with --no-java?)")
    return JavaResults(path, date, described, commit, jvms, tuple(cases))


def _case(java: dict[str, Any]) -> JavaCase:
    case = JavaCase(
        x=int(java["x"]),
        k=int(java["k"]),
        n=int(java["n"]),
        entries_per_ledger=int(java["entries_per_ledger"]),
        nack_share=float(java["nack_share"]),
        rounding=str(java["rounding"]),
        retained_bytes=int(java["retained_bytes"]),
        retained_bytes_run_optimized=int(java["retained_bytes_run_optimized"]),
    )
    if case.n <= 0:
        raise ValueError(f"n must be > 0, got {case.n}")
    return case
