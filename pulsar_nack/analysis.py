"""The memory sweep's task: one grid point in, one row of measurements out (pure; runs on Spark workers).

A :class:`GridPoint` names one experiment of the TimeBucket blog's memory analysis (§3.2): a tracker
(``contender``) is fed ``n`` nacked ids of the blog's workload (``x`` ids per ms, ``entries_per_ledger``
entries per ledger, a ``nack_share`` of the message stream nacked, ``batch`` messages per entry) and
:func:`measure` reports what it holds — buckets, bitmaps, Roaring containers, retained bytes — and how fast it
was built and drained. Grids are lists of points, built from a small JSON format (:func:`parse_grid`,
:func:`load_grid`); ``default`` is 48 (x, k) points (x = 1, 2, 4, 8, 16, 32 ids per ms; k = 0, 4, 8, 10, 12,
15, 16, 18) plus one point per baseline, ``small`` a dozen quick points that touch every axis.

Memory is measured without a fresh process per point (a Spark worker runs many points):

* **index** — :meth:`TimeBucketIndex.memory_usage`: Python objects at the sizes the allocator hands out
  plus CRoaring's C heap read with ``malloc_usable_size``. It is a walk of the live structure, so it is
  exact for what it counts, up to tens of bytes of allocator rounding that depend on the process's
  heap history (see :data:`MEMORY_COLUMNS`). docs/performance.md compares it with a fresh-process
  measurement: within 1–5 % before compaction; after compaction it misses a few KB of allocator
  slack, which matters only for structures of a few tens of KB.
* **hashmap**, **heap** — a delta of :func:`pulsar_nack.memory.heap_in_use` (pymalloc's allocated blocks +
  glibc's in-use chunks) around building the tracker, after a warm-up build and ``gc.collect()``. It
  counts allocated blocks, not RSS, so memory freed by earlier points does not inflate it; what can
  disturb it is anything else allocating in the process meanwhile (another thread) — a few hundred bytes
  against the baselines' megabytes. The index rows carry the same delta (``heap_delta_bytes``, taken
  right after building) as a cross-check of the walk before compaction (``bytes_before_compact``).

Cost of :func:`measure`: O(n) to generate and build, plus O(buckets × ledgers) Python work to walk the
index twice (before and after compaction) — the walk dominates when buckets are tiny (k = 0: one
bucket per ms).
"""

from __future__ import annotations

import gc
import itertools
import json
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Final, Literal, TypeAlias, get_args

import numpy as np
import numpy.typing as npt

from pulsar_nack.baselines import HashMapTracker, TripleLongHeap
from pulsar_nack.index import MAX_ENTRY_ID, MAX_PRECISION_BITS, TimeBucketIndex
from pulsar_nack.memory import heap_in_use
from pulsar_nack.workloads import Workload

__all__ = [
    "COLUMNS",
    "CONTENDERS",
    "GRIDS",
    "MEMORY_COLUMNS",
    "TIMING_COLUMNS",
    "Contender",
    "GridError",
    "GridPoint",
    "Row",
    "load_grid",
    "measure",
    "parse_grid",
    "pip393_bytes_per_id",
    "workload",
]

Contender = Literal["index", "hashmap", "heap"]
CONTENDERS: Final[tuple[str, ...]] = get_args(Contender)
Rounding = Literal["floor", "ceil"]

#: A measured row: column name → value (None where a column does not apply to the contender).
Row: TypeAlias = dict[str, int | float | str | bool | None]

#: Bytes of one Roaring bitset container (2^16 bits), and the cardinality above which CRoaring and
#: RoaringBitmap switch from an array container to a bitset (PIP-393's 4096 threshold).
BITSET_BYTES: Final = 8192
ARRAY_LIMIT: Final = 4096
#: PIP-393's cost of one value in an array container (the blog counts 2 B, the bare uint16).
PIP393_ARRAY_BYTES: Final = 4


