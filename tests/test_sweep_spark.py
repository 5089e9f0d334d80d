"""The Spark job: partitions, rows equal to an in-process run, Parquet, progress, the session, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from spark_fixtures import SMALL, assert_rows_agree

from pulsar_nack.cli import main
from pulsar_nack.sweep.grid import GridPoint
from pulsar_nack.sweep.java_results import DEFAULT_JAVA_RESULTS
from pulsar_nack.sweep.measure import COLUMNS, measure
from pulsar_nack.sweep.spark import check_master, points_rdd, spark_session, sweep, write_parquet


def test_one_partition_per_point_in_grid_order(spark: Any) -> None:
    assert points_rdd(spark, SMALL).glom().collect() == [[point] for point in SMALL]


def test_spark_rows_equal_an_in_process_run(spark_rows: list[dict[str, Any]]) -> None:
    assert [row["contender"] for row in spark_rows] == [point.contender for point in SMALL]
    assert_rows_agree(spark_rows, [measure(point) for point in SMALL])


def test_parquet_round_trip_keeps_rows_and_types(
    spark: Any, spark_rows: list[dict[str, Any]], tmp_path: Path
) -> None:
    path = write_parquet(spark_rows, tmp_path / "sweep.parquet")
    table = pq.read_table(path)
    assert table.column_names == list(COLUMNS)
    assert table.to_pylist() == spark_rows
    types = {field.name: str(field.type) for field in table.schema}
    assert types["x"] == "int64" and types["bytes_per_id"] == "double" and types["compact"] == "bool"
    assert types["contender"] == "string"
    # Spark's DataFrame reader sees the same rows and types.
    frame = spark.read.parquet(str(path))
    assert [row.asDict() for row in frame.collect()] == spark_rows
    spark_types = dict(frame.dtypes)
    assert spark_types["buckets"] == "bigint" and spark_types["theory_bytes_per_id"] == "double"


def test_progress_bar_counts_every_point(spark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    points = [GridPoint(x=x, k=4, n=2_000) for x in (1, 2, 3)]
    rows = sweep(spark, points, progress=True)
    assert [row["x"] for row in rows] == [1, 2, 3]
    assert "3/3" in capsys.readouterr().err


@pytest.mark.parametrize(
    "master",
    ["local", "local[1]", "local[*]", "local[4,2]", "spark://a.example:7077", "spark://h1:7077,h2:7077"],
)
def test_check_master_accepts_spark_urls(master: str) -> None:
    assert check_master(master) == master


@pytest.mark.parametrize(
    "master", ["", "local[0]", "local[x]", "spark://nohost", "sc://host:15002", "http://h:1"]
)
def test_check_master_rejects_others(master: str) -> None:
    with pytest.raises(ValueError, match=r"^master must be"):
        check_master(master)


def test_one_session_per_process(spark: Any) -> None:
    with pytest.raises(RuntimeError, match="already running"), spark_session("local[1]"):
        pass
    with pytest.raises(ValueError, match=r"^master must be"), spark_session("mesos://h:5050"):
        pass


# -- the command line ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--grid", "huge"], "--grid: 'huge' is neither a built-in grid (default, small) nor a file"),
        (["--grid", "{bad}"], "--grid: 'bad' is neither"),
        (["--master", "local[0]"], "--master: master must be local, local[N]"),
        (["--out", "{file}"], "--out: {file} exists and is not a folder"),
    ],
)
def test_cli_rejects_bad_input_naming_the_parameter(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"grids": [{"x": 0}]}')
    file = tmp_path / "file"
    file.write_text("")
    argv = [arg.format(bad=bad, file=file) for arg in argv]
    with pytest.raises(SystemExit) as exit_info:
        main(["sweep", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    expected = message.format(file=file).replace(
        "'bad' is neither", f"grid file {bad}: grids[0]: x must be >= 1"
    )
    assert f"pulsar-nack sweep: error: {expected}" in err


def test_cli_needs_a_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2 and "COMMAND" in capsys.readouterr().err


def test_cli_end_to_end(tmp_path: Path) -> None:
    """`pulsar-nack sweep` in a fresh process (its own JVM): a grid file in, Parquet + report out."""
    grid = tmp_path / "grid.json"
    grid.write_text(
        json.dumps({"defaults": {"n": 3000}, "grids": [{"x": 4, "k": [6, 9]}, {"contender": "heap"}]})
    )
    out = tmp_path / "out"
    command = [sys.executable, "-m", "pulsar_nack.cli", "sweep", "--grid", str(grid), "--master", "local[1]"]
    done = subprocess.run(
        [*command, "--out", str(out)], capture_output=True, text=True, timeout=300, env=dict(os.environ)
    )
    assert done.returncode == 0, done.stderr
    assert "3 points (9,000 ids) on local[1]" in done.stdout
    assert "3/3" in done.stderr, "progress"
    rows = pq.read_table(out / "sweep.parquet").to_pylist()
    points = [GridPoint(x=4, k=6, n=3000), GridPoint(x=4, k=9, n=3000), GridPoint(contender="heap", n=3000)]
    assert_rows_agree(rows, [measure(point) for point in points])
    info = json.loads((out / "sweep.json").read_text())
    assert info["master"] == "local[1]" and info["points"] == 3
    assert info["java_results"] == str(DEFAULT_JAVA_RESULTS), "the repository's results file, by default"
    assert info["total_s"] > info["start_s"] + info["sweep_s"] + info["stop_s"] + info["parquet_s"] > 0
    assert (out / "report.html").is_file() and (out / "bytes_per_id.png").is_file()


def test_grid_order_survives_uneven_points(spark: Any) -> None:
    """A heavy point first does not reorder the rows (one partition each, collected in order)."""
    points = [GridPoint(x=1, k=0, n=20_000), *[GridPoint(x=8, k=k, n=2_000) for k in (2, 4, 6)]]
    assert [(row["x"], row["k"]) for row in sweep(spark, points, progress=False)] == [
        (1, 0),
        (8, 2),
        (8, 4),
        (8, 6),
    ]
