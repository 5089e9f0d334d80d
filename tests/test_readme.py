"""README.md is the package index's long description and the first page a user reads: every Python block
in it runs as written (against an embedded pulsar-lite standing in for ``pulsar://localhost:6650``), its
links are absolute (relative ones break on the package index), and its layout table names every module
and folder of the package and nothing that does not exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from pulsar_nack.testing import Broker

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
#: The service URL the README's blocks are written for; the test points it at its own broker.
README_URL = "pulsar://localhost:6650"
BLOCKS = re.findall(r"^```python\n(.*?)^```$", README, flags=re.MULTILINE | re.DOTALL)


def test_the_readme_has_python_blocks() -> None:
    assert len(BLOCKS) >= 6 and all(README_URL in block for block in BLOCKS)


@pytest.mark.parametrize("number", range(len(BLOCKS)))
def test_each_python_block_runs_as_written(number: int, pulsar_lite: Broker) -> None:
    """A fresh interpreter per block, as a reader pastes it: exit status 0 (the blocks assert what they
    claim), within a generous bound — a block that waits for a message nobody sends fails here."""
    code = BLOCKS[number].replace(README_URL, pulsar_lite.service_url)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, f"block {number}:\n{BLOCKS[number]}\n{out.stderr[-3000:]}"


def test_links_are_absolute() -> None:
    targets = re.findall(r"\]\(([^)\s]+)\)", README)
    assert targets, "the README links to its docs"
    relative = [t for t in targets if not t.startswith(("https://", "http://", "#"))]
    assert relative == []


def test_links_point_into_this_repository_where_the_metadata_says() -> None:
    """Links into the repository start with the metadata's Source URL and name files that exist."""
    source = re.search(r"^\s*Source = (\S+)$", (REPO / "setup.cfg").read_text(), flags=re.MULTILINE)
    assert source is not None
    prefix = f"{source.group(1)}/blob/main/"
    ours = [t for t in re.findall(r"\]\(([^)\s]+)\)", README) if "pulsar-nack/pulsar-nack" in t]
    assert ours
    for target in ours:
        assert target.startswith(prefix), target
        assert (REPO / target.removeprefix(prefix).split("#")[0]).exists(), target


def _layout_paths() -> set[str]:
    """The paths the Layout table names: its first column, ``a/b.py``, ``c.py`` (same folder as the
    previous path in the cell) and folders ``d/``."""
    section = README.split("## Layout", 1)[1].split("\n## ", 1)[0]
    paths: set[str] = set()
    for row in re.findall(r"^\| (.+?) \|", section, flags=re.MULTILINE):
        folder = ""
        for name in re.findall(r"`([^`]+)`", row):
            if "/" in name.rstrip("/"):
                folder = name.rstrip("/").rsplit("/", 1)[0] + "/"
                paths.add(name.rstrip("/"))
            else:
                paths.add(folder + name.rstrip("/"))
    return paths


def test_the_layout_table_is_true() -> None:
    named = _layout_paths()
    package = REPO / "pulsar_nack"
    modules = {
        f"pulsar_nack/{path.name}"
        for path in package.iterdir()
        if (path.suffix == ".py" and path.name != "__init__.py")
        or (path.is_dir() and path.name != "__pycache__")
    }
    assert modules - named == set(), "modules the layout table leaves out"
    assert [path for path in named if not (REPO / path).exists()] == [], "named in the table, not there"


@pytest.mark.parametrize(
    "command", ["pulsar-nack estimate", "pulsar-nack --version", "pulsar-nack sweep --files"]
)
def test_the_tool_commands_run_as_written(command: str) -> None:
    """The README's quick tool commands (those that need no broker, Spark or minutes) exit 0."""
    lines = [line.split("#")[0].split() for line in README.splitlines() if line.startswith(command)]
    assert lines, command
    for argv in lines:
        out = subprocess.run(
            [sys.executable, "-m", "pulsar_nack.cli", *argv[1:]], capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, f"{' '.join(argv)}: {out.stderr[-2000:]}"