@dataclass(frozen=True)
class GridPoint:
    """One experiment of the sweep.

    ``x`` ids per ms and ``k`` precision bits make the nominal bucket size ``M = x·2^k`` ids.
    ``nack_share`` is the share of the consecutive message stream that is nacked (1.0 = dense; below 1
    the messages are chosen by SplitMix64, as in :class:`~pulsar_nack.workloads.Workload`). ``batch``
    messages make one entry: with ``batch > 1`` every id carries a batch index (``0..batch-1``), and the
    index tracks those per entry; ``batch == 1`` means plain, non-batched entries. ``compact`` calls
    :meth:`TimeBucketIndex.compact` after building (baselines have nothing to compact). ``rounding`` is
    the index's bucket rounding. Every value is checked on construction; errors name the field.
    """

    contender: Contender = "index"
    x: int = 8
    k: int = 8
    n: int = 200_000
    entries_per_ledger: int = 50_000
    nack_share: float = 1.0
    batch: int = 1
    rounding: Rounding = "floor"
    compact: bool = True

    def __post_init__(self) -> None:
        for name in ("x", "k", "n", "entries_per_ledger", "batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r}")
        if isinstance(self.nack_share, bool) or not isinstance(self.nack_share, int | float):
            raise TypeError(f"nack_share must be a number, got {self.nack_share!r}")
        object.__setattr__(self, "nack_share", float(self.nack_share))
        if not isinstance(self.compact, bool):
            raise TypeError(f"compact must be true or false, got {self.compact!r}")
        if self.contender not in CONTENDERS:
            raise ValueError(f"contender must be one of {', '.join(CONTENDERS)}, got {self.contender!r}")
        if self.rounding not in get_args(Rounding):
            raise ValueError(f"rounding must be 'floor' or 'ceil', got {self.rounding!r}")
        if self.x < 1:
            raise ValueError(f"x must be >= 1 id per ms, got {self.x}")
        if not 0 <= self.k <= MAX_PRECISION_BITS:
            raise ValueError(f"k must be in 0..{MAX_PRECISION_BITS}, got {self.k}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if not 0.0 < self.nack_share <= 1.0:
            raise ValueError(f"nack_share must be in (0, 1], got {self.nack_share}")
        if self.entries_per_ledger < 1:
            raise ValueError(f"entries_per_ledger must be >= 1, got {self.entries_per_ledger}")
        if self.batch < 1:
            raise ValueError(f"batch must be >= 1 message per entry, got {self.batch}")
        if self.entries_per_ledger * self.batch > MAX_ENTRY_ID:
            raise ValueError(
                f"entries_per_ledger × batch must be <= {MAX_ENTRY_ID}, got "
                f"{self.entries_per_ledger} × {self.batch}"
            )

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> GridPoint:
        """The point a row of :func:`measure` (or any mapping holding every field) was measured at."""
        return cls(**{name: row[name] for name in _FIELDS})

    @property
    def ids_per_bucket(self) -> int:
        """The nominal bucket size M = x·2^k (a bucket holds at most n ids)."""
        return self.x << self.k

    def label(self) -> str:
        """A short human label, e.g. ``index x=8 k=10 sparse 0.1 batch 4 ceil no-compact``."""
        parts = [self.contender, f"x={self.x}", f"k={self.k}"]
        if self.nack_share < 1.0:
            parts.append(f"sparse {self.nack_share:g}")
        if self.batch > 1:
            parts.append(f"batch {self.batch}")
        if self.rounding != "floor":
            parts.append(self.rounding)
        if not self.compact:
            parts.append("no-compact")
        return " ".join(parts)


# -- theory ------------------------------------------------------------------------------------------


def pip393_bytes_per_id(
    ids_per_bucket: float, entries_per_ledger: int = 50_000, nack_share: float = 1.0
) -> float:
    """PIP-393's average entry size for buckets of ``ids_per_bucket`` ids (section "Memory occupation").

    A bucket of M ids spans ``L = ceil(M / C)`` ledgers, where ``C = entries_per_ledger · nack_share`` is
    how many nacked ids one ledger holds, and stores one bitmap of ``c = min(M, C)`` ids per ledger:
    ``4c`` bytes as an array container below 4096 values, 8 KiB as a bitset above. Per id that is
    4 B (M < 4096), 8192/M B (4096 ≤ M ≤ C) and ≈ 8192/C B beyond (0.163 B at C = 50,000). The PIP
    ignores the bucket's key and ledger ids (16 B per bucket and ledger) and run containers. O(1).
    """
    if ids_per_bucket <= 0:
        raise ValueError(f"ids_per_bucket must be > 0, got {ids_per_bucket}")
    per_ledger = entries_per_ledger * nack_share
    ledgers = math.ceil(ids_per_bucket / per_ledger)
    cardinality = min(ids_per_bucket, per_ledger)
    bitmap = PIP393_ARRAY_BYTES * cardinality if cardinality < ARRAY_LIMIT else BITSET_BYTES
    return ledgers * bitmap / ids_per_bucket


# -- the workload ------------------------------------------------------------------------------------


#: ``(due_ms, ledger_ids, entry_ids, batch_indexes or None)``, as ``add_many`` takes them.
Ids: TypeAlias = tuple[
    npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.uint32], npt.NDArray[np.int64] | None
]


