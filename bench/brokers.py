"""Benchmark: what the two test brokers cost — start, restart and stop times, memory, download size.

For pulsar-lite (the embedded default) and Apache Pulsar standalone (from Maven Central, `harness/broker/`):
``rounds`` cold starts in fresh data folders, a restart (same data) and a stop each; resident memory after
start (VmRSS of the broker's PID); for Apache Pulsar the size of its resolved classpath — the jars the
first run downloads into ~/.m2.

    python bench/brokers.py [--rounds 3]

Writes ``bench/results/brokers.json`` and the ``brokers`` section of docs/performance.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import report
from tqdm import tqdm


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def measure(broker_type: Any, rounds: int) -> dict[str, Any]:
    samples: dict[str, list[float]] = {"start_s": [], "restart_s": [], "stop_s": [], "rss_mb": []}
    for _ in tqdm(range(rounds), desc=broker_type.__name__, file=sys.stderr):
        broker = broker_type()
        started = time.perf_counter()
        broker.start()
        samples["start_s"].append(time.perf_counter() - started)
        assert broker.pid is not None
        samples["rss_mb"].append(rss_mb(broker.pid))
        started = time.perf_counter()
        broker.restart()
        samples["restart_s"].append(time.perf_counter() - started)
        started = time.perf_counter()
        broker.stop()
        samples["stop_s"].append(time.perf_counter() - started)
    return {
        name: {"median": statistics.median(v), "min": min(v), "max": max(v)} for name, v in samples.items()
    }


def classpath_size(project: Path) -> dict[str, Any]:
    from harness.maven import classpath_file

    entries = [Path(p) for p in classpath_file(project).read_text().strip().split(":") if p]
    jars = [p for p in entries if p.suffix == ".jar" and p.is_file()]
    return {"jars": len(jars), "bytes": sum(p.stat().st_size for p in jars)}


def main(argv: list[str]) -> int:
    from harness.maven import apache_pulsar_available, default_maven_project
    from harness.standalone import PulsarStandalone
    from pulsar_nack.testing import PulsarLite

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    results: dict[str, Any] = {
        "machine": report.machine(),
        "brokers": {"pulsar-lite": measure(PulsarLite, args.rounds)},
    }
    ok, reason = apache_pulsar_available()
    if ok:
        results["brokers"]["Apache Pulsar"] = measure(PulsarStandalone, args.rounds)
        results["apache_classpath"] = classpath_size(default_maven_project())
    else:
        results["apache_skipped"] = reason
    report.save_json("brokers", results)
    markdown = render(results)
    report.write_section("brokers", markdown)
    print(markdown)
    return 0


def render(results: dict[str, Any]) -> str:
    def cell(figures: dict[str, float], unit: str, digits: int) -> str:
        return (
            f"{figures['median']:.{digits}f} {unit} ({figures['min']:.{digits}f}–{figures['max']:.{digits}f})"
        )

    rows = [
        [name, cell(f["start_s"], "s", 2), cell(f["restart_s"], "s", 2), cell(f["stop_s"], "s", 2),
         cell(f["rss_mb"], "MB", 0)]
        for name, f in results["brokers"].items()
    ]  # fmt: skip
    parts = [
        "## The test brokers",
        "",
        "`python bench/brokers.py` — median (min–max) over fresh starts; RSS of the broker process right "
        "after it is ready.",
        "",
        report.machine_line(results["machine"]),
        "",
        report.table(["broker", "start", "restart (same data)", "stop", "memory (RSS)"], rows),
    ]
    if "apache_classpath" in results:
        classpath = results["apache_classpath"]
        parts += [
            "",
            f"Apache Pulsar's first run downloads its classpath into ~/.m2: {classpath['jars']} jars, "
            f"{classpath['bytes'] / 1e6:.0f} MB (plus Maven's own plugins); later runs read the cached "
            "`harness/broker/target/classpath.txt` and start without Maven.",
        ]
    else:
        parts += ["", f"Apache Pulsar not measured: {results['apache_skipped']}"]
    return "\n".join(parts)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
