"""The ``pulsar-nack`` command line.

Each subcommand is one registration function (adds its parser, sets ``run``: ``_register_sweep`` here,
:func:`pulsar_nack.demo.register`) and one function that does the work and returns the exit status;
:data:`_SUBCOMMANDS` lists the registrations. Heavy imports (pyspark, matplotlib) happen inside the
subcommand that needs them.

    pulsar-nack demo [--service-url URL] [--messages N] ...   (pulsar_nack.demo)
    pulsar-nack profile [--rate MSG/S] [--delay 1h|uniform:LOW:HIGH|exp:MEAN] [--duration 60s] [--topics T]
                        [--partitions P] [--batch-size N] [--nack-share F] [--precision-bits K] [--rounding R]
                        [--entries-per-ledger E] [--chunked-share F] [--chunked-bytes B]
                        [--max-held-chunked-bytes B] [--no-java] [--json FILE]       (pulsar_nack.profile)
    pulsar-nack estimate --rate MSG/S --delay 1h [--precision-bits K] [--entries-per-ledger E]
                         [--batch-size N] [--nack-share F] [--topics T] [--fit FILE] [--json FILE]
                                                                                    (pulsar_nack.estimate)
    pulsar-nack sweep [--grid default|small|FILE] [--master local[*]|spark://HOST:PORT] [--out DIR]
                      [--java-results FILE|none] [--files]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, NoReturn

from pulsar_nack import __version__, demo
from pulsar_nack.progress import ProgressStream

__all__ = [
    "RunError",
    "UsageError",
    "build_parser",
    "check_reachable",
    "check_service_url",
    "main",
    "require_extra",
]


class UsageError(Exception):
    """Bad command-line input, found after parsing; the message names the parameter. Exit status 2."""


class RunError(Exception):
    """The run cannot go on — a broker or Spark master out of reach, a missing extra, a failed
    operation; the message names the cause (and the URL or option involved). Exit status 1."""


# -- checks shared by the subcommands ------------------------------------------------------------------

#: URL scheme → default port, for the URLs the subcommands take.
_DEFAULT_PORTS = {"pulsar": 6650, "pulsar+ssl": 6651, "http": 80, "https": 443, "spark": 7077}


def _host_ports(option: str, url: str, schemes: tuple[str, ...]) -> list[tuple[str, int]]:
    """The (host, port) pairs of ``scheme://HOST[:PORT][,HOST[:PORT]...][/PATH]``; UsageError naming
    ``option`` for another scheme, an empty host or a bad port. O(len(url))."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in schemes:
        expected = ", ".join(f"{name}://" for name in schemes)
        raise UsageError(f"{option}: expected a {expected} URL, got {url!r}")
    pairs = []
    for part in rest.split("/", 1)[0].split(","):
        host, colon, port = part.rpartition(":")
        if not colon or host.endswith(":"):  # no port, or a bare IPv6 address
            host, port = part, str(_DEFAULT_PORTS[scheme])
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"{option}: expected HOST:PORT after {scheme}://, got {part!r} in {url!r}")
        pairs.append((host, int(port)))
    return pairs


def check_service_url(option: str, url: str) -> str:
    """``url`` if it is a Pulsar service URL (pulsar://, pulsar+ssl://, http://, https://, one or more
    HOST:PORT), else UsageError naming ``option``. Checks the text only. O(len(url))."""
    _host_ports(option, url, ("pulsar", "pulsar+ssl", "http", "https"))
    return url


def check_reachable(option: str, url: str, timeout_s: float, schemes: tuple[str, ...]) -> None:
    """RunError naming ``option`` and ``url`` unless one of its HOST:PORTs accepts a TCP connection within
    ``timeout_s`` each. A wrong host or port then fails at once, with the URL in the message, instead of
    a client retrying it for its whole operation timeout (or Spark for a minute) and ending in a
    traceback. O(hosts) connection attempts."""
    reasons = []
    for host, port in _host_ports(option, url, schemes):
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return
        except OSError as error:
            reasons.append(f"{host}:{port}: {error.strerror or error}")
    raise RunError(f"{option}: cannot connect to {url} ({'; '.join(reasons)})")


