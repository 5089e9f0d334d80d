"""The memory sweep as a Spark job: grid points → rows on the workers → Parquet and a report with plots.

:func:`run` is the whole job (what ``pulsar-nack sweep`` and ``spark/memory_sweep.ipynb`` call); its parts
are usable on their own:

* :func:`spark_session` — a SparkSession for the sweep: the light ``local[2]`` setup verified on small
  machines by default, any master URL otherwise; its scratch space lives in a temporary folder that is
  removed afterwards, and the JVM it started is shut down.
* :func:`sweep` — one Spark partition per grid point, in grid order; each task is
  :func:`pulsar_nack.analysis.measure`; progress is polled from Spark's status tracker.
* :func:`write_parquet` — the rows as one Parquet file (written by the driver), typed by
  :data:`pulsar_nack.analysis.COLUMNS`.
* :func:`figures` and :func:`write_report` — matplotlib plots (bytes/id against M = x·2^k with PIP-393's
  curve, buckets against k, memory against precision, the index against the baselines and the Java
  structure) and ``report.md`` / ``report.html`` around them.

The job's cost is the points' own work (see :mod:`pulsar_nack.analysis`) spread over the cores, plus a
Spark start of several seconds.
"""

from __future__ import annotations

import html
import itertools
import json
import math
import os
import platform
import re
import shutil
import statistics
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
from typing import Any, Final, TypeAlias

import pyarrow as pa
import pyarrow.parquet as pq
from matplotlib.figure import Figure
from pyspark import RDD, SparkContext
from pyspark.sql import SparkSession
from tqdm import tqdm

from pulsar_nack.analysis import COLUMNS, GridPoint, Row, measure, pip393_bytes_per_id

__all__ = [
    "DEFAULT_MASTER",
    "JAVA_PIP393_10M",
    "RunInfo",
    "SweepResult",
    "check_master",
    "figures",
    "findings",
    "parquet_schema",
    "points_rdd",
    "run",
    "spark_session",
    "summary_table",
    "sweep",
    "write_parquet",
    "write_report",
]

DEFAULT_MASTER: Final = "local[2]"

#: The Java PIP-393 structure (fastutil AVL map → open hash map → Roaring64Bitmap) with 10M ids of the same
#: workload, retained heap in MB (10^6 B) without and with ``runOptimize`` — measured on this machine kind
#: with ``bench/java``. Keyed by (x, k).
JAVA_PIP393_10M: Final[dict[tuple[int, int], tuple[float, float]]] = {
    (1, 10): (29.28, 7.86),
    (4, 10): (22.18, 2.00),
    (8, 10): (11.96, 1.03),
    (8, 15): (2.02, 0.08),
    (1, 8): (55.72, 31.30),
    (8, 8): (24.86, 3.96),
}
_JAVA_IDS = 10_000_000

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
    package = Path(__file__).resolve().parent
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


def points_rdd(spark: SparkSession, points: Sequence[GridPoint]) -> RDD[GridPoint]:
    """The grid as an RDD with one partition per point, in grid order (so heavy points run side by side)."""
    if not points:
        raise ValueError("points must not be empty")
    return spark.sparkContext.parallelize(list(points), len(points))


def sweep(spark: SparkSession, points: Sequence[GridPoint], progress: bool = True) -> list[Row]:
    """Measure every point on Spark (one task each, :func:`pulsar_nack.analysis.measure`); rows in grid order.

    With ``progress`` a tqdm bar on stderr follows the finished tasks. The workers must be able to import
    ``pulsar_nack`` (installed, or shipped as :func:`spark_session` does for cluster masters).
    """
    context = spark.sparkContext
    group = f"pulsar-nack-sweep-{uuid.uuid4().hex[:8]}"
    context.setJobGroup(group, f"pulsar-nack memory sweep, {len(points)} points")
    rdd = points_rdd(spark, points).map(measure)
    if not progress:
        return rdd.collect()
    with _Progress(context, group, len(points)):
        return rdd.collect()


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
        with tqdm(total=self._total, unit="point", desc="sweep", file=sys.stderr) as bar:
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
    """The rows' Arrow schema (a ``pyarrow.Schema``), from :data:`pulsar_nack.analysis.COLUMNS`."""
    return pa.schema([(name, _ARROW_TYPES[kind]) for name, kind in COLUMNS.items()])


