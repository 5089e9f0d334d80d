"""Memory and time profile of a user's nack workload, run through the real tracker (``pulsar-nack profile``).

A :class:`Workload` describes a consumer: message rate, nack delay (fixed or a distribution), duration,
topics × partitions, batch size, share of messages nacked, precision bits, rounding and entries per ledger.
:func:`profile` feeds those messages — in arrival order, on a simulated clock, no broker — through a real
:class:`~pulsar_nack.tracker.NackTracker` exactly as the consumer does: each arrival passes the arrival
filter, the application nacks (``schedule``) or acks it, due buckets are forwarded (``flush``) one native
latency early, their copies come back one latency later and are acked, and buckets left behind are
compacted every second, as the timer does. At the end of the duration it reports what is pending.

Memory is measured three ways, each in a fresh interpreter running the same workload (the parent only
collects figures), and labelled:

* ``tracemalloc`` — Python allocations traced by :mod:`tracemalloc` (blind to CRoaring's C heap, which
  CRoaring takes from ``malloc`` directly);
* ``malloc`` — process-level with the system allocator: ``PYTHONMALLOC=malloc`` (every Python object
  from glibc too) and glibc's in-use bytes (``mallinfo2``, tcache off: :data:`~pulsar_nack.memory.
  MEASURING_ENV`), so Python objects and CRoaring are counted alike — the figure the estimate is fitted to;
* ``rss`` — the resident set size delta with the default allocator (what ``top`` shows; it keeps memory
  the allocators freed but did not return, and counts pages, not bytes).

The default-allocator process also times each nack (``schedule``) and each forward (``flush`` per
forwarded entry) and takes a per-type breakdown of the tracker's own objects with :mod:`pympler`
(``asizeof.flatsize`` per object; a pyroaring bitmap as its Python object plus its CRoaring heap read
with glibc's ``malloc_usable_size`` — ``asizeof`` alone reports a bitmap's *serialized* size).

Side by side, when available: the Java PIP-393 structure (``bench/java``, a fresh JVM; a benchmark, so
in a source checkout only) on the same number of pending entries, and the native
client's tracker, costed with its bytes per pending nack as ``bench/nack_lateness.py`` measured them
(``pulsar_nack/data/native_nack_cost.json``, provenance shown).

Chunked messages (``chunked_share`` > 0): that share of the nacked messages is large (``chunked_bytes``
each) and is held in memory by a real :class:`~pulsar_nack.chunks.ChunkHold` as the consumer holds it —
a payload of that many bytes each, up to ``max_held_chunked_bytes``; past it the nack goes to the tracker
(the broker fallback) — and handed out when due. The held payload is in every memory measure and has its
own row (``nack_stats()``'s ``chunked_held`` / ``chunked_held_bytes``).

Cost: O(messages) Python work per probe (three probes), plus O(index objects) for the breakdown.
"""

from __future__ import annotations

import gc
import json
import math
import os
import random
import re
import subprocess
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from types import BuiltinFunctionType, FunctionType, ModuleType
from typing import Any, Final

import numpy as np

from pulsar_nack.chunks import DEFAULT_MAX_HELD_CHUNKED_BYTES
from pulsar_nack.index import MAX_PRECISION_BITS
from pulsar_nack.shipped import java_reference

__all__ = [
    "MAX_MESSAGES",
    "STEP_MS",
    "Delay",
    "ProfileError",
    "ProfileResult",
    "Workload",
    "check_integer",
    "check_number",
    "native_cost",
    "parse_delay",
    "parse_duration_ms",
    "profile",
    "render",
    "run_probe",
    "type_breakdown",
]

#: The most messages one profile runs (each probe is O(messages) Python work: ~10 s per million).
MAX_MESSAGES: Final = 20_000_000
#: Simulated time step: arrivals between two steps see the same clock; the timer's work runs per step.
STEP_MS: Final = 10.0
_PROGRESS_EVERY: Final = 10_000
_PROBE_TIMEOUT_S: Final = 3600.0


class ProfileError(ValueError):
    """A workload parameter out of range; the message names the parameter."""


# -- the workload ------------------------------------------------------------------------------------

_UNITS_MS: Final = {
    "ms": 1.0,
    "s": 1_000.0,
    "m": 60_000.0,
    "min": 60_000.0,
    "h": 3_600_000.0,
    "d": 86_400_000.0,
}
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(ms|s|min|m|h|d)?\s*$", re.IGNORECASE)


def parse_duration_ms(text: str, name: str) -> float:
    """``"250ms"``, ``"30s"``, ``"5m"``/``"5min"``, ``"1h"``, ``"1d"`` or a bare number of seconds → ms.
    Raises :class:`ProfileError` naming ``name`` for anything else, or a negative or infinite value."""
    match = _DURATION.match(text) if isinstance(text, str) else None
    if match is None:
        raise ProfileError(f"{name}: expected a duration like 250ms, 30s, 5m, 1h or 1d, got {text!r}")
    value = float(match.group(1)) * _UNITS_MS[(match.group(2) or "s").lower()]
    if not math.isfinite(value):
        raise ProfileError(f"{name}: must be finite, got {text!r}")
    return value


