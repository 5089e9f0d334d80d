"""Shared plumbing of the benchmarks: machine facts, JSON results, sections of docs/performance.md, a probe
in a fresh interpreter (:func:`run_probe`), and the brokers and clients the broker
benchmarks run (:func:`brokers`, :func:`client`).

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


def rounding_note(results: dict[str, Any], precision_bits: int) -> str:
    """How the wrapper rounded bucket times in a results file: its ``rounding`` (a file written before it
    was recorded ran floor rounding) at its ``precision_bits`` (this one if the file does not say)."""
    k = results.get("precision_bits", precision_bits)
    if results.get("rounding", "floor") == "floor":
        return f"floor rounding: up to {2**k} ms early by design"
    return "ceil rounding: never early"


def run_probe(
    script: Path | str,
    payload: Any,
    timeout: float = 900,
    env: dict[str, str | None] | None = None,
    measuring: bool = True,
    flag: str = "--probe",
) -> dict[str, Any]:
    """Run ``script --probe JSON(payload)`` in a fresh interpreter from the repository root and return the
    JSON object its last line prints; RuntimeError with the tail of its stderr if it fails.

    The environment is this process's, set up for heap measurement (``pulsar_nack.memory.MEASURING_ENV``)
    unless ``measuring`` is false, then ``env`` on top (a None value removes the variable)."""
    from pulsar_nack.memory import MEASURING_ENV

    child_env = {**os.environ, **(MEASURING_ENV if measuring else {})}
    for name, value in (env or {}).items():
        if value is None:
            child_env.pop(name, None)
        else:
            child_env[name] = value
    out = subprocess.run(
        [sys.executable, str(script), flag, json.dumps(payload)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=child_env,
    )
    if out.returncode != 0:
        raise RuntimeError(f"probe {payload} failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


#: The two consumers the broker benchmarks compare: the official client's and pulsar-nack's.
KINDS = ("native", "wrapper")


def client(kind: str, service_url: str) -> Any:
    """A ``pulsar.Client`` (``kind`` ``native``) or a ``pulsar_nack.Client`` (``wrapper``) on
    ``service_url``, logging errors only."""
    import pulsar

    import pulsar_nack

    client_type = pulsar.Client if kind == "native" else pulsar_nack.Client
    return client_type(
        service_url, operation_timeout_seconds=30, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )


def brokers(names: list[str]) -> list[tuple[str, Any]]:
    """The brokers ``--brokers`` names (``lite``, ``apache``) as (label, class) pairs; Apache Pulsar is
    skipped, saying why on stderr, where it cannot run. SystemExit for an unknown name."""
    from harness.maven import apache_pulsar_available
    from harness.standalone import PulsarStandalone
    from pulsar_nack.testing import PulsarLite

    found: list[tuple[str, Any]] = []
    for name in names:
        if name == "lite":
            found.append(("pulsar-lite", PulsarLite))
        elif name == "apache":
            ok, reason = apache_pulsar_available()
            if ok:
                found.append(("Apache Pulsar", PulsarStandalone))
            else:
                print(f"Apache Pulsar skipped: {reason}", file=sys.stderr)
        else:
            raise SystemExit(f"--brokers: unknown broker {name!r} (lite, apache)")
    return found
