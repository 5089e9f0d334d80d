"""The sweep on a real Spark cluster, as spark/README.md documents it: a standalone master and one worker on
127.0.0.1, started from pyspark's own ``bin/spark-class``, and the README's ``spark-submit`` command.

Each role gets a Python of its own — a venv, no system site-packages, holding exactly the packages of the
README's ``pip install`` line for it (versions pinned to this venv's, installed by pip, cached under
``.work/spark-roles/``): the workers ``numpy pyroaring sortedcontainers``, the driver those and
``pyarrow matplotlib``. Neither has ``pulsar_nack``, the Pulsar client or ``pyspark``: Spark puts its
``pyspark.zip`` on both roles' path, the package reaches the driver only as ``--py-files`` — a zip with a
wheel's name and layout, which Spark does *not* put on the executors' path — and the executors only
because the job ships it (``spark_session`` → ``_package_zip`` → ``addPyFile``). No ``PYSPARK_*``
variable is set: the README's ``--conf spark.pyspark.python``/``spark.pyspark.driver.python`` choose the
Pythons. The rows must equal those of a ``local[1]`` run of the same grid (see
:func:`spark_fixtures.assert_rows_agree`: structure exactly, memory within the tolerances explained there,
timings ignored). Both daemons are stopped by their process group (the one they were started in, with
their executors and Python workers) whatever happens.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pyspark
import pytest
from spark_fixtures import SMALL, assert_rows_agree

REPO = Path(__file__).resolve().parent.parent
SPARK_HOME = Path(pyspark.__file__).resolve().parent
#: JVM options of every JVM of the cluster: quick to start, small.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:-UsePerfData"
#: What the daemons may take: the master and worker JVMs themselves, and the worker's offer to executors.
DAEMON_MEMORY, WORKER_MEMORY, EXECUTOR_MEMORY = "256m", "1g", "512m"
_LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


README = REPO / "spark" / "README.md"
#: The README's spark-submit command's placeholders: the master, the wheel, the two Pythons.
MASTER, WHEEL = "spark://spark-master:7077", "dist/pulsar_nack-0.1.0-py3-none-any.whl"
WORKER_PYTHON, DRIVER_PYTHON = "/opt/venv/bin/python", "/opt/driver/bin/python"
ROLES = {"worker": "on every worker", "driver": "on the driver's machine"}


def documented_packages() -> dict[str, list[str]]:
    """{role: packages} from spark/README.md's ``pip install … # on every worker`` / ``… # on the
    driver's machine`` lines."""
    found: dict[str, list[str]] = {}
    for role, where in ROLES.items():
        lines = re.findall(rf"^pip install ([\w .-]+?)\s+# {re.escape(where)}$", README.read_text(), re.M)
        assert len(lines) == 1, f"spark/README.md has one 'pip install ... # {where}' line"
        found[role] = lines[0].split()
    return found


def documented_submit() -> list[str]:
    """spark/README.md's spark-submit command, as arguments (continuation lines joined)."""
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(), re.S)
    [command] = [
        line
        for block in blocks
        for line in block.replace("\\\n", " ").splitlines()
        if line.startswith("spark-submit ")
    ]
    return shlex.split(command)


def _role_python(role: str, packages: list[str]) -> Path:
    """A venv (no system site-packages) with exactly ``packages`` and their dependencies, at this venv's
    versions (a constraints file), installed by this venv's pip from the package index or its cache.
    Cached under .work/spark-roles/ by role, packages and versions; built aside and renamed into place,
    so an interrupted build leaves no half venv behind."""
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    key = hashlib.sha256(f"{sys.version}\n{role}\n{packages}\n{frozen}".encode()).hexdigest()[:12]
    roles = REPO / ".work" / "spark-roles"
    folder = roles / f"{role}-{key}"
    python = folder / "bin" / "python"
    if python.is_file():
        return python
    roles.mkdir(parents=True, exist_ok=True)
    building = roles / f".{role}-{key}-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(building)], check=True, timeout=60)
    constraints = building / "constraints.txt"
    constraints.write_text(frozen)
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(building / "bin" / "python"), "install",
         "--quiet", "--disable-pip-version-check", "--only-binary", ":all:", "-c", str(constraints),
         *packages],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert installed.returncode == 0, f"pip install {packages} for the {role}:\n{installed.stderr[-3000:]}"
    with contextlib.suppress(OSError):  # (another run renamed its build into place first: use that)
        building.rename(folder)
    shutil.rmtree(building, ignore_errors=True)
    return python


def _package_archive(folder: Path) -> Path:
    """``pulsar_nack`` as a zip named like its wheel (package files at the root, data included)."""
    archive = folder / "pulsar_nack-0.1.0-py3-none-any.whl"
    package = REPO / "pulsar_nack"
    with zipfile.ZipFile(archive, "w") as zipped:
        for source in sorted(package.rglob("*")):
            if source.is_file() and "__pycache__" not in source.parts:
                zipped.write(source, Path("pulsar_nack") / source.relative_to(package))
    return archive


