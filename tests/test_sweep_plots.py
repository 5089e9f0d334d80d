"""The sweep's plots: drawn only from the rows they need."""

from __future__ import annotations

from pulsar_nack.sweep.grid import GridPoint
from pulsar_nack.sweep.measure import measure
from pulsar_nack.sweep.plots import figures
from pulsar_nack.sweep.report import findings


def test_plots_need_their_rows() -> None:
    baselines_only = [measure(GridPoint(contender="heap", n=1_000))]
    assert figures(baselines_only) == {}
    assert findings(baselines_only) == []
    index_only = [measure(GridPoint(x=8, k=k, n=2_000)) for k in (4, 8)]
    assert set(figures(index_only)) == {"bytes_per_id", "buckets", "memory_vs_precision", "contenders"}

