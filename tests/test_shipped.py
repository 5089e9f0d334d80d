"""The repository files that travel with the package (pulsar_nack.shipped, setup.py's build hook); the
built wheel and sdist themselves are checked from fresh venvs by .ci/packages.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pulsar_nack.cli import main
from pulsar_nack.shipped import CHECKOUT, SPARK_FILES, _java_reference_from, repository_file

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
    names = (*SPARK_FILES, "bench/java_reference.py", *results)
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


def test_an_install_loads_the_java_reference_from_its_package_resource(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No checkout: the packaged ``bench`` folder (here a copy of the repository's module and pom) is read
    as a package resource into the cache and the module runs from there, its Maven module beside it; a
    second load rewrites nothing unchanged (the jar is not rebuilt), a changed file is copied again."""
    packaged = tmp_path / "package" / "bench"
    (packaged / "java").mkdir(parents=True)
    (packaged / "java_reference.py").write_bytes((ROOT / "bench/java_reference.py").read_bytes())
    (packaged / "java" / "pom.xml").write_bytes((ROOT / "bench/java/pom.xml").read_bytes())
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert _java_reference_from(tmp_path / "no-checkout.py", tmp_path / "nothing") is None
    module = _java_reference_from(tmp_path / "no-checkout.py", packaged)
    assert module is not None and callable(module.run_case)
    java_dir = Path(module.JAVA_DIR)
    assert java_dir.is_relative_to(tmp_path / "cache" / "pulsar-nack") and (java_dir / "pom.xml").is_file()
    copied = java_dir.parent / "java_reference.py"
    stamp = copied.stat().st_mtime_ns
    (packaged / "java" / "pom.xml").write_text("<project/>\n")
    _java_reference_from(tmp_path / "no-checkout.py", packaged)
    assert copied.stat().st_mtime_ns == stamp and (java_dir / "pom.xml").read_text() == "<project/>\n"
    # A checkout wins: its module runs where it is.
    here = _java_reference_from(ROOT / "bench/java_reference.py", packaged)
    assert here is not None and Path(here.JAVA_DIR) == ROOT / "bench" / "java"
