"""Capacity planning: predicted steady-state memory of pulsar-nack's tracker, the Java PIP-393 structure and
the native client's tracker for a workload (``pulsar-nack estimate``), from models fitted to measurements.

The model is linear in *structural features* computed from the workload's parameters — how many buckets,
(bucket, ledger) slots, Roaring containers and payload bytes, ledgers, batch entries and lingering forwards
the tracker holds in steady state (:func:`features`, derived from PIP-393's analysis extended to topics,
batches and sparse nacks) — with coefficients (bytes per feature) fitted by non-negative least squares to
``pulsar-nack profile`` measurements (process-level, system allocator: the ``malloc`` measure) and to Java
runs (``bench/java``), by ``bench/fit_estimate.py``. That step writes the coefficients, the range of
parameters they were fitted over and the fit's errors to ``pulsar_nack/data/estimate_fit.json``
(:func:`load_fit`); :func:`estimate` says when a workload lies outside that range. The native client's
tracker holds one node per nack (the C++ port of PIP-393 trims steady-clock nanoseconds, so every nack is
its own bucket): its bytes per pending nack are the figure ``bench/nack_lateness.py`` measured.

Steady state: nacks have arrived for longer than the delay plus the arrival filter's linger, so
``rate × nack share × delay`` messages are pending and forwards of the last linger are remembered.
Cost: O(features) per estimate.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Final

from pulsar_nack.entry_sets import MAX_LOW_BITS
from pulsar_nack.index import MAX_PRECISION_BITS, PROMOTE_AT, STAGE_UP_TO
from pulsar_nack.profile import ProfileError, check_integer, check_number, native_cost

__all__ = [
    "FEATURES",
    "JAVA_FEATURES",
    "Estimate",
    "Fit",
    "FitError",
    "Scenario",
    "estimate",
    "features",
    "java_features",
    "load_fit",
    "predict",
    "range_key",
    "render",
    "tracker_default",
]

#: The fitted model shipped with the package (written by bench/fit_estimate.py).
FIT_FILE: Final = "data/estimate_fit.json"

#: Roaring: values per 2^16 container key range; an array container becomes a bitset above 4096 values.
_CONTAINER_SPAN: Final = 65_536
_ARRAY_LIMIT: Final = 4_096
_BITSET_BYTES: Final = 8_192


def tracker_default(name: str) -> float:
    """A default of :class:`~pulsar_nack.tracker.NackTracker` (the consumer's), read from its signature."""
    from pulsar_nack.tracker import NackTracker

    value = inspect.signature(NackTracker.__init__).parameters[name].default
    return float(value)


def _forward_lead_ms() -> float:
    """How long before its time the tracker forwards a bucket: the native client's latency."""
    from pulsar_nack.native import NativeTiming

    return float(NativeTiming().latency_ms)


class FitError(ValueError):
    """The fit file is missing or malformed; the message names the file."""


@dataclass(frozen=True)
class Scenario:
    """A steady-state workload: ``rate`` messages/s over ``topics`` topics (partitions count as topics),
    every nack delayed ``delay_ms`` — or, with ``delay_spread_ms``, by a delay drawn uniformly from
    ``delay_ms`` to ``delay_ms + delay_spread_ms`` —, ``batch_size`` messages per entry, ``nack_share`` of
    them nacked."""

    rate: float
    delay_ms: float
    precision_bits: int = 8
    entries_per_ledger: int = 50_000
    batch_size: int = 1
    nack_share: float = 1.0
    topics: int = 1
    duration_ms: float | None = None  # how long nacks have arrived; None: long enough (steady state)
    delay_spread_ms: float = 0.0

    def __post_init__(self) -> None:
        check_number("rate", self.rate, low=0.0, low_open=True)
        check_number("delay", self.delay_ms, low=0.0, low_open=True)
        check_integer("precision_bits", self.precision_bits, 0, MAX_PRECISION_BITS)
        check_integer("entries_per_ledger", self.entries_per_ledger, 1, 2**31 - 1)
        check_integer("batch_size", self.batch_size, 1, 1_000)
        check_number("nack_share", self.nack_share, low=0.0, low_open=True, high=1.0)
        check_integer("topics", self.topics, 1, 100_000)
        if self.duration_ms is not None:
            check_number("duration", self.duration_ms, low=0.0, low_open=True)
        check_number("delay_spread", self.delay_spread_ms, low=0.0)

    @property
    def horizon_ms(self) -> float:
        """How long the nacks pending now have arrived: the delay, or the duration if shorter."""
        return self.delay_ms if self.duration_ms is None else min(self.delay_ms, self.duration_ms)

    @property
    def arrivals_ms(self) -> float:
        """How long the arrivals of the nacks pending now span: the longest delay, or the duration if
        shorter."""
        longest = self.delay_ms + self.delay_spread_ms
        return longest if self.duration_ms is None else min(longest, self.duration_ms)

    @property
    def due_span_ms(self) -> float:
        """How long the due times of the nacks pending now span: the horizon, plus the spread."""
        return self.horizon_ms + self.delay_spread_ms

    @property
    def pending_ms(self) -> float:
        """The ms of arrivals the pending nacks amount to: the arrivals of the last ``t`` ms are pending
        while their delay exceeds ``t`` — all of them up to ``delay_ms``, then a share falling linearly
        over the spread (the delay, or the duration if shorter, when it is 0)."""
        spread, run = self.delay_spread_ms, self.arrivals_ms
        if run <= self.delay_ms or spread == 0:
            return min(run, self.delay_ms)
        over = run - self.delay_ms
        return self.delay_ms + over - over * over / (2 * spread)

    @property
    def pending(self) -> float:
        """Nacked messages pending: rate × share × :attr:`pending_ms` (the delay in steady state, the mean
        delay with a spread)."""
        return self.rate * self.nack_share * self.pending_ms / 1_000

    def redelivered_ms(self, limit_ms: float) -> float:
        """For how long (ms, at most ``limit_ms``) nacks have been coming due."""
        if self.duration_ms is None:
            return limit_ms
        return min(limit_ms, max(self.duration_ms - self.delay_ms, 0.0))


#: pulsar-nack's features, in the order of the fitted coefficients (see :func:`features`).
FEATURES: Final = (
    "constant",
    "packed_rows",
    "packed_buckets",
    "packed_entries",
    "hot_ids",
    "hot_slots",
    "hot_own_slots",
    "live_ids",
    "live_slots",
    "own_slots",
    "live_buckets",
    "live_members",
    "live_payload",
    "own_messages",
    "ledger_keys",
    "packed_ledgers",
    "batch_entries",
    "batch_messages",
    "filter_payload",
    "single_nacks",
    "fired_ids",
    "fired_entries",
    "fired_keys",
)
#: The Java structure's features (the same analysis, no compaction, no arrival filter).
JAVA_FEATURES: Final = ("constant", "buckets", "slots", "java_payload", "ledger_keys")


@dataclass(frozen=True)
class _Shape:
    """Intermediate quantities of the steady state, per the PIP-393 analysis."""

    ids: float  # index ids (entries with a pending nack)
    buckets: float
    slots: float
    ids_per_slot: float
    containers_per_slot: float
    entry_share: float  # of all entries: those with a nacked message
    density: float  # of the entries a slot spans: those with a pending nack in it
    ledger_keys: float
    entries_per_ms: float  # per topic
    ids_per_window: float  # per topic: the ids of one bucket


def _occupied(entries: float, share: float) -> float:
    """Share of windows holding at least one nacked entry when ``entries`` entries, evenly spaced
    (arrivals are steady), fall into each and each is nacked with probability ``share``."""
    if entries >= 1:
        return -math.expm1(entries * math.log1p(-share)) if share < 1 else 1.0
    return entries * share


def _shape(s: Scenario) -> _Shape:
    """With a spread, a bucket window's ids come from arrivals over the window plus the spread: as many
    ids as without one (spread over more windows), from more entries — sparser slots, more ledgers a
    window — and the nacked messages of one batch entry draw their delays apart, so that they fall in
    up to as many buckets as the spread spans: an id (a (bucket, entry) pair) each. Without one, the
    arrivals of a window's own width, and an entry's nacked messages in one bucket."""
    width = float(1 << s.precision_bits)
    entries_per_ms = s.rate / (s.topics * s.batch_size) / 1_000
    entry_share = 1 - (1 - s.nack_share) ** s.batch_size
    pairs = 1.0  # buckets an entry's nacked messages fall in
    if s.delay_spread_ms:
        messages = s.batch_size * s.nack_share / entry_share  # nacked messages of a nacked entry
        spanned_windows = s.delay_spread_ms / width + 1
        pairs = spanned_windows * -math.expm1(messages * math.log1p(-1 / spanned_windows))
    nacked_per_ms = entries_per_ms * entry_share * pairs  # per topic: (bucket, entry) pairs
    ids = s.topics * nacked_per_ms * s.pending_ms
    due_span = s.due_span_ms
    windows = due_span / width + 1  # bucket windows the pending nacks span (the partial one at each end)
    filled = min(width, due_span)  # a bucket wider than the due times' span fills only for the span
    per_window = nacked_per_ms * s.pending_ms * filled / due_span  # ids of one topic in one bucket window
    spanned = entries_per_ms * min(width + s.delay_spread_ms, s.arrivals_ms)  # entries a window draws from
    density = min(entry_share, per_window / spanned) if spanned else entry_share
    ledgers_per_window = 1 + spanned / s.entries_per_ledger
    occupied = _occupied(spanned, density)
    buckets = windows * _occupied(s.topics * spanned, density)
    slots = min(s.topics * windows * occupied * min(ledgers_per_window, 1 + per_window), max(ids, 1.0))
    span = spanned / ledgers_per_window  # entries one slot spans
    return _Shape(
        ids=ids,
        buckets=buckets,
        slots=slots,
        ids_per_slot=ids / slots if slots else 0.0,
        containers_per_slot=max(1.0, span / _CONTAINER_SPAN),
        entry_share=entry_share,
        density=density,
        ledger_keys=s.topics * (1 + entries_per_ms * s.arrivals_ms / s.entries_per_ledger),
        entries_per_ms=entries_per_ms,
        ids_per_window=per_window,
    )


def _container_bytes(values: float, share: float, runs: bool) -> float:
    """Payload of one Roaring container of ``values`` ids drawn with density ``share`` from consecutive
    ids: an array (2 B per value) up to 4096 values, else a bitset (8 KiB); after ``run_optimize``
    (``runs``) a run container (4 B per run) when smaller."""
    size = min(2 * values, _BITSET_BYTES) if values <= _ARRAY_LIMIT else _BITSET_BYTES
    if runs:
        size = min(size, 4 * (values * (1 - share) + 1))
    return size


def _java_container_bytes(values: float) -> float:
    """Payload of one RoaringBitmap (Java) container of ``values`` ids as built: an array grown by
    ``ArrayContainer.increaseCapacity`` (4, then ×2 below 64, ×1.5 below 1067, ×1.25 beyond) up to 4096
    values, else an 8 KiB bitset."""
    if values > _ARRAY_LIMIT:
        return _BITSET_BYTES
    capacity = 0
    while capacity < values:
        if capacity == 0:
            capacity = 4
        elif capacity < 64:
            capacity *= 2
        elif capacity < 1067:
            capacity = capacity * 3 // 2
        else:
            capacity = capacity * 5 // 4
    return 2.0 * capacity


def _shared_value_bytes(s: Scenario, shape: _Shape, share: float) -> float:
    """Bytes a value of a set of entries kept in shared 64-bit Roaring bitmaps costs (the arrival filter's
    :class:`~pulsar_nack.entry_sets.EntrySets`, the packed tier's membership bitmap): the low bits that
    number the ledgers move below the entry id, so a container holds 2**(16 - L) consecutive entries of
    each of up to 2**L ledgers, ``share`` of them present; run containers where smaller. O(1)."""
    ledgers = max(1.0, shape.ledger_keys)
    low = min(MAX_LOW_BITS, math.ceil(math.log2(ledgers)))
    span = min(float(s.entries_per_ledger), shape.entries_per_ms * s.arrivals_ms, 2.0 ** (16 - low))
    values = max(1.0, span * min(2.0**low, ledgers) * share)
    return _container_bytes(values, share, runs=True) / values


def _in_flight_ms(s: Scenario, width: float) -> float:
    """For a run of ``duration_ms`` <= the delay (as ``pulsar-nack profile`` runs one, floor rounding):
    how many ms of its arrivals are in flight at its end — forwarded within the native latency before
    it, their copies not back yet. The tracker forwards a bucket that much ahead of its time, so those
    are the buckets of times in (duration, duration + latency]; a bucket of time b holds the arrivals
    of [b - delay, b - delay + 2**k). O(buckets in the latency)."""
    assert s.duration_ms is not None
    lead = _forward_lead_ms()
    total = 0.0
    bucket = (math.floor(s.duration_ms / width) + 1) * width
    while bucket <= s.duration_ms + lead:
        low, high = bucket - s.delay_ms, bucket - s.delay_ms + width
        total += max(0.0, min(high, s.duration_ms) - max(low, 0.0))
        bucket += width
    return total


def _in_flight_share(s: Scenario, steps: int = 256) -> float:
    """:func:`_in_flight_ms`'s share of the pending ids with a spread: those of the run's arrivals whose
    delay ends within the native latency after the run (its end is ``duration_ms``, its arrivals steady
    from 0; bucket rounding left out: the spread blurs it). O(steps)."""
    assert s.duration_ms is not None
    lead, low, spread = _forward_lead_ms(), s.delay_ms, s.delay_spread_ms
    total = 0.0
    for step in range(steps):  # arrivals ``age`` ms before the end, midpoints
        age = (step + 0.5) * s.duration_ms / steps
        total += max(0.0, min(age + lead, low + spread) - max(age, low)) / spread
    return total / steps * s.duration_ms / s.pending_ms


def _staged_to_packed(s: Scenario, shape: _Shape) -> bool:
    """Whether the nack path's staging log files every bucket in the packed tier for good: a nack that
    does not follow one into the same slot is staged, and a staged bucket whose slots each got fewer than
    :data:`PROMOTE_AT` ids since the last filing (the timer's, ~``compact_after_ms``; or every
    :data:`STAGE_UP_TO` nacks) goes to the packed tier — and its later ids with it, while no burst (a
    second nack into the slot just nacked: one topic, a batch's messages) has made it live."""
    if s.topics == 1:
        return False  # consecutive nacks fall into the same slot
    nacks_per_entry = s.batch_size * s.nack_share / shape.entry_share
    if nacks_per_entry >= 1.5:
        return False  # a batch's messages nacked together: bursts
    nack_rate = s.rate * s.nack_share / 1_000  # per ms
    filing_ms = min(tracker_default("compact_after_ms"), STAGE_UP_TO / nack_rate)
    width = float(1 << s.precision_bits)
    slots = s.topics * ((filing_ms + s.delay_spread_ms) / width + 1)  # (a spread: more windows a filing)
    return nack_rate * filing_ms / slots < PROMOTE_AT


def features(s: Scenario) -> dict[str, float]:
    """pulsar-nack's structural features of ``s`` (see the module docstring), after the index's tiers
    (``pulsar_nack.index``, ``pulsar_nack.packed``). O(1).

    * *hot*: the bucket nacks are filed in and those of the last ``compact_after_ms`` — not compacted yet:
      slots in shared 64-bit bitmaps, or bitmaps of their own from :data:`PROMOTE_AT` ids.
    * *packed*: a compacted bucket whose slots are all small moves to the packed store (a 6-byte code a
      nacked message, an offset a bucket, a membership bitmap) when its rows cost less than the live
      tier's objects — the index's own rule (``_evict``: 15 B a row against 300 B a bucket, 24 B a slot,
      130 B a batch entry's member record, a few bytes an id), applied to the mean bucket, a
      ``compact_after_ms`` slice of it at a time (the timer weighs what arrived since it last compacted).
      With many topics and one nack an entry, the nack path's staging log files every bucket there,
      the hot end too (:func:`_staged_to_packed`).
    * *live*: compacted buckets that stay: runs and bitmaps of their own, shared bitmaps, and a record of
      which messages are nacked for every batch entry of a slot without a bitmap of its own (all nacked too).
    * the arrival filter: pending non-batched ids and batched entries as values of shared 64-bit bitmaps
      (:func:`_shared_value_bytes`, as the packed tier's membership bitmap), a record per batch entry.
    * *fired*: a run as long as the delay ends with the ids of the buckets forwarded within the native
      latency in flight (:func:`_in_flight_ms`): the filter keeps a flight a non-batched id, a record a
      batch entry (followed for the linger after its forward).
    """
    shape = _shape(s)
    width = float(1 << s.precision_bits)
    batched = s.batch_size > 1
    compact_ms = tracker_default("compact_after_ms")
    hot = min(1.0, (width + compact_ms) / (s.pending_ms + width))
    if _staged_to_packed(s, shape):
        hot, packed, own = 0.0, 1.0, False
    else:
        # What the packing rule weighs: a bucket's ids, slots and rows (a packed row a nacked message; with
        # batches too: a batch message's slot is 1 + its index) — a bucket wider than compact_after_ms a
        # slice at a time, what arrived since the timer last compacted.
        buckets = max(shape.buckets, 1.0)
        part = min(1.0, compact_ms / width)
        ids_b, rows_b = shape.ids * part / buckets, s.pending * part / buckets
        slots_b = min(shape.slots / buckets, max(ids_b, 1.0))
        own = shape.ids_per_slot * part >= PROMOTE_AT
        live_b = 300 + 24 * slots_b + (130 * ids_b if batched else 0.0) + 3 * ids_b
        packed = (1 - hot) if not own and (15 * rows_b < 300 or 15 * rows_b < live_b) else 0.0
    live = 1 - packed - hot
    fired = 0.0  # share of the ids in flight at the end of a run shorter than the delay
    if s.duration_ms is not None and s.duration_ms <= s.delay_ms:
        fired = _in_flight_ms(s, width) / s.duration_ms if not s.delay_spread_ms else _in_flight_share(s)
    per_container = shape.ids_per_slot / shape.containers_per_slot
    payload = shape.slots * shape.containers_per_slot * _container_bytes(per_container, shape.density, True)
    # The arrival filter's sets: a value a pending non-batched nack, or a batched entry; the packed
    # tier's membership bitmap: a value an entry it has rows of.
    value_bytes = _shared_value_bytes(s, shape, shape.entry_share)
    filter_payload = shape.ids * value_bytes
    return {
        "constant": 1.0,
        "packed_rows": s.pending * packed,
        "packed_buckets": shape.buckets * packed,
        "packed_entries": shape.ids * packed * value_bytes,
        "hot_ids": shape.ids * hot,
        "hot_slots": 0.0 if own else shape.slots * hot,
        "hot_own_slots": shape.slots * hot if own else 0.0,
        "live_ids": shape.ids * live,
        "live_slots": 0.0 if own else shape.slots * live,
        "own_slots": shape.slots * live if own else 0.0,
        "live_buckets": shape.buckets * live,
        # (a slot with a bitmap of its own keeps its entries' members in it: no record an entry)
        "live_members": shape.ids * live if batched and not own else 0.0,
        "live_payload": payload * live if own else 0.0,
        # ... where a slot of its own keeps them: a member (entry << 10 | index) a nacked message
        "own_messages": s.pending * (1 - packed) if batched and own else 0.0,
        # a ledger with live slots has a record (~200 B); one the packed tier alone holds, an ordinal
        "ledger_keys": shape.ledger_keys * (1 - packed),
        "packed_ledgers": shape.ledger_keys * packed,
        "batch_entries": shape.ids if batched else 0.0,
        "batch_messages": s.pending if batched else 0.0,
        "filter_payload": filter_payload,
        "single_nacks": 0.0 if batched else s.pending,
        "fired_ids": 0.0 if batched else shape.ids * fired,
        # (a forwarded batch entry is followed — a record an entry — for the linger after its forward)
        "fired_entries": shape.ids * fired if batched else 0.0,
        "fired_keys": shape.ledger_keys * min(1.0, fired * shape.ids / shape.ledger_keys),
    }


def java_features(s: Scenario) -> dict[str, float]:
    """The Java structure's features of ``s``: as built (no runOptimize), one bitmap per slot. O(1)."""
    shape = _shape(s)
    per_container = shape.ids_per_slot / shape.containers_per_slot
    containers = shape.slots * shape.containers_per_slot
    return {
        "constant": 1.0,
        "buckets": shape.buckets,
        "slots": shape.slots,
        "java_payload": containers * _java_container_bytes(per_container),
        "ledger_keys": shape.ledger_keys,
    }


# -- the fitted model ---------------------------------------------------------------------------------------


def predict(coefficients: Mapping[str, float], row: Mapping[str, float]) -> float:
    """The model's bytes for one feature row: Σ coefficient × feature. O(features)."""
    return sum(coefficients[name] * row[name] for name in coefficients)


@dataclass(frozen=True)
class Fit:
    """A fitted model file: per contender, coefficients and the parameter range they hold for."""

    data: dict[str, Any]
    source: str

    @property
    def ranges(self) -> dict[str, list[float]]:
        ranges: dict[str, list[float]] = self.data["range"]
        return ranges


def load_fit(path: Path | None = None) -> Fit:
    """The fit file (default: the package's); :class:`FitError` naming the file if unusable."""
    try:
        if path is None:
            text = resources.files("pulsar_nack").joinpath(FIT_FILE).read_text()
            source = f"pulsar_nack/{FIT_FILE}"
        else:
            text, source = path.read_text(), str(path)
        data = json.loads(text)
    except (OSError, ValueError) as error:
        raise FitError(
            f"{path or FIT_FILE}: cannot read the fitted model ({error}); run bench/fit_estimate.py"
        ) from None
    for key in ("pulsar_nack", "java", "range", "machine"):
        if key not in data:
            raise FitError(f"{source}: no {key!r} block; run bench/fit_estimate.py")
    if set(data["pulsar_nack"]["coefficients"]) != set(FEATURES):
        raise FitError(f"{source}: its features differ from this version's; run bench/fit_estimate.py")
    return Fit(data, source)


@dataclass(frozen=True)
class Estimate:
    """Predicted steady-state memory (bytes) and what it rests on."""

    scenario: Scenario
    pending: float
    pulsar_nack_bytes: float
    java_bytes: float | None
    native_bytes: float
    outside: list[str]  # parameters outside the fitted range (empty: inside)
    features: dict[str, float]
    fit_source: str
    fit_error: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def range_key(s: Scenario) -> dict[str, float]:
    """The quantities whose fitted range :func:`estimate` checks ``s`` against."""
    shape = _shape(s)
    return {
        "rate": s.rate,
        "horizon_ms": s.horizon_ms,
        "delay_spread_ms": s.delay_spread_ms,
        "precision_bits": s.precision_bits,
        "batch_size": s.batch_size,
        "nack_share": s.nack_share,
        "topics": s.topics,
        "entries_per_ledger": s.entries_per_ledger,
        "ids_per_slot": shape.ids_per_slot,
        "redelivered_ms": s.redelivered_ms(math.inf),  # the fit's workloads: nothing due yet (0..0)
    }


def estimate(s: Scenario, fit: Fit | None = None) -> Estimate:
    """Predict ``s``'s steady-state memory with ``fit`` (default: the package's model). O(1)."""
    if not isinstance(s, Scenario):
        raise ProfileError(f"scenario: expected a Scenario, got {type(s).__name__}")
    fit = fit or load_fit()
    row = features(s)
    ours = predict(fit.data["pulsar_nack"]["coefficients"], row)
    java = fit.data["java"]
    java_bytes = predict(java["coefficients"], java_features(s)) if java.get("coefficients") else None
    outside = [
        f"{name} {value:g} (fitted over {low:g}..{high:g})"
        for name, value in range_key(s).items()
        for low, high in [fit.ranges.get(name, (-math.inf, math.inf))]
        if not low * (1 - 1e-9) <= value <= high * (1 + 1e-9)
    ]
    return Estimate(
        scenario=s,
        pending=s.pending,
        pulsar_nack_bytes=ours,
        java_bytes=java_bytes,
        native_bytes=float(native_cost()["bytes_per_nack"]) * s.pending,
        outside=outside,
        features=row,
        fit_source=fit.source,
        fit_error=dict(fit.data["pulsar_nack"].get("error", {})),
    )


def _mb(value: float) -> str:
    return f"{value / 1e6:,.3f} MB" if value < 1e9 else f"{value / 1e9:,.2f} GB"


def render(result: Estimate, fit: Fit) -> Iterator[str]:
    """Lines of the report ``pulsar-nack estimate`` prints."""
    s = result.scenario
    state = "steady state" if s.duration_ms is None else f"after {s.duration_ms / 1_000:g} s of nacks"
    spread = f" to {(s.delay_ms + s.delay_spread_ms) / 1_000:g} s (uniform)" if s.delay_spread_ms else ""
    yield (
        f"workload: {s.rate:g} msg/s over {s.topics} topic(s), batches of {s.batch_size}, "
        f"{s.nack_share:.0%} nacked, delay {s.delay_ms / 1_000:g} s{spread}, k = {s.precision_bits}, "
        f"{s.entries_per_ledger:,} entries per ledger ({state})"
    )
    pending = result.pending
    yield f"pending nacked messages: {pending:,.0f}"

    def per(value: float) -> str:
        return f"{value / pending:.2f} B per pending nack" if pending else ""

    ours = result.pulsar_nack_bytes
    yield f"  pulsar-nack (tracker, system allocator): {_mb(ours):>12}  {per(ours)}"
    if result.java_bytes is not None:
        java = result.java_bytes
        yield f"  Java PIP-393 structure (as built):       {_mb(java):>12}  {per(java)}"
    native = result.native_bytes
    ratio = f", {native / ours:,.0f}× pulsar-nack" if ours > 0 else ""
    yield f"  native client tracker:                   {_mb(native):>12}  {per(native)}{ratio}"
    data = fit.data
    error = data["pulsar_nack"]["error"]
    cost = native_cost()
    yield (
        f"model: {fit.source}, measured {data['machine']['date']} at commit {data['machine']['commit']}"
        + (f", fitted {data['fitted']['date']} at {data['fitted']['commit']} " if "fitted" in data else " ")
        + f"(pulsar-nack error median {error['median']:.0%}, max {error['max']:.0%} over {error['points']} "
        f"profiled workloads; native: {cost['source']} ({cost['broker']}, {cost['date']}, "
        f"commit {cost['commit']}))"
    )
    yield "fitted range: " + ", ".join(
        f"{name} {low:g}..{high:g}" for name, (low, high) in fit.ranges.items()
    )
    if result.outside:
        yield "OUTSIDE the fitted range (extrapolated, treat as indicative): " + "; ".join(result.outside)
