"""The memory sweep as a Spark job: grid points → rows on the workers → Parquet and a report with plots.

:func:`run` is the whole job (what ``pulsar-nack sweep`` and ``spark/memory_sweep.ipynb`` call); its parts
are usable on their own:

* :func:`spark_session` — a SparkSession for the sweep: the light ``local[2]`` setup verified on small
  machines by default, any master URL otherwise; its scratch space lives in a temporary folder that is
  removed afterwards, and the JVM it started is shut down.
* :func:`sweep` — one Spark partition per grid point, in grid order; each task is
  :func:`pulsar_nack.sweep.measure.measure`; progress is polled from Spark's status tracker.
* :func:`write_parquet` — the rows as one Parquet file (written by the driver), typed by
  :data:`pulsar_nack.sweep.measure.COLUMNS`.
* the report — :func:`pulsar_nack.sweep.report.write_report`, with the plots of
  :mod:`pulsar_nack.sweep.plots`.

The job's cost is the points' own work (see :mod:`pulsar_nack.sweep.measure`) spread over the cores, plus
a Spark start of several seconds.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import sys
import tempfile
import threading
import time
import uuid
import zipfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark import RDD, SparkContext
from pyspark.sql import SparkSession
from tqdm import tqdm

from pulsar_nack.progress import ProgressStream
from pulsar_nack.sweep.grid import GridPoint
from pulsar_nack.sweep.java_results import load_java_results
from pulsar_nack.sweep.measure import COLUMNS, Row, measure
from pulsar_nack.sweep.report import RunInfo, write_report

__all__ = [
    "DEFAULT_MASTER",
    "SweepResult",
    "check_master",
    "parquet_schema",
    "points_rdd",
    "run",
    "run_info",
    "run_tasks",
    "spark_session",
    "sweep",
    "write_parquet",
]

DEFAULT_MASTER: Final = "local[2]"
T = TypeVar("T")

# -- the session ---------------------------------------------------------------------------------------

_MASTER = re.compile(
    r"local(\[(\*|[1-9]\d*)(,[1-9]\d*)?\])?"  # local, local[N], local[*], local[N,maxFailures]
    r"|spark://[\w.-]+:\d{1,5}(,[\w.-]+:\d{1,5})*"  # standalone, optionally with standby masters
    r"|yarn|k8s://\S+"
)
#: Settings of a light session: no UI, few shuffle partitions, reused workers.
_LIGHT_CONFIG: Final = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.python.worker.reuse": "true",
}
#: Driver settings applied only when this process starts the JVM (spark-submit fixes them otherwise).
_DRIVER_CONFIG: Final = {"spark.driver.memory": "1g", "spark.default.parallelism": "2"}
_DRIVER_JAVA_OPTIONS: Final = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:-UsePerfData"
#: Quiet driver logging: errors only. Spark's loggers get a config of their own so that Spark treats the
#: level as chosen (it otherwise resets a pyspark driver to WARN and says so).
_LOG4J2: Final = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.spark.name = org.apache.spark
logger.spark.level = error
"""


def check_master(master: str) -> str:
    """Return ``master`` if it is a Spark master URL the sweep can use, else raise ValueError.

    Accepted: ``local``, ``local[N]``, ``local[*]``, ``local[N,F]``, ``spark://HOST:PORT[,HOST:PORT…]``,
    ``yarn``, ``k8s://URL``. (Spark Connect ``sc://`` has no RDD API, which the sweep uses.)
    """
    if not isinstance(master, str) or not _MASTER.fullmatch(master):
        raise ValueError(
            f"master must be local, local[N], local[*], spark://HOST:PORT, yarn or k8s://URL, got {master!r}"
        )
    return master


