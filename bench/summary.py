"""The README's comparison table, generated from the benchmarks' result files (nothing typed in).

Reads ``bench/results/{nack_memory,nack_lateness,nack_path,consumer_cost,batch_drain}.json`` and rewrites
the block between ``<!-- BEGIN comparison -->`` and ``<!-- END comparison -->`` in README.md. Each row
names the benchmark (and the commit and date it ran at) that measured it.

    python bench/summary.py
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import report

README = report.ROOT / "README.md"


def _load(name: str) -> dict[str, Any] | None:
    path = report.RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _stamp(data: dict[str, Any]) -> str:
    facts = data["machine"]
    return f"{facts['date'][:10]}, {facts['commit']}"


def _shape(point: dict[str, Any]) -> str:
    """A grid point of bench/nack_memory.py in words."""
    batch = "not batched" if point["batch"] == 1 else f"batches of {point['batch']}"
    delay = point["delay_s"]
    delay_text = f"{delay // 3600} h" if delay >= 3600 else f"{delay} s"
    if point["spread"] != "fixed":
        delay_text += " + up to 60 s"
    return (
        f"{point['topics']:,} topic{'s' if point['topics'] > 1 else ''}, {batch}, "
        f"{point['share']:.0%} nacked, {delay_text}, k = {point['k']}"
    )


def rows() -> list[list[str]]:
    out: list[list[str]] = []
    lateness, memory = _load("nack_lateness"), _load("nack_memory")
    whole = _load("nack_memory_grid")  # the run of the whole grid (--extra grid --all --resume), if further
    if whole and (not memory or whole["summary"]["points"] > memory["summary"]["points"]):
        memory = whole
    native_bytes = None
    if lateness:
        natives = [b["memory"]["native"]["bytes_per_nack"] for b in lateness["brokers"].values()]
        native_bytes = max(natives)
    if memory:
        totals = memory["summary"]
        native = memory.get("native_bytes_per_nack") or native_bytes
        grid = f"{totals['points']} of {memory['grid_points']} grid points"
        picks = [
            ("worst", totals["worst"]["measured_per_nack"], f" ({_shape(totals['worst'])})"),
            ("median", totals["median_per_nack"], ""),
            ("best", totals["best"]["measured_per_nack"], f" ({_shape(totals['best'])})"),
        ]
        for label, ours, shape in picks:
            ratio = ""
            if native and ours > 0:
                ratio = f" — {native / ours:.0f}× less" if ours < native else f" — {ours / native:.2f}× MORE"
            out.append([
                f"memory per pending nack, {label} of {grid}{shape}",
                f"{native:.0f} B" if native else "–",
                f"{ours:.1f} B{ratio}",
                f"nack_memory, nack_lateness ({_stamp(memory)})",
            ])
    if lateness:
        steady = [
            row for b in lateness["brokers"].values() for row in b["lateness"] if row["pattern"] == "steady"
        ]
        longest = max(row["delay_ms"] for row in steady)
        rows_at = [row for row in steady if row["delay_ms"] == longest]
        native_p99 = max(row["native"]["p99"] for row in rows_at)
        wrapper_p99 = max(row["wrapper"]["p99"] for row in rows_at)
        k = lateness["precision_bits"]
        every = [row["wrapper"] for b in lateness["brokers"].values() for row in b["lateness"]]
        mins = [w["min"] for w in every if w.get("min") is not None]
        early = sum(w.get("early", 0) for w in every) if all("early" in w for w in every) else None
        earliest = ""
        if mins:
            count = f"{early} early, " if early is not None else ""
            earliest = f"; every delay and pattern: {count}earliest {min(mins):+.1f} ms"
        out.append([
            f"lateness p99, steady stream of nacks, {longest / 1000:g} s delay",
            f"{native_p99 / 1000:.1f} s late",
            f"{wrapper_p99:+.1f} ms (k = {k}, {report.rounding_note(lateness, k)}{earliest})",
            f"nack_lateness ({_stamp(lateness)})",
        ])
    if lateness:
        costs = [b["call_cost_us"] for b in lateness["brokers"].values()]
        out.append([
            "`negative_acknowledge` of a non-batched message",
            f"{min(c['native'] for c in costs):.1f}–{max(c['native'] for c in costs):.1f} µs",
            f"{min(c['wrapper'] for c in costs):.1f}–{max(c['wrapper'] for c in costs):.1f} µs",
            f"nack_lateness ({_stamp(lateness)})",
        ])
    path = _load("nack_path")
    if path:
        nacks = [r["nack_us"] for r in path["rows"]]
        native = path["rows"][0]["native_nack_us"]
        checks = [r["arrival_check_us"] for r in path["rows"]]
        buckets = f"{path['rows'][0]['buckets']:,}–{path['rows'][-1]['buckets']:,}"
        out.append([
            f"batched `negative_acknowledge`, {buckets} pending buckets in the ledger",
            f"{native:.1f} µs",
            f"{min(nacks):.1f}–{max(nacks):.1f} µs; arrival check {max(checks):.1f} µs, flat",
            f"nack_path ({_stamp(path)})",
        ])
    for name, how in (("consumer_cost", ""), ("consumer_cost_fast", ", `fast_receive=True`")):
        cost = _load(name)
        if cost:
            out.extend(_cost_rows(cost, name, how))
    drain = _load("batch_drain")
    if drain:
        for label, result in drain["results"].items():
            ok = not (result["handout_errors"] or result["handed_out_after_ack"])
            ok = ok and not result["leftovers_for_a_fresh_consumer"] and result["drained"]
            out.append([
                f"{result['messages']:,} messages in batches of 10, 1 nacked per batch ({label})",
                "the whole batch again per nack",
                f"{'each message once per nack, drained' if ok else 'FAILED'} in {result['drain_s']:.0f} s",
                f"batch_drain ({_stamp(drain)})",
            ])
    return out


def _cost_rows(cost: dict[str, Any], name: str, how: str) -> list[list[str]]:
    """README rows of a consumer_cost results file: one per producer batch size."""
    out: list[list[str]] = []
    # one row per producer batch size, so that nobody reads one batch size's ratio for another's
    ratios: dict[int, list[tuple[float, str]]] = {}
    loads: dict[int, list[float]] = {}  # 1-min load averages at the runs' starts (newer files)
    for label, broker in cost["brokers"].items():
        for cell in broker["cells"]:
            if cell.get("scenario", "A") == "A" and cell.get("ratio", {}).get("cpu"):
                batch = cell.get("batch", 100 if cell["batching"] else 1)  # (older files: 100 or off)
                ratios.setdefault(batch, []).append((cell["ratio"]["cpu"], f"{cell['mode']}, {label}"))
                loads.setdefault(batch, []).extend(r["loadavg"] for r in cell["runs"] if "loadavg" in r)
    for batch, values in sorted(ratios.items()):
        worst = max(values)
        shape = f"batches of {batch:,}" if batch > 1 else "not batched"
        out.append([
            f"CPU per message, nothing nacked, {shape}{how} (every receive mode, "
            f"{len(cost['brokers'])} broker{'s' if len(cost['brokers']) > 1 else ''}"
            + (
                f"; load average {min(loads[batch]):.0f}–{max(loads[batch]):.0f} on 2 cores)"
                if loads.get(batch)
                else ")"
            ),
            "1×",
            f"{min(values)[0]:.2f}–{worst[0]:.2f}× the native consumer's (worst: {worst[1]})",
            f"{name} ({_stamp(cost)})",
        ])
    return out


def main(argv: list[str]) -> int:
    table = report.table(["measured on 2 cores", "native client", "pulsar-nack", "benchmark"], rows())
    block = f"<!-- BEGIN comparison -->\n{table}\n<!-- END comparison -->"
    text = README.read_text()
    pattern = re.compile(r"<!-- BEGIN comparison -->.*?<!-- END comparison -->", re.DOTALL)
    if not pattern.search(text):
        raise SystemExit("README.md has no comparison block")
    README.write_text(pattern.sub(lambda _: block, text))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
