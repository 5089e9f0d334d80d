"""``pulsar-nack demo``: a real run against an embedded broker, its input checks, and the native client's
figure it prints — measured by bench/nack_lateness.py and shipped as package data, never typed in."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from pulsar_nack import demo
from pulsar_nack.cli import main

REPO = Path(__file__).resolve().parent.parent


def _packaged_cost() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        resources.files("pulsar_nack").joinpath("data", "native_nack_cost.json").read_text()
    )
    return data


def test_demo_acks_every_message_and_reports_the_tracker() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pulsar_nack.cli", "demo", "--messages", "600", "--max-delay-ms", "800"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    summary = re.search(
        r"messages 600, acked (\d+), received (\d+), nacked (\d+), redelivered (\d+)", out.stdout
    )
    assert summary is not None, out.stdout
    acked, received, nacked, redelivered = (int(g) for g in summary.groups())
    assert acked == 600 and nacked > 0 and redelivered == nacked and received == 600 + nacked
    assert "lateness (arrival − due, ms)" in out.stdout and "tracker memory at the peak" in out.stdout
    assert "pending" in out.stderr, "the live progress line"
    cost = _packaged_cost()
    assert (
        f"the native client {cost['bytes_per_nack']:.0f} B (measured {cost['date']} on {cost['machine']} by "
        "bench/nack_lateness.py)"
    ) in out.stdout
    # one definition on both sides: the wrapper's marginal bytes per pending nack, then its parts
    marginal = re.search(r"over \d+ samples\): pulsar-nack (-?[\d.]+) B", out.stdout)
    assert marginal is not None or "too few samples" in out.stdout, out.stdout
    assert re.search(r"in all \(index [\d,]+ B, arrivals [\d,]+ B, timer [\d,]+ B", out.stdout), out.stdout


def test_the_packaged_native_figure_is_the_benchmarks_measurement() -> None:
    """The package data is bench/results/nack_lateness.json's native bytes per pending nack, with its
    date, machine, versions and commit."""
    cost = _packaged_cost()
    results = json.loads((REPO / "bench" / "results" / "nack_lateness.json").read_text())
    measured = results["brokers"][cost["broker"]]["memory"]
    assert cost["bytes_per_nack"] == measured["native"]["bytes_per_nack"]
    assert cost["pending"] == measured["count"]
    machine = results["machine"]
    assert (cost["date"], cost["commit"], cost["source"]) == (
        machine["date"],
        machine["commit"],
        "bench/nack_lateness.py",
    )
    assert cost["machine"] == f"{machine['cpu']} ({machine['cores']} cores)"
    assert cost["versions"] == {"python": machine["python"], **machine["libraries"]}


def test_the_native_figure_comes_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "cost.json"
    cost = {"bytes_per_nack": 123.4, "date": "2030-01-02", "machine": "Test CPU", "source": "bench/x.py"}
    path.write_text(json.dumps(cost))
    native = demo.native_cost(path)
    assert native == demo.NativeCost(123.4, "2030-01-02", "Test CPU", "bench/x.py")
    # the tracker grows 10 B per pending nack over 2,000 B fixed: the marginal is 10, not total / pending
    samples = [(pending, 2_000 + 10 * pending) for pending in (0, 500, 1_000)]
    progress = demo._Progress(peak_pending=1_000, peak_bytes=12_000, memory=samples,
                              peak_parts=(("index", 9_000), ("arrivals", 3_000)))  # fmt: skip
    marginal, total = demo._memory_lines(progress, native)
    assert marginal.endswith(
        "over 3 samples): pulsar-nack 10.0 B, the native client 123 B (measured 2030-01-02 on Test CPU by "
        "bench/x.py); 12× less"
    )
    assert total == (
        "tracker memory at the peak of 1,000 pending nacks: 12,000 B in all (index 9,000 B, arrivals 3,000 B)"
    )


def test_the_marginal_needs_samples_spread_over_pending() -> None:
    assert demo.marginal_bytes([(0, 100), (1_000, 20_100)]) is None, "two samples"
    assert demo.marginal_bytes([(500, 100), (520, 300), (540, 500)]) is None, "pending barely moved"
    assert demo.marginal_bytes([(0, 100), (100, 1_100), (200, 2_100)]) == pytest.approx(10.0)


@pytest.mark.parametrize("content", [None, "{broken", '{"date": "2030-01-02"}'])
def test_without_the_file_the_native_figure_is_unavailable(
    content: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "native_nack_cost.json"
    if content is not None:
        path.write_text(content)
    monkeypatch.setattr(demo, "NATIVE_COST_FILE", path)
    assert demo.native_cost() is None
    samples = [(0, 0), (500, 5_000), (1_000, 10_000)]
    progress = demo._Progress(received=10, acked=10, peak_pending=1_000, peak_bytes=10_000, memory=samples)
    stats = type("Stats", (), {"redelivered": 0, "held_back": 0, "dropped": 0})()
    demo._summary(progress, stats, argparse.Namespace(messages=10, precision_bits=8))
    out = capsys.readouterr().out
    assert "the native client's figure is unavailable" in out
    assert "pulsar-nack 10.0 B" in out and "× less" not in out


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["--messages", "0"], "--messages"),
        (["--nack-share", "1.5"], "--nack-share"),
        (["--bogus"], "--bogus"),
    ],
)
def test_demo_rejects_bad_arguments(argv: list[str], text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["demo", *argv])
    assert info.value.code == 2 and text in capsys.readouterr().err