def _under_spark_submit() -> bool:
    """True when spark-submit started this process (it then owns the JVM and the master)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


@contextmanager
def spark_session(master: str | None = None, app_name: str = "pulsar-nack sweep") -> Iterator[SparkSession]:
    """A SparkSession for the sweep; stopped, its JVM shut down and its scratch folder removed on exit.

    ``master`` None means ``local[2]`` — or, under ``spark-submit``, the master given to spark-submit
    (passing one there is an error: spark-submit has fixed it). For ``local`` masters the Python workers
    run this interpreter (``PYSPARK_PYTHON``) and Spark binds to 127.0.0.1; for cluster masters the
    workers use their own Python and the ``pulsar_nack`` package is shipped to them as a zip (its
    dependencies — numpy, pyroaring, sortedcontainers — must be installed there). Raises ValueError for
    a bad master and RuntimeError if a SparkContext is already running in this process.
    """
    submitted = _under_spark_submit()
    if submitted and master is not None:
        raise ValueError("master is set by spark-submit's --master; do not pass one when running under it")
    resolved = None if submitted else check_master(master or DEFAULT_MASTER)
    if SparkContext._active_spark_context is not None:
        raise RuntimeError("a SparkContext is already running in this process; pass its session to sweep()")
    local = resolved is not None and resolved.startswith("local")
    scratch = Path(tempfile.mkdtemp(prefix="pulsar-nack-spark-"))
    saved_env = {name: os.environ.get(name) for name in ("PYSPARK_PYTHON", "SPARK_LOCAL_IP")}
    try:
        builder = SparkSession.builder.appName(app_name)
        for key, value in _LIGHT_CONFIG.items():
            builder = builder.config(key, value)
        if resolved is not None:  # this process starts the JVM
            (scratch / "log4j2.properties").write_text(_LOG4J2)
            java_options = (
                f"{_DRIVER_JAVA_OPTIONS} -Djava.io.tmpdir={scratch} "
                f"-Dlog4j2.configurationFile=file:{scratch / 'log4j2.properties'}"
            )
            builder = builder.master(resolved).config("spark.driver.extraJavaOptions", java_options)
            builder = builder.config("spark.local.dir", str(scratch / "local"))
            for key, value in _DRIVER_CONFIG.items():
                builder = builder.config(key, value)
        if local:
            os.environ["PYSPARK_PYTHON"] = sys.executable
            os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
        spark: SparkSession = builder.getOrCreate()
        try:
            if not local:
                spark.sparkContext.addPyFile(str(_package_zip(scratch)))
            yield spark
        finally:
            spark.stop()
            if resolved is not None:
                _shut_down_jvm()
    finally:
        for name, saved in saved_env.items():
            if saved is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = saved
        shutil.rmtree(scratch, ignore_errors=True)


def _shut_down_jvm() -> None:
    """Stop the JVM this process launched for Spark (closing its stdin ends it), so that nothing of the
    session outlives it and a later session starts a fresh JVM with its own settings."""
    gateway = SparkContext._gateway
    if gateway is None:
        return
    gateway.shutdown()
    process = getattr(gateway, "proc", None)
    if process is not None and process.stdin is not None:
        process.stdin.close()
        process.wait(timeout=60)
    SparkContext._gateway = None
    SparkContext._jvm = None


def _package_zip(folder: Path) -> Path:
    """This ``pulsar_nack`` package as a zip for cluster workers, in ``folder``. O(package).

    Zips the package's .py files; if the package was itself imported from an archive (a wheel or zip
    given to spark-submit's ``--py-files``), copies that archive — Spark puts only .zip/.egg/.jar files on
    the workers' ``sys.path``, so a wheel must travel as a .zip.
    """
    package = Path(__file__).resolve().parent.parent  # pulsar_nack/, above this sweep/ subpackage
    target = folder / "pulsar_nack.zip"
    if not package.is_dir():
        archive = next(parent for parent in package.parents if parent.is_file())
        shutil.copyfile(archive, target)
        return target
    with zipfile.ZipFile(target, "w") as archive_file:
        for source in sorted(package.rglob("*.py")):
            archive_file.write(source, Path("pulsar_nack") / source.relative_to(package))
    return target


# -- the job -----------------------------------------------------------------------------------------------


def points_rdd(spark: SparkSession, points: Sequence[T]) -> RDD[T]:
    """The grid as an RDD with one partition per point, in grid order (so heavy points run side by side)."""
    if not points:
        raise ValueError("points must not be empty")
    return spark.sparkContext.parallelize(list(points), len(points))


def sweep(spark: SparkSession, points: Sequence[GridPoint], progress: bool = True) -> list[Row]:
    """Measure every point on Spark (one task each, :func:`~pulsar_nack.sweep.measure.measure`); rows in
    grid order.

    With ``progress`` a tqdm bar on stderr follows the finished tasks. The workers must be able to import
    ``pulsar_nack`` (installed, or shipped as :func:`spark_session` does for cluster masters).
    """
    return run_tasks(spark, points, measure, "pulsar-nack memory sweep", progress)


def run_tasks(
    spark: SparkSession, points: Sequence[T], task: Callable[[T], Row], name: str, progress: bool = True
) -> list[Row]:
    """``task`` of every point on Spark (one partition and task each, :func:`points_rdd`); rows in grid
    order. ``name`` describes the job to Spark; ``progress`` as in :func:`sweep`."""
    context = spark.sparkContext
    group = f"pulsar-nack-{uuid.uuid4().hex[:8]}"
    rdd = points_rdd(spark, points).map(task)
    description = f"{name}, {len(points)} points"
    if not progress:
        return _collect(context, group, description, rdd)
    with _Progress(context, group, len(points)):
        return _collect(context, group, description, rdd)


def _collect(context: SparkContext, group: str, description: str, rdd: RDD[Row]) -> list[Row]:
    """``rdd.collect()`` as job group ``group``, in a thread of its own (a job group is a property of the
    thread that starts the job), the calling thread waiting for it.

    Why: Ctrl-C. pyspark's SIGINT handler cancels the jobs over py4j and raises KeyboardInterrupt in the
    main thread; when that thread is itself inside a py4j call (a ``collect`` waiting for its answer), the
    handler's call re-enters the same socket and py4j logs a screen of tracebacks. Waiting here instead,
    the interrupt arrives outside py4j: the job group is cancelled, Spark's logging silenced (its tasks
    end with errors, as asked) and KeyboardInterrupt goes on up — the session's ``with`` stops Spark.
    """
    outcome: dict[str, Any] = {}

    def collect() -> None:
        try:
            context.setJobGroup(group, description)
            outcome["rows"] = rdd.collect()
        except BaseException as error:  # the caller raises it (or ignores it after a Ctrl-C)
            outcome["error"] = error

    thread = threading.Thread(target=collect, name="sweep-collect", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.25)
    except KeyboardInterrupt:
        context.setLogLevel("OFF")
        context.cancelJobGroup(group)
        thread.join(60)
        raise
    if "error" in outcome:
        raise outcome["error"]
    rows: list[Row] = outcome["rows"]
    return rows


class _Progress(threading.Thread):
    """Polls the status tracker for the finished tasks of a job group and shows them as a tqdm bar."""

    def __init__(self, context: SparkContext, group: str, total: int, interval_s: float = 0.25) -> None:
        super().__init__(name="sweep-progress", daemon=True)
        self._context, self._group, self._total, self._interval = context, group, total, interval_s
        self._stopped = threading.Event()

    def __enter__(self) -> _Progress:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        self.join()

    def run(self) -> None:
        with tqdm(total=self._total, unit="point", desc="sweep", file=ProgressStream(sys.stderr)) as bar:
            while not self._stopped.wait(self._interval):
                bar.update(self._finished() - bar.n)
            bar.update(self._finished() - bar.n)

    def _finished(self) -> int:
        tracker = self._context.statusTracker()
        done = 0
        for job in tracker.getJobIdsForGroup(self._group):
            info = tracker.getJobInfo(job)
            for stage in info.stageIds if info else ():
                stage_info = tracker.getStageInfo(stage)
                done += stage_info.numCompletedTasks if stage_info else 0
        return min(done, self._total)


_ARROW_TYPES: Final[dict[type, Any]] = {
    int: pa.int64(),
    float: pa.float64(),
    str: pa.string(),
    bool: pa.bool_(),
}


def parquet_schema() -> Any:
    """The rows' Arrow schema (a ``pyarrow.Schema``), from :data:`pulsar_nack.sweep.measure.COLUMNS`."""
    return pa.schema([(name, _ARROW_TYPES[kind]) for name, kind in COLUMNS.items()])