def write_parquet(rows: Sequence[Row], path: Path) -> Path:
    """Write ``rows`` as one Parquet file at ``path``. O(rows).

    Written by the driver, where :func:`sweep` collected the rows: on a cluster, executors could not
    write into the driver's output folder (Spark's own writer would leave the parts on their disks).
    """
    pq.write_table(pa.Table.from_pylist(list(rows), schema=parquet_schema()), path)
    return path


@dataclass(frozen=True)
class RunInfo:
    """What was run, where, and how long each phase took (seconds): starting Spark, the sweep, stopping
    Spark (and its JVM), writing Parquet, the report, and all of it."""

    grid: str
    master: str
    points: int
    ids: int
    spark_version: str
    python: str
    date: str
    start_s: float
    sweep_s: float
    stop_s: float
    parquet_s: float
    report_s: float
    total_s: float


@dataclass(frozen=True)
class SweepResult:
    """The rows and run facts of :func:`run`, and where it wrote them."""

    rows: list[Row]
    info: RunInfo
    parquet: Path
    report: Path


def run(
    grid: str,
    points: Sequence[GridPoint],
    out: Path,
    master: str | None = None,
    progress: bool = True,
) -> SweepResult:
    """The whole job: start Spark, measure ``points``, write ``out/sweep.parquet``, ``out/sweep.json`` (the
    run facts), ``out/report.md``, ``out/report.html`` and the plots. ``grid`` names the grid in the report.
    """
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
    info = RunInfo(
        grid=grid,
        master=used_master,
        points=len(points),
        ids=sum(point.n for point in points),
        spark_version=version,
        python=platform.python_version(),
        date=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        start_s=spark_up - started,
        sweep_s=swept - spark_up,
        stop_s=stopped - swept,
        parquet_s=written - stopped,
        report_s=0.0,
        total_s=0.0,
    )
    report = write_report(rows, out, info)
    finished = time.perf_counter()
    info = replace(info, report_s=finished - written, total_s=finished - started)
    (out / "sweep.json").write_text(json.dumps(asdict(info), indent=2) + "\n")
    return SweepResult(rows, info, parquet, report)


# -- plots ---------------------------------------------------------------------------------------------

_BEFORE, _AFTER, _THEORY = "#1f77b4", "#d62728", "#555555"
_VARIANT_COLOURS: Final = ("#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")


def _reference(rows: Sequence[Row]) -> list[Row]:
    """The index rows of the dense, unbatched, floor workload — the one PIP-393's theory describes —
    one per (x, k), preferring the compacted run when a point was measured both ways."""
    chosen: dict[tuple[Any, Any], Row] = {}
    for row in rows:
        reference = row["contender"] == "index" and row["rounding"] == "floor"
        reference = reference and row["nack_share"] == 1.0 and row["batch"] == 1
        if reference and (chosen.get((row["x"], row["k"])) is None or row["compact"]):
            chosen[(row["x"], row["k"])] = row
    return sorted(chosen.values(), key=lambda r: (_num(r["ids_per_bucket"]), _num(r["x"])))


def _variants(rows: Sequence[Row]) -> list[Row]:
    """Index rows off the reference workload (sparse, batched, ceil) or measured without compaction."""
    reference = {id(row) for row in _reference(rows)}
    return [row for row in rows if row["contender"] == "index" and id(row) not in reference]


def _num(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)


def _per_id(row: Row, column: str) -> float:
    return _num(row[column]) / _num(row["n"])