@dataclass(frozen=True)
class Delay:
    """The nack delay: ``fixed`` (``low_ms``), ``uniform`` between ``low_ms`` and ``high_ms``, or
    ``exponential`` with mean ``low_ms`` (capped at 20 means, so a run's horizon is bounded)."""

    kind: str = "fixed"
    low_ms: float = 60_000.0
    high_ms: float = 60_000.0

    def __post_init__(self) -> None:
        if self.kind not in ("fixed", "uniform", "exponential"):
            raise ProfileError(f"delay: kind must be fixed, uniform or exponential, got {self.kind!r}")
        for name, value in (("low", self.low_ms), ("high", self.high_ms)):
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ProfileError(f"delay: {name} must be a finite number of ms >= 0, got {value!r}")
        if self.kind == "uniform" and self.high_ms < self.low_ms:
            raise ProfileError(f"delay: uniform high ({self.high_ms} ms) is below low ({self.low_ms} ms)")
        if self.kind == "exponential" and self.low_ms <= 0:
            raise ProfileError("delay: an exponential delay needs a mean > 0")

    @property
    def mean_ms(self) -> float:
        return (self.low_ms + self.high_ms) / 2 if self.kind == "uniform" else self.low_ms

    @property
    def max_ms(self) -> float:
        return {"fixed": self.low_ms, "uniform": self.high_ms, "exponential": 20 * self.low_ms}[self.kind]

    def sampler(self, rng: random.Random) -> Callable[[], float]:
        """A function drawing one delay (ms). O(1) per draw."""
        if self.kind == "fixed":
            value = self.low_ms
            return lambda: value
        if self.kind == "uniform":
            low, high = self.low_ms, self.high_ms
            return lambda: rng.uniform(low, high)
        mean, cap = self.low_ms, self.max_ms
        return lambda: min(rng.expovariate(1 / mean), cap)

    def describe(self) -> str:
        if self.kind == "fixed":
            return _ms_text(self.low_ms)
        if self.kind == "uniform":
            return f"uniform {_ms_text(self.low_ms)}–{_ms_text(self.high_ms)}"
        return f"exponential, mean {_ms_text(self.low_ms)}"


def parse_delay(text: str) -> Delay:
    """``"1h"`` (fixed), ``"uniform:1m:1h"`` or ``"exp:10m"`` → :class:`Delay`; errors name ``delay``."""
    if not isinstance(text, str):
        raise ProfileError(f"delay: expected text, got {type(text).__name__}")
    parts = text.split(":")
    if len(parts) == 1:
        return Delay("fixed", parse_duration_ms(parts[0], "delay"), parse_duration_ms(parts[0], "delay"))
    kind = parts[0].strip().lower()
    if kind == "uniform" and len(parts) == 3:
        return Delay("uniform", parse_duration_ms(parts[1], "delay"), parse_duration_ms(parts[2], "delay"))
    if kind in ("exp", "exponential") and len(parts) == 2:
        mean = parse_duration_ms(parts[1], "delay")
        return Delay("exponential", mean, mean)
    raise ProfileError(f"delay: expected 1h, uniform:LOW:HIGH or exp:MEAN, got {text!r}")


def _ms_text(ms: float) -> str:
    for unit, size in (("h", 3_600_000.0), ("min", 60_000.0), ("s", 1_000.0)):
        if ms >= size and ms % size == 0:
            return f"{ms / size:g} {unit}"
    return f"{ms:g} ms"


@dataclass(frozen=True)
class Workload:
    """A consumer's nack workload. Every field is checked; a bad one raises :class:`ProfileError` naming it.

    ``rate``: messages per second, all topics and partitions together (spread round-robin); ``duration_s``:
    how long messages arrive (pending nacks are counted at its end); ``topics`` × ``partitions``: the
    partitioned topics the consumer reads, each partition its own ledgers; ``batch_size``: messages per
    entry (1: no batching); ``nack_share``: the share of messages the application nacks (the rest it
    acks); ``precision_bits``, ``rounding``: the tracker's *k* and bucket rounding; ``entries_per_ledger``:
    the broker's managedLedgerMaxEntriesPerLedger; ``seed``: which messages are nacked and the delays.
    ``chunked_share``: the share of nacked messages that are chunked (large; only without batching),
    ``chunked_bytes`` each, held up to ``max_held_chunked_bytes`` (the consumer option of that name).
    """

    rate: float = 1_000.0
    delay: Delay = field(default_factory=Delay)
    duration_s: float = 60.0
    topics: int = 1
    partitions: int = 1
    batch_size: int = 1
    nack_share: float = 1.0
    precision_bits: int = 8
    rounding: str = "floor"
    entries_per_ledger: int = 50_000
    seed: int = 7
    chunked_share: float = 0.0
    chunked_bytes: int = 8 * 2**20
    max_held_chunked_bytes: int = DEFAULT_MAX_HELD_CHUNKED_BYTES

    def __post_init__(self) -> None:
        check_number("rate", self.rate, low=0.0, low_open=True)
        if not isinstance(self.delay, Delay):
            raise ProfileError(f"delay: expected a Delay, got {type(self.delay).__name__}")
        check_number("duration_s", self.duration_s, low=0.0, low_open=True)
        check_integer("topics", self.topics, 1, 100_000)
        check_integer("partitions", self.partitions, 1, 10_000)
        check_integer("batch_size", self.batch_size, 1, 1_000)  # the index keeps batch indexes below 1024
        check_number("nack_share", self.nack_share, low=0.0, low_open=True, high=1.0)
        check_integer("precision_bits", self.precision_bits, 0, MAX_PRECISION_BITS)
        if self.rounding not in ("floor", "ceil"):
            raise ProfileError(f"rounding: must be 'floor' or 'ceil', got {self.rounding!r}")
        check_integer("entries_per_ledger", self.entries_per_ledger, 1, 2**31 - 1)
        check_integer("seed", self.seed, 0, 2**63 - 1)
        check_number("chunked_share", self.chunked_share, low=0.0, high=1.0)
        check_integer("chunked_bytes", self.chunked_bytes, 16 * 2**10, 2**31 - 1)  # native.MIN_CHUNKED_BYTES
        check_integer("max_held_chunked_bytes", self.max_held_chunked_bytes, 0, 2**40)
        if self.chunked_share and self.batch_size > 1:
            raise ProfileError("chunked_share: chunked messages are never batched: needs batch_size 1")
        if self.topics * self.partitions > 100_000:
            raise ProfileError(f"topics × partitions: at most 100,000, got {self.topics * self.partitions:,}")
        if self.messages < 1:
            raise ProfileError(
                f"rate × duration_s: less than one message ({self.rate:g}/s × {self.duration_s:g} s)"
            )
        if self.messages > MAX_MESSAGES:
            raise ProfileError(
                f"rate × duration_s: {self.messages:,} messages is more than {MAX_MESSAGES:,} (a profile "
                "runs every message through the tracker three times); lower the rate or the duration"
            )

    @property
    def messages(self) -> int:
        return int(self.rate * self.duration_s)

    @property
    def streams(self) -> int:
        """Partitions the consumer reads (topics × partitions)."""
        return self.topics * self.partitions

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Workload:
        return cls(**{**data, "delay": Delay(**data["delay"])})

    def describe(self) -> str:
        batch = f"batches of {self.batch_size}" if self.batch_size > 1 else "no batching"
        return (
            f"{self.rate:g} msg/s for {self.duration_s:g} s over {self.topics} topic(s) × {self.partitions} "
            f"partition(s), {batch}, {self.nack_share:.0%} nacked, delay {self.delay.describe()}, "
            f"k = {self.precision_bits} ({self.rounding}), {self.entries_per_ledger:,} entries per ledger"
        )