def write_parquet(rows: Sequence[Row], path: Path) -> Path:
    """Write ``rows`` as one Parquet file at ``path``. O(rows).

    Written by the driver, where :func:`sweep` collected the rows: on a cluster, executors could not
    write into the driver's output folder (Spark's own writer would leave the parts on their disks).
    """
    pq.write_table(pa.Table.from_pylist(list(rows), schema=parquet_schema()), path)
    return path


@dataclass(frozen=True)
class SweepResult:
    """The rows and run facts of :func:`run`, and where it wrote them."""

    rows: list[Row]
    info: RunInfo
    parquet: Path
    report: Path


class _Counted(Protocol):
    @property
    def n(self) -> int: ...


def run_info(
    grid: str,
    master: str,
    points: Sequence[_Counted],
    spark_version: str,
    marks: tuple[float, float, float, float, float],
) -> RunInfo:
    """The run facts of a job over ``points`` (each counting ``n`` ids) whose phases ended at ``marks``
    (perf_counter: started, Spark up, swept, Spark stopped, Parquet written); the report's and the total
    time are filled in once it is written."""
    started, spark_up, swept, stopped, written = marks
    return RunInfo(
        grid=grid,
        master=master,
        points=len(points),
        ids=sum(point.n for point in points),
        spark_version=spark_version,
        python=platform.python_version(),
        date=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        start_s=spark_up - started,
        sweep_s=swept - spark_up,
        stop_s=stopped - swept,
        parquet_s=written - stopped,
        report_s=0.0,
        total_s=0.0,
    )


