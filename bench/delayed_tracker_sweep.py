"""The experiment of the Pulsar 3.0 delayed-message article (“New Delayed Message In Pulsar 3.0”) on the
models of :mod:`delayed_trackers`: a grid of points, one measured per Spark task, and what
``bench/broker_trackers.py`` prints and plots from the rows.

* :class:`TrackerPoint` — one experiment (a model, its settings, ``n`` messages of the article's workload);
  :data:`TRACKER_GRIDS` holds ``seed004`` (the article's experiment: 1M to 100M messages, every model) and
  ``small``; :func:`load_tracker_grid` reads those or a JSON file in the sweep's grid format
  (:func:`pulsar_nack.sweep.grid.parse_points`) with :class:`TrackerPoint`'s fields;
* :func:`measure_tracker` — one point in, one row of :data:`TRACKER_COLUMNS` out (the Spark task);
* :func:`run_trackers` — the points on Spark (the sweep's session,
  :func:`pulsar_nack.sweep.spark.spark_session`);
* :func:`plot_trackers`, :func:`tracker_table`, :func:`article_comparison`, :func:`tracker_findings` —
  the plot, the table, the article's figures beside ours, and sentences computed from the rows.

A bench module, not shipped: Spark's Python workers import it (and :mod:`delayed_trackers`) from the files
:func:`run_trackers` hands to Spark.
"""

from __future__ import annotations

import gc
import itertools
import json
import math
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Final, get_args

import delayed_trackers
from delayed_trackers import (
    ARTICLE_FIGURES,
    MODELS,
    ArticleFigures,
    ArticleWorkload,
    BucketSettings,
    BucketTracker,
    DelayedTracker,
    Growth,
    Model,
    TimeBucketTracker,
    TrackerOutOfMemory,
    TripleLongPriorityQueue,
    precision_bits_for_tick,
    recover,
)
from matplotlib.figure import Figure

from pulsar_nack.index import Rounding
from pulsar_nack.memory import heap_in_use
from pulsar_nack.sweep.grid import GridError, parse_points
from pulsar_nack.sweep.measure import Row, number
from pulsar_nack.sweep.report import RunInfo

#: The public source of the experiment and of :data:`~delayed_trackers.ARTICLE_FIGURES`, as the reports
#: name it (StreamNative's Pulsar 3.0 delayed-message article).
ARTICLE: Final = "“New Delayed Message In Pulsar 3.0”"


