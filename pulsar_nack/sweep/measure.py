"""The memory sweep's task: one grid point in, one row of measurements out (pure; runs on Spark workers).

:func:`measure` feeds a :class:`~pulsar_nack.sweep.grid.GridPoint`'s tracker the point's workload
(:func:`workload`) and reports what it holds — buckets, bitmaps, Roaring containers, retained bytes — and
how fast it was built and drained; :func:`pip393_bytes_per_id` is what PIP-393's theory predicts.

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
import math
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, Final, TypeAlias

import numpy as np
import numpy.typing as npt

from pulsar_nack.index import TimeBucketIndex
from pulsar_nack.memory import heap_in_use
from pulsar_nack.sweep.baselines import HashMapTracker, TripleLongHeap
from pulsar_nack.sweep.grid import GridPoint
from pulsar_nack.sweep.workloads import Workload

__all__ = [
    "COLUMNS",
    "MEMORY_COLUMNS",
    "TIMING_COLUMNS",
    "Row",
    "measure",
    "number",
    "per_id",
    "pip393_bytes_per_id",
    "reference_rows",
    "workload",
]


#: A measured row: column name → value (None where a column does not apply to the contender).
Row: TypeAlias = dict[str, int | float | str | bool | None]

#: Bytes of one Roaring bitset container (2^16 bits), and the cardinality above which CRoaring and
#: RoaringBitmap switch from an array container to a bitset (PIP-393's 4096 threshold).
BITSET_BYTES: Final = 8192
ARRAY_LIMIT: Final = 4096
#: PIP-393's cost of one value in an array container (the blog counts 2 B, the bare uint16).
PIP393_ARRAY_BYTES: Final = 4


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
        row |= {k: v for k, v in tracker.structure().items() if k in COLUMNS}  # the columns the sweep keeps
        row["buckets"] = tracker.bucket_count  # both tiers' (structure() counts the live tier's only)
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


# -- reading rows --------------------------------------------------------------------------------------


def reference_rows(rows: Sequence[Row]) -> list[Row]:
    """The index rows of the dense, unbatched, floor workload — the one PIP-393's theory describes —
    one per (x, k), preferring the compacted run when a point was measured both ways."""
    chosen: dict[tuple[Any, Any], Row] = {}
    for row in rows:
        reference = row["contender"] == "index" and row["rounding"] == "floor"
        reference = reference and row["nack_share"] == 1.0 and row["batch"] == 1
        if reference and (chosen.get((row["x"], row["k"])) is None or row["compact"]):
            chosen[(row["x"], row["k"])] = row
    return sorted(chosen.values(), key=lambda r: (number(r["ids_per_bucket"]), number(r["x"])))


def number(value: object) -> float:
    """A row's numeric cell as a float; TypeError for anything else (None, bool, str)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)


def per_id(row: Row, column: str) -> float:
    """``row[column]`` per id of the point (divided by its ``n``)."""
    return number(row[column]) / number(row["n"])
