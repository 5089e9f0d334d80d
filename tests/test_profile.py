"""``pulsar_nack.profile``: every workload parameter checked, and the figures measured — more pending nacks
cost more by every measure, the per-type breakdown sums to its total and agrees with the measurements from
outside, pending counts follow the delay, the native figure is the packaged measurement."""

from __future__ import annotations

import json
import math
from importlib import resources
from typing import Any

import pytest
from pyroaring import BitMap

from pulsar_nack.memory import bitmap_heap_bytes
from pulsar_nack.profile import (
    Delay,
    ProfileError,
    ProfileResult,
    Workload,
    java_side,
    parse_delay,
    parse_duration_ms,
    profile,
    render,
    type_breakdown,
)

# -- validation -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("rate", 0.0), ("rate", -5.0), ("rate", math.nan), ("rate", math.inf), ("rate", "10"), ("rate", True),
        ("duration_s", 0.0), ("duration_s", -1.0), ("duration_s", math.inf),
        ("topics", 0), ("topics", 2.5), ("topics", 100_001),
        ("partitions", 0), ("partitions", 10_001),
        ("batch_size", 0), ("batch_size", 1_001), ("batch_size", 1.0),
        ("nack_share", 0.0), ("nack_share", 1.01), ("nack_share", math.nan),
        ("precision_bits", -1), ("precision_bits", 31), ("precision_bits", False),
        ("rounding", "nearest"), ("rounding", None),
        ("entries_per_ledger", 0), ("entries_per_ledger", 2**31),
        ("seed", -1), ("seed", "x"),
        ("delay", 60_000),
        ("chunked_share", -0.1), ("chunked_share", 1.5), ("chunked_share", math.nan),
        ("chunked_bytes", 1_000), ("chunked_bytes", 2**31), ("chunked_bytes", 1.5),
        ("max_held_chunked_bytes", -1), ("max_held_chunked_bytes", 2**41),
    ],
)  # fmt: skip
def test_every_workload_parameter_is_checked_and_named(name: str, value: Any) -> None:
    with pytest.raises(ProfileError, match=rf"^{name}: "):
        Workload(**{name: value})


def test_chunked_messages_need_no_batching() -> None:
    with pytest.raises(ProfileError, match=r"^chunked_share: chunked messages are never batched"):
        Workload(chunked_share=0.1, batch_size=10)
    assert Workload(chunked_share=0.0, batch_size=10).batch_size == 10


def test_too_few_or_too_many_messages_name_rate_and_duration() -> None:
    with pytest.raises(ProfileError, match=r"^rate × duration_s: less than one message"):
        Workload(rate=0.5, duration_s=1.0)
    with pytest.raises(ProfileError, match=r"^rate × duration_s: .* more than"):
        Workload(rate=1e6, duration_s=3600.0)
    with pytest.raises(ProfileError, match=r"^topics × partitions"):
        Workload(topics=1_000, partitions=1_000)


@pytest.mark.parametrize(
    ("kind", "low", "high", "reason"),
    [
        ("normal", 1.0, 1.0, "kind"),
        ("fixed", -1.0, -1.0, "low"),
        ("fixed", math.nan, math.nan, "low"),
        ("uniform", 10.0, 5.0, "below low"),
        ("exponential", 0.0, 0.0, "mean"),
        ("fixed", 1.0, math.inf, "high"),
    ],
)
def test_delay_parameters_are_checked(kind: str, low: float, high: float, reason: str) -> None:
    with pytest.raises(ProfileError, match=rf"^delay: .*{reason}"):
        Delay(kind, low, high)


def test_durations_and_delays_parse_with_units() -> None:
    assert parse_duration_ms("250ms", "x") == 250
    assert parse_duration_ms("30", "x") == 30_000  # a bare number is seconds
    assert parse_duration_ms("5m", "x") == parse_duration_ms("5min", "x") == 300_000
    assert parse_duration_ms("1h", "x") == 3_600_000 and parse_duration_ms("1d", "x") == 86_400_000
    assert parse_delay("1h") == Delay("fixed", 3_600_000, 3_600_000)
    assert parse_delay("uniform:1m:1h") == Delay("uniform", 60_000, 3_600_000)
    assert parse_delay("exp:10s") == Delay("exponential", 10_000, 10_000)
    for bad in ("1x", "", "-5s", "1h1m", "1e999h"):
        with pytest.raises(ProfileError, match=r"^delay: "):
            parse_delay(bad)
    for bad in ("normal:1s", "uniform:1s", "exp:1s:2s"):
        with pytest.raises(ProfileError, match=r"^delay: expected"):
            parse_delay(bad)