# -- the points ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrackerPoint:
    """One experiment of the tracker sweep: ``model`` fed the first ``n`` messages of the Pulsar 3.0
    article's workload (:class:`~delayed_trackers.ArticleWorkload`), its memory measured, then a
    restart recovered.

    ``growth`` and ``memory_limit_bytes`` (0: none) apply to the heap; ``tick_ms`` (the broker's
    ``delayedDeliveryTickTimeMillis``) to the TimeBucket and bucket models, ``rounding`` to the TimeBucket
    one (``ceil`` is the strict variant); the next five are the bucket tracker's settings
    (:class:`~delayed_trackers.BucketSettings`), ``fsync`` whether its segment files are synced;
    ``read_cost_us`` is the modelled cost of reading one replayed message (not measured). Values are
    checked on construction; errors name the field.
    """

    model: Model = "heap"
    n: int = 1_000_000
    growth: Growth = "double"
    memory_limit_bytes: int = 0
    tick_ms: int = 1_000
    rounding: Rounding = "floor"
    min_index_count_per_bucket: int = 50_000
    max_indexes_per_segment: int = 5_000
    max_time_step_per_segment_s: int = 300
    max_num_buckets: int = -1
    max_loaded_ids: int = 100_000
    fsync: bool = True
    read_cost_us: float = 0.0

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {', '.join(MODELS)}, got {self.model!r}")
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be an int >= 1, got {self.n!r}")
        if self.growth not in ("double", "segmented"):
            raise ValueError(f"growth must be 'double' or 'segmented', got {self.growth!r}")
        if isinstance(self.memory_limit_bytes, bool) or not isinstance(self.memory_limit_bytes, int):
            raise TypeError(f"memory_limit_bytes must be an int, got {self.memory_limit_bytes!r}")
        if self.memory_limit_bytes < 0:
            raise ValueError(f"memory_limit_bytes must be >= 0 (0: no limit), got {self.memory_limit_bytes}")
        if self.rounding not in get_args(Rounding):
            raise ValueError(f"rounding must be 'floor' or 'ceil', got {self.rounding!r}")
        if not isinstance(self.fsync, bool):
            raise TypeError(f"fsync must be true or false, got {self.fsync!r}")
        if isinstance(self.read_cost_us, bool) or not isinstance(self.read_cost_us, int | float):
            raise TypeError(f"read_cost_us must be a number, got {self.read_cost_us!r}")
        object.__setattr__(self, "read_cost_us", float(self.read_cost_us))
        if not self.read_cost_us >= 0:
            raise ValueError(f"read_cost_us must be >= 0, got {self.read_cost_us}")
        self.bucket_settings()  # checks tick_ms and the bucket settings, naming the field

    def bucket_settings(self) -> BucketSettings:
        """The bucket tracker's settings of this point."""
        return BucketSettings(
            min_index_count_per_bucket=self.min_index_count_per_bucket,
            max_indexes_per_segment=self.max_indexes_per_segment,
            max_time_step_per_segment_s=self.max_time_step_per_segment_s,
            max_num_buckets=self.max_num_buckets,
            tick_ms=self.tick_ms,
            max_loaded_ids=self.max_loaded_ids,
        )

    def variant(self) -> str:
        """The model and the settings that set it apart, e.g. ``heap segmented, limit 1,024 MiB``."""
        if self.model == "heap":
            limit = f", limit {self.memory_limit_bytes / 2**20:,.0f} MiB" if self.memory_limit_bytes else ""
            return f"heap {self.growth}{limit}"
        if self.model == "timebucket":
            strict = " strict" if self.rounding == "ceil" else ""
            return f"timebucket tick {self.tick_ms} ms{strict}"
        merge = f", ≤ {self.max_num_buckets} segments" if self.max_num_buckets != -1 else ""
        return f"buckets budget {self.max_loaded_ids:,}{merge}"

    def label(self) -> str:
        """:meth:`variant` and the message count, e.g. ``heap double n=10,000,000``."""
        return f"{self.variant()} n={self.n:,}"

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> TrackerPoint:
        """The point a row of :func:`measure_tracker` was measured at."""
        return cls(**{name: row[name] for name in _TRACKER_FIELDS})


_TRACKER_FIELDS: Final = tuple(f.name for f in fields(TrackerPoint))
_GIB: Final = 2**30

#: Built-in tracker grids, in :func:`~pulsar_nack.sweep.grid.parse_grid`'s JSON format with
#: :class:`TrackerPoint`'s fields.
TRACKER_GRIDS: Final[dict[str, dict[str, Any]]] = {
    # The Pulsar 3.0 article's experiment up to its 100M messages: the heap growing by doubling with no
    # limit, the heap growing by segments under a 1 GiB direct-memory limit (our choice: the article does not
    # give its broker's), the TimeBucket variant (floor; strict once), and the bucket tracker.
    "seed004": {
        "grids": [
            {
                "model": "heap",
                "growth": "double",
                "n": [1_000_000, 3_000_000, 10_000_000, 30_000_000, 100_000_000],
            },
            {
                "model": "heap",
                "growth": "segmented",
                "memory_limit_bytes": _GIB,
                "n": [1_000_000, 3_000_000, 10_000_000, 30_000_000, 100_000_000],
            },
            {"model": "timebucket", "n": [1_000_000, 3_000_000, 10_000_000, 30_000_000, 100_000_000]},
            {"model": "timebucket", "rounding": "ceil", "n": 10_000_000},
            {"model": "buckets", "n": [1_000_000, 3_000_000, 10_000_000, 30_000_000, 100_000_000]},
        ],
    },
    # Every model at 60,000 and 120,000 messages (one and two sealed ledgers): for tests.
    "small": {
        "defaults": {"fsync": False, "min_index_count_per_bucket": 5_000, "max_loaded_ids": 2_000},
        "grids": [{"model": ["heap", "timebucket", "buckets"], "n": [60_000, 120_000]}],
    },
}


