"""Files of the repository that travel with the package: the benchmark results the sweep and the notebook
draw their Java and seeds figures from (``bench/results/index_memory.json``, ``bench/results/seeds.json``)
and the Spark recipe (``spark/sweep_job.py``, ``spark/memory_sweep.ipynb``, ``spark/README.md``).

In a source checkout they are read where they are; the wheel and the sdist carry copies under
``pulsar_nack/data/repository/`` with the same relative paths (``setup.py`` copies them at build time, so
the repository holds each file once). ``pulsar-nack sweep --files`` prints where they are.

The Java PIP-393 reference (``bench/java_reference.py`` and its Maven module ``bench/java``) is a
benchmark and does not travel: :func:`java_reference` finds it in a checkout only.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Final

__all__ = ["CHECKOUT", "PACKAGED", "SPARK_FILES", "java_reference", "repository_file"]

#: The repository root when the package runs from a source checkout (its parent folder).
CHECKOUT: Final = Path(__file__).resolve().parent.parent
#: Where the wheel and the sdist put the repository's files (absent in a checkout).
PACKAGED: Final = Path(__file__).resolve().parent / "data" / "repository"
#: The Spark recipe: the spark-submit job, the notebook, their README.
SPARK_FILES: Final = ("spark/sweep_job.py", "spark/memory_sweep.ipynb", "spark/README.md")


def repository_file(name: str) -> Path | None:
    """The repository file ``name`` (a path relative to the repository root, e.g.
    ``"bench/results/seeds.json"``): the checkout's if there is one, else the packaged copy, else None.
    O(1) file checks."""
    for root in (CHECKOUT, PACKAGED):
        path = root / name
        if path.is_file():
            return path
    return None


def java_reference(checkout: Path = CHECKOUT) -> ModuleType | None:
    """The Java PIP-393 reference runner, ``bench/java_reference.py`` of the source checkout ``checkout``
    (it builds its jar in ``bench/java/target``, as the benchmarks do), or None when there is none — an
    installed package: the reference is a benchmark, not shipped. O(size of the module) to load."""
    path = checkout / "bench" / "java_reference.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location("_pulsar_nack_java_reference", path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