def test_profile_rejects_what_is_not_a_workload() -> None:
    with pytest.raises(ProfileError, match=r"^workload: "):
        profile({"rate": 10}, java=False)  # type: ignore[arg-type]


# -- measured figures ----------------------------------------------------------------------------------

SMALL = Workload(rate=2_000, duration_s=6, delay=parse_delay("1h"), nack_share=0.3)
LARGER = Workload(rate=2_000, duration_s=30, delay=parse_delay("1h"), nack_share=0.3)


@pytest.fixture(scope="module")
def small() -> ProfileResult:
    return profile(SMALL, java=False)


@pytest.fixture(scope="module")
def larger() -> ProfileResult:
    return profile(LARGER, java=False)


def test_more_pending_nacks_cost_more_by_every_measure(small: ProfileResult, larger: ProfileResult) -> None:
    # 5x the messages, the same share nacked: 5x the pending nacks (the seed draws the same first ones).
    assert 4.5 < larger.pending / small.pending < 5.5
    for measure in ("malloc", "tracemalloc", "reported"):
        assert small.memory[measure] > 0, measure
        assert larger.memory[measure] > 2 * small.memory[measure], (measure, small.memory, larger.memory)
    assert larger.breakdown_total > 2 * small.breakdown_total
    # 30 % of a consecutive stream: array containers, a few bytes per pending nack — far from 0, far below
    # the native client's hundreds.
    assert 1.0 < larger.per_pending("malloc") < 50.0


def test_the_breakdown_sums_to_its_total_and_agrees_with_outside(larger: ProfileResult) -> None:
    assert larger.breakdown_total == sum(larger.breakdown.values())
    assert larger.breakdown["CRoaring heap (32-bit bitmaps)"] > 0
    assert "pyroaring.BitMap" in larger.breakdown
    # The breakdown (pympler + CRoaring) and the process-level measure count the same objects.
    assert 0.6 < larger.breakdown_total / larger.memory["malloc"] < 1.4, (larger.breakdown, larger.memory)
    assert 0.6 < larger.breakdown_total / larger.memory["reported"] < 1.4


def test_counts_and_times_are_reported(larger: ProfileResult) -> None:
    assert larger.messages == 60_000
    assert larger.pending == larger.nacked  # the delay outlasts the run: nothing forwarded yet
    assert 0.27 < larger.nacked / larger.messages < 0.33
    assert larger.pending_ids == larger.pending  # no batches: one index id per message
    assert larger.ledgers == 2  # 60,000 entries of 50,000 per ledger
    assert larger.buckets > 100 and larger.slots >= larger.buckets  # 30 s of 256 ms buckets
    assert larger.nack_us > 0 and larger.forward_us > 0 and larger.forward_source == "drain"


def test_a_delay_shorter_than_the_run_leaves_a_delay_worth_pending() -> None:
    result = profile(Workload(rate=2_000, duration_s=10, delay=parse_delay("2s")), java=False)
    # ~2 s of nacks pending (plus up to one bucket and the native lead forwarded early)
    assert 3_000 < result.pending < 4_600, result.pending
    assert result.forwards > 0 and result.forwarded_entries >= result.nacked - result.pending
    assert result.forward_source == "run"


def test_the_native_figure_is_the_packaged_measurement(small: ProfileResult) -> None:
    packaged = json.loads(
        resources.files("pulsar_nack").joinpath("data", "native_nack_cost.json").read_text()
    )
    assert small.native is not None
    assert small.native["bytes_per_nack"] == packaged["bytes_per_nack"]
    assert small.native["bytes"] == pytest.approx(packaged["bytes_per_nack"] * small.pending)
    assert packaged["commit"] in small.native["source"]


def test_the_breakdown_adds_croarings_heap_that_asizeof_misses() -> None:
    from pympler import asizeof

    bitmap = BitMap(range(0, 200_000, 3))
    breakdown = type_breakdown([[bitmap]])
    assert breakdown["CRoaring heap (32-bit bitmaps)"] == bitmap_heap_bytes(bitmap)
    assert breakdown["pyroaring.BitMap"] == BitMap.__basicsize__
    serialized: int = asizeof.asizeof(bitmap)  # type: ignore[no-untyped-call]
    assert sum(breakdown.values()) > serialized  # serialized size: misses the C heap


def test_the_java_structure_runs_beside_it() -> None:
    from pulsar_nack.shipped import java_reference

    reference: Any = java_reference()
    if reference is None or not reference.available():
        pytest.skip("java and mvn are needed")
    result, note = java_side(SMALL, 3_600)
    assert result is not None, note
    assert result["n"] == 3_600 and result["retained_bytes"] > 0 and result["buckets"] > 0
    assert "x = 1 nacked entries/ms" in note