def check_number(
    name: str, value: object, low: float, low_open: bool = False, high: float | None = None
) -> None:
    """Raise :class:`ProfileError` naming ``name`` unless ``value`` is a finite number in the range."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ProfileError(f"{name}: expected a finite number, got {value!r}")
    if value < low or (low_open and value == low) or (high is not None and value > high):
        bounds = f"{'(' if low_open else '['}{low:g}, {'inf)' if high is None else f'{high:g}]'}"
        raise ProfileError(f"{name}: must be in {bounds}, got {value!r}")


def check_integer(name: str, value: object, low: int, high: int) -> None:
    """Raise :class:`ProfileError` naming ``name`` unless ``value`` is an int in ``low..high``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProfileError(f"{name}: expected an integer, got {value!r}")
    if not low <= value <= high:
        raise ProfileError(f"{name}: must be in {low}..{high:,}, got {value!r}")


# -- the result ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfileResult:
    """What :func:`profile` measured. Memory in bytes; times in µs. ``memory`` holds the three labelled
    measures (``tracemalloc``, ``malloc``, ``rss``) and ``reported`` (``nack_stats(with_memory=True)``)."""

    workload: Workload
    messages: int
    nacked: int  # messages nacked during the run
    pending: int  # nacked messages not yet forwarded at the end of the duration
    pending_ids: int  # ids in the index (batch messages of one entry and bucket count once)
    buckets: int
    ledgers: int  # (topic, ledger) pairs with pending ids
    slots: int  # (bucket, ledger) pairs
    forwards: int  # flushes that forwarded something
    forwarded_entries: int
    nack_us: float  # one schedule() call, mean
    forward_us: float  # flush time per forwarded entry (the final drain when nothing fell due)
    forward_source: str  # "run" or "drain"
    memory: dict[str, int]
    breakdown: dict[str, int]  # pympler per type (+ CRoaring heap rows): sums to breakdown_total
    java: dict[str, Any] | None
    java_note: str
    native: dict[str, Any] | None
    elapsed_s: float
    #: None: offline (simulated clock). Else the broker run's description (:mod:`pulsar_nack.profile_broker`):
    #: ``memory`` is then the consumer process's growth, and ``native`` measured in the same run.
    broker: str | None = None
    chunked_nacked: int = 0  # nacks of chunked messages
    held_chunked: int = 0  # chunked messages held in memory at the end (nack_stats().chunked_held)
    held_chunked_bytes: int = 0  # their payload (nack_stats().chunked_held_bytes), in every memory measure
    chunked_over_bound: int = 0  # chunked nacks past max_held_chunked_bytes (to the tracker: the broker)

    @property
    def breakdown_total(self) -> int:
        return sum(self.breakdown.values())

    def per_pending(self, measure: str = "malloc") -> float:
        """Bytes per pending nacked message by ``measure`` (0 when nothing is pending)."""
        return self.memory[measure] / self.pending if self.pending else 0.0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["workload"] = self.workload.to_json()
        out["breakdown_total"] = self.breakdown_total
        return out


# -- the probe (a fresh interpreter) ------------------------------------------------------------------


def _partition_names(workload: Workload) -> list[str]:
    if workload.partitions == 1:
        return [f"persistent://public/default/profile-{t}" for t in range(workload.topics)]
    return [
        f"persistent://public/default/profile-{t}-partition-{p}"
        for t in range(workload.topics)
        for p in range(workload.partitions)
    ]


