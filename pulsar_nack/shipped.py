"""Files of the repository that travel with the package: the Java PIP-393 reference
(``bench/java_reference.py`` and its Maven module ``bench/java``), the benchmark results the sweep and the
notebook draw their Java and seeds figures from (``bench/results/index_memory.json``,
``bench/results/seeds.json``) and the Spark recipe (``spark/sweep_job.py``, ``spark/memory_sweep.ipynb``,
``spark/README.md``).

In a source checkout they are read where they are; the wheel and the sdist carry copies under
``pulsar_nack/data/repository/`` with the same relative paths (``setup.py`` copies them at build time, so
the repository holds each file once). ``pulsar-nack sweep --files`` prints where they are.
"""

from __future__ import annotations

import importlib.util
import os
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from types import ModuleType
from typing import Final

from pulsar_nack import __version__

__all__ = ["CHECKOUT", "PACKAGED", "SPARK_FILES", "java_reference", "repository_file"]

#: The repository root when the package runs from a source checkout (its parent folder).
CHECKOUT: Final = Path(__file__).resolve().parent.parent
#: Where the wheel and the sdist put the repository's files (absent in a checkout).
PACKAGED: Final = Path(__file__).resolve().parent / "data" / "repository"
#: The Spark recipe: the spark-submit job, the notebook, their README.
SPARK_FILES: Final = ("spark/sweep_job.py", "spark/memory_sweep.ipynb", "spark/README.md")

_JAVA_REFERENCE: Final = "bench/java_reference.py"


def repository_file(name: str) -> Path | None:
    """The repository file ``name`` (a path relative to the repository root, e.g.
    ``"bench/results/seeds.json"``): the checkout's if there is one, else the packaged copy, else None.
    O(1) file checks."""
    for root in (CHECKOUT, PACKAGED):
        path = root / name
        if path.is_file():
            return path
    return None


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pulsar-nack" / f"java-reference-{__version__}"


def _copy_changed(source: Traversable, target: Path) -> None:
    """Copy the tree ``source`` (a package resource) into ``target``, only files whose bytes differ: an
    unchanged source keeps its old modification time, so the reference does not rebuild a current jar.
    O(bytes of the tree)."""
    for item in source.iterdir():
        destination = target / item.name
        if item.is_dir():
            _copy_changed(item, destination)
            continue
        data = item.read_bytes()
        if destination.is_file() and destination.read_bytes() == data:
            continue
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.write_bytes(data)


def java_reference() -> ModuleType | None:
    """The Java PIP-393 reference runner (``bench/java_reference.py``), or None if neither a checkout nor
    the package has it.

    From a checkout the module runs where it is and builds its jar in ``bench/java/target``, as the
    benchmarks do. From an install the packaged sources — read as package resources
    (:mod:`importlib.resources`), so a zipped install serves them too — are first copied to
    ``$XDG_CACHE_HOME/pulsar-nack/java-reference-VERSION`` (default ``~/.cache``) and built there by
    Maven, so nothing is written into the installed package; the first build fetches fastutil and
    RoaringBitmap from Maven Central into ``~/.m2``. O(bytes of the sources) to copy and load."""
    packaged = resources.files("pulsar_nack").joinpath("data", "repository", "bench")
    return _java_reference_from(CHECKOUT / _JAVA_REFERENCE, packaged)


def _java_reference_from(checkout: Path, packaged: Traversable) -> ModuleType | None:
    """:func:`java_reference` with its two places as arguments: ``checkout``, the module in a source
    checkout; ``packaged``, the package resource holding the packaged ``bench`` folder."""
    path = checkout
    if not path.is_file():
        if not packaged.joinpath("java_reference.py").is_file():
            return None
        cache = _cache_root() / "bench"
        _copy_changed(packaged, cache)
        path = cache / "java_reference.py"
    spec = importlib.util.spec_from_file_location("_pulsar_nack_java_reference", path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
