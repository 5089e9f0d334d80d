"""CI step after `make test`: build the sdist and the wheel, install each into a fresh venv and use it there.

    python .ci/packages.py [--keep]

`python -m build` makes the sdist, then the wheel *from the sdist* (so a file missing from MANIFEST.in
breaks the wheel too). The contents are checked: the sdist ships no tests (they need the repository), both
carry the repository files setup.py copies into the package (Java reference, results, Spark recipe).
Each artifact goes into its own new venv with the `broker` and `profile` extras; the wheel's venv gets the
*lowest* pulsar-client setup.cfg allows (the floor CI tests), the sdist's the newest pip picks. Then, from a
folder outside the checkout, with no PYTHONPATH: `pulsar-nack --version`, `estimate`, a short `profile` (with
the Java column when java and mvn are on PATH: built from the packaged sources in a fresh cache), a short
`demo` on the embedded broker and `sweep --files`. Everything lives in build/packages/ (removed at the
end unless --keep). Prints the time of each step; exits non-zero at the first failure.
"""

from __future__ import annotations

import configparser
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
    "bench/java_reference.py",
    "bench/java/pom.xml",
    "bench/java/src/main/java/pulsarnack/bench/Pip393Memory.java",
    "bench/results/index_memory.json",
    "bench/results/seeds.json",
    "spark/sweep_job.py",
    "spark/memory_sweep.ipynb",
    "spark/README.md",
)
STARTED = time.monotonic()


def step(title: str, command: list[str], cwd: Path = ROOT, env: dict[str, str] | None = None) -> str:
    """Run ``command``; print its title and time; on failure print its output and exit 1."""
    began = time.monotonic()
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    took = time.monotonic() - began
    print(f"[{time.monotonic() - STARTED:6.1f} s] {title}: {took:.1f} s (exit {proc.returncode})", flush=True)
    if proc.returncode != 0:
        print(proc.stdout[-6000:], proc.stderr[-6000:], sep="\n", file=sys.stderr)
        sys.exit(1)
    return proc.stdout


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
    for name in ("pulsar_nack/py.typed", "pulsar_nack/data/estimate_fit.json"):
        if name not in inside:
            fail(f"the wheel lacks {name}")
    print(f"contents: sdist {len(names)} files, no tests; wheel {len(inside)} files", flush=True)


def try_artifact(kind: str, artifact: Path, version: str, extra_requirements: list[str]) -> None:
    venv = WORK / f"venv-{kind}"
    step(f"{kind}: new venv", [sys.executable, "-m", "venv", str(venv)])
    python, cli = venv / "bin" / "python", str(venv / "bin" / "pulsar-nack")
    step(
        f"{kind}: pip install {artifact.name}[broker,profile] {' '.join(extra_requirements)}",
        [str(python), "-m", "pip", "install", "--quiet", f"pulsar-nack[broker,profile] @ {artifact.as_uri()}",
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
    env["XDG_CACHE_HOME"] = str(WORK / f"cache-{kind}")  # the Java reference builds from the packaged sources
    printed = step(f"{kind}: pulsar-nack --version", [cli, "--version"], run, env)
    if version not in printed:
        fail(f"{kind}: --version printed {printed!r}, expected {version}")
    printed = step(f"{kind}: estimate", [cli, "estimate", "--rate", "10000", "--delay", "1h"], run, env)
    if "pulsar-nack" not in printed:
        fail(f"{kind}: estimate printed no pulsar-nack row:\n{printed}")
    java = shutil.which("java") is not None and shutil.which("mvn") is not None
    profile = [cli, "profile", "--rate", "1000", "--duration", "5s", "--delay", "1h", "--no-progress"]
    if not java:
        profile.append("--no-java")
    printed = step(f"{kind}: profile ({'with' if java else 'no'} Java)", profile, run, env)
    if java and "Java PIP-393 structure:" not in printed:
        fail(f"{kind}: profile printed no Java figures though java and mvn are on PATH:\n{printed}")
    demo = [cli, "demo", "--messages", "300", "--max-delay-ms", "2000"]
    step(f"{kind}: demo --messages 300", demo, run, env)
    printed = step(f"{kind}: sweep --files", [cli, "sweep", "--files"], run, env)
    for line in printed.splitlines():
        path = Path(line.split(": ", 1)[1])
        if not path.is_file() or venv not in path.parents:
            fail(f"{kind}: sweep --files: {line} is not a file of the install")


def main(argv: list[str]) -> int:
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    dist = WORK / "dist"
    step("build sdist, then the wheel from it", [sys.executable, "-m", "build", "--outdir", str(dist), "."])
    sdist, wheel = next(dist.glob("*.tar.gz")), next(dist.glob("*.whl"))
    version = wheel.name.split("-")[1]
    check_contents(sdist, wheel)
    floor = pulsar_client_floor()
    try_artifact("wheel", wheel, version, [f"pulsar-client=={floor}"])
    try_artifact("sdist", sdist, version, [])
    if "--keep" not in argv:
        shutil.rmtree(WORK)
    print(f"packages: wheel and sdist {version} work from fresh venvs ({time.monotonic() - STARTED:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
