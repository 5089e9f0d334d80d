"""spark/memory_sweep.ipynb: committed without outputs, and it runs headless, drawing its plots and table."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pyarrow.parquet as pq

from pulsar_nack.sweep.grid import load_grid
from pulsar_nack.sweep.java_results import DEFAULT_JAVA_RESULTS, load_java_results
from pulsar_nack.sweep.plots import DEFAULT_SEEDS_RESULTS

NOTEBOOK = Path(__file__).resolve().parent.parent / "spark" / "memory_sweep.ipynb"


def test_notebook_is_committed_clean() -> None:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.outputs == [] and cell.execution_count is None for cell in code)
    assert "parameters" in code[0].metadata.get("tags", []), "papermill's parameters cell comes first"


def test_papermill_knows_every_documented_parameter() -> None:
    """papermill infers the parameters from the tagged cell (a comment with ``=`` in it hides its line:
    "Passed unknown parameter"); spark/README.md documents each of them."""
    import papermill

    inferred = papermill.inspect_notebook(str(NOTEBOOK))
    assert list(inferred) == ["grid", "master", "out_dir", "java_results", "seeds_results"]
    readme = (NOTEBOOK.parent / "README.md").read_text()
    assert all(f"`{name}`" in readme for name in inferred)


def test_notebook_runs_headless_and_draws_its_plots_and_table(tmp_path: Path) -> None:
    import papermill

    out = tmp_path / "sweep"
    executed = tmp_path / "executed.ipynb"
    papermill.execute_notebook(
        str(NOTEBOOK),
        str(executed),
        parameters={"grid": "small", "master": "local[2]", "out_dir": str(out)},
        kernel_name="python3",
        cwd=str(tmp_path),
        progress_bar=False,
    )
    outputs = [
        output for cell in nbformat.read(executed, as_version=4).cells for output in cell.get("outputs", [])
    ]
    assert not [output for output in outputs if output.output_type == "error"]
    images = [output for output in outputs if "image/png" in output.get("data", {})]
    assert len(images) == 6  # the sweep's four, and bench/seeds.py's two from its results file
    tables = [
        output.data["text/html"]
        for output in outputs
        if "<table" in output.get("data", {}).get("text/html", "")
    ]
    points = load_grid("small")
    assert len(tables) == 1 and tables[0].count("<tr") == len(points) + 1
    assert "index x=8 k=10 batch 4" in tables[0]
    notes = [output.data["text/markdown"] for output in outputs if "text/markdown" in output.get("data", {})]
    assert len(notes) == 1 and "B/id" in notes[0]
    # The Java bars: from the repository's results file by default, which the notebook names.
    printed = "".join(output.get("text", "") for output in outputs if output.output_type == "stream")
    assert f"{load_java_results(DEFAULT_JAVA_RESULTS).provenance()}; Java bars at (x, k) = " in printed
    # The seeds plots: from bench/seeds.py's results file, which the notebook names with its run.
    seeds = json.loads(DEFAULT_SEEDS_RESULTS.read_text())["machine"]
    assert f"{DEFAULT_SEEDS_RESULTS}: measured {seeds['date']}, commit {seeds['commit']}" in printed
    # The same run wrote the job's files.
    assert pq.read_table(out / "sweep.parquet").num_rows == len(points)
    assert (out / "report.md").is_file() and (out / "report.html").is_file()
