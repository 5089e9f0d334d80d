"""The sweep on a real Spark cluster: a standalone master and one worker on 127.0.0.1, started from pyspark's
own ``bin/spark-class``, the job submitted with ``spark-submit --master spark://…`` and the project shipped.

The driver and the executors run a Python that has the sweep's dependencies (numpy, pyroaring,
sortedcontainers, pyspark, pyarrow, matplotlib — this venv's site-packages on its path) but neither
``pulsar_nack`` nor the Pulsar client (``pulsar``, ``_pulsar`` are blocked): the package reaches the driver
only as ``--py-files`` — a zip with a wheel's name and layout, which Spark does *not* put on the executors'
path — and reaches the executors only because the job ships it (``spark_session`` → ``_package_zip`` →
``addPyFile``). The rows must equal those of a ``local[1]`` run of the same grid (see
:func:`spark_fixtures.assert_rows_agree`: structure exactly, memory within the tolerances explained there,
timings ignored). Both daemons are stopped by their process group (the one they were started in, with their
executors and Python workers) whatever happens.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import sysconfig
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


def _bare_python(folder: Path) -> Path:
    """A venv whose Python sees this venv's third-party packages but not ``pulsar_nack`` (its editable
    install is a ``.pth`` hook, which only a site directory runs) nor the Pulsar client (blocked)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=60)
    python = folder / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout.strip()  # fmt: skip
    (Path(site) / "deps.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n"
        "import sys; sys.modules.update({'pulsar': None, '_pulsar': None})\n"
    )
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


def _environment(tmp: Path, python: Path) -> dict[str, str]:
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
        PYSPARK_PYTHON=str(python),
        PYSPARK_DRIVER_PYTHON=str(python),
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


def test_sweep_on_a_standalone_cluster_equals_a_local_run(tmp_path: Path) -> None:
    python = _bare_python(tmp_path / "bare")
    for module in ("pulsar_nack", "pulsar", "_pulsar"):
        found = subprocess.run(
            [str(python), "-c", f"import {module}"], cwd=tmp_path, capture_output=True, timeout=60
        )
        assert found.returncode != 0, f"the cluster's Python must not import {module}"
    assert subprocess.run([str(python), "-c", "import pyroaring, pyspark"], timeout=60).returncode == 0
    env = _environment(tmp_path, python)
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
            [str(SPARK_HOME / "bin" / "spark-submit"),
             "--master", master_url,
             "--py-files", str(_package_archive(tmp_path)),
             "--driver-memory", "512m",
             "--conf", f"spark.executor.memory={EXECUTOR_MEMORY}",
             "--conf", f"spark.pyspark.python={python}",
             "--conf", f"spark.driver.extraJavaOptions={JVM_OPTIONS} -Djava.io.tmpdir={tmp_path}",
             "--conf", f"spark.executor.extraJavaOptions={JVM_OPTIONS} -Djava.io.tmpdir={tmp_path}",
             str(REPO / "spark" / "sweep_job.py"),
             "--grid", "small", "--out", str(tmp_path / "cluster"), "--no-progress"],
            timeout_s=120, env=env, cwd=tmp_path,
        )  # fmt: skip
        executors = sorted((tmp_path / "work").glob("app-*/*/stderr"))
        assert submitted.returncode == 0, (
            f"{submitted.stderr[-4000:]}\n-- executor --\n{_tail(executors[0]) if executors else '(none)'}"
        )
    info = json.loads((tmp_path / "cluster" / "sweep.json").read_text())
    assert info["master"] == master_url and info["points"] == len(SMALL)
    assert executors, "the points ran in an executor the worker launched"
    cluster_rows, local_rows = _rows(tmp_path / "cluster"), _rows(tmp_path / "local")
    assert [(row["contender"], row["x"], row["k"]) for row in cluster_rows] == [
        (point.contender, point.x, point.k) for point in SMALL
    ]
    assert_rows_agree(cluster_rows, local_rows)
    assert not _group_alive(master.pid) and not _group_alive(worker.pid), "both daemons' groups stopped"