def plot_bytes_per_id(rows: Sequence[Row]) -> Figure | None:
    """Bytes per id against M = x·2^k (log-log): before and after compaction, PIP-393's curve, variants."""
    reference = _reference(rows)
    if not reference:
        return None
    figure = Figure(figsize=(10, 5), layout="constrained")
    axes = figure.add_subplot()
    m = [_num(row["ids_per_bucket"]) for row in reference]
    axes.scatter(m, [_per_id(r, "bytes_before_compact") for r in reference], c=_BEFORE, label="index, plain")
    compacted = [row for row in reference if row["compact"]]
    axes.scatter(
        [_num(r["ids_per_bucket"]) for r in compacted],
        [_num(r["bytes_per_id"]) for r in compacted],
        c=_AFTER,
        marker="s",
        label="index after compact()",
    )
    for ledger_size in sorted({int(_num(r["entries_per_ledger"])) for r in reference}):
        low, high = math.floor(8 * math.log2(min(m))), math.ceil(8 * math.log2(max(m)))
        grid_m = [2 ** (e / 8) for e in range(low, high + 1)]
        axes.plot(
            grid_m,
            [pip393_bytes_per_id(value, ledger_size) for value in grid_m],
            c=_THEORY,
            ls="--",
            label=f"PIP-393 theory ({ledger_size:,} entries/ledger)",
        )
    axes.axhline(1 / 8, c=_THEORY, ls=":", lw=1, label="1 bit per id")
    for row, colour in zip(_variants(rows), itertools.cycle(_VARIANT_COLOURS)):
        axes.scatter(
            _num(row["ids_per_bucket"]),
            _num(row["bytes_per_id"]),
            c=colour,
            marker="^",
            label=GridPoint.from_row(row).label(),
        )
    axes.set(xscale="log", yscale="log", xlabel="M = x·2^k (ids per bucket)", ylabel="bytes per id")
    axes.set_title("Index memory per id against bucket size")
    axes.grid(True, which="major", alpha=0.3)
    axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    return figure


def plot_buckets(rows: Sequence[Row]) -> Figure | None:
    """Buckets against k, one line per rate x, with the expected ceil(n / x·2^k) dashed."""
    reference = _reference(rows)
    if not reference:
        return None
    figure = Figure(figsize=(8, 5), layout="constrained")
    axes = figure.add_subplot()
    for x, series in _by_rate(reference).items():
        ks = [_num(r["k"]) for r in series]
        line = axes.plot(ks, [_num(r["buckets"]) for r in series], marker="o", label=f"x = {x} ids/ms")[0]
        expected = [max(1.0, math.ceil(_num(r["n"]) / _num(r["ids_per_bucket"]))) for r in series]
        axes.plot(ks, expected, ls="--", c=line.get_color(), alpha=0.6)
    axes.set(yscale="log", xlabel="k (precision bits; buckets of 2^k ms)", ylabel="buckets")
    axes.set_title("Buckets against precision (dashed: n / x·2^k)")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")
    return figure


def plot_memory_vs_precision(rows: Sequence[Row], rates: int = 4) -> Figure | None:
    """Retained MB against k for up to ``rates`` rates x (spread over the grid's); dashed: not compacted."""
    by_rate = _by_rate(_reference(rows))
    if not by_rate:
        return None
    chosen = sorted(by_rate)
    if len(chosen) > rates:
        chosen = [chosen[round(i * (len(chosen) - 1) / (rates - 1))] for i in range(rates)]
    figure = Figure(figsize=(8, 5), layout="constrained")
    axes = figure.add_subplot()
    for x in chosen:
        series = by_rate[x]
        plain = axes.plot(
            [_num(r["k"]) for r in series],
            [_num(r["bytes_before_compact"]) / 1e6 for r in series],
            ls="--",
            alpha=0.6,
        )[0]
        compacted = [r for r in series if r["compact"]]
        axes.plot(
            [_num(r["k"]) for r in compacted],
            [_num(r["retained_bytes"]) / 1e6 for r in compacted],
            marker="o",
            c=plain.get_color(),
            label=f"x = {x}",
        )
    n = sorted({int(_num(r["n"])) for r in _reference(rows)})
    axes.set(
        yscale="log",
        xlabel="k (precision bits)",
        ylabel=f"retained MB ({', '.join(f'{v:,}' for v in n)} ids)",
    )
    axes.set_title("Index memory against precision (solid: compacted, dashed: plain)")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")
    return figure


