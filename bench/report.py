"""Shared plumbing of the benchmarks: machine facts, JSON results, and sections of docs/performance.md.

Each benchmark owns one section of ``docs/performance.md`` between ``<!-- BEGIN name -->`` and
``<!-- END name -->`` and rewrites only that, so benchmarks can run separately.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The repository root, last on the path: the test harness (`harness`, not shipped) for the benchmarks that
# start Apache Pulsar, without shadowing the installed pulsar_nack (or a snapshot put first on the path).
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))
RESULTS = ROOT / "bench" / "results"
PERFORMANCE_MD = ROOT / "docs" / "performance.md"

_HEADER = """# Performance

Every figure here is printed and written by a benchmark in `bench/`; nothing is typed in by hand.
Each section names the command that produced it. Memory is *retained* heap measured from outside in a
fresh process (pymalloc blocks + glibc in-use chunks, see `pulsar_nack/memory.py`); MB = 10^6 bytes.
"""


def machine() -> dict[str, Any]:
    """Facts that make figures comparable: CPU, cores, Python and library versions, git commit."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for module in ("pyroaring", "sortedcontainers", "numpy", "pulsar"):
        with contextlib.suppress(ImportError, AttributeError):
            versions[module] = __import__(module).__version__
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "libraries": versions,
        "commit": commit,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def machine_line(facts: dict[str, Any]) -> str:
    libs = ", ".join(f"{k} {v}" for k, v in facts["libraries"].items())
    return (
        f"_{facts['date']}, commit {facts['commit']}: {facts['cpu']} ({facts['cores']} cores), "
        f"Python {facts['python']}, {libs}._"
    )


def save_json(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    return path


def write_section(name: str, markdown: str) -> None:
    """Replace (or append) section ``name`` of docs/performance.md."""
    PERFORMANCE_MD.parent.mkdir(parents=True, exist_ok=True)
    text = PERFORMANCE_MD.read_text() if PERFORMANCE_MD.exists() else _HEADER
    block = f"<!-- BEGIN {name} -->\n{markdown.rstrip()}\n<!-- END {name} -->"
    pattern = re.compile(rf"<!-- BEGIN {re.escape(name)} -->.*?<!-- END {re.escape(name)} -->", re.DOTALL)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else f"{text.rstrip()}\n\n{block}\n"
    PERFORMANCE_MD.write_text(text)


def table(headers: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def run_probe(script: Path, payload: dict[str, Any], timeout: float = 900) -> dict[str, Any]:
    """Run ``script --probe JSON`` in a fresh interpreter set up for heap measurement
    (``pulsar_nack.memory.MEASURING_ENV``); it prints one JSON object as its last line."""
    from pulsar_nack.memory import MEASURING_ENV

    out = subprocess.run(
        [sys.executable, str(script), "--probe", json.dumps(payload)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, **MEASURING_ENV},
    )
    if out.returncode != 0:
        raise RuntimeError(f"probe {payload} failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result