def _environment(tmp: Path) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith(("PYSPARK_", "SPARK_"))}
    env.pop("PYTHONPATH", None)
    conf = tmp / "conf"
    conf.mkdir(exist_ok=True)
    (conf / "log4j2.properties").write_text(_LOG4J2)
    env.update(
        SPARK_HOME=str(SPARK_HOME),
        SPARK_CONF_DIR=str(conf),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOCAL_DIRS=str(tmp / "local"),
        SPARK_WORKER_DIR=str(tmp / "work"),
        SPARK_LOG_DIR=str(tmp / "logs"),
        SPARK_DAEMON_MEMORY=DAEMON_MEMORY,
        SPARK_DAEMON_JAVA_OPTS=f"{JVM_OPTIONS} -Djava.io.tmpdir={tmp}",
    )
    return env


@contextlib.contextmanager
def _daemon(command: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[Any]]:
    """Start a daemon in a process group of its own; on exit stop that group (SIGTERM, then SIGKILL)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as output:
        process = subprocess.Popen(
            command, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield process
    finally:
        _stop_group(process)


def _stop_group(process: subprocess.Popen[Any]) -> None:
    """Stop the process group ``process`` leads (its id is the process's): SIGTERM, then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            process.poll()  # reap the leader, else its zombie keeps the group alive
            if not _group_alive(process.pid):
                return
            time.sleep(0.1)


def _run(command: list[str], timeout_s: float, **options: Any) -> subprocess.CompletedProcess[str]:
    """``subprocess.run`` in a process group of its own, the whole group stopped on a timeout or error
    (spark-submit's JVM starts the driver's Python as its child)."""
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **options
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    finally:
        _stop_group(process)
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.is_file() else ""


def _wait_for_worker(ui_port: int, master: subprocess.Popen[Any], logs: Path, timeout_s: float) -> None:
    """Until the master's status page lists one ALIVE worker."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert master.poll() is None, f"the master exited:\n{_tail(logs / 'master.log')}"
        with contextlib.suppress(OSError, ValueError):
            with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as response:
                status: dict[str, Any] = json.load(response)
            if any(worker.get("state") == "ALIVE" for worker in status.get("workers", [])):
                return
        time.sleep(0.5)
    pytest.fail(
        f"no worker registered within {timeout_s:.0f} s:\n{_tail(logs / 'master.log')}\n"
        f"{_tail(logs / 'worker.log')}"
    )


def _rows(out: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = pq.read_table(out / "sweep.parquet").to_pylist()
    return rows


def _submit_command(master_url: str, archive: Path, pythons: dict[str, Path], out: Path) -> list[str]:
    """The README's spark-submit command with its placeholders replaced (the master, the wheel, the two
    Pythons, the small grid, ``out``) and this machine's memory and JVM options added."""
    command = documented_submit()
    assert command[0] == "spark-submit" and command.count("--conf") == 2
    assert command[command.index("--grid") + 1] == "default"
    command[command.index("--grid") + 1] = "small"
    command[command.index("--out") + 1] = str(out)
    replaced = {
        MASTER: master_url,
        WHEEL: str(archive),
        f"spark.pyspark.python={WORKER_PYTHON}": f"spark.pyspark.python={pythons['worker']}",
        f"spark.pyspark.driver.python={DRIVER_PYTHON}": f"spark.pyspark.driver.python={pythons['driver']}",
        "spark/sweep_job.py": str(REPO / "spark" / "sweep_job.py"),
    }
    assert all(placeholder in command for placeholder in replaced), command
    command = [replaced.get(argument, argument) for argument in command]
    local = [
        "--driver-memory", "512m",
        "--conf", f"spark.executor.memory={EXECUTOR_MEMORY}",
        "--conf", f"spark.driver.extraJavaOptions={JVM_OPTIONS} -Djava.io.tmpdir={out.parent}",
        "--conf", f"spark.executor.extraJavaOptions={JVM_OPTIONS} -Djava.io.tmpdir={out.parent}",
    ]  # fmt: skip
    return [str(SPARK_HOME / "bin" / "spark-submit"), *command[1:3], *local, *command[3:], "--no-progress"]


def test_both_readmes_give_the_same_pythons_to_spark_submit() -> None:
    top = (REPO / "README.md").read_text()
    assert f"--conf spark.pyspark.python={WORKER_PYTHON}" in top
    assert f"--conf spark.pyspark.driver.python={DRIVER_PYTHON}" in top
    packages = documented_packages()
    extra = [name for name in packages["driver"] if name not in packages["worker"]]
    assert f"`{' '.join(packages['worker'])}`" in top and f"`{' '.join(extra)}`" in top


