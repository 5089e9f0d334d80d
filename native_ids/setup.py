"""Builds the optional ``_pulsar_nack_ids`` extension in place (a prototype for issue 28, not yet part of the
package): ``cd native_ids && python setup.py build_ext --inplace`` (with pybind11 3.0.x importable, e.g.
``pip install --target /tmp/pyb11 'pybind11>=3.0,<3.1'`` and ``PYTHONPATH=/tmp/pyb11``).

It is skipped, with a message and exit status 0, when what it needs is missing, so that an install never
depends on it: a C++ compiler, pybind11 3.0.x (the internals version pulsar-client 3.13 was built with;
pybind11 3.1 uses another one and cannot see pulsar-client's types) and pulsar-client's bundled libpulsar.
"""

from __future__ import annotations

import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent


def _pulsar_client_version() -> str:
    from importlib.metadata import version

    return version("pulsar-client")


def _libpulsar() -> Path | None:
    """pulsar-client's bundled libpulsar (its file name carries a hash that changes with each wheel)."""
    try:
        import _pulsar
    except ImportError:
        return None
    libs = sorted((Path(_pulsar.__file__).parent / "pulsar_client.libs").glob("libpulsar*.so*"))
    return libs[0] if libs else None


def _pybind11_include() -> str | None:
    try:
        import pybind11
    except ImportError:
        return None
    if pybind11.version_info[:2] != (3, 0):
        return None
    return str(pybind11.get_include())


class OptionalBuildExt(build_ext):
    """A failed compile is a skipped extension, never a failed install."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as error:  # any build failure means: no extension
            print(f"_pulsar_nack_ids not built ({error}): the pure-Python path is used", file=sys.stderr)


lib = _libpulsar()
include = _pybind11_include()
extensions = []
if lib is None or include is None:
    print(
        f"_pulsar_nack_ids skipped: libpulsar {lib}, pybind11 3.0 headers {include}",
        file=sys.stderr,
    )
else:
    extensions.append(
        Extension(
            "_pulsar_nack_ids",
            sources=[str(HERE / "ids.cpp")],
            include_dirs=[include, str(HERE)],
            language="c++",
            define_macros=[("PULSAR_CLIENT_VERSION", f'"{_pulsar_client_version()}"')],
            extra_compile_args=["-std=c++17", "-O2", "-fvisibility=hidden"],
            # link by path; the loader then finds the copy _pulsar already loaded by its soname
            extra_link_args=[str(lib), f"-Wl,-rpath,{lib.parent}"],
        )
    )

setup(
    name="pulsar-nack-ids-prototype",
    version="0",
    ext_modules=extensions,
    cmdclass={"build_ext": OptionalBuildExt},
    script_args=sys.argv[1:] or ["build_ext", "--inplace"],
)