def _by_rate(reference: Sequence[Row]) -> dict[int, list[Row]]:
    series: dict[int, list[Row]] = {}
    for row in reference:
        series.setdefault(int(_num(row["x"])), []).append(row)
    return {x: sorted(rows, key=lambda r: _num(r["k"])) for x, rows in sorted(series.items())}


def _contender_cases(rows: Sequence[Row]) -> list[Row]:
    """Reference rows at the (x, k) of the Java measurements; if none match, up to ``_MAX_CASES`` reference
    rows spread over M."""
    reference = _reference(rows)
    java = [row for row in reference if (row["x"], row["k"]) in JAVA_PIP393_10M]
    if java or len(reference) <= _MAX_CASES:
        return java or reference
    step = (len(reference) - 1) / (_MAX_CASES - 1)
    return [reference[round(i * step)] for i in range(_MAX_CASES)]


_MAX_CASES: Final = 8


def plot_contenders(rows: Sequence[Row]) -> Figure | None:
    """Bytes per id of the index (plain and compacted) and the Java structure at the Java cases; the
    baselines (which do not depend on x or k) as horizontal lines."""
    cases = _contender_cases(rows)
    baselines = [row for row in rows if row["contender"] != "index"]
    if not cases:
        return None
    figure = Figure(figsize=(9, 5), layout="constrained")
    axes = figure.add_subplot()
    series: list[tuple[str, Callable[[Row], float | None]]] = [
        ("index, plain", lambda r: _per_id(r, "bytes_before_compact")),
        ("index, compacted", lambda r: _num(r["bytes_per_id"]) if r["compact"] else None),
        ("Java PIP-393, 10M ids", lambda r: _java_per_id(r, 0)),
        ("Java + runOptimize, 10M ids", lambda r: _java_per_id(r, 1)),
    ]
    width = 0.8 / len(series)
    for i, (label, value) in enumerate(series):
        points = [(j, value(row)) for j, row in enumerate(cases)]
        shown = [(j, v) for j, v in points if v is not None]
        if shown:
            offset = (i - (len(series) - 1) / 2) * width
            axes.bar([j + offset for j, _ in shown], [v for _, v in shown], width, label=label)
    for row, style in zip(baselines, ("-", "-.", ":"), strict=False):
        axes.axhline(
            _num(row["bytes_per_id"]), c="black", ls=style, lw=1, label=f"{row['contender']} (measured)"
        )
    axes.set_xticks(range(len(cases)), [f"x={r['x']}\nk={r['k']}" for r in cases])
    axes.set(yscale="log", ylabel="bytes per id")
    axes.set_title("Index against the Java PIP-393 structure and the old designs")
    axes.grid(True, axis="y", alpha=0.3)
    axes.legend(fontsize="small")
    return figure


def _java_per_id(row: Row, column: int) -> float | None:
    java = JAVA_PIP393_10M.get((int(_num(row["x"])), int(_num(row["k"]))))
    return None if java is None else java[column] * 1e6 / _JAVA_IDS


#: Plot file stem → (title in the report, plot function).
_PLOTS: Final[dict[str, tuple[str, Callable[[Sequence[Row]], Figure | None]]]] = {
    "bytes_per_id": ("Bytes per id against M = x·2^k", plot_bytes_per_id),
    "buckets": ("Buckets against k", plot_buckets),
    "memory_vs_precision": ("Memory against precision", plot_memory_vs_precision),
    "contenders": ("The index against the baselines and the Java structure", plot_contenders),
}


def figures(rows: Sequence[Row]) -> dict[str, Figure]:
    """Every plot the rows allow, by file stem (a grid without index rows, say, has no bytes/id plot)."""
    drawn = {name: plot(rows) for name, (_, plot) in _PLOTS.items()}
    return {name: figure for name, figure in drawn.items() if figure is not None}


# -- the report ------------------------------------------------------------------------------------------

