"""The sweep's plots: drawn only from the rows they need."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pulsar_nack.sweep.grid import GridPoint
from pulsar_nack.sweep.measure import measure
from pulsar_nack.sweep.plots import (
    DEFAULT_SEEDS_RESULTS,
    figures,
    plot_seeds_bytes_per_id,
    plot_seeds_memory,
)
from pulsar_nack.sweep.report import findings


def test_plots_need_their_rows() -> None:
    baselines_only = [measure(GridPoint(contender="heap", n=1_000))]
    assert figures(baselines_only) == {}
    assert findings(baselines_only) == []
    index_only = [measure(GridPoint(x=8, k=k, n=2_000)) for k in (4, 8)]
    assert set(figures(index_only)) == {"bytes_per_id", "buckets", "memory_vs_precision", "contenders"}


def _floats(values: object) -> list[float]:
    """A line's x or y data as floats (matplotlib types them loosely)."""
    return [float(v) for v in np.asarray(values, dtype=float)]


def test_the_seeds_plots_draw_the_results_file() -> None:
    """bench/seeds.py's two plots (also in the notebook) draw the results file's figures, not others."""
    results = json.loads(DEFAULT_SEEDS_RESULTS.read_text())
    n = results["formula_n"]
    lines = {line.get_label(): line for line in plot_seeds_bytes_per_id(results).axes[0].get_lines()}
    cases = sorted(results["formula"].items(), key=lambda item: math.prod(
        int(v) if i == 0 else 2 ** int(v) for i, v in enumerate(item[0].split(","))
    ))  # fmt: skip
    compacted = [row["ours"]["malloc"]["bytes"] / n for _, row in cases]
    assert _floats(lines["ours (compacted)"].get_ydata()) == pytest.approx(compacted)
    assert "PIP-393 formula" in lines and "Java runOptimize" in lines
    memory = plot_seeds_memory(results, native_bytes_per_nack=448.0).axes[0]
    native = next(line for line in memory.get_lines() if line.get_label() == "native client (448 B/nack)")
    pending = _floats(native.get_xdata())
    assert _floats(native.get_ydata()) == pytest.approx([448.0 * p / 2**20 for p in pending])
    assert pending[:2] == sorted(int(count) for count in results["old"])
    # like for like: compacted beside runOptimize, as built beside as built, at the same counts
    drawn = {str(line.get_label()): _floats(line.get_ydata()) for line in memory.get_lines()}
    rows = [results["old"][str(int(count))] for count in pending[:2]]
    for ours, field, java, java_field in (
        ("pulsar-nack compacted", "bytes", "Java + runOptimize", "retained_bytes_run_optimized"),
        ("pulsar-nack as built", "bytes_before_compact", "Java PIP-393 as built", "retained_bytes"),
    ):
        assert drawn[f"{ours} (measured)"] == pytest.approx(
            [r["ours"]["malloc"][field] / 2**20 for r in rows]
        )
        assert drawn[f"{java} (measured)"] == pytest.approx([r["java"][java_field] / 2**20 for r in rows])
    assert not [label for label in drawn if "Java" in label and "estimate" in label]
