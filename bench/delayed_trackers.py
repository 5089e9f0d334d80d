"""Models of the broker's delayed-delivery trackers, measured: how much memory N delayed messages take and
how long a restarted broker needs before it can dispatch again (PIP-195; the experiment of the Pulsar 3.0
delayed-message article, “New Delayed Message In Pulsar 3.0”).

Three models behind one interface (:class:`DelayedTracker`): ``add_many`` N delayed indexes with due times,
``pop_due`` what is due, ``own_bytes`` — the model's own account of its memory, a cross-check: the sweep
measures the process heap around it (:func:`delayed_tracker_sweep.measure_tracker`) — and
:func:`recover` after a restart.

* :class:`TripleLongPriorityQueue` — the broker's in-memory tracker before Pulsar 3.0 (its class of the
  same name): a priority queue of ``(due, ledger, entry)`` longs off-heap, 24 B per index, growing its
  buffers when full. Here: three numpy int64 columns kept sorted in bulk (a sorted array is a valid
  min-heap); growth by ``"double"`` (copy into a buffer twice the size: old and new are held at once
  during the copy) or ``"segmented"`` (append fixed segments, no copy; Pulsar's ``SegmentedLongArray``
  past its first segment). ``memory_limit_bytes`` is the direct-memory limit: a growth that would hold
  more raises :class:`TrackerOutOfMemory` naming how many indexes were held — the count at which the
  broker goes out of memory.
* :class:`TimeBucketTracker` — the same in-memory tracker on the TimeBucket structure of apache/pulsar PR
  #23611 (the TimeBucket blog, PIP-393's analysis): due times trimmed to ``2^k`` ms with ``k`` derived
  from ``delayedDeliveryTickTimeMillis`` (:func:`precision_bits_for_tick`), here on our
  :class:`~pulsar_nack.index.TimeBucketIndex`. Rounding ``"floor"`` is the broker's trim (a message may be
  dispatched up to ``2^k - 1`` ms early); ``"ceil"`` is the *strict* variant (never early, up to ``2^k - 1``
  ms late).
* :class:`BucketTracker` — PIP-195's bucket tracker on our
  :class:`~pulsar_nack.snapshot.segments.SegmentStore` over a local directory. The broker's settings map
  to :class:`~pulsar_nack.snapshot.segments.SegmentConfig` as :class:`BucketSettings` documents; the
  bucket is sealed at the first ledger boundary once it holds ``min_index_count_per_bucket`` indexes.

Recovery (:func:`recover`, after the old tracker is gone):

* the in-memory models rebuild the index from **every** delayed message of the backlog — the broker
  replays the whole topic from the subscription's mark-delete position. The model measures the index
  rebuild (its CPU time, with the backlog regenerated in memory); the cost of *reading* the messages from
  BookKeeper is not measured: it is modelled as ``replayed × read_cost_s`` with the named parameter
  ``read_cost_s`` (0 unless given), reported apart from the measured time;
* the bucket tracker restores its segments from storage (:meth:`SegmentStore.restore`) and replays only
  the ledgers after the last sealed bucket (the broker's *LastMutableBucket*, never snapshotted).

Messages due by the time of the restart are not indexed again (the broker dispatches them at once), so a
recovered tracker holds exactly the ids that were pending and not due.

Every class here is single-threaded (the sweep runs one per task). A bench module (``bench/``), not
shipped: ``bench/broker_trackers.py`` runs the experiment (:mod:`delayed_tracker_sweep`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, Protocol, TypeAlias, get_args

import numpy as np
import numpy.typing as npt

from pulsar_nack.index import NackIndex, Rounding, TimeBucketIndex, as_id_arrays
from pulsar_nack.snapshot import LocalDirectoryStorage, SegmentConfig, SegmentStore
from pulsar_nack.sweep.workloads import T0_MS, splitmix64

__all__ = [
    "ARTICLE_FIGURES",
    "MODELS",
    "ArrayBacklog",
    "ArticleFigures",
    "ArticleWorkload",
    "Backlog",
    "BucketSettings",
    "BucketTracker",
    "DelayedTracker",
    "Growth",
    "IdArrays",
    "Model",
    "Recovery",
    "TimeBucketTracker",
    "TrackerOutOfMemory",
    "TripleLongPriorityQueue",
    "precision_bits_for_tick",
    "recover",
]

Model = Literal["heap", "timebucket", "buckets"]
MODELS: Final[tuple[str, ...]] = get_args(Model)
Growth = Literal["double", "segmented"]

#: ``(due_ms int64, ledger_ids int64, entry_ids int64)``: delayed indexes, one position per message.
IdArrays: TypeAlias = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]
#: What ``pop_due`` returns: an ``(n, 3)`` int64 array of ``(filed_ms, ledger_id, entry_id)`` rows in the
#: order the tracker dispatches them, where ``filed_ms`` is the time the tracker filed the index under
#: (the due time itself for the heap, its bucket for the others).
Popped: TypeAlias = npt.NDArray[np.int64]

_FIELDS_PER_INDEX = 3
_LONG = 8


@dataclass(frozen=True)
class ArticleFigures:
    """The results of the Pulsar 3.0 delayed-message article (“New Delayed Message In Pulsar 3.0”; Apache
    Pulsar 3.0.4 on the smallest StreamNative Cloud cluster; 100M messages at 1,000/s with delays of 48 h
    to 48 h 10 min). Quoted from the article, never measured here."""

    in_memory_oom_messages: int = 35_000_000
    in_memory_direct_memory_mb: int = 847
    in_memory_recovery_messages: int = 35_000_000
    in_memory_recovery_s: int = 6_120
    bucket_messages: int = 100_000_000
    bucket_recovery_s: int = 90

    @property
    def recovery_us_per_message(self) -> float:
        """The in-memory tracker's recovery per replayed message in the article (6,120 s / 35M ≈ 175 µs):
        mostly reading the message back from BookKeeper, which the models do not do."""
        return self.in_memory_recovery_s / self.in_memory_recovery_messages * 1e6


#: The article's figures, to print beside ours.
ARTICLE_FIGURES: Final = ArticleFigures()


class TrackerOutOfMemory(MemoryError):
    """A growth of :class:`TripleLongPriorityQueue` would exceed ``memory_limit_bytes``; ``held`` ids fit."""

    def __init__(self, held: int, needed_bytes: int, limit_bytes: int) -> None:
        super().__init__(
            f"out of memory at {held:,} delayed indexes: growing needs {needed_bytes:,} B, "
            f"memory_limit_bytes is {limit_bytes:,}"
        )
        self.held, self.needed_bytes, self.limit_bytes = held, needed_bytes, limit_bytes


def precision_bits_for_tick(tick_ms: int) -> int:
    """``k`` for ``delayedDeliveryTickTimeMillis = tick_ms``: the largest ``k`` with ``2^k <= tick_ms``
    (0 for a tick of 0 or 1 ms), so that a bucket never spans more than one tick — the broker dispatches
    no finer than its tick anyway (apache/pulsar PR #23611 derives its precision bits from the tick).
    O(1)."""
    if isinstance(tick_ms, bool) or not isinstance(tick_ms, int):
        raise TypeError(f"tick_ms must be an int, got {tick_ms!r}")
    if tick_ms < 0:
        raise ValueError(f"tick_ms must be >= 0, got {tick_ms}")
    return max(tick_ms.bit_length() - 1, 0)


def _ids(due_ms: object, ledger_ids: object, entry_ids: object) -> IdArrays:
    """Validated int64 columns (the index's checks: integers, equal lengths, no negatives). O(n)."""
    due, ledgers, entries, _ = as_id_arrays(due_ms, ledger_ids, entry_ids)
    return due, ledgers, entries.astype(np.int64)


# -- the backlog: what a restarted broker replays --------------------------------------------------------


class Backlog(Protocol):
    """The topic's unacknowledged delayed messages, as a restarted broker reads them: in publish order,
    optionally from a ledger on (the ledgers no snapshot covers)."""

    def chunks(self, from_ledger: int | None = None) -> Iterator[IdArrays]: ...


@dataclass(frozen=True)
class ArticleWorkload:
    """The Pulsar 3.0 article's test (``pulsar-perf produce -dr 172800,173400 -r 1000``), reproducible and
    chunked.

    Message ``i`` is published at ``start_ms + i * 1000 / rate_per_s``, is entry ``i % entries_per_ledger``
    of ledger ``10,000 + i // entries_per_ledger`` (delayed messages are never batched by the client), and
    is due ``delay`` ms later, with ``delay`` uniform in ``[min_delay_s, max_delay_s]`` seconds drawn by
    SplitMix64 of ``i`` — so any chunk can be regenerated alone, which is how a recovery replays it.
    """

    n: int
    rate_per_s: int = 1_000
    min_delay_s: int = 172_800
    max_delay_s: int = 173_400
    entries_per_ledger: int = 50_000
    start_ms: int = T0_MS
    first_ledger: int = 10_000
    chunk: int = 1 << 20

    def __post_init__(self) -> None:
        for name in ("n", "rate_per_s", "min_delay_s", "max_delay_s", "entries_per_ledger", "chunk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r}")
        if self.n < 0:
            raise ValueError(f"n must be >= 0, got {self.n}")
        for name in ("rate_per_s", "entries_per_ledger", "chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.min_delay_s <= self.max_delay_s:
            raise ValueError(
                f"min_delay_s and max_delay_s must satisfy 0 <= min_delay_s <= max_delay_s, "
                f"got {self.min_delay_s} and {self.max_delay_s}"
            )

    def slice(self, start: int, stop: int) -> IdArrays:
        """Messages ``start .. stop - 1``. O(stop - start)."""
        i = np.arange(start, stop, dtype=np.int64)
        published = self.start_ms + (i * 1000) // self.rate_per_s
        span = np.uint64((self.max_delay_s - self.min_delay_s) * 1000 + 1)
        delay = (splitmix64(i.astype(np.uint64)) % span).astype(np.int64) + self.min_delay_s * 1000
        ledgers = self.first_ledger + i // self.entries_per_ledger
        return published + delay, ledgers, i % self.entries_per_ledger

    def published_ms(self, count: int) -> int:
        """When message ``count - 1`` was published: the time the producer stops after ``count``."""
        return self.start_ms + (max(count - 1, 0) * 1000) // self.rate_per_s

    def chunks(self, from_ledger: int | None = None) -> Iterator[IdArrays]:
        """All ``n`` messages in publish order, ``chunk`` at a time; from ``from_ledger`` on if given."""
        start = 0
        if from_ledger is not None:
            start = min(self.n, max(0, (from_ledger - self.first_ledger) * self.entries_per_ledger))
        for low in range(start, self.n, self.chunk):
            yield self.slice(low, min(low + self.chunk, self.n))


class ArrayBacklog:
    """A backlog held as arrays: the messages published, minus those acknowledged. For tests and small
    runs; O(n) memory."""

    def __init__(self) -> None:
        self._parts: list[IdArrays] = []
        self._acked: set[tuple[int, int]] = set()

    def publish(self, due_ms: object, ledger_ids: object, entry_ids: object) -> None:
        """Append delayed messages to the log. O(n)."""
        self._parts.append(_ids(due_ms, ledger_ids, entry_ids))

    def ack(self, popped: Popped) -> None:
        """Acknowledge dispatched messages (rows of ``pop_due``): a replay skips them. O(n)."""
        self._acked.update(zip(popped[:, 1].tolist(), popped[:, 2].tolist(), strict=True))

    def __len__(self) -> int:
        return sum(len(due) for due, _, _ in self._parts) - len(self._acked)

    def chunks(self, from_ledger: int | None = None) -> Iterator[IdArrays]:
        for due, ledgers, entries in self._parts:
            keep = np.ones(len(due), dtype=bool) if from_ledger is None else ledgers >= from_ledger
            if self._acked:
                keep &= np.array(
                    [
                        (led, e) not in self._acked
                        for led, e in zip(ledgers.tolist(), entries.tolist(), strict=True)
                    ],
                    dtype=bool,
                )
            if keep.any():
                yield due[keep], ledgers[keep], entries[keep]


# -- the interface ---------------------------------------------------------------------------------------


class DelayedTracker(Protocol):
    """What every model offers. ``pop_due`` rows: see :data:`Popped`."""

    model: Model

    def __len__(self) -> int: ...

    def add_many(self, due_ms: object, ledger_ids: object, entry_ids: object) -> None: ...

    def pop_due(self, now_ms: int) -> Popped: ...

    def filed_ms(self, due_ms: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]: ...

    def own_bytes(self) -> int | None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Recovery:
    """What :func:`recover` did: the measured time to a tracker ready to dispatch (``seconds``), the
    messages it replayed from the backlog, the ids it restored from snapshots, the ids pending after, and
    the modelled time to read the replayed messages (``replayed × read_cost_s``; not measured)."""

    seconds: float
    replayed: int
    restored: int
    pending: int
    modelled_read_s: float

    @property
    def total_s(self) -> float:
        """Measured rebuild plus modelled reading."""
        return self.seconds + self.modelled_read_s


# -- 1. the triple-long heap ---------------------------------------------------------------------------------


class TripleLongPriorityQueue:
    """The broker's ``TripleLongPriorityQueue``: ``(due, ledger, entry)`` longs, 24 B per index plus spare
    capacity.

    Three int64 columns; indexes are appended and the live region is sorted in bulk (lexicographic on
    due, ledger, entry) before a pop needs the order — a sorted array is a binary min-heap. Popping
    advances a head offset; the buffers never shrink (nor do the broker's). ``growth`` and
    ``memory_limit_bytes``: see the module docstring (0 = no limit).

    Complexities: ``add_many`` O(m) amortized (a growth copies the held indexes once); ``pop_due`` O(n log
    n) after adds (one sort), O(log n + due) otherwise; ``len`` O(1).
    """

    model: Model = "heap"

    def __init__(
        self,
        memory_limit_bytes: int = 0,
        growth: Growth = "double",
        initial_capacity: int = 16,
        segment_indexes: int = 1 << 20,
    ) -> None:
        for name, value in (
            ("memory_limit_bytes", memory_limit_bytes),
            ("initial_capacity", initial_capacity),
            ("segment_indexes", segment_indexes),
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r}")
        if memory_limit_bytes < 0:
            raise ValueError(f"memory_limit_bytes must be >= 0 (0: no limit), got {memory_limit_bytes}")
        if initial_capacity < 1:
            raise ValueError(f"initial_capacity must be >= 1, got {initial_capacity}")
        if segment_indexes < 1:
            raise ValueError(f"segment_indexes must be >= 1, got {segment_indexes}")
        if growth not in get_args(Growth):
            raise ValueError(f"growth must be 'double' or 'segmented', got {growth!r}")
        self.memory_limit_bytes, self.growth = memory_limit_bytes, growth
        self._segment = segment_indexes
        self._head = 0  # live indexes are _cols[:, _head:_tail]
        self._tail = 0
        self._sorted = True
        first = initial_capacity if growth == "double" else segment_indexes
        self._check_limit(0, first * _FIELDS_PER_INDEX * _LONG)
        self._cols = np.empty((_FIELDS_PER_INDEX, first), dtype=np.int64)

    def __len__(self) -> int:
        return self._tail - self._head

    @property
    def capacity(self) -> int:
        """Indexes the buffers hold room for."""
        return int(self._cols.shape[1])

    def own_bytes(self) -> int:
        """Bytes of the buffers (capacity × 24). O(1)."""
        return int(self._cols.nbytes)

    def filed_ms(self, due_ms: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        return due_ms

    def add_many(self, due_ms: object, ledger_ids: object, entry_ids: object) -> None:
        """Append indexes; raises :class:`TrackerOutOfMemory` (after adding those that fit) when a growth
        would pass the limit. O(m) amortized."""
        due, ledgers, entries = _ids(due_ms, ledger_ids, entry_ids)
        fit, refused = self._reserve(len(due))
        block = np.stack([due[:fit], ledgers[:fit], entries[:fit]])
        if fit:
            tail = self._tail
            if self._sorted and len(self):
                last = self._cols[:, tail - 1]
                first = block[:, 0]
                self._sorted = (first[0], first[1], first[2]) >= (last[0], last[1], last[2])
            self._sorted = self._sorted and bool(np.all(_ordered(block)))
            self._cols[:, tail : tail + fit] = block
            self._tail = tail + fit
        if refused is not None:
            raise TrackerOutOfMemory(len(self), refused, self.memory_limit_bytes)

    def pop_due(self, now_ms: int) -> Popped:
        """Remove and return the indexes due by ``now_ms``, in (due, ledger, entry) order."""
        if not len(self):
            return np.empty((0, 3), dtype=np.int64)
        self._sort()
        live = self._cols[:, self._head : self._tail]
        count = int(np.searchsorted(live[0], now_ms, side="right"))
        popped = live[:, :count].T.copy()
        self._head += count
        if self._head == self._tail:
            self._head = self._tail = 0
        return popped

    def close(self) -> None:
        self._cols = np.empty((_FIELDS_PER_INDEX, 0), dtype=np.int64)
        self._head = self._tail = 0

    def _sort(self) -> None:
        if self._sorted:
            return
        live = self._cols[:, self._head : self._tail]
        order = np.lexsort((live[2], live[1], live[0]))
        self._cols[:, : len(order)] = live[:, order]
        self._head, self._tail, self._sorted = 0, len(order), True

    def _check_limit(self, held_bytes: int, new_bytes: int) -> None:
        limit = self.memory_limit_bytes
        if limit and held_bytes + new_bytes > limit:
            raise TrackerOutOfMemory(len(self), held_bytes + new_bytes, limit)

    def _reserve(self, more: int) -> tuple[int, int | None]:
        """Grow until ``more`` indexes fit or the limit stops it; returns how many fit and, if the limit
        stopped it, the bytes the refused growth would have held. (No exception is kept: its traceback
        would keep the caller's arrays alive.)"""
        if self._head and self._tail + more > self.capacity:  # reuse the room popped indexes left
            live = self._cols[:, self._head : self._tail].copy()
            self._cols[:, : live.shape[1]] = live
            self._head, self._tail = 0, live.shape[1]
        needed = self._tail + more
        while needed > self.capacity:
            capacity = self.capacity
            grown = capacity * 2 if self.growth == "double" else capacity + self._segment
            held = self.own_bytes()
            new_bytes = grown * _FIELDS_PER_INDEX * _LONG
            # doubling copies into a new buffer while the old one is still held; segments add to it
            peak = held + new_bytes if self.growth == "double" else new_bytes
            if self.memory_limit_bytes and peak > self.memory_limit_bytes:
                return capacity - self._tail, peak
            cols = np.empty((_FIELDS_PER_INDEX, grown), dtype=np.int64)
            cols[:, : self._tail] = self._cols[:, : self._tail]
            self._cols = cols
        return more, None


def _ordered(block: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Column-wise lexicographic ``block[:, i] <= block[:, i + 1]`` of a (3, m) array."""
    a, b = block[:, :-1], block[:, 1:]
    lt0, eq0 = a[0] < b[0], a[0] == b[0]
    lt1, eq1 = a[1] < b[1], a[1] == b[1]
    result: npt.NDArray[np.bool_] = lt0 | (eq0 & (lt1 | (eq1 & (a[2] <= b[2]))))
    return result


# -- 2. the TimeBucket variant -------------------------------------------------------------------------------


class TimeBucketTracker:
    """The in-memory tracker on the TimeBucket index (apache/pulsar PR #23611): due times trimmed to
    ``2^k`` ms, ``k = precision_bits_for_tick(tick_ms)``; ``rounding`` ``"floor"`` (the broker's trim) or
    ``"ceil"`` (strict: never early). Complexities: those of :class:`~pulsar_nack.index.TimeBucketIndex`;
    ``pop_due`` pops bucket by bucket, O(due buckets × ledgers + due ids)."""

    model: Model = "timebucket"

    def __init__(self, tick_ms: int = 1_000, rounding: Rounding = "floor") -> None:
        self.tick_ms = tick_ms
        self.index = TimeBucketIndex(precision_bits_for_tick(tick_ms), rounding)

    def __len__(self) -> int:
        return len(self.index)

    def filed_ms(self, due_ms: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        k = self.index.precision_bits
        up = (1 << k) - 1 if self.index.rounding == "ceil" else 0
        return (due_ms + up) & np.int64(-1 << k)

    def add_many(self, due_ms: object, ledger_ids: object, entry_ids: object) -> None:
        """Add ids one by one as *fresh* (``TimeBucketIndex.add(..., fresh=True)``): the broker's tracker
        is handed each message once, so the index's check against the ledger's other buckets — costly
        here, where random delays spread every ledger over a thousand buckets — is skipped. O(m)."""
        due, ledgers, entries = _ids(due_ms, ledger_ids, entry_ids)
        add = self.index.add
        for d, ledger, entry in zip(due.tolist(), ledgers.tolist(), entries.tolist(), strict=True):
            add(d, ledger, entry, -1, "", True)

    def pop_due(self, now_ms: int) -> Popped:
        return _pop_by_bucket(self.index, now_ms)

    def own_bytes(self) -> int:
        """The index's own walk (Python objects at allocator sizes + CRoaring's heap). O(objects)."""
        return self.index.memory_usage().total_bytes

    def close(self) -> None:
        self.index.clear()


def _pop_by_bucket(index: NackIndex, now_ms: int) -> Popped:
    """Pop bucket by bucket up to ``now_ms`` so that each id comes with the bucket it was filed under."""
    rows: list[Popped] = []
    while True:
        bucket = index.next_due_ms()
        if bucket is None or bucket > now_ms:
            break
        got = index.pop_due(bucket)
        for ids in got:
            entries = ids.entry_ids.astype(np.int64)
            block = np.empty((len(entries), 3), dtype=np.int64)
            block[:, 0], block[:, 1], block[:, 2] = bucket, ids.ledger_id, entries
            rows.append(block)
        if not got and index.next_due_ms() == bucket:
            raise RuntimeError(f"the tracker reports ids due at {bucket} but pops none")
    return np.concatenate(rows) if rows else np.empty((0, 3), dtype=np.int64)


# -- 3. PIP-195's bucket tracker -----------------------------------------------------------------------------


@dataclass(frozen=True)
class BucketSettings:
    """The broker's PIP-195 settings and how they map onto :class:`SegmentConfig`.

    ================================================================ ======================================
    broker setting (default)                                         here
    ================================================================ ======================================
    ``delayedDeliveryMinIndexCountPerBucket`` (50,000)               ``min_index_count_per_bucket``: the
                                                                     tracker seals (``checkpoint``) at the
                                                                     first ledger boundary once the open
                                                                     bucket holds this many indexes
    ``delayedDeliveryMaxIndexesPerBucketSnapshotSegment`` (5,000)    ``SegmentConfig.min_ids_per_segment``
                                                                     (a segment is cut at this many ids;
                                                                     -1, no limit → 2^24, the reader's cap)
    ``delayedDeliveryMaxTimeStepPerBucketSnapshotSegmentSeconds``    ``SegmentConfig.max_segment_span_ms``
    (300)                                                            (× 1000)
    ``delayedDeliveryMaxNumBuckets`` (-1: no merging)                ``SegmentConfig.max_segments``: -1 →
                                                                     no merging; N → at most N unloaded
                                                                     *segments* (ours merge segments, the
                                                                     broker merges buckets of segments)
    ``delayedDeliveryTickTimeMillis`` (1,000)                        ``precision_bits`` =
                                                                     :func:`precision_bits_for_tick`
    (none: the broker loads the first segment of every bucket)       ``max_loaded_ids``,
                                                                     ``load_ahead_ms``: our memory budget
    ================================================================ ======================================

    ``checkpoint_interval_ms`` is set beyond reach: the broker seals only at ledger boundaries.
    """

    min_index_count_per_bucket: int = 50_000
    max_indexes_per_segment: int = 5_000
    max_time_step_per_segment_s: int = 300
    max_num_buckets: int = -1
    tick_ms: int = 1_000
    max_loaded_ids: int = 100_000
    load_ahead_ms: int = 60_000

    def __post_init__(self) -> None:
        for name in (
            "min_index_count_per_bucket",
            "max_indexes_per_segment",
            "max_time_step_per_segment_s",
            "max_num_buckets",
            "tick_ms",
            "max_loaded_ids",
            "load_ahead_ms",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r}")
        if self.min_index_count_per_bucket < 1:
            raise ValueError(
                f"min_index_count_per_bucket must be >= 1, got {self.min_index_count_per_bucket}"
            )
        for name in ("max_indexes_per_segment", "max_num_buckets"):
            value = getattr(self, name)
            if value < 1 and value != -1:
                raise ValueError(f"{name} must be >= 1 or -1 (no limit), got {value}")
        if self.max_time_step_per_segment_s < 1:
            raise ValueError(
                f"max_time_step_per_segment_s must be >= 1, got {self.max_time_step_per_segment_s}"
            )
        for name in ("tick_ms", "max_loaded_ids", "load_ahead_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    def segment_config(self) -> SegmentConfig:
        """The :class:`SegmentConfig` these settings map to (see the table above)."""
        return SegmentConfig(
            min_ids_per_segment=_NO_SEGMENT_LIMIT
            if self.max_indexes_per_segment == -1
            else self.max_indexes_per_segment,
            max_segment_span_ms=self.max_time_step_per_segment_s * 1000,
            checkpoint_interval_ms=_NEVER_MS,
            max_loaded_ids=self.max_loaded_ids,
            load_ahead_ms=self.load_ahead_ms,
            max_segments=_NO_MERGE if self.max_num_buckets == -1 else self.max_num_buckets,
        )


_NO_SEGMENT_LIMIT: Final = 1 << 24  # ReadLimits.max_ids: a reader would refuse bigger segments
_NO_MERGE: Final = 1 << 62
_NEVER_MS: Final = 1 << 62


class BucketTracker:
    """PIP-195's bucket tracker on a :class:`SegmentStore` over ``directory`` (a local directory).

    ``add_many`` adds ids one by one (the store's only way in) and seals at ledger boundaries (see
    :class:`BucketSettings`); ``now_ms`` is the tracker's clock for sealing and loading (the sweep feeds it
    the publish time). Complexities: those of :class:`SegmentStore`; a seal is O(ids sealed).
    """

    model: Model = "buckets"

    def __init__(
        self,
        directory: str | os.PathLike[str],
        settings: BucketSettings | None = None,
        *,
        fsync: bool = True,
    ) -> None:
        self.settings = settings if settings is not None else BucketSettings()
        self.directory = Path(directory)
        self.fsync = fsync
        self.storage = LocalDirectoryStorage(self.directory, fsync=fsync)
        self.store = SegmentStore(
            self.storage,
            self.settings.segment_config(),
            precision_bits=precision_bits_for_tick(self.settings.tick_ms),
        )
        self.now_ms = 0
        self._open = 0  # ids added since the last seal: PIP-195's LastMutableBucket
        self._ledger: int | None = None  # the ledger the last id came from
        #: every ledger <= this one is in a sealed bucket (a replay starts after it)
        self.sealed_through: int | None = None

    def __len__(self) -> int:
        return len(self.store)

    def filed_ms(self, due_ms: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        return due_ms & np.int64(-1 << precision_bits_for_tick(self.settings.tick_ms))

    def add_many(self, due_ms: object, ledger_ids: object, entry_ids: object) -> None:
        """Add ids in publish order; seal at each ledger boundary past ``min_index_count_per_bucket``."""
        due, ledgers, entries = _ids(due_ms, ledger_ids, entry_ids)
        add = self.store.add
        boundaries = np.flatnonzero(np.diff(ledgers)) + 1
        starts = [0, *boundaries.tolist()]
        stops = [*boundaries.tolist(), len(ledgers)]
        for start, stop in zip(starts, stops, strict=True):
            ledger = int(ledgers[start])
            if self._ledger is not None and ledger != self._ledger:
                self._at_boundary()
            self._ledger = ledger
            for d, e in zip(due[start:stop].tolist(), entries[start:stop].tolist(), strict=True):
                add(d, ledger, e)
            self._open += stop - start

    def seal(self) -> None:
        """Seal the open bucket now (the broker does at a ledger boundary). O(ids sealed)."""
        if self._open:
            self.store.checkpoint(self.now_ms)
            self.store.maintain(self.now_ms)  # merges, when max_num_buckets asks for them
            self._open = 0
            self.sealed_through = self._ledger

    def _at_boundary(self) -> None:
        if self._open >= self.settings.min_index_count_per_bucket:
            self.seal()

    def pop_due(self, now_ms: int) -> Popped:
        return _pop_by_bucket(self.store, now_ms)

    def own_bytes(self) -> None:
        """None: the store has no walk of its memory (the sweep's heap measurement is the figure)."""
        return None

    def snapshot_bytes(self) -> int:
        """Bytes of the segment files on storage. O(segments)."""
        return self.store.stats().bytes_total

    def close(self) -> None:
        """Nothing to flush: a crash loses the open bucket, which a recovery replays."""


# -- recovery ---------------------------------------------------------------------------------------------


def recover(
    tracker: DelayedTracker, backlog: Backlog, now_ms: int, read_cost_s: float = 0.0
) -> tuple[DelayedTracker, Recovery]:
    """Restart ``tracker``'s broker at ``now_ms``: a new tracker of the same model and settings, rebuilt
    as the broker rebuilds it (module docstring). ``tracker`` is closed first (its memory is released, as
    a restarted broker's is). ``read_cost_s``: modelled seconds to read one replayed message. Raises
    :class:`TrackerOutOfMemory` if a heap with a memory limit cannot hold the backlog again."""
    if isinstance(read_cost_s, bool) or not isinstance(read_cost_s, int | float) or not read_cost_s >= 0:
        raise ValueError(f"read_cost_s must be a number >= 0, got {read_cost_s!r}")
    fresh: DelayedTracker
    from_ledger: int | None = None
    restored = 0
    if isinstance(tracker, TripleLongPriorityQueue):
        settings = (tracker.memory_limit_bytes, tracker.growth, tracker._segment)
        tracker.close()
        started = time.perf_counter()
        fresh = TripleLongPriorityQueue(settings[0], settings[1], segment_indexes=settings[2])
    elif isinstance(tracker, TimeBucketTracker):
        tick, rounding = tracker.tick_ms, tracker.index.rounding
        tracker.close()
        started = time.perf_counter()
        fresh = TimeBucketTracker(tick, rounding)
    elif isinstance(tracker, BucketTracker):
        tracker.close()
        started = time.perf_counter()
        bucket = BucketTracker(tracker.directory, tracker.settings, fsync=tracker.fsync)
        bucket.now_ms = now_ms
        restored = bucket.store.restore(now_ms).ids
        if tracker.sealed_through is not None:
            from_ledger = tracker.sealed_through + 1
            bucket.sealed_through = tracker.sealed_through
        fresh = bucket
    else:
        raise TypeError(
            f"tracker must be one of the models {', '.join(MODELS)}, got {type(tracker).__name__}"
        )
    replayed = 0
    for due, ledgers, entries in backlog.chunks(from_ledger):
        replayed += len(due)
        later = fresh.filed_ms(due) > now_ms  # due ones are dispatched at once, not indexed
        fresh.add_many(due[later], ledgers[later], entries[later])
    if isinstance(fresh, BucketTracker):
        # restored ids that fell due while the broker was down are dispatched at once
        fresh.pop_due(now_ms)
    seconds = time.perf_counter() - started
    return fresh, Recovery(seconds, replayed, restored, len(fresh), replayed * float(read_cost_s))
