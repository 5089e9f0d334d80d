"""The ``pulsar-nack`` command line.

Each subcommand is one registration function (adds its parser, sets ``run``: ``_register_sweep`` here,
:func:`pulsar_nack.demo.register`) and one function that does the work and returns the exit status;
:data:`_SUBCOMMANDS` lists the registrations. Heavy imports (pyspark, matplotlib) happen inside the
subcommand that needs them.

    pulsar-nack demo [--service-url URL] [--messages N] ...   (pulsar_nack.demo)
    pulsar-nack sweep [--grid default|small|FILE] [--master local[*]|spark://HOST:PORT] [--out DIR]
                      [--java-results FILE|none]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from pulsar_nack import demo

__all__ = ["UsageError", "build_parser", "main"]


class UsageError(Exception):
    """Bad command-line input, found after parsing; the message names the parameter."""


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
        "when it exists, else none)",
    )
    parser.add_argument("--no-progress", action="store_true", help="do not show the progress bar")
    parser.set_defaults(run=_sweep)


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
    from pulsar_nack.sweep.grid import GridError, load_grid

    try:
        points = load_grid(args.grid)
    except GridError as error:
        raise UsageError(f"--grid: {error}") from None
    if args.master is not None:
        from pulsar_nack.sweep.spark import check_master

        try:
            check_master(args.master)
        except ValueError as error:
            raise UsageError(f"--master: {error}") from None
    if args.out.exists() and not args.out.is_dir():
        raise UsageError(f"--out: {args.out} exists and is not a folder")
    java_results = _java_results(args.java_results)

    from pulsar_nack.sweep.spark import run

    result = run(
        args.grid,
        points,
        args.out,
        master=args.master,
        progress=not args.no_progress,
        java_results=java_results,
    )
    info = result.info
    print(
        f"{info.points} points ({info.ids:,} ids) on {info.master}: {info.total_s:.1f} s "
        f"(Spark start {info.start_s:.1f} s, sweep {info.sweep_s:.1f} s, Spark stop {info.stop_s:.1f} s, "
        f"Parquet {info.parquet_s:.1f} s, report {info.report_s:.1f} s)"
    )
    print(f"wrote {result.parquet}, {result.report} and {result.report.with_suffix('.html')}")
    print(f"Java bars: {java_results}" if java_results else "Java bars: none (no --java-results file)")
    return 0


# -- the command ---------------------------------------------------------------------------------------

_SUBCOMMANDS: tuple[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None], ...] = (
    demo.register,
    _register_sweep,
)


def build_parser() -> argparse.ArgumentParser:
    """The ``pulsar-nack`` parser with every subcommand registered."""
    parser = argparse.ArgumentParser(prog="pulsar-nack", description="PIP-393 nack tracking tools.")
    subcommands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in _SUBCOMMANDS:
        register(subcommands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``pulsar-nack`` with ``argv`` (default: the process's arguments); returns the exit status.

    Bad input exits with status 2 and a message naming the parameter (argparse's convention).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except UsageError as error:
        parser.exit(2, f"{parser.prog} {args.command}: error: {error}\n")


if __name__ == "__main__":
    sys.exit(main())