# -- held chunked messages ------------------------------------------------------------------------------

MIB = 2**20
PLAIN = Workload(rate=200, duration_s=5, delay=parse_delay("1h"))
CHUNKED = Workload(
    rate=200, duration_s=5, delay=parse_delay("1h"), chunked_share=0.01, chunked_bytes=MIB,
    max_held_chunked_bytes=4 * MIB,
)  # fmt: skip


def test_held_chunked_payload_is_its_own_row_and_in_every_measure() -> None:
    """1 % of 1,000 nacks are 1 MiB chunked messages, held up to 4 MiB: four are held (their payload in
    every memory measure, and in the reported figure as nack_stats() reports it), the rest went to the
    tracker past the bound; the report has a row of its own for them."""
    plain, chunked = profile(PLAIN, java=False), profile(CHUNKED, java=False)
    assert chunked.chunked_nacked >= 5, "the seed draws more chunked nacks than the bound holds"
    assert (chunked.held_chunked, chunked.held_chunked_bytes) == (4, 4 * MIB)
    assert chunked.chunked_over_bound == chunked.chunked_nacked - 4
    assert chunked.nacked == plain.nacked == 1_000
    assert chunked.pending == plain.pending - 4, "held ones are not in the tracker"
    for measure in ("malloc", "tracemalloc", "reported", "rss"):
        grew = chunked.memory[measure] - plain.memory[measure]
        assert 3.5 * MIB < grew < 5 * MIB, (measure, plain.memory, chunked.memory)
    assert chunked.breakdown["bytes"] >= 4 * MIB
    lines = list(render(chunked))
    row = next(line for line in lines if "held chunked payload" in line)
    assert "4.194 MB" in row and "4 of" in row and "past it" in row, row
    assert any("no chunked messages" in line for line in render(plain))


@pytest.mark.parametrize(
    ("precision_bits", "batch_size", "topics"), [(8, 10, 1), (0, 1, 100), (12, 100, 1_000)]
)
def test_a_consumer_left_with_one_nack_after_a_busy_run_keeps_16_kib(
    monkeypatch: pytest.MonkeyPatch, precision_bits: int, batch_size: int, topics: int
) -> None:
    """Issue 23 (≤ 16 KiB fixed + 16 B a pending nack, memory flat with run time): a run whose delays
    spread over 5 s (the lateness estimator's offsets of 40 buckets made, its sample full) drained — every
    forwarded copy back and acked, the timer run for 100 s more — and then one nack pending for an hour:
    the tracker holds ≤ 16 KiB + 16 B by its walk. 17.5-18.8 KB before the offsets were made as buckets
    came (they come back with the first nack at their largest) and drained tables were let go."""
    from pulsar_nack import profile as profile_module

    made: list[Any] = []
    new_tracker = profile_module._new_tracker

    def capture(workload: Workload) -> Any:
        made.append(new_tracker(workload))
        return made[-1]

    monkeypatch.setattr(profile_module, "_new_tracker", capture)
    workload = Workload(
        rate=400, delay=Delay("uniform", 100.0, 5_000.0), duration_s=20.0, topics=topics,
        batch_size=batch_size, nack_share=0.3, precision_bits=precision_bits,
    )  # fmt: skip
    tracker = profile_module._drive(workload, lambda done: None, lambda: None).tracker
    _, clock, in_flight = made[0]
    now = clock[0]
    for _ in range(2_000):  # 100 s of the timer: forwards, their copies back, compactions, sweeps
        now += 50
        clock[0] = now
        next_due = tracker.index.next_due_ms()
        if next_due is not None and next_due <= now + tracker.lead_ms:
            tracker.flush(now)
        while in_flight and in_flight[0][0] <= now:
            profile_module._redeliver(tracker, in_flight.popleft()[1], batch_size)
        tracker.compact()
        sweep_due = tracker.arrivals.sweep_due
        if sweep_due is not None and now > sweep_due:
            for again in tracker.arrivals.sweep():
                tracker.schedule(max(again[0], now), *again[1:])
    assert tracker.stats().pending == 0 and len(tracker.arrivals.lateness) > 1_000
    tracker.schedule(now + 3_600_000, 9_999_999, 1, -1, "persistent://public/default/late")
    clock[0] = now + 2_000
    tracker.compact()
    stats = tracker.stats(with_memory=True)
    assert stats.pending == 1
    assert stats.memory_bytes <= 16 * 1024 + 16, stats.memory_parts
