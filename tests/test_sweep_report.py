"""The sweep's report: every plot drawn and every point tabled, findings computed from the rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spark_fixtures import SMALL

from pulsar_nack.sweep.report import RunInfo, findings, summary_table, write_report


def test_report_draws_every_plot_and_tables_every_point(
    spark_rows: list[dict[str, Any]], tmp_path: Path
) -> None:
    info = RunInfo(
        grid="small",
        master="local[2]",
        points=len(SMALL),
        ids=240_000,
        spark_version="4",
        python="3.11",
        date="today",
        start_s=1.0,
        sweep_s=2.0,
        stop_s=0.5,
        parquet_s=0.1,
        report_s=0.0,
        total_s=0.0,
    )
    report = write_report(spark_rows, tmp_path, info)
    text = report.read_text()
    for name in ("bytes_per_id", "buckets", "memory_vs_precision", "contenders"):
        assert (tmp_path / f"{name}.png").stat().st_size > 10_000
        assert f"]({name}.png)" in text
    headers, cells = summary_table(spark_rows)
    assert len(cells) == len(SMALL) and "| " + " | ".join(headers) + " |" in text
    assert "index x=8 k=10 sparse 0.1" in text and "hashmap x=8 k=10" in text
    html = (tmp_path / "report.html").read_text()
    assert html.count("<img ") == 4 and html.count("<tr>") == len(SMALL) + 1
    for sentence in findings(spark_rows):
        assert sentence in text


def test_findings_come_from_the_numbers(spark_rows: list[dict[str, Any]]) -> None:
    notes = findings(spark_rows)
    # small grid, dense reference rows: x ∈ {1, 8} × k ∈ {4, 8, 12} and (8, 10) without compaction
    worst = max(
        (r for r in spark_rows if r["contender"] == "index" and r["nack_share"] == 1 and r["batch"] == 1),
        key=lambda r: r["bytes_before_compact"] / r["n"] / r["theory_bytes_per_id"],
    )
    assert any(f"M = {worst['ids_per_bucket']:,}" in note for note in notes)
    hashmap = next(r for r in spark_rows if r["contender"] == "hashmap")
    assert any(f"holds {hashmap['bytes_per_id']:.1f} B/id" in note for note in notes)