def load_tracker_grid(grid: str) -> list[TrackerPoint]:
    """The points of a built-in tracker grid (``seed004``, ``small``) or of a JSON grid file of
    :class:`TrackerPoint` fields (:func:`~pulsar_nack.sweep.grid.parse_grid`'s format). Raises
    :class:`~pulsar_nack.sweep.grid.GridError`."""
    if grid in TRACKER_GRIDS:
        spec: Any = TRACKER_GRIDS[grid]
        source = f"tracker grid {grid!r}"
    else:
        path = Path(grid)
        if not path.is_file():
            raise GridError(
                f"{grid!r} is neither a built-in tracker grid ({', '.join(TRACKER_GRIDS)}) nor a file"
            )
        try:
            spec = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise GridError(f"cannot read tracker grid file {grid}: {error}") from None
        source = f"tracker grid file {grid}"
    return parse_points(spec, source, TrackerPoint, _TRACKER_FIELDS)


# -- one point measured -------------------------------------------------------------------------------------

#: Every column of a tracker row, in order, with its type: the point's fields, then the measurements.
TRACKER_COLUMNS: Final[dict[str, type]] = {
    "model": str,
    "n": int,
    "growth": str,
    "memory_limit_bytes": int,
    "tick_ms": int,
    "rounding": str,
    "min_index_count_per_bucket": int,
    "max_indexes_per_segment": int,
    "max_time_step_per_segment_s": int,
    "max_num_buckets": int,
    "max_loaded_ids": int,
    "fsync": bool,
    "read_cost_us": float,
    "variant": str,
    "precision_bits": int,
    "held": int,
    "oom_at": int,
    "heap_bytes": int,
    "own_bytes": int,
    "bytes_per_id": float,
    "ids_in_memory": int,
    "segments": int,
    "snapshot_bytes": int,
    "build_s": float,
    "recovery_s": float,
    "replayed": int,
    "restored": int,
    "recovered": int,
    "modelled_read_s": float,
    "recovery_heap_bytes": int,
    "measure_s": float,
}