def check_writable(option: str, path: Path | None) -> None:
    """UsageError naming ``option`` unless ``path`` can be written — checked by opening it for appending
    (and removing it again if that created it), so that an unwritable path fails before the run, not
    after it. None passes. O(1)."""
    if path is None:
        return
    if path.is_dir():
        raise UsageError(f"{option}: {path} is a folder")
    existed = path.exists()
    try:
        with path.open("a"):
            pass
    except OSError as error:
        raise UsageError(f"{option}: cannot write {path}: {error.strerror or error}") from None
    if not existed:
        path.unlink()


def require_extra(what: str, extra: str, *modules: str) -> None:
    """RunError naming the extra to install unless every one of ``modules`` is importable: ``what`` (a
    subcommand) needs them, and ``pip install 'pulsar-nack[extra]'`` brings them. O(modules)."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise RunError(f"{what} needs {', '.join(missing)}: pip install 'pulsar-nack[{extra}]'")


# -- sweep ---------------------------------------------------------------------------------------------


def _register_sweep(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subcommands.add_parser(
        "sweep",
        help="run the memory parameter sweep on Spark and write Parquet + a report",
        description="Measure the TimeBucket index (and the baselines) over a grid of workloads on Spark, "
        "one task per grid point; write sweep.parquet, sweep.json, report.md, report.html and PNG plots.",
    )
    parser.add_argument(
        "--grid",
        default="default",
        help="'default' (48 (x, k) points + 2 baselines, 200k ids each), 'small' (12 quick points) or a "
        "JSON grid file (format: pulsar_nack.sweep.grid.parse_grid; default: %(default)s)",
    )
    parser.add_argument(
        "--master",
        default=None,
        help="Spark master URL: local[N], local[*], spark://HOST:PORT, yarn, k8s://URL "
        "(default: local[2], or spark-submit's --master when run under spark-submit)",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("sweep-out"), help="output folder (default: %(default)s)"
    )
    parser.add_argument(
        "--java-results",
        default=None,
        metavar="FILE|none",
        help="results file of bench/index_memory.py with the Java PIP-393 figures the report's Java bars "
        "come from; 'none' for no Java bars (default: the repository's bench/results/index_memory.json "
        "in a checkout, else the copy the package carries)",
    )
    parser.add_argument("--no-progress", action="store_true", help="do not show the progress bar")
    parser.add_argument(
        "--files",
        action="store_true",
        help="print where the spark-submit job (spark/sweep_job.py), the notebook "
        "(spark/memory_sweep.ipynb), their README and the results files are — in a checkout or in the "
        "installed package — and exit",
    )
    parser.set_defaults(run=_sweep)


def _sweep_files() -> int:
    """``sweep --files``: one ``name: path`` line per shipped file of the Spark recipe. O(1)."""
    from pulsar_nack.shipped import SPARK_FILES, repository_file

    for name in (*SPARK_FILES, "bench/results/index_memory.json", "bench/results/seeds.json"):
        path = repository_file(name)
        if path is None:
            raise RunError(f"{name} is neither in a checkout nor in this install")
        print(f"{name}: {path}")
    return 0


def _java_results(value: str | None) -> Path | None:
    """``--java-results``: the file (checked now, before Spark starts), or None for 'none' / no default."""
    from pulsar_nack.sweep.java_results import JavaResultsError, default_java_results, load_java_results

    if value is None:
        return default_java_results()
    if value == "none":
        return None
    path = Path(value)
    try:
        load_java_results(path)
    except JavaResultsError as error:
        raise UsageError(f"--java-results: {error}") from None
    return path


def _sweep(args: argparse.Namespace) -> int:
    if args.files:
        return _sweep_files()
    from pulsar_nack.sweep.grid import GridError, load_grid

    try:
        points = load_grid(args.grid)
    except GridError as error:
        raise UsageError(f"--grid: {error}") from None
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started us: its JVM, its master
    missing = [name for name in _SWEEP_MODULES if importlib.util.find_spec(name) is None]
    if missing:  # before --master: its check is in pulsar_nack.sweep.spark, which imports them
        raise _sweep_lacks(missing, submitted)
    if args.master is not None:
        from pulsar_nack.sweep.spark import check_master

        if submitted:
            raise UsageError("--master: spark-submit's --master sets it; do not pass one under spark-submit")
        try:
            check_master(args.master)
        except ValueError as error:
            raise UsageError(f"--master: {error}") from None
    if args.out.exists() and not args.out.is_dir():
        raise UsageError(f"--out: {args.out} exists and is not a folder")
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"--out: cannot create {args.out}: {error.strerror or error}") from None
    java_results = _java_results(args.java_results)
    if not submitted and shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise RunError("Spark needs Java 17 or newer: put java on PATH or set JAVA_HOME")
    if args.master is not None and args.master.startswith("spark://"):
        check_reachable("--master", args.master, 10.0, ("spark",))

    try:
        from py4j.protocol import Py4JError  # type: ignore[import-untyped]

        from pulsar_nack.sweep.spark import run

        result = run(
            args.grid,
            points,
            args.out,
            master=args.master,
            progress=not args.no_progress,
            java_results=java_results,
        )
    except ModuleNotFoundError as error:  # a module the check above does not list (a dependency's own)
        raise _sweep_lacks([(error.name or str(error)).partition(".")[0]], submitted) from None
    except Py4JError as error:  # Spark's own failure: its log above says why; the Java trace adds nothing
        raise RunError(f"Spark failed (master {args.master or 'default'}): {_first_line(error)}") from None
    info = result.info
    print(
        f"{info.points} points ({info.ids:,} ids) on {info.master}: {info.total_s:.1f} s "
        f"(Spark start {info.start_s:.1f} s, sweep {info.sweep_s:.1f} s, Spark stop {info.stop_s:.1f} s, "
        f"Parquet {info.parquet_s:.1f} s, report {info.report_s:.1f} s)"
    )
    print(f"wrote {result.parquet}, {result.report} and {result.report.with_suffix('.html')}")
    print(f"Java bars: {java_results}" if java_results else "Java bars: none (no --java-results file)")
    return 0


#: What the sweep's driver imports besides the core's dependencies: Spark and py4j, the progress bar, the
#: Parquet writer, the report's plots. (Workers need only the core's: see spark/README.md.)
_SWEEP_MODULES: Final = ("pyspark", "py4j", "tqdm", "pyarrow", "matplotlib")


def _sweep_lacks(missing: list[str], submitted: bool) -> RunError:
    """The error for a sweep whose driver cannot import ``missing``: the extra to install — or, under
    spark-submit, which Python lacks them (spark-submit picks the driver's with
    ``spark.pyspark.driver.python``, and the packages it needs are listed in spark/README.md)."""
    names = ", ".join(missing)
    if not submitted:
        return RunError(f"the sweep needs {names}: pip install 'pulsar-nack[spark]'")
    return RunError(
        f"the sweep's driver Python ({sys.executable}) needs {names}: pip install {' '.join(missing)} "
        "there, or set spark.pyspark.driver.python to a Python that has it (see spark/README.md)"
    )


def _first_line(error: Exception) -> str:
    """The first line of a py4j error's message — without calling into a JVM that may be gone."""
    try:
        text = str(error)
    except Exception:  # the gateway is closed: py4j's own summary
        text = str(getattr(error, "errmsg", "") or type(error).__name__)
    lines = [line.strip(" :") for line in text.splitlines() if line.strip(" :")]
    if len(lines) > 1 and lines[0].startswith("An error occurred"):  # py4j's "while calling X"; then why
        return lines[1]
    return lines[0] if lines else type(error).__name__