@dataclass
class _Run:
    """The simulation's outcome, inside a probe."""

    tracker: Any
    hold: Any  # the ChunkHold of chunked messages
    chunked_nacked: int
    buckets: Any  # numpy int64 array: the bucket of each nack, in order
    nacked: int
    forwards: int
    forwarded_entries: int
    forward_s: float
    nack_s: float
    last_target: float
    #: The simulation's own objects made before the memory baseline (ledger ids, topic names, random
    #: generators), kept alive with the result: freed when the simulation returned, they made the
    #: measured heap growth ~65-75 KB smaller than what the tracker keeps at 1,000 topics.
    driver: tuple[Any, ...] = ()


def _new_tracker(workload: Workload) -> tuple[Any, list[float], deque[tuple[float, Sequence[Any]]]]:
    """A tracker on a simulated clock (``clock[0]``) whose forwards land in ``in_flight``."""
    from pulsar_nack.timer import TimerWheel
    from pulsar_nack.tracker import NackTracker

    clock = [1_000_000.0]

    def now() -> float:
        return clock[0]

    in_flight: deque[tuple[float, Sequence[Any]]] = deque()
    tracker = NackTracker(
        lambda due: in_flight.append((clock[0] + tracker.lead_ms, due)),
        precision_bits=workload.precision_bits,
        rounding=workload.rounding,  # type: ignore[arg-type]
        clock=now,
        wheel=TimerWheel(clock=now, start=False),  # the simulation runs the timer's work itself
    )
    return tracker, clock, in_flight


def _drive(workload: Workload, progress: Callable[[int], None], before: Callable[[], None]) -> _Run:
    """Run the workload; ``before()`` is called once the tracker exists (the memory baseline)."""
    from pulsar_nack.chunks import ChunkHold

    tracker, clock, in_flight = _new_tracker(workload)
    hold = ChunkHold(workload.max_held_chunked_bytes)
    # Which nacks are chunked: a generator of its own, so that the other draws match a run without them.
    chunk_rng = random.Random(workload.seed + 1)
    chunked_share, chunked_bytes, chunked_nacked = workload.chunked_share, workload.chunked_bytes, 0
    arrivals, schedule, acked = tracker.arrivals, tracker.schedule, tracker.acked
    rng = random.Random(workload.seed)
    draw, share, size = workload.delay.sampler(rng), workload.nack_share, workload.batch_size
    names = _partition_names(workload)
    streams = len(names)
    # Each partition writes its own ledgers (ledger ids are unique in a cluster).
    ledger_of = [1_000 + 1_000_000 * s for s in range(streams)]
    entry_of = [0] * streams
    epl = workload.entries_per_ledger
    batched = size > 1
    # Preallocated before the baseline: the simulation's own bookkeeping must not count as the tracker's.
    buckets = np.empty(workload.messages, dtype=np.int64)
    nacked = 0
    nack_s = forward_s = 0.0
    forwards = forwarded_entries = 0
    last_target = -math.inf
    start = clock[0]
    step_ms = 1_000.0 / workload.rate * size * streams  # one entry of every partition per round
    next_compact = start + 1_000.0
    lead = tracker.lead_ms
    perf = time.perf_counter
    before()

    def timer_work(t: float) -> None:
        nonlocal forward_s, forwards, forwarded_entries, last_target, next_compact
        clock[0] = t
        following = tracker.index.next_due_ms()
        if following is not None and following <= t + lead:
            started = perf()
            went = tracker.flush(t)
            forward_s += perf() - started
            if went:
                forwards += 1
                forwarded_entries += went
                last_target = t + lead
        while in_flight and in_flight[0][0] <= t:  # the broker's copies of forwarded ids come back
            _, due = in_flight.popleft()
            _redeliver(tracker, due, size)
        while hold.held and hold.pop_due(t) is not None:  # held chunked messages handed out, then acked
            pass
        if t >= next_compact:  # the timer compacts buckets the nacks moved on from, ~1 s later
            tracker.compact()
            next_compact = t + 1_000.0
        sweep_due = arrivals.sweep_due
        if sweep_due is not None and t > sweep_due:  # the timer retires forwards older than the linger
            for again in arrivals.sweep():  # (copies that never came: none here, the "broker" is exact)
                tracker.schedule(max(again[0], t), *again[1:])

    messages, done, arrived = workload.messages, 0, 0
    next_step = start + STEP_MS
    entry_ms = step_ms / streams  # partitions take turns, each entry at its own time
    while done < messages:
        s = arrived % streams
        t = start + arrived * entry_ms
        arrived += 1
        if t >= next_step:
            timer_work(t)
            next_step = t + STEP_MS
        clock[0] = t
        entry = entry_of[s]
        entry_of[s] += 1
        ledger_id, entry_id = ledger_of[s] + entry // epl, entry % epl
        topic = names[s]
        count = min(size, messages - done)
        for index in range(count) if batched else (-1,):
            arrivals.admit(ledger_id, entry_id, index, topic, size)
            if rng.random() < share:
                due = t + draw()
                if chunked_share and chunk_rng.random() < chunked_share:
                    chunked_nacked += 1
                    # Held as the consumer holds it: the payload stays in memory (allocated only if it
                    # fits: past the bound hold() refuses it, and it goes to the tracker below).
                    fits = hold.held_bytes + chunked_bytes <= hold.max_bytes
                    payload = b"\x01" * chunked_bytes if fits else None  # touched, as received data is
                    if hold.hold((topic, ledger_id, entry_id), payload, due, 1, chunked_bytes):
                        continue
                started = perf()
                bucket = schedule(due, ledger_id, entry_id, index, topic)
                nack_s += perf() - started
                if bucket is not None:
                    buckets[nacked] = bucket
                    nacked += 1
            else:
                acked(ledger_id, entry_id, index, topic)
        done += count
        if done % _PROGRESS_EVERY < count:
            progress(done)
    end = start + workload.duration_s * 1_000.0
    timer_work(end)
    tracker.compact()  # what the timer does ~1 s after nacks move on from a bucket
    # The copies the last forwards asked for are the simulated broker's (a consumer hands forwarded ids
    # to the native client and keeps none of its objects): not the tracker's memory.
    in_flight.clear()
    progress(messages)
    return _Run(
        tracker,
        hold,
        chunked_nacked,
        buckets[:nacked],
        nacked,
        forwards,
        forwarded_entries,
        forward_s,
        nack_s,
        last_target,
        (ledger_of, names, rng, chunk_rng, draw),
    )