def measure_tracker(point: TrackerPoint, scratch: str | None = None) -> Row:
    """Feed the point's model the first ``n`` messages of the Pulsar 3.0 article's workload in publish
    order, measure it, restart it (:func:`~delayed_trackers.recover`) and measure the recovered
    tracker.

    Memory is **measured**: ``heap_bytes`` is the :func:`~pulsar_nack.memory.heap_in_use` delta (pymalloc
    blocks + glibc in-use chunks, numpy's buffers and CRoaring's heap included) between before the
    tracker existed and after it holds every id, with no workload array alive at either reading;
    ``own_bytes`` is the model's own account (heap: its buffers; TimeBucket: the index's walk; buckets:
    none), a cross-check. ``recovery_heap_bytes`` is the same delta after the recovery (the old tracker
    released first). A heap with ``memory_limit_bytes`` stops at the growth that would pass the limit:
    ``oom_at`` is how many ids it held (the topic's backlog for the recovery is then those ids), and
    None when every id fit. The restart happens when the producer stops: with the article's delays (≥ 48 h)
    nothing is due yet, so every held id must come back (RuntimeError otherwise).

    The bucket tracker writes its segments into a fresh folder under ``scratch`` (default: the system's
    temporary folder), removed afterwards. Cost: O(n) — see each model's complexities.
    """
    started_all = time.perf_counter()
    workload_ = ArticleWorkload(point.n)
    folder = Path(tempfile.mkdtemp(prefix="pulsar-nack-trackers-", dir=scratch))
    try:
        gc.collect()
        before = heap_in_use()
        tracker = _tracker(point, folder)
        oom_at: int | None = None
        started = time.perf_counter()
        for low in range(0, point.n, workload_.chunk):
            if isinstance(tracker, BucketTracker):
                tracker.now_ms = workload_.published_ms(low + 1)
            try:
                tracker.add_many(*workload_.slice(low, min(low + workload_.chunk, point.n)))
            except TrackerOutOfMemory as error:
                oom_at = error.held
                break
        build_s = time.perf_counter() - started
        held = len(tracker)
        stopped_ms = workload_.published_ms(held)
        if isinstance(tracker, BucketTracker):
            tracker.now_ms = stopped_ms
        gc.collect()
        heap_bytes = heap_in_use() - before
        row: Row = dict.fromkeys(TRACKER_COLUMNS)
        row |= asdict(point)
        row |= {
            "variant": point.variant(),
            "precision_bits": None if point.model == "heap" else precision_bits_for_tick(point.tick_ms),
            "held": held,
            "oom_at": oom_at,
            "heap_bytes": heap_bytes,
            "own_bytes": tracker.own_bytes(),
            "bytes_per_id": heap_bytes / held,
            "ids_in_memory": held,
            "build_s": build_s,
        }
        if isinstance(tracker, BucketTracker):
            stats = tracker.store.stats()
            row |= {
                "ids_in_memory": stats.ids_in_memory,
                "segments": stats.segments_total,
                "snapshot_bytes": stats.bytes_total,
            }
        backlog = workload_ if oom_at is None else ArticleWorkload(held)
        recovered, recovery = recover(tracker, backlog, stopped_ms, point.read_cost_us / 1e6)
        del tracker
        gc.collect()
        row |= {
            "recovery_s": recovery.seconds,
            "replayed": recovery.replayed,
            "restored": recovery.restored,
            "recovered": recovery.pending,
            "modelled_read_s": recovery.modelled_read_s,
            "recovery_heap_bytes": heap_in_use() - before,
        }
        if recovery.pending != held:
            raise RuntimeError(f"{point.label()}: {held:,} ids held, {recovery.pending:,} after the recovery")
        recovered.close()
        del recovered
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    row["measure_s"] = time.perf_counter() - started_all
    return row


def _tracker(point: TrackerPoint, folder: Path) -> DelayedTracker:
    if point.model == "heap":
        return TripleLongPriorityQueue(point.memory_limit_bytes, point.growth)
    if point.model == "timebucket":
        return TimeBucketTracker(point.tick_ms, point.rounding)
    return BucketTracker(folder, point.bucket_settings(), fsync=point.fsync)


# -- the plot ------------------------------------------------------------------------------------------

_MODEL_COLOURS: Final = {"heap": "#d62728", "timebucket": "#ff7f0e", "buckets": "#1f77b4"}
_MILLION: Final = 1e6


def tracker_series(rows: Sequence[Row]) -> dict[str, list[Row]]:
    """Tracker rows by variant (model and settings), each sorted by n; variants measured at one n only
    are left out (they make no line)."""
    series: dict[str, list[Row]] = {}
    for row in rows:
        series.setdefault(str(row["variant"]), []).append(row)
    return {
        name: sorted(group, key=lambda r: number(r["n"])) for name, group in series.items() if len(group) > 1
    }