def test_sweep_on_a_standalone_cluster_equals_a_local_run(tmp_path: Path) -> None:
    packages = documented_packages()
    pythons = {role: _role_python(role, listed) for role, listed in packages.items()}
    env = _environment(tmp_path)  # (no PYTHONPATH: the checks below see what Spark's processes see)
    for role, python in pythons.items():
        for module in ("pulsar_nack", "pulsar", "_pulsar", "pyspark", "pandas"):
            found = subprocess.run(
                [str(python), "-c", f"import {module}"],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                timeout=60,
            )
            assert found.returncode != 0, f"the {role}'s Python must not import {module}"
        imports = ", ".join(name.replace("-", "_") for name in packages[role])
        assert subprocess.run([str(python), "-c", f"import {imports}"], env=env, timeout=60).returncode == 0
    worker_python = str(pythons["worker"])
    no_pyarrow = subprocess.run([worker_python, "-c", "import pyarrow"], env=env, capture_output=True)
    assert no_pyarrow.returncode != 0, "the workers' Python has only the workers' packages"
    logs = tmp_path / "logs"
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port, master_ui, worker_ui = _free_port(), _free_port(), _free_port()
    master_url = f"spark://127.0.0.1:{port}"
    master_command = [
        spark_class, "org.apache.spark.deploy.master.Master",
        "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(master_ui),
    ]  # fmt: skip
    worker_command = [
        spark_class, "org.apache.spark.deploy.worker.Worker",
        "--host", "127.0.0.1", "--webui-port", str(worker_ui),
        "--cores", "2", "--memory", WORKER_MEMORY, "--work-dir", env["SPARK_WORKER_DIR"], master_url,
    ]  # fmt: skip
    with (
        _daemon(master_command, env, logs / "master.log") as master,
        _daemon(worker_command, env, logs / "worker.log") as worker,
    ):
        # While the daemons start: the same grid on local[1], in a process of its own (this venv).
        local = _run(
            [sys.executable, "-m", "pulsar_nack.cli", "sweep", "--grid", "small", "--master", "local[1]",
             "--out", str(tmp_path / "local"), "--no-progress", "--java-results", "none"],
            timeout_s=120, cwd=tmp_path,
        )  # fmt: skip
        assert local.returncode == 0, local.stderr[-3000:]
        _wait_for_worker(master_ui, master, logs, timeout_s=60)
        submitted = _run(
            _submit_command(master_url, _package_archive(tmp_path), pythons, tmp_path / "cluster"),
            timeout_s=180,
            env=env,
            cwd=tmp_path,
        )
        executors = sorted((tmp_path / "work").glob("app-*/*/stderr"))
        executor = _tail(executors[0]) if executors else "(none)"
        assert submitted.returncode == 0, (
            f"{submitted.stdout[-2000:]}\n{submitted.stderr[-4000:]}\n-- executor --\n{executor}"
        )
        # Without spark.pyspark.driver.python the driver runs the workers' Python, which lacks pyarrow:
        # one line naming that Python and the module, exit 1, before a job is submitted. (spark-submit
        # passes the driver's stderr on through its own stdout.)
        command = _submit_command(master_url, _package_archive(tmp_path), pythons, tmp_path / "no-driver")
        at = command.index(f"spark.pyspark.driver.python={pythons['driver']}")
        del command[at - 1 : at + 1]
        lacking = _run(command, timeout_s=180, env=env, cwd=tmp_path)
        output = lacking.stdout + lacking.stderr
        assert lacking.returncode == 1, output[-3000:]
        assert "Traceback" not in output, output[-3000:]
        said = [line for line in output.splitlines() if line.startswith("pulsar-nack sweep:")]
        assert len(said) == 1 and f"driver Python ({worker_python}) needs " in said[0], output[-3000:]
        assert "pyarrow" in said[0].partition(" needs ")[2].partition(":")[0], said[0]
        assert not (tmp_path / "no-driver" / "sweep.parquet").exists()
    info = json.loads((tmp_path / "cluster" / "sweep.json").read_text())
    assert info["master"] == master_url and info["points"] == len(SMALL)
    assert executors, "the points ran in an executor the worker launched"
    cluster_rows, local_rows = _rows(tmp_path / "cluster"), _rows(tmp_path / "local")
    assert [(row["contender"], row["x"], row["k"]) for row in cluster_rows] == [
        (point.contender, point.x, point.k) for point in SMALL
    ]
    assert_rows_agree(cluster_rows, local_rows)
    assert (tmp_path / "cluster" / "report.md").is_file(), "the driver wrote the report"
    assert not _group_alive(master.pid) and not _group_alive(worker.pid), "both daemons' groups stopped"