def _redeliver(tracker: Any, due: Sequence[Any], size: int) -> None:
    """The copies a forward brings back arrive; the application acks each one it is handed."""
    from pulsar_nack.arrivals import Verdict

    admit = tracker.arrivals.admit
    for ids in due:
        topic, ledger_id = ids.topic, ids.ledger_id
        for entry_id in ids.entry_ids.tolist():
            for index in range(size) if size > 1 else (-1,):
                if admit(ledger_id, entry_id, index, topic, size) is Verdict.DELIVER:
                    tracker.acked(ledger_id, entry_id, index, topic)


def probe(mode: str, workload: Workload, progress: Callable[[int], None]) -> dict[str, Any]:
    """One measurement in this (fresh) interpreter: ``"default"`` (times, RSS, pympler breakdown,
    structure), ``"malloc"`` (mallinfo2 delta; run with PYTHONMALLOC=malloc), ``"malloc-warm"`` (the same
    after one run of the workload whose tracker is dropped first: a process's first tracker leaves heap
    behind that a second one does not add to — ~330 KB at 100 topics, batches of 10, 1 h — so the second
    measures what a tracker keeps; the first run's figure comes back as ``cold_bytes``) or
    ``"tracemalloc"``."""
    import tracemalloc

    from pulsar_nack.memory import heap_in_use, release_free_heap, rss_bytes

    baseline: dict[str, int] = {}
    cold: int | None = None
    if mode == "malloc-warm":
        mode = "malloc"
        start: dict[str, int] = {}

        def cold_start() -> None:
            gc.collect()
            start["heap"] = heap_in_use()

        warm_up = _drive(workload, lambda _done: None, cold_start)
        gc.collect()
        cold = heap_in_use() - start["heap"]
        warm_up.tracker.close()
        del warm_up

    def before() -> None:
        gc.collect()
        if mode == "tracemalloc":
            tracemalloc.start()
            baseline["traced"] = tracemalloc.get_traced_memory()[0]
        elif mode == "malloc":
            baseline["heap"] = heap_in_use()
        else:  # the tracker's compaction trims glibc's heap: trim first, or earlier frees count as its own
            release_free_heap()
            baseline["rss"] = rss_bytes()

    run = _drive(workload, progress, before)
    gc.collect()
    tracker = run.tracker
    out: dict[str, Any] = {"mode": mode}
    if mode == "tracemalloc":
        out["bytes"] = tracemalloc.get_traced_memory()[0] - baseline["traced"]
        tracemalloc.stop()
        return out
    if mode == "malloc":
        out["bytes"] = heap_in_use() - baseline["heap"]
        if cold is not None:
            out["cold_bytes"] = cold
        # After the heap is read: what nack_stats() reports and what is pending, for a report error in
        # the same process (the grid bench runs only this probe).
        stats = run.hold.stats(tracker.stats(with_memory=True), with_memory=True)
        out |= {
            "pending": int(np.count_nonzero(run.buckets > run.last_target)),
            "pending_ids": stats.pending,
            "buckets": stats.buckets,
            "reported": stats.memory_bytes,
        }
        return out
    out["bytes"] = rss_bytes() - baseline["rss"]
    hold = run.hold
    stats = hold.stats(tracker.stats(with_memory=True), with_memory=True)  # what nack_stats() reports
    index = tracker.index
    structure = index.structure()
    pending = int(np.count_nonzero(run.buckets > run.last_target))
    roots = [index, tracker.arrivals, *([hold] if run.chunked_nacked else [])]
    out |= {
        "nacked": run.nacked + run.chunked_nacked - stats.chunked_over_bound,  # held ones too
        "pending": pending,
        "pending_ids": stats.pending,
        "buckets": stats.buckets,
        "slots": structure["slots"],
        "ledgers": len({(topic, ledger) for _, topic, ledger, _ in index}),
        "reported": stats.memory_bytes,
        "chunked_nacked": run.chunked_nacked,
        "held_chunked": stats.chunked_held,
        "held_chunked_bytes": stats.chunked_held_bytes,
        "chunked_over_bound": stats.chunked_over_bound,
        "breakdown": type_breakdown(roots, stop=[tracker]),
        "nack_us": run.nack_s / run.nacked * 1e6 if run.nacked else 0.0,
    }
    forwarded, forward_s, source = run.forwarded_entries, run.forward_s, "run"
    if not forwarded:  # nothing fell due in the duration: time draining everything pending instead
        started = time.perf_counter()
        forwarded = tracker.flush(everything=True)
        forward_s, source = time.perf_counter() - started, "drain"
    out |= {
        "forwards": run.forwards,
        "forwarded_entries": run.forwarded_entries,
        "forward_us": forward_s / forwarded * 1e6 if forwarded else 0.0,
        "forward_source": source,
    }
    tracker.close()
    return out