def plot_trackers(
    rows: Sequence[Row], article: ArticleFigures = ARTICLE_FIGURES, read_cost_us: float | None = None
) -> Figure | None:
    """The two charts of the Pulsar 3.0 delayed-message article for the models, against the messages each
    tracker *held* (a heap with a memory limit stops where it ran out, marked with a cross): measured memory,
    and measured recovery time (log scale) — with ``read_cost_us``, also the recovery plus a modelled read of
    every replayed message (thin dotted lines, labelled as modelled). The article's figures are black stars.
    None without two sizes of any variant."""
    series = tracker_series(rows)
    if not series:
        return None
    figure = Figure(figsize=(13, 5.5), layout="constrained")
    memory, recovery = figure.subplots(1, 2)
    for (name, group), style in zip(series.items(), itertools.cycle(("-", "--", ":", "-."))):
        colour = _MODEL_COLOURS.get(str(group[0]["model"]), "#555555")
        x = [number(r["held"]) / _MILLION for r in group]
        mib = [number(r["heap_bytes"]) / 2**20 for r in group]
        memory.plot(x, mib, ls=style, marker="o", c=colour, label=name)
        recovery.plot(x, [number(r["recovery_s"]) for r in group], ls=style, marker="o", c=colour, label=name)
        if read_cost_us is not None:
            recovery.plot(
                x,
                [number(r["recovery_s"]) + number(r["replayed"]) * read_cost_us / 1e6 for r in group],
                ls=":",
                lw=1,
                c=colour,
                label=f"{name} + modelled read",
            )
        oom = [r for r in group if r["oom_at"] is not None]
        if oom:
            held, held_mib = number(oom[0]["held"]) / _MILLION, number(oom[0]["heap_bytes"]) / 2**20
            memory.scatter(held, held_mib, marker="X", s=120, c=colour, zorder=4)
            memory.annotate(
                f"out of memory at {held:.1f}M",
                (held, held_mib),
                textcoords="offset points",
                xytext=(8, -14),
                fontsize="small",
                color=colour,
            )
    memory.scatter(
        article.in_memory_oom_messages / _MILLION,
        article.in_memory_direct_memory_mb,
        marker="*",
        s=160,
        c="black",
        label=f"Pulsar 3.0 article: in-memory tracker, {article.in_memory_direct_memory_mb} MB, then out of "
        "memory",
        zorder=5,
    )
    recovery.scatter(
        [article.in_memory_recovery_messages / _MILLION, article.bucket_messages / _MILLION],
        [article.in_memory_recovery_s, article.bucket_recovery_s],
        marker="*",
        s=160,
        c="black",
        label=f"Pulsar 3.0 article: in-memory {article.in_memory_recovery_s:,} s, buckets "
        f"{article.bucket_recovery_s} s",
        zorder=5,
    )
    memory.set(xlabel="delayed messages held (millions)", ylabel="measured memory (MiB)")
    memory.set_title("Memory against delayed messages (X: out of memory)")
    recovery.set(xlabel="delayed messages held (millions)", ylabel="recovery (s)", yscale="log")
    title = "Recovery after a restart, measured"
    if read_cost_us is not None:
        title += f"\n(dotted: + modelled read, {read_cost_us:.0f} µs per replayed message)"
    recovery.set_title(title, fontsize="medium")
    for axes in (memory, recovery):
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize="x-small")
    return figure


# -- the tables ----------------------------------------------------------------------------------------


def _int(value: object) -> str:
    return "–" if value is None else f"{int(number(value)):,}"


def _mib(value: object) -> str:
    return "–" if value is None else f"{number(value) / 2**20:,.1f}"


#: Columns of the tracker report's table: header → cell of a row.
_TRACKERS: Final[dict[str, Callable[[Row], str]]] = {
    "model": lambda r: str(r["variant"]),
    "messages": lambda r: f"{int(number(r['n'])):,}",
    "held": lambda r: f"{int(number(r['held'])):,}" + (" (out of memory)" if r["oom_at"] is not None else ""),
    "memory MiB": lambda r: _mib(r["heap_bytes"]),
    "B/id": lambda r: f"{number(r['bytes_per_id']):.2f}",
    "own account MiB": lambda r: _mib(r["own_bytes"]),
    "ids in memory": lambda r: f"{int(number(r['ids_in_memory'])):,}",
    "segments": lambda r: _int(r["segments"]),
    "snapshots MiB": lambda r: _mib(r["snapshot_bytes"]),
    "build s": lambda r: f"{number(r['build_s']):.1f}",
    "recovery s": lambda r: f"{number(r['recovery_s']):.2f}",
    "replayed": lambda r: f"{int(number(r['replayed'])):,}",
    "restored": lambda r: f"{int(number(r['restored'])):,}",
    "modelled read s": lambda r: f"{number(r['modelled_read_s']):,.0f}",
}


def tracker_table(rows: Sequence[Row]) -> tuple[list[str], list[list[str]]]:
    """The tracker report's table of all points: (headers, rows of formatted cells), in grid order."""
    return list(_TRACKERS), [[cell(row) for cell in _TRACKERS.values()] for row in rows]