def workload(point: GridPoint) -> Ids:
    """``(due_ms, ledger_ids, entry_ids, batch_indexes)`` of the point's ``n`` ids, in nack order. O(n).

    Message ``q`` of the stream is batch index ``q % batch`` of stream entry ``q // batch``; the blog's
    generator with ``entries_per_ledger · batch`` messages per ledger yields exactly that split, so for
    ``batch == 1`` this is :meth:`Workload.generate` unchanged (and ``batch_indexes`` is None).
    """
    due, ledgers, messages = Workload(
        x=point.x,
        n=point.n,
        entries_per_ledger=point.entries_per_ledger * point.batch,
        nack_share=point.nack_share,
    ).generate()
    if point.batch == 1:
        return due, ledgers, messages, None
    batch = np.uint32(point.batch)
    return due, ledgers, messages // batch, (messages % batch).astype(np.int64)


# -- one grid point ------------------------------------------------------------------------------------

#: Every column of a row, in order, with its type (the Parquet schema is built from this): the point's
#: fields, then the measurements.
COLUMNS: Final[dict[str, type]] = {
    "contender": str,
    "x": int,
    "k": int,
    "n": int,
    "entries_per_ledger": int,
    "nack_share": float,
    "batch": int,
    "rounding": str,
    "compact": bool,
    "ids_per_bucket": int,
    "theory_bytes_per_id": float,
    "pending": int,
    "buckets": int,
    "slots": int,
    "bitmaps": int,
    "packed_runs": int,
    "array_containers": int,
    "bitset_containers": int,
    "run_containers": int,
    "python_bytes": int,
    "roaring_bytes": int,
    "bytes_before_compact": int,
    "retained_bytes": int,
    "bytes_per_id": float,
    "heap_delta_bytes": int,
    "memory_method": str,
    "build_ns_per_id": float,
    "drain_ns_per_id": float,
    "measure_s": float,
}

#: Columns that vary between runs of the same point: the timings, freely.
TIMING_COLUMNS: Final = frozenset({"build_ns_per_id", "drain_ns_per_id", "measure_s"})
#: Columns that vary by a little between runs: memory read from the allocator. glibc may hand out a chunk
#: a size larger when it reuses freed memory, and an int may or may not be shared, so the index's walk
#: differs by tens of bytes between processes; a heap delta also sees whatever else was allocated
#: meanwhile. Every other column of a row is exact.
MEMORY_COLUMNS: Final = frozenset(
    {
        "python_bytes",
        "roaring_bytes",
        "bytes_before_compact",
        "retained_bytes",
        "bytes_per_id",
        "heap_delta_bytes",
    }
)

_WARM_UP_IDS = 2_000
_FAR_FUTURE_MS = 2**62


