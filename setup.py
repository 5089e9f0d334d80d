"""Build hook: the metadata is in setup.cfg. Repository files the package needs at run time but that live
outside it — the benchmark results the sweep draws its Java and seeds figures
from, the Spark job and notebook — are copied into the built package under ``pulsar_nack/data/repository/``
with their relative paths (read by :mod:`pulsar_nack.shipped`), so the repository keeps one copy of each.
MANIFEST.in puts the same files into the sdist, from which the wheel is then built."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

#: Globs relative to the repository root; each must match at least one file.
REPOSITORY_FILES = (
    "bench/results/index_memory.json",
    "bench/results/seeds.json",
    "spark/sweep_job.py",
    "spark/memory_sweep.ipynb",
    "spark/README.md",
)


class BuildPyWithRepositoryFiles(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):  # an editable install reads them from the checkout
            return
        root = Path(__file__).resolve().parent
        target = Path(self.build_lib) / "pulsar_nack" / "data" / "repository"
        for pattern in REPOSITORY_FILES:
            matches = [path for path in root.glob(pattern) if path.is_file()]
            if not matches:
                raise FileNotFoundError(f"setup.py: no file matches {pattern!r} (is MANIFEST.in complete?)")
            for path in matches:
                destination = target / path.relative_to(root)
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, destination)


setup(cmdclass={"build_py": BuildPyWithRepositoryFiles})