def _largest(rows: Sequence[Row], **match: object) -> Row | None:
    """The row with the most messages among those whose columns equal ``match``."""
    chosen = [r for r in rows if all(r[name] == value for name, value in match.items())]
    return max(chosen, key=lambda r: number(r["n"])) if chosen else None


def _nearest(rows: Sequence[Row], n: int, **match: object) -> Row | None:
    """The row whose message count is nearest ``n`` (on a log scale) among those matching ``match``."""
    chosen = [r for r in rows if all(r[name] == value for name, value in match.items())]
    if not chosen:
        return None
    return min(chosen, key=lambda r: abs(math.log(number(r["held"]) / n)))


def article_comparison(
    rows: Sequence[Row], article: ArticleFigures = ARTICLE_FIGURES, read_cost_us: float | None = None
) -> list[list[str]]:
    """The Pulsar 3.0 article's figures with ours beside them: (what, its value, ours, our row) rows; a
    figure the rows cannot answer is left out. With ``read_cost_us`` the recoveries also show a *modelled*
    read of every replayed message at that cost, labelled as such (the rows' own ``modelled_read_s``
    otherwise)."""

    def read_s(row: Row) -> float:
        if read_cost_us is None:
            return number(row["modelled_read_s"])
        return number(row["replayed"]) * read_cost_us / 1e6

    modelled = "modelled read" if read_cost_us is None else f"modelled read at {read_cost_us:.0f} µs/message"
    out: list[list[str]] = []
    limited = [r for r in rows if r["model"] == "heap" and r["oom_at"] is not None]
    if limited:
        row = min(limited, key=lambda r: number(r["oom_at"]))
        out.append(
            [
                "in-memory tracker: messages when it ran out of memory",
                f"{article.in_memory_oom_messages:,}",
                f"{int(number(row['oom_at'])):,} "
                f"(limit {number(row['memory_limit_bytes']) / 2**20:,.0f} MiB, ours)",
                str(row["variant"]),
            ]
        )
        out.append(
            [
                "in-memory tracker: memory at that point",
                f"{article.in_memory_direct_memory_mb} MB (direct memory)",
                f"{_mib(row['heap_bytes'])} MiB ({number(row['bytes_per_id']):.1f} B/id)",
                str(row["variant"]),
            ]
        )
    for model in ("heap", "timebucket"):
        near = _nearest(rows, article.in_memory_recovery_messages, model=model, oom_at=None)
        if near is not None:
            row = near
            out.append(
                [
                    f"in-memory tracker ({model}): recovery of {int(number(row['held'])):,} messages",
                    f"{article.in_memory_recovery_s:,} s for {article.in_memory_recovery_messages:,}",
                    f"{number(row['recovery_s']):,.1f} s index rebuild "
                    f"(+ {read_s(row):,.0f} s {modelled} of {int(number(row['replayed'])):,})",
                    str(row["variant"]),
                ]
            )
    buckets = _largest(rows, model="buckets")
    if buckets is not None:
        out.append(
            [
                f"bucket tracker: {int(number(buckets['held'])):,} messages held",
                f"{article.bucket_messages:,} held, direct memory low and flat",
                f"{_mib(buckets['heap_bytes'])} MiB ({number(buckets['bytes_per_id']):.2f} B/id), "
                f"{int(number(buckets['ids_in_memory'])):,} ids in memory",
                str(buckets["variant"]),
            ]
        )
        out.append(
            [
                f"bucket tracker: recovery of {int(number(buckets['held'])):,} messages",
                f"{article.bucket_recovery_s} s for {article.bucket_messages:,}",
                f"{number(buckets['recovery_s']):,.1f} s ({int(number(buckets['restored'])):,} restored "
                f"from the segment files; + {read_s(buckets):,.1f} s {modelled} of "
                f"{int(number(buckets['replayed'])):,} replayed)",
                str(buckets["variant"]),
            ]
        )
    return out


