"""CI step after `make test`: build the sdist and the wheel, install each into a fresh venv and use it there.

    python .ci/packages.py [--keep]

`python -m build` makes the sdist, then the wheel *from the sdist* (so a file missing from MANIFEST.in
breaks the wheel too). The contents are checked: the sdist ships no tests (they need the repository), both
carry the repository files setup.py copies into the package (results, Spark recipe) and neither carries
the benchmarks' Java reference. Each artifact goes into its own new venv: the wheel with the `broker`,
`profile` and `spark` extras and the *lowest* pulsar-client setup.cfg allows (the floor CI tests), the sdist
with `broker` and `profile` and the newest pip picks. Then, from a folder outside the checkout, with no
PYTHONPATH: `pulsar-nack --version`, `estimate`, a short `profile` (its Java line says the Java structure
needs a checkout), a short `demo` on the embedded broker, `sweep --files`, and `sweep --grid small` on
Spark `local[2]` (wheel; when java is on PATH) or the sweep's one-line error naming the `spark` extra
(sdist). Everything lives in build/packages/ (removed at the end unless --keep). Prints the time of each
step; exits non-zero at the first failure.
"""

from __future__ import annotations

import configparser
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "build" / "packages"
#: Files setup.py copies into the package (under pulsar_nack/data/repository/), checked in both artifacts.
REPOSITORY_FILES = (
    "bench/results/index_memory.json",
    "bench/results/seeds.json",
    "spark/sweep_job.py",
    "spark/memory_sweep.ipynb",
    "spark/README.md",
)
STARTED = time.monotonic()


def step(
    title: str, command: list[str], cwd: Path = ROOT, env: dict[str, str] | None = None, exit_code: int = 0
) -> str:
    """Run ``command``; print its title and time; unless it exits with ``exit_code`` print its output and
    exit 1. Returns its stdout (with ``exit_code`` != 0: its stderr)."""
    began = time.monotonic()
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    took = time.monotonic() - began
    print(f"[{time.monotonic() - STARTED:6.1f} s] {title}: {took:.1f} s (exit {proc.returncode})", flush=True)
    if proc.returncode != exit_code:
        print(proc.stdout[-6000:], proc.stderr[-6000:], sep="\n", file=sys.stderr)
        sys.exit(1)
    return proc.stdout if exit_code == 0 else proc.stderr


def fail(message: str) -> None:
    print(f"packages: {message}", file=sys.stderr)
    sys.exit(1)