#: Columns of the report's table of all points: header → cell of a row.
_SUMMARY: Final[dict[str, Callable[[Row], str]]] = {
    "point": lambda r: GridPoint.from_row(r).label(),
    "M": lambda r: f"{r['ids_per_bucket']:,}",
    "buckets": lambda r: _int(r["buckets"]),
    "slots": lambda r: _int(r["slots"]),
    "containers a/b/r + runs": lambda r: (
        "–"
        if r["slots"] is None
        else f"{r['array_containers']}/{r['bitset_containers']}/{r['run_containers']} + {r['packed_runs']}"
    ),
    "B/id plain": lambda r: (
        "–" if r["bytes_before_compact"] is None else f"{_per_id(r, 'bytes_before_compact'):.3g}"
    ),
    "B/id": lambda r: f"{_num(r['bytes_per_id']):.3g}",
    "PIP-393 B/id": lambda r: (
        "–" if r["theory_bytes_per_id"] is None else f"{_num(r['theory_bytes_per_id']):.3g}"
    ),
    "retained KB": lambda r: f"{_num(r['retained_bytes']) / 1e3:,.1f}",
    "build ns/id": lambda r: f"{_num(r['build_ns_per_id']):.0f}",
    "drain ns/id": lambda r: f"{_num(r['drain_ns_per_id']):.0f}",
    "task s": lambda r: f"{_num(r['measure_s']):.2f}",
}


def _int(value: object) -> str:
    return "–" if value is None else f"{int(_num(value)):,}"


def summary_table(rows: Sequence[Row]) -> tuple[list[str], list[list[str]]]:
    """The report's table of all points: (headers, rows of formatted cells), in grid order."""
    return list(_SUMMARY), [[cell(row) for cell in _SUMMARY.values()] for row in rows]


def findings(rows: Sequence[Row]) -> list[str]:
    """Plain sentences on what the rows show, computed from them (none when the rows lack the data)."""
    out: list[str] = []
    reference = _reference(rows)
    if reference:
        ratios = [(_per_id(r, "bytes_before_compact") / _num(r["theory_bytes_per_id"]), r) for r in reference]
        close = [r for ratio, r in ratios if 0.5 <= ratio <= 2]
        worst_ratio, worst = max(ratios, key=lambda pair: pair[0])
        if close:
            low, high = (
                min(_num(r["ids_per_bucket"]) for r in close),
                max(_num(r["ids_per_bucket"]) for r in close),
            )
            out.append(
                f"Before compaction the index is within 2× of PIP-393's curve for {len(close)} of "
                f"{len(ratios)} points (M from {low:,.0f} to {high:,.0f})."
            )
        m, plain = _num(worst["ids_per_bucket"]), _per_id(worst, "bytes_before_compact")
        out.append(
            f"The largest excess is at M = {m:,.0f} (x={worst['x']}, k={worst['k']}): {plain:,.1f} B/id "
            f"against {_num(worst['theory_bytes_per_id']):.3g} in theory ({worst_ratio:,.0f}×) — "
            f"{_num(worst['buckets']):,.0f} buckets, each paying for its own Python objects, which the "
            "theory leaves out."
        )
        compacted = [r for r in reference if r["compact"]]
        if compacted:
            gains = [_num(r["bytes_before_compact"]) / _num(r["retained_bytes"]) for r in compacted]
            runs = sum(_num(r["packed_runs"]) for r in compacted)
            slots = sum(_num(r["slots"]) for r in compacted)
            out.append(
                f"compact() shrinks these structures {min(gains):.1f}–{max(gains):.1f}× (median "
                f"{statistics.median(gains):.1f}×); {runs:,.0f} of {slots:,.0f} (bucket, ledger) slots "
                "became a single packed run, because dense nacks are consecutive entry ids."
            )
    index = [r for r in reference if r["compact"]] or reference
    for baseline in (r for r in rows if r["contender"] != "index"):
        if index:
            median = statistics.median(_num(r["bytes_per_id"]) for r in index)
            out.append(
                f"The {baseline['contender']} baseline holds {_num(baseline['bytes_per_id']):.1f} B/id, "
                f"{_num(baseline['bytes_per_id']) / median:,.0f}× the index's median {median:.3g} B/id."
            )
    return out