# -- pympler per-type breakdown ----------------------------------------------------------------------

_SKIP_TYPES: Final = (type, ModuleType, FunctionType, BuiltinFunctionType)


def type_breakdown(roots: Sequence[object], stop: Sequence[object] = ()) -> dict[str, int]:
    """Bytes of everything reachable from ``roots`` (not through ``stop``, types, modules or functions),
    by type: :func:`pympler.asizeof.flatsize` per object (``sys.getsizeof`` for numpy arrays: their data
    included when they own it), except pyroaring bitmaps, whose Python object
    counts its type's basic size and whose C heap (measured with glibc, or estimated from CRoaring's
    statistics for 64-bit bitmaps) goes to its own row. The rows sum to the total. O(objects)."""
    from pympler import asizeof
    from pyroaring import AbstractBitMap, AbstractBitMap64, BitMap

    flatsize: Callable[[object], int] = asizeof.flatsize  # untyped: pympler ships no annotations

    from pulsar_nack.memory import bitmap64_heap_bytes, bitmap_heap_bytes

    sizes: Counter[str] = Counter()
    seen = {id(obj) for obj in stop}
    pending: list[object] = list(roots)
    while pending:
        obj = pending.pop()
        if id(obj) in seen or isinstance(obj, _SKIP_TYPES):
            continue
        seen.add(id(obj))
        kind = type(obj)
        name = f"{kind.__module__}.{kind.__qualname__}" if kind.__module__ != "builtins" else kind.__name__
        if isinstance(obj, AbstractBitMap | AbstractBitMap64):
            sizes[name] += kind.__basicsize__
            if isinstance(obj, BitMap):
                sizes["CRoaring heap (32-bit bitmaps)"] += bitmap_heap_bytes(obj)
            else:
                sizes["CRoaring heap (64-bit bitmaps, estimated)"] += bitmap64_heap_bytes(obj)
            continue
        if isinstance(obj, np.ndarray):  # getsizeof counts an array's own data (pympler fails on some)
            sizes[name] += sys.getsizeof(obj)
            if obj.base is not None:
                pending.append(obj.base)
        else:
            sizes[name] += int(flatsize(obj))
        pending.extend(gc.get_referents(obj))
    return dict(sizes.most_common())


# -- side by side ------------------------------------------------------------------------------------


#: The native client's memory per pending nack as ``bench/nack_lateness.py`` measured it (package data it
#: writes): ``bytes_per_nack``, ``broker``, ``date``, ``machine``, ``versions``, ``commit``, ``source``.
NATIVE_COST_FILE: Traversable = resources.files("pulsar_nack").joinpath("data", "native_nack_cost.json")


def native_cost(path: Traversable | None = None) -> dict[str, Any]:
    """The native client's measured bytes per pending nack, with its provenance, from ``path`` (default
    :data:`NATIVE_COST_FILE`): the one reader of that file (profile, estimate, demo, bench). Raises
    :class:`ProfileError` naming the file if it is missing, unreadable or lacks a field. O(file)."""
    source = NATIVE_COST_FILE if path is None else path
    try:
        data: dict[str, Any] = json.loads(source.read_text())
        data["bytes_per_nack"] = float(data["bytes_per_nack"])
        for key in ("broker", "commit", "date", "machine", "source"):
            data[key] = str(data[key])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ProfileError(
            f"{source}: no usable measurement of the native client ({error!r}); bench/nack_lateness.py "
            "writes it"
        ) from None
    return data


def java_side(workload: Workload, entries: int) -> tuple[dict[str, Any] | None, str]:
    """The Java PIP-393 structure holding ``entries`` pending entries of this workload, in a fresh JVM
    (``bench/java``), or None and why not. The Java module replays the blog's single stream: x entries per
    ms (an integer ≥ 1), the entry-level nack share, one ledger sequence — topics and batch indexes are
    not modelled there, so the note says how the workload was mapped."""
    reference: Any = java_reference()
    if reference is None:
        return None, "Java: not run (needs a source checkout: bench/java_reference.py is not shipped)"
    if not reference.available():
        return None, "Java: not run (java and mvn are not on PATH)"
    if entries < 1:
        return None, "Java: not run (nothing pending)"
    entry_share = 1 - (1 - workload.nack_share) ** workload.batch_size
    per_ms = workload.rate / workload.batch_size * entry_share / 1_000
    x = max(1, round(per_ms))
    note = (
        f"Java: {entries:,} entries as the blog's single stream, x = {x} nacked entries/ms "
        f"(workload: {per_ms:.3g}{', rounded' if x != per_ms else ''}), k = {workload.precision_bits}, "
        f"entry nack share {entry_share:.3g}, {workload.entries_per_ledger:,} entries per ledger"
    )
    if workload.streams > 1:
        note += f"; the workload's {workload.streams} partitions are one stream there"
    if workload.delay.kind != "fixed":
        note += "; due times in arrival order (no delay distribution)"
    try:
        result: dict[str, Any] = reference.run_case(
            x,
            workload.precision_bits,
            n=entries,
            entries_per_ledger=workload.entries_per_ledger,
            nack_share=max(min(entry_share, 1.0), 1e-9),
            rounding=workload.rounding,
        )
    except (RuntimeError, subprocess.SubprocessError, OSError) as error:
        return None, f"Java: failed ({str(error).splitlines()[0]})"
    result.pop("checksum", None)
    return result, note


