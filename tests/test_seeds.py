"""bench/seeds.py's PIP-195 section: the article's figures beside ours, read from the tracker models'
results file (bench/results/broker_trackers.json) — never typed in, and docs/seeds.md is what it renders."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
TRACKERS = REPO / "bench" / "results" / "broker_trackers.json"


@pytest.fixture(scope="module")
def seeds() -> ModuleType:
    """bench/seeds.py as a module (it imports bench/report.py as ``report``)."""
    sys.path.insert(0, str(REPO / "bench"))
    try:
        spec = importlib.util.spec_from_file_location("bench_seeds", REPO / "bench" / "seeds.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(REPO / "bench"))


def _cells(lines: list[str], figure: str) -> list[str]:
    """The cells of the table row whose first cell starts with ``figure``."""
    table = "\n".join(lines).splitlines()
    rows = [line.strip("|").split(" | ") for line in table if line.startswith(f"| {figure}")]
    assert len(rows) == 1, f"one row for {figure!r}, got {len(rows)}"
    return [cell.strip() for cell in rows[0]]


def test_every_figure_of_the_article_has_a_measured_row(seeds: ModuleType) -> None:
    trackers = seeds.load_trackers(TRACKERS)
    lines = seeds.pip195_section(trackers)
    text = "\n".join(lines)
    assert "pending" not in text
    rows = json.loads(TRACKERS.read_text())["rows"]
    oom = min((r for r in rows if r["oom_at"] is not None), key=lambda r: r["oom_at"])
    buckets = max((r for r in rows if r["model"] == "buckets"), key=lambda r: r["held"])
    memory = _cells(lines, "in-memory tracker, memory at 35,000,000")
    assert memory[1] == "847 MB of direct memory" and memory[3] == "– (a)"
    assert _cells(lines, "in-memory tracker, out of memory at")[2].startswith(f"{oom['oom_at']:,} messages")
    assert _cells(lines, "in-memory tracker, recovery of 35M")[1] == "6,120 s"
    held = _cells(lines, "bucket tracker, 100M delayed messages")
    assert held[2].startswith(f"{buckets['held']:,} held") and f"{buckets['bytes_per_id']:.2f} B" in held[2]
    recovery = _cells(lines, "bucket tracker, recovery of 100M")
    assert recovery[1] == "90 s" and recovery[2].startswith(f"{buckets['recovery_s']:,.1f} s")
    assert recovery[4] == f"{buckets['recovery_s'] / 90:.2f}"
    assert "No Java figure" in text  # the Java column says why it is empty


def test_the_figures_follow_the_results_file(seeds: ModuleType) -> None:
    trackers: dict[str, Any] = copy.deepcopy(seeds.load_trackers(TRACKERS))
    for row in trackers["rows"]:
        if row["model"] == "buckets":
            row["recovery_s"] = 45.0
        if row["oom_at"] is not None:
            row["oom_at"] = row["held"] = 12_345_678
    lines = seeds.pip195_section(trackers)
    assert _cells(lines, "bucket tracker, recovery of 100M")[4] == "0.50"
    out_of_memory = _cells(lines, "in-memory tracker, out of memory at")
    assert out_of_memory[2].startswith("12,345,678 messages") and out_of_memory[4] == "0.35"


def test_without_the_results_file_it_says_how_to_make_it(seeds: ModuleType, tmp_path: Path) -> None:
    assert seeds.load_trackers(tmp_path / "missing.json") is None
    text = "\n".join(seeds.pip195_section(None))
    assert "python bench/broker_trackers.py" in text and "|" not in text


def test_the_committed_document_is_what_the_bench_renders(seeds: ModuleType) -> None:
    section = "\n".join(seeds.pip195_section(seeds.load_trackers(TRACKERS)))
    assert section in (REPO / "docs" / "seeds.md").read_text()
