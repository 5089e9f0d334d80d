"""bench/spark_sweep.py writes docs/sweep.md's figures from its results file: the section in the docs is
what the file computes to (a hand edit, or a rerun that left the docs behind, fails here), and the text
reads its numbers from the rows, not from the page."""

from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# bench/ is a directory of scripts that import each other by name, as `python bench/x.py` lets them.
sys.path.append(str(REPO / "bench"))

import spark_sweep  # noqa: E402

from pulsar_nack.sweep.java_results import default_java_results, load_java_results  # noqa: E402

RESULTS = REPO / "bench" / "results" / "spark_sweep.json"


def _java() -> Any:
    path = default_java_results()
    return None if path is None else load_java_results(path)


def _section() -> str:
    text = (REPO / "docs" / "sweep.md").read_text()
    found = re.search(r"<!-- BEGIN sweep-figures -->\n(.*?)\n<!-- END sweep-figures -->", text, re.DOTALL)
    assert found, "docs/sweep.md has its generated sweep-figures section"
    return found.group(1)


def test_docs_sweep_figures_are_those_of_the_results_file() -> None:
    results = json.loads(RESULTS.read_text())
    assert _section() == spark_sweep.sweep_doc(results, _java()).rstrip()


def test_the_figures_follow_the_rows() -> None:
    """Doubling one point's retained bytes moves the figures that derive from it."""
    results = json.loads(RESULTS.read_text())
    before = spark_sweep.sweep_doc(results, _java())
    changed = copy.deepcopy(results)
    row = next(r for r in changed["rows"] if (r["contender"], r["x"], r["k"]) == ("index", 1, 0))
    row["retained_bytes"] *= 2
    row["bytes_per_id"] *= 2
    after = spark_sweep.sweep_doc(changed, _java())
    assert after != before
    assert f"{row['bytes_per_id']:.3g} B per id against" in after