_TEXTS: Final = {
    "bytes_per_id": "Dots: the index as built (plain Roaring bitmaps, what PIP-393's formula describes); "
    "squares: after `compact()`; dashed: PIP-393's average entry size (4 B below 4096 ids per bucket, "
    "8192/M B up to a ledger, ≈0.163 B beyond); dotted: one bit per id. Triangles are the other workloads "
    "of the grid.",
    "buckets": "Each bucket spans 2^k ms, so buckets fall by half with every bit until one holds all ids.",
    "memory_vs_precision": "Retained memory of the whole index; every extra bit of imprecision halves the "
    "buckets and the per-bucket overhead with them.",
    "contenders": "Bars: bytes per id of the index and of the Java PIP-393 structure (fastutil + "
    "RoaringBitmap, 10M ids, measured by bench/java) at the same (x, k); lines: the hash map and the "
    "triple-long heap measured in this sweep.",
}

Block: TypeAlias = tuple[str, Any]


def _blocks(rows: Sequence[Row], info: RunInfo, images: dict[str, str]) -> list[Block]:
    blocks: list[Block] = [
        ("h1", f"Memory sweep: grid {info.grid}, {info.points} points"),
        (
            "p",
            f"{info.ids:,} ids in all on `{info.master}` (Spark {info.spark_version}, Python {info.python}), "
            f"{info.date}. Spark start {info.start_s:.1f} s, sweep {info.sweep_s:.1f} s, Spark stop "
            f"{info.stop_s:.1f} s. Memory: the index's `memory_usage()` (Python objects at allocator "
            "sizes + CRoaring's C heap); baselines: `heap_in_use()` delta around building them.",
        ),
    ]
    notes = findings(rows)
    if notes:
        blocks += [("h2", "Findings"), ("ul", notes)]
    for name, (title, _) in _PLOTS.items():
        if name in images:
            blocks += [("h2", title), ("img", (images[name], title)), ("p", _TEXTS[name])]
    blocks += [("h2", "All points"), ("table", summary_table(rows))]
    return blocks


def write_report(rows: Sequence[Row], out: Path, info: RunInfo) -> Path:
    """Write the plots as PNG, ``report.md`` and ``report.html`` into ``out``; returns the Markdown path."""
    images: dict[str, str] = {}
    for name, figure in figures(rows).items():
        figure.savefig(out / f"{name}.png", dpi=110)
        images[name] = f"{name}.png"
    blocks = _blocks(rows, info, images)
    (out / "report.md").write_text(_markdown(blocks))
    (out / "report.html").write_text(_html(blocks, f"pulsar-nack sweep: {info.grid}"))
    return out / "report.md"


def _markdown(blocks: Sequence[Block]) -> str:
    lines: list[str] = []
    for kind, content in blocks:
        if kind in ("h1", "h2"):
            lines.append(f"{'#' * int(kind[1])} {content}")
        elif kind == "p":
            lines.append(content)
        elif kind == "ul":
            lines.extend(f"- {item}" for item in content)
        elif kind == "img":
            lines.append(f"![{content[1]}]({content[0]})")
        else:
            headers, cells = content
            lines.append("| " + " | ".join(headers) + " |")
            lines.append("|" + "---|" * len(headers))
            lines.extend("| " + " | ".join(row) + " |" for row in cells)
        lines.append("")
    return "\n".join(lines)


def _html(blocks: Sequence[Block], title: str) -> str:
    def inline(text: str) -> str:
        return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))

    body: list[str] = []
    for kind, content in blocks:
        if kind in ("h1", "h2", "p"):
            body.append(f"<{kind}>{inline(content)}</{kind}>")
        elif kind == "ul":
            body.append("<ul>" + "".join(f"<li>{inline(item)}</li>" for item in content) + "</ul>")
        elif kind == "img":
            body.append(f'<img src="{html.escape(content[0])}" alt="{html.escape(content[1])}">')
        else:
            headers, cells = content
            head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
            rows = "".join(
                "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in cells
            )
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
    style = (
        "body{font-family:sans-serif;max-width:70em;margin:2em auto}table{border-collapse:collapse;"
        "font-size:90%}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}img{max-width:100%}"
    )
    return (
        f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