def measure(point: GridPoint) -> Row:
    """Build the point's tracker from its workload and measure it; one row with every :data:`COLUMNS` key.

    Steps: generate the ids; warm up (build and drain a small tracker, so first-use allocations are not
    counted); ``gc.collect()`` and read :func:`heap_in_use`; ``add_many`` all ids (timed); read the heap
    delta (``heap_delta_bytes``, before anything else allocates); for the index, walk it
    (``bytes_before_compact``), ``compact()`` if asked and walk it again (``retained_bytes``, Roaring
    container counts); drain everything with one ``pop_due`` (timed). ``measure_s`` is the wall time of
    the whole call. Raises RuntimeError if the drain leaves ids behind. Cost: see the module docstring.
    """
    measure_started = time.perf_counter()
    due, ledgers, entries, batches = workload(point)
    warm = slice(0, _WARM_UP_IDS)
    _build(
        point, due[warm], ledgers[warm], entries[warm], None if batches is None else batches[warm]
    ).pop_due(_FAR_FUTURE_MS)
    gc.collect()
    heap_before = heap_in_use()
    started = time.perf_counter_ns()
    tracker = _build(point, due, ledgers, entries, batches)
    build_ns = time.perf_counter_ns() - started
    gc.collect()
    heap_delta = heap_in_use() - heap_before
    row: Row = dict.fromkeys(COLUMNS)
    row |= asdict(point)
    row |= {"ids_per_bucket": point.ids_per_bucket, "pending": len(tracker), "heap_delta_bytes": heap_delta}
    if isinstance(tracker, TimeBucketIndex):
        row["bytes_before_compact"] = tracker.memory_usage().total_bytes
        if point.compact:
            tracker.compact()
        usage = tracker.memory_usage()
        row |= tracker.structure()
        row |= {
            "python_bytes": usage.python_bytes,
            "roaring_bytes": usage.roaring_bytes,
            "retained_bytes": usage.total_bytes,
            "memory_method": "memory_usage",
        }
        if point.batch == 1:
            row["theory_bytes_per_id"] = pip393_bytes_per_id(
                min(point.ids_per_bucket, point.n), point.entries_per_ledger, point.nack_share
            )
    else:
        row |= {"retained_bytes": heap_delta, "memory_method": "heap_in_use delta"}
    started = time.perf_counter_ns()
    tracker.pop_due(_FAR_FUTURE_MS)
    drain_ns = time.perf_counter_ns() - started
    if len(tracker):
        raise RuntimeError(f"{point.label()}: {len(tracker)} ids left after draining everything")
    retained = row["retained_bytes"]
    assert isinstance(retained, int)
    row |= {
        "bytes_per_id": retained / point.n,
        "build_ns_per_id": build_ns / point.n,
        "drain_ns_per_id": drain_ns / point.n,
        "measure_s": time.perf_counter() - measure_started,
    }
    return row


Tracker: TypeAlias = TimeBucketIndex | HashMapTracker | TripleLongHeap


def _build(
    point: GridPoint,
    due: npt.NDArray[np.int64],
    ledgers: npt.NDArray[np.int64],
    entries: npt.NDArray[np.uint32],
    batches: npt.NDArray[np.int64] | None,
) -> Tracker:
    """A new tracker of the point's contender holding the given ids (bulk add)."""
    tracker: Tracker
    if point.contender == "index":
        tracker = TimeBucketIndex(point.k, point.rounding)
    elif point.contender == "hashmap":
        tracker = HashMapTracker()
    else:
        tracker = TripleLongHeap()
    tracker.add_many(due, ledgers, entries, batches)
    return tracker


# -- grids -------------------------------------------------------------------------------------------


class GridError(ValueError):
    """A grid name, file or specification that cannot be turned into grid points."""


#: Built-in grids, in the JSON format of :func:`parse_grid`.
GRIDS: Final[dict[str, dict[str, Any]]] = {
    # 48 (x, k) points of the index, plus each baseline once (their memory depends on
    # neither x nor k), 200,000 ids each.
    "default": {
        "defaults": {"n": 200_000},
        "grids": [
            {"contender": "index", "x": [1, 2, 4, 8, 16, 32], "k": [0, 4, 8, 10, 12, 15, 16, 18]},
            {"contender": ["hashmap", "heap"], "x": 8, "k": 10},
        ],
    },
    # A dozen points that touch every axis, 20,000 ids each: for tests and the notebook.
    "small": {
        "defaults": {"n": 20_000},
        "grids": [
            {"contender": "index", "x": [1, 8], "k": [4, 8, 12]},
            {"contender": "index", "x": 8, "k": 10, "nack_share": 0.1},
            {"contender": "index", "x": 8, "k": 10, "batch": 4},
            {"contender": "index", "x": 8, "k": 10, "rounding": "ceil"},
            {"contender": "index", "x": 8, "k": 10, "compact": False},
            {"contender": ["hashmap", "heap"], "x": 8, "k": 10},
        ],
    },
}