# -- the parent ---------------------------------------------------------------------------------------

_MODES: Final = ("default", "malloc", "malloc-warm", "tracemalloc")


def _probe_env(mode: str) -> dict[str, str]:
    from pulsar_nack.memory import MEASURING_ENV

    env = {**os.environ, **MEASURING_ENV}
    env.pop("PYTHONMALLOC", None)
    if mode in ("malloc", "malloc-warm"):
        env["PYTHONMALLOC"] = "malloc"
    # The child imports this very package (a worktree or a checkout), not another installed copy.
    package_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    return env


def run_probe(mode: str, workload: Workload, progress: Callable[[int], None]) -> dict[str, Any]:
    """Run :func:`probe` ``mode`` (``default``, ``malloc``, ``tracemalloc``) in a fresh interpreter set up for
    it; it reports progress lines, then one JSON line, which this returns. O(workload) in the child."""
    command = [sys.executable, "-m", "pulsar_nack.profile", mode, json.dumps(workload.to_json())]
    return run_child(command, _probe_env(mode), f"profile probe {mode!r}", _PROBE_TIMEOUT_S, progress)


def run_child(
    command: Sequence[str],
    env: dict[str, str],
    what: str,
    timeout_s: float,
    progress: Callable[[int], None],
) -> dict[str, Any]:
    """Run a probe ``command`` and return the JSON object of its last ``{...}`` line, passing each
    ``progress N`` line on to ``progress(N)``; :class:`RuntimeError` naming ``what`` with the tail of its
    stderr if it fails or prints no result; killed if it has not ended ``timeout_s`` after its output."""
    return finish_child(start_child(command, env), what, timeout_s, progress)