# -- profile -------------------------------------------------------------------------------------------

#: Workload fields whose command-line option is not simply ``--field-name``.
_PROFILE_OPTIONS = {"duration_s": "--duration", "delay": "--delay"}


def _option(field: str) -> str:
    return _PROFILE_OPTIONS.get(field, "--" + field.replace("_", "-"))


def _register_profile(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subcommands.add_parser(
        "profile",
        help="run a described nack workload through the real tracker and measure memory and time",
        description="Feed a workload (rate, delay, duration, topics, batches, nack share, precision) through "
        "a real NackTracker on a simulated clock — no broker; with --broker URL, through that broker — in "
        "fresh processes, and report memory per "
        "pending nack three ways (tracemalloc, system allocator + mallinfo2, RSS), buckets, ledgers, time "
        "per nack and per forward, a pympler per-type breakdown, and beside it the native client's measured "
        "cost and the Java PIP-393 structure (from a source checkout, when java and mvn are available). "
        "Durations take ms, s, m, h or d (a bare number is seconds).",
    )
    parser.add_argument(
        "--rate", type=float, default=1_000.0, help="messages per second (default: %(default)g)"
    )
    parser.add_argument(
        "--delay",
        default="60s",
        help="nack delay: fixed (1h), uniform:LOW:HIGH or exp:MEAN (default: %(default)s)",
    )
    parser.add_argument("--duration", default="60s", help="how long messages arrive (default: %(default)s)")
    parser.add_argument("--topics", type=int, default=1, help="topics (default: %(default)s)")
    parser.add_argument(
        "--partitions", type=int, default=1, help="partitions per topic (default: %(default)s)"
    )
    parser.add_argument("--batch-size", type=int, default=1, help="messages per entry (default: %(default)s)")
    parser.add_argument(
        "--nack-share",
        type=float,
        default=1.0,
        help="share of messages nacked, (0, 1] (default: %(default)g)",
    )
    parser.add_argument("--precision-bits", type=int, default=8, help="k: buckets of 2^k ms (default: 8)")
    parser.add_argument("--rounding", default="floor", help="floor or ceil (default: %(default)s)")
    parser.add_argument(
        "--entries-per-ledger", type=int, default=50_000, help="the broker's ledger size (default: 50000)"
    )
    parser.add_argument(
        "--chunked-share",
        type=float,
        default=0.0,
        help="share of the nacked messages that are chunked (large; without batching), held in memory "
        "until due up to --max-held-chunked-bytes (default: %(default)g)",
    )
    parser.add_argument(
        "--chunked-bytes", type=int, default=8 * 2**20, help="payload of a chunked message (default: 8 MiB)"
    )
    parser.add_argument(
        "--max-held-chunked-bytes",
        type=int,
        default=64 * 2**20,
        help="the consumer option of that name: held payload bound (default: 64 MiB)",
    )
    parser.add_argument("--seed", type=int, default=7, help="which messages are nacked (default: 7)")
    parser.add_argument("--no-java", action="store_true", help="do not run the Java structure beside it")
    parser.add_argument(
        "--broker",
        metavar="URL",
        default=None,
        help="run the workload through this broker instead (pulsar://HOST:PORT): produce it to fresh topics, "
        "consume it paced at --rate with pulsar-nack and, side by side, with the official client's native "
        "nacks, each measure in a fresh process (non-partitioned topics; at most 1,000,000 messages)",
    )
    parser.add_argument(
        "--broker-timeout",
        default="5m",
        help="with --broker: the longest one consuming process may take (default: %(default)s)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write every figure to this JSON file")
    parser.add_argument("--no-progress", action="store_true", help="do not show the progress bar")
    parser.set_defaults(run=_profile)


def _profile_workload(args: argparse.Namespace) -> Any:
    """The :class:`~pulsar_nack.profile.Workload` of the arguments; UsageError naming the option."""
    from pulsar_nack.profile import ProfileError, Workload, parse_delay, parse_duration_ms

    try:
        return Workload(
            rate=args.rate,
            delay=parse_delay(args.delay),
            duration_s=parse_duration_ms(args.duration, "duration_s") / 1_000,
            topics=args.topics,
            partitions=args.partitions,
            batch_size=args.batch_size,
            nack_share=args.nack_share,
            precision_bits=args.precision_bits,
            rounding=args.rounding,
            entries_per_ledger=args.entries_per_ledger,
            chunked_share=args.chunked_share,
            chunked_bytes=args.chunked_bytes,
            max_held_chunked_bytes=args.max_held_chunked_bytes,
            seed=args.seed,
        )
    except ProfileError as error:
        field, _, reason = str(error).partition(":")
        options = " × ".join(_option(part.strip()) for part in field.split("×"))
        raise UsageError(f"{options}:{reason}") from None


def _profile(args: argparse.Namespace) -> int:
    workload = _profile_workload(args)
    check_writable("--json", args.json)
    require_extra("profile", "profile", "pympler", *([] if args.no_progress else ["tqdm"]))
    if args.broker is not None:
        return _profile_broker(args, workload)
    from pulsar_nack.profile import profile

    bar: Any = None
    if not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(
            total=3 * workload.messages + 1, unit="msg", unit_scale=True, file=ProgressStream(sys.stderr)
        )
    offsets = {"default": 0, "malloc": workload.messages, "tracemalloc": 2 * workload.messages}

    def progress(stage: str, done: int, total: int) -> None:
        if bar is not None:
            bar.set_description(stage)
            bar.n = offsets.get(stage, 3 * workload.messages) + done
            bar.refresh()

    try:
        result = profile(workload, java=not args.no_java, progress=progress)
    finally:
        if bar is not None:
            bar.close()
    return _print_profile(result, args.json)


def _print_profile(result: Any, json_path: Path | None) -> int:
    """Print a profile's report (and write its JSON) — offline or through a broker; exit status 0."""
    from pulsar_nack.profile import render

    for line in render(result):
        print(line)
    if json_path is not None:
        import json

        json_path.write_text(json.dumps(result.to_json(), indent=2) + "\n")
        print(f"wrote {json_path}")
    return 0


def _profile_broker(args: argparse.Namespace, workload: Any) -> int:
    """``profile --broker URL``: :func:`pulsar_nack.profile_broker.profile_broker`."""
    from pulsar_nack.profile import ProfileError, parse_duration_ms
    from pulsar_nack.profile_broker import BROKER_MODES, check_broker_run, profile_broker

    options = {"broker": "--broker", "timeout_s": "--broker-timeout", "partitions": "--partitions"}

    def usage(error: ProfileError) -> UsageError:
        field, _, reason = str(error).partition(":")
        named = " × ".join(options.get(part.strip(), _option(part.strip())) for part in field.split("×"))
        return UsageError(f"{named}:{reason}")

    stages = ("produce", *BROKER_MODES)
    bar: Any = None
    _host_ports("--broker", args.broker, ("pulsar", "pulsar+ssl"))
    try:
        timeout_s = parse_duration_ms(args.broker_timeout, "timeout_s") / 1_000
    except ProfileError as error:
        raise UsageError(f"--broker-timeout:{str(error).partition(':')[2]}") from None
    try:  # every argument is checked before the broker is contacted
        check_broker_run(workload, args.broker, timeout_s)
    except ProfileError as error:
        raise usage(error) from None
    # The client's operation timeout (30 s) bounds the connection attempt.
    check_reachable("--broker", args.broker, 30.0, ("pulsar", "pulsar+ssl"))
    import pulsar

    try:
        if not args.no_progress:
            from tqdm import tqdm

            bar = tqdm(
                total=len(stages) * workload.messages,
                unit="msg",
                unit_scale=True,
                file=ProgressStream(sys.stderr),
            )

        def progress(stage: str, done: int, total: int) -> None:
            if bar is not None and stage in stages:
                bar.set_description(stage)
                bar.n = stages.index(stage) * workload.messages + done
                bar.refresh()

        result = profile_broker(
            workload, args.broker, java=not args.no_java, timeout_s=timeout_s, progress=progress
        )
    except ProfileError as error:
        raise usage(error) from None
    except pulsar.Interrupted:  # Ctrl-C inside a blocking client call: a Ctrl-C
        raise KeyboardInterrupt from None
    except pulsar.PulsarException as error:
        raise RunError(f"--broker {args.broker}: {error}") from None
    finally:
        if bar is not None:
            bar.close()
    return _print_profile(result, args.json)


# -- estimate ------------------------------------------------------------------------------------------


def _register_estimate(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subcommands.add_parser(
        "estimate",
        help="predict steady-state memory for pulsar-nack, the native client and the Java structure",
        description="Predict the memory a consumer's nack tracking holds in steady state (rate × nack "
        "share × delay messages pending) for pulsar-nack, the Java PIP-393 structure and the native "
        "client, from models fitted to measurements (bench/fit_estimate.py); says when the workload lies "
        "outside the range the models were fitted over.",
    )
    parser.add_argument("--rate", type=float, required=True, help="messages per second, all topics")
    parser.add_argument(
        "--delay",
        required=True,
        help="nack delay: 250ms, 30s, 5m, 1h, 1d (bare: seconds), or uniform:LOW:HIGH (each nack's own, "
        "drawn between the two, as profile takes it)",
    )
    parser.add_argument("--precision-bits", type=int, default=8, help="k: buckets of 2^k ms (default: 8)")
    parser.add_argument(
        "--entries-per-ledger", type=int, default=50_000, help="the broker's ledger size (default: 50000)"
    )
    parser.add_argument("--batch-size", type=int, default=1, help="messages per entry (default: 1)")
    parser.add_argument("--nack-share", type=float, default=1.0, help="share of messages nacked (default: 1)")
    parser.add_argument("--topics", type=int, default=1, help="topics × partitions read (default: 1)")
    parser.add_argument(
        "--duration", default=None, help="nacks have arrived only this long (default: steady state)"
    )
    parser.add_argument("--fit", type=Path, default=None, help="a fit file (default: the package's)")
    parser.add_argument("--json", type=Path, default=None, help="also write the estimate to this JSON file")
    parser.set_defaults(run=_estimate)


def _estimate(args: argparse.Namespace) -> int:
    from pulsar_nack.estimate import FitError, Scenario, estimate, load_fit, render
    from pulsar_nack.profile import ProfileError, parse_delay, parse_duration_ms

    try:
        delay = parse_delay(args.delay)
        if delay.kind == "exponential":
            raise ProfileError(f"delay: the estimate models fixed and uniform delays, got {args.delay!r}")
        scenario = Scenario(
            rate=args.rate,
            delay_ms=delay.low_ms,
            delay_spread_ms=delay.high_ms - delay.low_ms,
            precision_bits=args.precision_bits,
            entries_per_ledger=args.entries_per_ledger,
            batch_size=args.batch_size,
            nack_share=args.nack_share,
            topics=args.topics,
            duration_ms=None if args.duration is None else parse_duration_ms(args.duration, "duration"),
        )
    except ProfileError as error:
        field, _, reason = str(error).partition(":")
        raise UsageError(f"{_option(field.strip())}:{reason}") from None
    check_writable("--json", args.json)
    try:
        fit = load_fit(args.fit)
    except FitError as error:
        raise UsageError(f"--fit: {error}") from None
    result = estimate(scenario, fit)
    for line in render(result, fit):
        print(line)
    if args.json is not None:
        import json

        args.json.write_text(json.dumps(result.to_json(), indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


# -- the command ---------------------------------------------------------------------------------------

_SUBCOMMANDS: tuple[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None], ...] = (
    demo.register,
    _register_profile,
    _register_estimate,
    _register_sweep,
)


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error: the message and where help is, not the whole usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``pulsar-nack`` parser with every subcommand registered."""
    parser: argparse.ArgumentParser = _Parser(prog="pulsar-nack", description="PIP-393 nack tracking tools.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subcommands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in _SUBCOMMANDS:
        register(subcommands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``pulsar-nack`` with ``argv`` (default: the process's arguments); returns the exit status.

    Bad input exits with status 2 and one line on stderr naming the parameter (argparse's convention),
    checked before a broker or Spark starts; a run that cannot go on (:class:`RunError`: a broker out of
    reach, a missing extra) exits with status 1 and one line naming the cause; Ctrl-C exits with 130,
    without a traceback.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        run: Callable[[argparse.Namespace], int] = args.run
        return run(args)
    except UsageError as error:
        parser.exit(2, f"{parser.prog} {args.command}: error: {error}\n")
    except RunError as error:
        parser.exit(1, f"{parser.prog} {args.command}: {error}\n")
    except KeyboardInterrupt:
        # Ctrl-C: the ``with`` blocks on the way out have stopped what the run started (brokers, Spark,
        # child processes); 128 + SIGINT is the status a shell gives an interrupted command.
        return 130


if __name__ == "__main__":
    # ``python -m pulsar_nack.cli``: run the imported module's main, whose UsageError / RunError are the
    # classes the subcommands raise (this file's copy as ``__main__`` has classes of its own).
    from pulsar_nack.cli import main as cli_main

    sys.exit(cli_main())