def pulsar_client_floor() -> str:
    """The lowest pulsar-client version setup.cfg allows (its ``pulsar-client>=X``)."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    for requirement in config["options"]["install_requires"].split("\n"):
        found = re.fullmatch(r"\s*pulsar-client\s*>=\s*([0-9.]+)\s*(,.*)?", requirement)
        if found:
            return found.group(1)
    fail("setup.cfg: no `pulsar-client>=X` in install_requires")
    raise AssertionError


def check_contents(sdist: Path, wheel: Path) -> None:
    with tarfile.open(sdist) as archive:
        top = sdist.name.removesuffix(".tar.gz")
        names = {name.removeprefix(top + "/") for name in archive.getnames()}
    tests = sorted(name for name in names if name.startswith("tests/"))
    if tests:
        fail(f"the sdist ships tests ({tests[:3]}...); MANIFEST.in prunes them")
    for name in ("LICENSE", "setup.py", "MANIFEST.in", *REPOSITORY_FILES):
        if name not in names:
            fail(f"the sdist lacks {name}")
    with zipfile.ZipFile(wheel) as archive:
        inside = set(archive.namelist())
    for name in REPOSITORY_FILES:
        if f"pulsar_nack/data/repository/{name}" not in inside:
            fail(f"the wheel lacks pulsar_nack/data/repository/{name}")
    benchmarks = sorted(name for name in (*names, *inside) if "bench/java" in name)
    if benchmarks:
        fail(f"the packages carry the benchmarks' Java reference: {benchmarks[:3]}")
    for name in ("pulsar_nack/py.typed", "pulsar_nack/data/estimate_fit.json"):
        if name not in inside:
            fail(f"the wheel lacks {name}")
    print(f"contents: sdist {len(names)} files, no tests; wheel {len(inside)} files", flush=True)


def try_artifact(kind: str, artifact: Path, version: str, extras: str, extra_requirements: list[str]) -> None:
    venv = WORK / f"venv-{kind}"
    step(f"{kind}: new venv", [sys.executable, "-m", "venv", str(venv)])
    python, cli = venv / "bin" / "python", str(venv / "bin" / "pulsar-nack")
    # The hash keys pip's cache of wheels built from an sdist: by path alone, it installs one built from an
    # earlier sdist of the same version.
    url = f"{artifact.as_uri()}#sha256={hashlib.sha256(artifact.read_bytes()).hexdigest()}"
    step(
        f"{kind}: pip install {artifact.name}[{extras}] {' '.join(extra_requirements)}",
        [str(python), "-m", "pip", "install", "--quiet", f"pulsar-nack[{extras}] @ {url}",
         *extra_requirements],
    )  # fmt: skip
    client = step(
        f"{kind}: pulsar-client version",
        [str(python), "-c", "import importlib.metadata as m; print(m.version('pulsar-client'))"],
    ).strip()
    print(f"{kind}: pulsar-client {client}", flush=True)
    run = WORK / f"run-{kind}"  # outside the checkout's import path: only the installed package is seen
    run.mkdir()
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    printed = step(f"{kind}: pulsar-nack --version", [cli, "--version"], run, env)
    if version not in printed:
        fail(f"{kind}: --version printed {printed!r}, expected {version}")
    printed = step(f"{kind}: estimate", [cli, "estimate", "--rate", "10000", "--delay", "1h"], run, env)
    if "pulsar-nack" not in printed:
        fail(f"{kind}: estimate printed no pulsar-nack row:\n{printed}")
    profile = [cli, "profile", "--rate", "1000", "--duration", "5s", "--delay", "1h", "--no-progress"]
    printed = step(f"{kind}: profile", profile, run, env)
    if "Java: not run (needs a source checkout" not in printed:
        fail(f"{kind}: profile's Java line does not say it needs a checkout:\n{printed}")
    demo = [cli, "demo", "--messages", "300", "--max-delay-ms", "2000"]
    step(f"{kind}: demo --messages 300", demo, run, env)
    printed = step(f"{kind}: sweep --files", [cli, "sweep", "--files"], run, env)
    for line in printed.splitlines():
        path = Path(line.split(": ", 1)[1])
        if not path.is_file() or venv not in path.parents:
            fail(f"{kind}: sweep --files: {line} is not a file of the install")
    sweep = [cli, "sweep", "--grid", "small", "--master", "local[2]", "--no-progress", "--out", "sweep-out"]
    if "spark" not in extras:
        printed = step(f"{kind}: sweep without the spark extra", sweep, run, env, exit_code=1)
        if "pip install 'pulsar-nack[spark]'" not in printed or "Traceback" in printed:
            fail(f"{kind}: sweep without pyspark does not name the extra in one line:\n{printed}")
    elif shutil.which("java") is not None or os.environ.get("JAVA_HOME"):
        printed = step(f"{kind}: sweep --grid small", sweep, run, env)
        written = [run / "sweep-out" / name for name in ("sweep.parquet", "report.md", "report.html")]
        if not all(path.is_file() for path in written) or "Java bars: " + str(venv) not in printed:
            fail(f"{kind}: sweep wrote no report, or not with the packaged Java results:\n{printed}")


def main(argv: list[str]) -> int:
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    dist = WORK / "dist"
    step("build sdist, then the wheel from it", [sys.executable, "-m", "build", "--outdir", str(dist), "."])
    sdist, wheel = next(dist.glob("*.tar.gz")), next(dist.glob("*.whl"))
    version = wheel.name.split("-")[1]
    check_contents(sdist, wheel)
    floor = pulsar_client_floor()
    try_artifact("wheel", wheel, version, "broker,profile,spark", [f"pulsar-client=={floor}"])
    try_artifact("sdist", sdist, version, "broker,profile", [])
    if "--keep" not in argv:
        shutil.rmtree(WORK)
    print(f"packages: wheel and sdist {version} work from fresh venvs ({time.monotonic() - STARTED:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