def tracker_findings(rows: Sequence[Row]) -> list[str]:
    """Plain sentences on the shape the rows show, computed from them."""
    out: list[str] = []
    for name, group in tracker_series(rows).items():
        fitting = [r for r in group if r["oom_at"] is None]
        first, last = group[0], group[-1]
        if len(fitting) >= 2:
            low, high = fitting[0], fitting[-1]
            slope = (number(high["heap_bytes"]) - number(low["heap_bytes"])) / (
                number(high["held"]) - number(low["held"])
            )
            out.append(
                f"{name}: {_mib(low['heap_bytes'])} MiB at {int(number(low['held'])):,} messages, "
                f"{_mib(high['heap_bytes'])} MiB at {int(number(high['held'])):,} — {slope:.2f} B per added "
                f"message; recovery {number(low['recovery_s']):.2f} s → {number(high['recovery_s']):.2f} s."
            )
        oom = next((r for r in group if r["oom_at"] is not None), None)
        if oom is not None:
            out.append(
                f"{name}: out of memory at {int(number(oom['oom_at'])):,} messages "
                f"({_mib(oom['heap_bytes'])} MiB held); every larger point holds the same."
            )
        if first["model"] == "buckets":
            out.append(
                f"{name}: at most {max(int(number(r['ids_in_memory'])) for r in group):,} ids in memory "
                "at any size (the open bucket; the loaded budget is "
                f"{int(number(last['max_loaded_ids'])):,}); what grows is each segment's membership "
                "bitmaps and metadata."
            )
            if last["segments"]:
                per_segment = number(last["heap_bytes"]) / number(last["segments"])
                out.append(
                    f"{name}: {per_segment / 1024:,.1f} KiB of memory per segment at "
                    f"{int(number(last['held'])):,} messages ({int(number(last['segments'])):,} segments "
                    f"of ≤ {int(number(last['max_indexes_per_segment'])):,} ids): random delays scatter a "
                    "segment's ids over its ledger, so its membership bitmap is a dense bitset rather than "
                    "a run (one bitmap per bucket and ledger would hold the ledger's consecutive "
                    "entries as one run)."
                )
            full = [r for r in rows if r["model"] != "buckets" and r["oom_at"] is None]
            if full:
                most = max(full, key=lambda r: number(r["held"]))
                out.append(
                    f"Replayed after a restart: {int(number(last['replayed'])):,} messages for the bucket "
                    f"tracker at {int(number(last['held'])):,} held (the open bucket only), against "
                    f"{int(number(most['replayed'])):,} for the in-memory tracker at "
                    f"{int(number(most['held'])):,} (every message) — the article's recovery gap is mostly "
                    "this read, which the models measure as a count, not as time."
                )
    return out


# -- the job ----------------------------------------------------------------------------------------------


def sweep_trackers(spark: Any, points: Sequence[TrackerPoint], progress: bool = True) -> list[Row]:
    """Measure ``points`` on the running Spark session ``spark`` (:func:`measure_tracker` per point, one
    task each, :func:`pulsar_nack.sweep.spark.run_tasks`); rows in grid order. The workers get this module
    and :mod:`delayed_trackers` from Spark (``addPyFile``): they are not part of the installed package."""
    from pulsar_nack.sweep.spark import run_tasks

    for path in (delayed_trackers.__file__, __file__):
        spark.sparkContext.addPyFile(str(path))
    return run_tasks(spark, points, measure_tracker, "pulsar-nack tracker models", progress)


def run_trackers(
    grid: str, points: Sequence[TrackerPoint], master: str | None = None, progress: bool = True
) -> tuple[list[Row], RunInfo]:
    """:func:`sweep_trackers` in a Spark session of its own (``master``; progress bar on stderr with
    ``progress``); the rows in grid order and the run facts (``grid`` names the grid)."""
    from pulsar_nack.sweep.spark import run_info, spark_session

    started = time.perf_counter()
    with spark_session(master, app_name="pulsar-nack tracker models") as spark:
        spark_up = time.perf_counter()
        rows = sweep_trackers(spark, points, progress)
        swept = time.perf_counter()
        version, used_master = spark.version, str(spark.sparkContext.master)
    stopped = time.perf_counter()
    info = run_info(grid, used_master, points, version, (started, spark_up, swept, stopped, stopped))
    return rows, replace(info, total_s=stopped - started)