_FIELDS: Final = tuple(f.name for f in fields(GridPoint))


def parse_grid(spec: Any, source: str = "grid") -> list[GridPoint]:
    """Expand a grid specification into points, in order. O(points).

    The format (JSON)::

        {"defaults": {"n": 200000},                     # optional: values for every point
         "grids": [{"x": [1, 2, 4], "k": [8, 10]},      # a product: x outer, k inner
                   {"contender": ["hashmap", "heap"]}]} # scalars and lists mix freely

    Each entry of ``grids`` is the Cartesian product of its values (a scalar is a one-value list),
    first key outermost; fields left out come from ``defaults``, then from :class:`GridPoint`. Fields
    are those of :class:`GridPoint`. Raises :class:`GridError` naming ``source`` and the bad part.
    """
    if not isinstance(spec, Mapping):
        raise GridError(f"{source}: must be a JSON object with 'grids' (and optional 'defaults')")
    unknown = set(spec) - {"defaults", "grids"}
    if unknown:
        raise GridError(
            f"{source}: unknown key(s) {sorted(unknown)}; expected 'grids' and optional 'defaults'"
        )
    defaults = spec.get("defaults", {})
    if not isinstance(defaults, Mapping):
        raise GridError(f"{source}: 'defaults' must be an object of field values")
    _check_fields(defaults, f"{source}: defaults")
    grids = spec.get("grids")
    if not isinstance(grids, list) or not grids:
        raise GridError(f"{source}: 'grids' must be a non-empty list of objects")
    points: list[GridPoint] = []
    seen: dict[GridPoint, str] = {}
    for i, grid in enumerate(grids):
        where = f"{source}: grids[{i}]"
        if not isinstance(grid, Mapping) or not grid:
            raise GridError(f"{where} must be a non-empty object of field values")
        _check_fields(grid, where)
        for values in _product(grid, where):
            try:
                point = GridPoint(**{**defaults, **values})
            except (TypeError, ValueError) as error:
                raise GridError(f"{where}: {error}") from None
            if point in seen:
                raise GridError(f"{where} repeats the point {point.label()} of {seen[point]}")
            seen[point] = where
            points.append(point)
    return points


def load_grid(grid: str) -> list[GridPoint]:
    """The points of a built-in grid (``default``, ``small``) or of a JSON grid file. O(points).

    Raises :class:`GridError` when ``grid`` is neither a built-in name nor a readable file, or the file
    is not valid JSON in :func:`parse_grid`'s format.
    """
    if grid in GRIDS:
        return parse_grid(GRIDS[grid], f"grid {grid!r}")
    path = Path(grid)
    if not path.is_file():
        raise GridError(f"{grid!r} is neither a built-in grid ({', '.join(GRIDS)}) nor a file")
    try:
        spec = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as error:
        raise GridError(f"cannot read grid file {grid}: {error}") from None
    except json.JSONDecodeError as error:
        raise GridError(f"grid file {grid} is not valid JSON: {error}") from None
    return parse_grid(spec, f"grid file {grid}")


def _check_fields(values: Mapping[str, Any], where: str) -> None:
    unknown = [name for name in values if name not in _FIELDS]
    if unknown:
        raise GridError(f"{where}: unknown field(s) {unknown}; fields are {', '.join(_FIELDS)}")


def _product(grid: Mapping[str, Any], where: str) -> Iterator[dict[str, Any]]:
    axes: list[Sequence[Any]] = []
    for name, value in grid.items():
        if isinstance(value, list):
            if not value:
                raise GridError(f"{where}: '{name}' is an empty list")
            axes.append(value)
        else:
            axes.append([value])
    for combination in itertools.product(*axes):
        yield dict(zip(grid, combination, strict=True))
