"""The repository files that travel with the package (pulsar_nack.shipped, setup.py's build hook); the
built wheel and sdist themselves are checked from fresh venvs by .ci/packages.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pulsar_nack.cli import main
from pulsar_nack.shipped import CHECKOUT, SPARK_FILES, java_reference, repository_file

ROOT = Path(__file__).resolve().parent.parent


def _setup_globs() -> tuple[str, ...]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "REPOSITORY_FILES":
            value = ast.literal_eval(node.value)
            assert isinstance(value, tuple)
            return value
    raise AssertionError("setup.py has no REPOSITORY_FILES")


def test_every_file_the_package_looks_up_is_one_setup_py_ships() -> None:
    globs = _setup_globs()
    results = ("bench/results/index_memory.json", "bench/results/seeds.json")
    names = (*SPARK_FILES, *results)
    for name in names:
        assert any(Path(name).match(pattern) or name == pattern for pattern in globs), name
        assert repository_file(name) == CHECKOUT / name
    manifest = (ROOT / "MANIFEST.in").read_text()
    for pattern in globs:
        assert list(ROOT.glob(pattern)), pattern
        assert pattern.split("/**")[0].split("/*")[0] in manifest, f"MANIFEST.in misses {pattern}"


def test_a_missing_file_is_none() -> None:
    assert repository_file("bench/results/no_such.json") is None


def test_sweep_files_prints_the_recipe(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", "--files"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(": ")[0] for line in lines[:3]] == list(SPARK_FILES)
    for line in lines:
        assert Path(line.split(": ", 1)[1]).is_file(), line


def test_the_java_reference_is_found_in_a_checkout_only(tmp_path: Path) -> None:
    """The Java reference is a benchmark: a checkout's module loads where it is; without a checkout (an
    install) there is none, and the package carries no copy of it."""
    assert java_reference(tmp_path) is None
    here = java_reference(ROOT)
    assert here is not None and callable(here.run_case)
    assert Path(here.JAVA_DIR) == ROOT / "bench" / "java"
    assert not any(pattern.startswith("bench/java") for pattern in _setup_globs())