def run(
    grid: str,
    points: Sequence[GridPoint],
    out: Path,
    master: str | None = None,
    progress: bool = True,
    java_results: Path | None = None,
) -> SweepResult:
    """The whole job: start Spark, measure ``points``, write ``out/sweep.parquet``, ``out/sweep.json`` (the
    run facts), ``out/report.md``, ``out/report.html`` and the plots. ``grid`` names the grid in the report.

    ``java_results`` is a results file of ``bench/index_memory.py`` (see
    :mod:`pulsar_nack.sweep.java_results`; :func:`~pulsar_nack.sweep.java_results.default_java_results`
    finds the repository's): the report's Java bars come from it, and without it there are none. It is
    read before Spark starts; a bad file raises :class:`~pulsar_nack.sweep.java_results.JavaResultsError`.
    """
    java = None if java_results is None else load_java_results(java_results)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with spark_session(master) as spark:
        spark_up = time.perf_counter()
        rows = sweep(spark, points, progress)
        swept = time.perf_counter()
        version, used_master = spark.version, str(spark.sparkContext.master)
    stopped = time.perf_counter()
    parquet = write_parquet(rows, out / "sweep.parquet")
    written = time.perf_counter()
    info = run_info(grid, used_master, points, version, (started, spark_up, swept, stopped, written))
    info = replace(info, java_results=None if java_results is None else str(java_results))
    report = write_report(rows, out, info, java)
    finished = time.perf_counter()
    info = replace(info, report_s=finished - written, total_s=finished - started)
    (out / "sweep.json").write_text(json.dumps(asdict(info), indent=2) + "\n")
    return SweepResult(rows, info, parquet, report)
