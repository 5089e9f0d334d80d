"""The Java PIP-393 bars of the sweep: drawn from a results file of the benchmark, never from typed-in
figures; left out, with a note on how to produce them, without one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from matplotlib.container import BarContainer

from pulsar_nack.cli import main
from pulsar_nack.sweep.grid import GridPoint
from pulsar_nack.sweep.java_results import (
    DEFAULT_JAVA_RESULTS,
    JavaResults,
    JavaResultsError,
    load_java_results,
)
from pulsar_nack.sweep.measure import Row, measure
from pulsar_nack.sweep.plots import plot_contenders
from pulsar_nack.sweep.report import RunInfo, java_note, write_report

#: Figures no real run would produce, so that a bar can only have come from this file.
_JAVA = {(8, 4): (12_345, 678), (8, 6): (23_456, 789), (1, 99): (1, 1)}
_IDS = 1_000


def _results_file(folder: Path, cases: dict[tuple[int, int], tuple[int, int]] = _JAVA) -> Path:
    """A small results file shaped like bench/index_memory.py's (plus a case run without Java)."""
    java = {
        f"{x},{k}": {
            "index": {},
            "java": dict(
                x=x, k=k, n=_IDS, entries_per_ledger=50_000, nack_share=1.0, rounding="floor",
                retained_bytes=plain, retained_bytes_run_optimized=optimized, vm="Test VM 17",
            ),
        }
        for (x, k), (plain, optimized) in cases.items()
    }  # fmt: skip
    payload: dict[str, Any] = {
        "machine": {"cpu": "Test CPU", "cores": 3, "commit": "abc1234", "date": "2030-01-02 03:04 UTC"},
        "n": _IDS,
        "cases": {**java, "8,8": {"index": {}}},
    }
    path = folder / "index_memory.json"
    path.write_text(json.dumps(payload))
    return path


@pytest.fixture(scope="module", name="rows")
def rows_fixture() -> list[Row]:
    """Reference rows at (8, 4), (8, 6), (8, 8): the file covers the first two."""
    return [measure(GridPoint(x=8, k=k, n=2_000)) for k in (4, 6, 8)]


def _bars(rows: list[Row], java: JavaResults | None) -> tuple[dict[str, list[float]], list[str]]:
    figure = plot_contenders(rows, java)
    assert figure is not None
    axes = figure.axes[0]
    bars = {
        str(container.get_label()): [patch.get_height() for patch in container.patches]
        for container in axes.containers
        if isinstance(container, BarContainer)
    }
    return bars, [tick.get_text() for tick in axes.get_xticklabels()]


def test_java_bars_come_from_the_results_file(rows: list[Row], tmp_path: Path) -> None:
    java = load_java_results(_results_file(tmp_path))
    bars, ticks = _bars(rows, java)
    assert ticks == ["x=8\nk=4", "x=8\nk=6"], "only the (x, k) the file covers"
    assert bars["Java PIP-393 as built, 1,000 ids"] == [12_345 / _IDS, 23_456 / _IDS]
    assert bars["Java + runOptimize, 1,000 ids"] == [678 / _IDS, 789 / _IDS]
    # like for like side by side, each labeled with the ids it held; the title says the counts differ
    assert list(bars) == [
        "index as built, 2,000 ids",
        "Java PIP-393 as built, 1,000 ids",
        "index compacted, 2,000 ids",
        "Java + runOptimize, 1,000 ids",
    ]
    assert len(bars["index as built, 2,000 ids"]) == 2
    figure = plot_contenders(rows, java)
    assert figure is not None
    assert "(ids per point differ: index 2,000, Java 1,000)" in figure.axes[0].get_title()


def test_without_results_no_java_bars(rows: list[Row]) -> None:
    bars, ticks = _bars(rows, None)
    assert not [label for label in bars if "Java" in label]
    assert len(ticks) == len(rows)


def test_report_names_the_file_its_date_and_machine(rows: list[Row], tmp_path: Path) -> None:
    path = _results_file(tmp_path)
    info = RunInfo("test", "local[1]", len(rows), 6_000, "4", "3.11", "today", 0, 0, 0, 0, 0, 0, str(path))
    text = write_report(rows, tmp_path, info, load_java_results(path)).read_text()
    assert f"Java figures from `{path}`, measured 2030-01-02 03:04 UTC on Test CPU (3 cores)" in text
    assert "Test VM 17, commit abc1234" in text and "Java bars at (x, k) = (8, 4), (8, 6)." in text
    (tmp_path / "none").mkdir()
    plain = write_report(rows, tmp_path / "none", info, None).read_text()
    assert "No Java bars" in plain and "python bench/index_memory.py" in plain and "Test CPU" not in plain


def test_note_when_the_file_covers_no_point(rows: list[Row], tmp_path: Path) -> None:
    java = load_java_results(_results_file(tmp_path, {(1, 99): (1, 1)}))
    assert not [label for label in _bars(rows, java)[0] if "Java" in label]
    note = java_note(rows, java)
    assert note.startswith("No Java bars: Java figures from") and "(1, 99)" in note


_MACHINE = '{"machine": {"cpu": "c", "cores": 1, "commit": "x", "date": "d"}, '


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read it"),
        ("{not json", "cannot read it"),
        ('{"cases": {}}', "not a results file of bench/index_memory.py"),
        (_MACHINE + '"cases": {"1,1": {}}}', "no case has Java figures"),
        (_MACHINE + '"cases": {"1,1": {"java": {"x": 1}}}}', "not a results file"),
    ],
)
def test_bad_results_files_are_refused(content: str | None, message: str, tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(JavaResultsError, match=message):
        load_java_results(path)


def test_the_repository_results_are_read_as_written() -> None:
    """The checked-in bench/results/index_memory.json: every Java case, figures unchanged."""
    raw = json.loads(DEFAULT_JAVA_RESULTS.read_text())
    java = load_java_results(DEFAULT_JAVA_RESULTS)
    expected = [case["java"] for case in raw["cases"].values() if "java" in case]
    assert [(c.x, c.k, c.nack_share) for c in java.cases] == [
        (j["x"], j["k"], j["nack_share"]) for j in expected
    ]
    for case, figures in zip(java.cases, expected, strict=True):
        assert case.per_id(run_optimized=True) == figures["retained_bytes_run_optimized"] / figures["n"]
        assert case.per_id(run_optimized=False) == figures["retained_bytes"] / figures["n"]
    assert java.date == raw["machine"]["date"]


def test_cli_refuses_a_bad_java_results_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.json"
    with pytest.raises(SystemExit) as exit_info:
        main(["sweep", "--grid", "small", "--java-results", str(missing), "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert f"pulsar-nack sweep: error: --java-results: Java results {missing}: cannot read it" in (
        capsys.readouterr().err
    )