def start_child(command: Sequence[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """Start a probe ``command`` with its output piped, for :func:`finish_child`."""
    return subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def finish_child(
    child: subprocess.Popen[str], what: str, timeout_s: float, progress: Callable[[int], None]
) -> dict[str, Any]:
    """:func:`run_child`'s reading of a started probe: to its end, the JSON object of its last ``{...}``
    line."""
    with child:
        assert child.stdout is not None and child.stderr is not None
        result: dict[str, Any] | None = None
        try:
            for line in child.stdout:
                if line.startswith("progress "):
                    progress(int(line.split()[1]))
                elif line.startswith("{"):
                    result = json.loads(line)
            errors = child.stderr.read()
            code = child.wait(timeout=timeout_s)
        except BaseException:  # a timeout, or Ctrl-C / SIGINT to this process only: the probe goes too
            child.kill()
            raise
    if code != 0 or result is None:
        raise RuntimeError(f"{what} failed (exit {code}):\n{errors[-3000:]}")
    return result


def _stage_progress(
    progress: Callable[[str, int, int], None] | None, stage: str, total: int
) -> Callable[[int], None]:
    def report(done: int) -> None:
        if progress is not None:
            progress(stage, done, total)

    return report


def profile(
    workload: Workload,
    *,
    java: bool = True,
    measures: Sequence[str] = ("malloc", "tracemalloc"),
    progress: Callable[[str, int, int], None] | None = None,
) -> ProfileResult:
    """Run ``workload`` through the real tracker in three fresh interpreters (see the module docstring)
    and, with ``java``, the Java structure in a fresh JVM; return every figure. ``measures``: which of the
    ``malloc`` and ``tracemalloc`` probes to run (the default-allocator one always runs: it counts and
    times; fewer probes, fewer figures in ``memory``). ``progress(stage, done, total)`` is called as
    messages go through. O(messages) per probe."""
    if not isinstance(workload, Workload):
        raise ProfileError(f"workload: expected a Workload, got {type(workload).__name__}")
    unknown = set(measures) - set(_MODES[1:])
    if unknown or isinstance(measures, str):
        raise ProfileError(f"measures: choose from {_MODES[1:]}, got {measures!r}")
    started = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    for mode in ("default", *(m for m in _MODES[1:] if m in measures)):
        results[mode] = run_probe(mode, workload, _stage_progress(progress, mode, workload.messages))
    main = results["default"]
    memory: dict[str, int] = {mode: int(results[mode]["bytes"]) for mode in _MODES[1:] if mode in results}
    memory |= {"rss": int(main["bytes"]), "reported": int(main["reported"])}
    pending_entries = int(main["pending_ids"])
    java_result, java_note = (None, "Java: not asked for") if not java else (None, "")
    if java:
        if progress:
            progress("java", 0, 1)
        java_result, java_note = java_side(workload, pending_entries)
        if progress:
            progress("java", 1, 1)
    cost = native_cost()
    native = {
        "bytes_per_nack": cost["bytes_per_nack"],
        "bytes": cost["bytes_per_nack"] * main["pending"],
        "source": f"{cost['source']} ({cost['broker']}, {cost['date']}, commit {cost['commit']})",
    }
    return ProfileResult(
        workload=workload,
        messages=workload.messages,
        nacked=int(main["nacked"]),
        pending=int(main["pending"]),
        pending_ids=pending_entries,
        buckets=int(main["buckets"]),
        ledgers=int(main["ledgers"]),
        slots=int(main["slots"]),
        forwards=int(main["forwards"]),
        forwarded_entries=int(main["forwarded_entries"]),
        nack_us=float(main["nack_us"]),
        forward_us=float(main["forward_us"]),
        forward_source=str(main["forward_source"]),
        memory=memory,
        breakdown={str(k): int(v) for k, v in main["breakdown"].items()},
        java=java_result,
        java_note=java_note,
        native=native,
        elapsed_s=time.perf_counter() - started,
        chunked_nacked=int(main["chunked_nacked"]),
        held_chunked=int(main["held_chunked"]),
        held_chunked_bytes=int(main["held_chunked_bytes"]),
        chunked_over_bound=int(main["chunked_over_bound"]),
    )


def render(result: ProfileResult) -> Iterator[str]:
    """Lines of the human-readable report ``pulsar-nack profile`` prints."""
    w = result.workload
    pending = result.pending
    yield f"workload: {w.describe()}"
    if result.broker is not None:
        yield f"through a broker: {result.broker}"
    yield (
        f"messages {result.messages:,}, nacked {result.nacked:,}, pending at the end {pending:,} "
        f"({result.pending_ids:,} index ids), buckets {result.buckets:,}, ledgers {result.ledgers:,}, "
        f"(bucket, ledger) slots {result.slots:,}"
    )
    yield (
        f"time: {result.nack_us:.2f} µs per nack (schedule), {result.forward_us:.2f} µs per forwarded entry "
        f"({'the final drain' if result.forward_source == 'drain' else f'{result.forwards:,} forwards'})"
    )
    yield (
        "memory of pulsar-nack's tracker (bytes retained after building, fresh process each):"
        if result.broker is None
        else "memory of the consumer with pulsar-nack (process growth from subscribing to the end of the "
        "run, client library included; fresh process each):"
    )
    labels = {
        "malloc": "process-level, system allocator (PYTHONMALLOC=malloc, mallinfo2)",
        "tracemalloc": "Python allocations (tracemalloc; misses CRoaring's C heap)",
        "rss": "RSS delta (default allocator; pages, keeps freed memory)",
        "reported": "nack_stats(with_memory=True) (the tracker's own walk)",
        "released": "given back to the heap when the tracker drops its nacks (malloc)",
        "dropped": "what the tracker's walk says dropping them frees (same process)",
        "kept": "what its walk reads then: the fixed part, whatever is pending",
    }
    for key, label in labels.items():
        if key not in result.memory:
            continue
        value = result.memory[key]
        if key == "kept":
            per = "fixed"
        else:
            per = f"{value / pending:.2f} B per pending nack" if pending else "nothing pending"
        yield f"  {label:<70} {value / 1e6:10.3f} MB  {per}"
    if w.chunked_share:
        yield (
            f"  {'of which held chunked payload (nack_stats chunked_held_bytes)':<70} "
            f"{result.held_chunked_bytes / 1e6:10.3f} MB  "
            f"{result.held_chunked:,} of {result.chunked_nacked:,} chunked nacks held "
            f"(bound {w.max_held_chunked_bytes / 1e6:g} MB; {result.chunked_over_bound:,} past it went "
            "to the tracker)"
        )
    else:
        yield f"  {'held chunked payload':<70} {0:10.3f} MB  no chunked messages (chunked_share 0)"
    total = result.breakdown_total
    yield f"per-type breakdown (pympler flatsize + CRoaring heap), total {total / 1e6:.3f} MB:"
    for name, size in list(result.breakdown.items())[:12]:
        yield f"  {name:<60} {size:>12,} B"
    if len(result.breakdown) > 12:
        rest = sum(list(result.breakdown.values())[12:])
        yield f"  {f'({len(result.breakdown) - 12} more types)':<60} {rest:>12,} B"
    yield "side by side:"
    malloc = result.memory.get("malloc", result.memory["reported"])
    if result.native is not None:
        native = result.native
        ratio = native["bytes"] / malloc if malloc > 0 else math.inf
        how = f"measured by {native['source']}" if result.broker is None else native["source"]
        yield (
            f"  native client: {native['bytes'] / 1e6:.3f} MB ({native['bytes_per_nack']:.1f} B per pending "
            f"nack, {how}) — {ratio:,.1f}× pulsar-nack (malloc measure)"
        )
    if result.java is not None:
        plain, optimized = result.java["retained_bytes"], result.java["retained_bytes_run_optimized"]
        yield (
            f"  Java PIP-393 structure: {plain / 1e6:.3f} MB as built, {optimized / 1e6:.3f} MB after "
            f"runOptimize ({result.java['buckets']:,} buckets)"
        )
    yield f"  {result.java_note}"
    yield f"({result.elapsed_s:.1f} s)"


def _main(argv: Sequence[str]) -> int:
    """Probe entry point: ``python -m pulsar_nack.profile MODE WORKLOAD_JSON``."""
    mode, payload = argv
    if mode not in _MODES:
        raise SystemExit(f"unknown probe mode {mode!r}")
    workload = Workload.from_json(json.loads(payload))

    def report(done: int) -> None:
        print(f"progress {done}", flush=True)

    print(json.dumps(probe(mode, workload, report)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
