"""``pulsar_nack.estimate``: parameters checked, the shipped model read
with its provenance and range — and its predictions within ±25 % of ``profile``'s measurements on small
workloads the model was not fitted on."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from pulsar_nack.estimate import (
    FEATURES,
    FitError,
    Scenario,
    estimate,
    features,
    java_features,
    load_fit,
)
from pulsar_nack.profile import Delay, ProfileError, Workload, native_cost, run_probe


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("rate", 0.0), ("rate", math.inf), ("rate", "fast"),
        ("delay_ms", 0.0), ("delay_ms", -1.0), ("delay_ms", math.nan),
        ("precision_bits", -1), ("precision_bits", 31), ("precision_bits", 8.0),
        ("entries_per_ledger", 0), ("batch_size", 0), ("batch_size", 1_001),
        ("nack_share", 0.0), ("nack_share", 2.0), ("topics", 0), ("topics", True),
        ("duration_ms", 0.0), ("duration_ms", math.inf),
        ("delay_spread_ms", -1.0), ("delay_spread_ms", math.inf),
    ],
)  # fmt: skip
def test_every_scenario_parameter_is_checked_and_named(name: str, value: Any) -> None:
    label = {"delay_ms": "delay", "duration_ms": "duration", "delay_spread_ms": "delay_spread"}.get(
        name, name
    )
    with pytest.raises(ProfileError, match=rf"^{label}: "):
        Scenario(**{"rate": 1_000.0, "delay_ms": 60_000.0, name: value})


def test_estimate_rejects_what_is_not_a_scenario() -> None:
    with pytest.raises(ProfileError, match=r"^scenario: "):
        estimate({"rate": 1.0})  # type: ignore[arg-type]


def test_features_follow_the_index_tiers() -> None:
    # Counted when the messages have arrived (duration = delay), as the fit's workloads are.
    def row(**kwargs: Any) -> dict[str, float]:
        delay = kwargs.pop("delay_ms", 60_000.0)
        return features(Scenario(delay_ms=delay, duration_ms=delay, **kwargs))

    # A dense stream: slots of 256 ids (own bitmaps, runs once compacted), nothing packed.
    dense = row(rate=1_000.0, precision_bits=8)
    assert dense["own_slots"] > 0 and dense["packed_rows"] == 0 and dense["live_slots"] == 0
    # Sparse and long (1 h, 100 topics, 10 % of batches of 10): compacted buckets are packed rows, one a
    # nacked message; only the hot end (the open bucket and the last second) is not.
    fleet = row(rate=278.0, delay_ms=3_600_000.0, precision_bits=8, topics=100, batch_size=10, nack_share=0.1)
    assert 0.99 * 278.0 * 0.1 * 3_600 < fleet["packed_rows"] < 278.0 * 0.1 * 3_600
    assert fleet["live_ids"] == pytest.approx(0, abs=1e-6)
    assert fleet["batch_entries"] > 0 and fleet["single_nacks"] == 0
    # Many nacks per batch entry: rows cost more than the live tier's members, so the buckets stay live.
    members = row(
        rate=100_000.0, delay_ms=10_000.0, precision_bits=8, topics=100, batch_size=100, nack_share=0.1
    )
    assert members["packed_rows"] == 0 and members["live_members"] > 0
    # In flight at the end of a run as long as the delay: the ids of buckets forwarded within the native
    # latency (~0.1 s) before it — at k = 0 a latency's worth of arrivals (the profile measured 1,021 of
    # 1,000 a 0.1 s), at k = 12 none (the next bucket, 12.3 s, is not forwarded by 10.1 s).
    assert 900 < row(rate=10_000.0, delay_ms=10_000.0, precision_bits=0)["fired_ids"] < 1_100
    assert row(rate=10_000.0, delay_ms=10_000.0, precision_bits=12)["fired_ids"] == 0
    # Many topics, one nack an entry: the nack path's staging log files every bucket in the packed tier,
    # the hot end too (the profile measured 6 B a row there, no live slot).
    staged = row(rate=10_000.0, delay_ms=10_000.0, precision_bits=12, topics=100)
    assert staged["packed_rows"] == pytest.approx(100_000) and staged["hot_ids"] == 0
    # The Java structure: one bitmap per slot and a bitset (8 KiB) once a container passes 4096 ids.
    java = java_features(Scenario(rate=8_000.0, delay_ms=60_000.0, precision_bits=10))
    assert java["java_payload"] == pytest.approx(java["slots"] * 8_192, rel=0.01)


def test_the_shipped_fit_has_provenance_range_and_every_feature() -> None:
    fit = load_fit()
    data = fit.data
    assert set(data["pulsar_nack"]["coefficients"]) == set(FEATURES)
    assert all(value >= 0 for value in data["pulsar_nack"]["coefficients"].values())
    assert {"date", "commit", "cpu"} <= set(data["machine"])
    assert "native" not in data  # the native figure is read from its own file, never a stale copy
    low, high = fit.ranges["rate"]
    assert 0 < low < high
    assert data["pulsar_nack"]["error"]["points"] >= 20


def test_a_missing_or_foreign_fit_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(FitError, match=r"nowhere\.json"):
        load_fit(tmp_path / "nowhere.json")
    stale = tmp_path / "stale.json"
    data = json.loads(json.dumps(load_fit().data))
    data["pulsar_nack"]["coefficients"] = {"constant": 1.0}
    stale.write_text(json.dumps(data))
    with pytest.raises(FitError, match=r"stale\.json: its features differ"):
        load_fit(stale)


def test_outside_the_fitted_range_is_said() -> None:
    inside = estimate(Scenario(rate=2_000.0, delay_ms=10_000.0, precision_bits=4, duration_ms=10_000.0))
    assert inside.outside == []
    # The fit measured workloads with nothing due yet: a steady state (redeliveries) is extrapolated.
    steady = estimate(Scenario(rate=2_000.0, delay_ms=10_000.0))
    assert any(item.startswith("redelivered_ms") for item in steady.outside)
    far = estimate(Scenario(rate=1e7, delay_ms=86_400_000.0))
    assert any(item.startswith("rate") for item in far.outside)
    assert far.native_bytes == pytest.approx(native_cost()["bytes_per_nack"] * far.pending)


# -- against the grid bench's measure: a sample of issue 23's grid ----------------------------------------

#: (topics, batch size, nack share, delay s, k): many topics not batched; batches all nacked over 1,000
#: topics; 10 % of batches of 100 nacked (live batch members); batches of 10 over 1,000 topics, k = 0 (a
#: bucket a millisecond).
GRID_SAMPLE = [
    (100, 1, 1.0, 10, 0, 0),
    (1_000, 100, 1.0, 60, 0, 0),
    (100, 100, 0.1, 10, 8, 0),
    (1_000, 10, 1.0, 10, 0, 0),
    # delays spread over 60 s: a batch's nacked messages fall in buckets apart (members, not entries)
    (1, 100, 1.0, 10, 8, 60),
    (100, 10, 0.1, 10, 8, 60),
]
#: The bench's 100,000 pending nacks a point: each point takes 2-8 s here (two runs in a fresh process).
PENDING = 100_000


@pytest.mark.parametrize(("topics", "batch", "share", "delay_s", "k", "spread_s"), GRID_SAMPLE)
def test_estimate_is_within_25_percent_of_the_grid_measure(
    topics: int, batch: int, share: float, delay_s: int, k: int, spread_s: int
) -> None:
    """Measured as bench/nack_memory.py measures a grid point: the real tracker, every nack still pending
    (messages over the shortest delay), the heap the process keeps in its second run of the workload."""
    delay_ms, spread_ms = delay_s * 1_000.0, spread_s * 1_000.0
    rate = round(PENDING / share) / delay_s
    workload = Workload(
        rate=rate,
        delay=Delay("uniform", delay_ms, delay_ms + spread_ms)
        if spread_s
        else Delay("fixed", delay_ms, delay_ms),
        duration_s=float(delay_s),
        topics=topics,
        batch_size=batch,
        nack_share=share,
        precision_bits=k,
    )
    measured = run_probe("malloc-warm", workload, lambda _done: None)
    predicted = estimate(
        Scenario(
            rate=rate, delay_ms=delay_ms, precision_bits=k, batch_size=batch, nack_share=share,
            topics=topics, duration_ms=delay_ms, delay_spread_ms=spread_ms,
        )
    )  # fmt: skip
    assert predicted.outside == []
    assert predicted.pending == pytest.approx(measured["pending"], rel=0.1)
    ratio = predicted.pulsar_nack_bytes / measured["bytes"]
    assert 0.75 <= ratio <= 1.25, (ratio, predicted.pulsar_nack_bytes, measured)
