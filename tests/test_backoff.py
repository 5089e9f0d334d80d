"""pulsar_nack.backoff: ``MultiplierRedeliveryBackoff`` (arguments, monotonicity and bounds, jitter) and what
``backoff_delay`` accepts from any backoff's ``next()``. No broker: a consumer's use of a backoff is tested in
test_consumer.py and test_inputs.py."""

from __future__ import annotations

import itertools
import re
from typing import Any

import numpy as np
import pytest
from test_inputs import BACKOFF_RESULT_BAD, INF, NAN, WRONG_TYPES, Returns, ids, kwargs_id

from pulsar_nack import MultiplierRedeliveryBackoff
from pulsar_nack.backoff import backoff_delay

NAME = "negative_ack_redelivery_backoff"  # how the consumer names its backoff in these messages


# -- what a backoff returns -----------------------------------------------------------------------


@pytest.mark.parametrize(("result", "error"), BACKOFF_RESULT_BAD, ids=[ids(v) for v, _ in BACKOFF_RESULT_BAD])
def test_bad_backoff_results_name_the_backoff(result: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match=re.escape(f"{NAME}.next(3) returned {result!r}")):
        backoff_delay(Returns(result), 3, NAME)


@pytest.mark.parametrize(
    ("result", "ms"),
    [(0, 0.0), (1000, 1000.0), (np.int64(7), 7.0), (np.float32(2.5), 2.5), (7.5, 7.5)],
    ids=ids,
)
def test_good_backoff_results(result: Any, ms: float) -> None:
    assert backoff_delay(Returns(result), 0, NAME) == ms


# -- MultiplierRedeliveryBackoff ------------------------------------------------------------------------

BACKOFF_ARGS_BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    *(({"min_delay_ms": v}, TypeError, "min_delay_ms") for v in [*WRONG_TYPES, 1.5, INF, NAN]),
    *(({"max_delay_ms": v}, TypeError, "max_delay_ms") for v in [*WRONG_TYPES, 1.5, INF, NAN]),
    ({"min_delay_ms": -1}, ValueError, "min_delay_ms"),
    ({"max_delay_ms": -1}, ValueError, "max_delay_ms"),
    ({"max_delay_ms": 2**63}, ValueError, "max_delay_ms"),
    ({"min_delay_ms": 2000, "max_delay_ms": 1000}, ValueError, "max_delay_ms"),
    *(({"multiplier": v}, TypeError, "multiplier") for v in WRONG_TYPES),
    *(({"multiplier": v}, ValueError, "multiplier") for v in [0.5, 0, -2, INF, NAN]),
    *(({"jitter_percent": v}, TypeError, "jitter_percent") for v in WRONG_TYPES),
    *(({"jitter_percent": v}, ValueError, "jitter_percent") for v in [-1, 100.5, INF, NAN]),
    *(({"seed": v}, TypeError, "seed") for v in [1.5, "7", True, b"7"]),
]


@pytest.mark.parametrize(
    ("kwargs", "error", "name"), BACKOFF_ARGS_BAD, ids=[kwargs_id(k) for k, _, _ in BACKOFF_ARGS_BAD]
)
def test_backoff_rejects_bad_arguments(kwargs: dict[str, Any], error: type[Exception], name: str) -> None:
    arguments: dict[str, Any] = {"min_delay_ms": 1000, "max_delay_ms": 60_000, **kwargs}
    with pytest.raises(error, match=name):
        MultiplierRedeliveryBackoff(**arguments)


def test_backoff_good_arguments() -> None:
    numbers: list[Any] = [np.int64(100), np.uint32(1000), np.float32(2), np.int8(0), np.int64(3)]
    b = MultiplierRedeliveryBackoff(*numbers[:3], jitter_percent=numbers[3])
    assert (b.min_delay_ms, b.max_delay_ms, b.multiplier) == (100, 1000, 2.0)
    assert type(b.min_delay_ms) is int and type(b.max_delay_ms) is int
    assert MultiplierRedeliveryBackoff(0, 0).next(50) == 0
    assert MultiplierRedeliveryBackoff(5, 5, 1).next(10**9) == 5
    assert MultiplierRedeliveryBackoff(1, 2**63 - 1, 1e308).next(1) == 2**63 - 1
    assert MultiplierRedeliveryBackoff(1, 10, jitter_percent=100, seed=numbers[4]).seed == 3


@pytest.mark.parametrize("count", [1.5, "3", None, True, NAN], ids=ids)
def test_backoff_next_rejects_a_bad_redelivery_count(count: Any) -> None:
    with pytest.raises(TypeError, match="redelivery_count"):
        MultiplierRedeliveryBackoff(100, 1000).next(count)


def test_backoff_next_takes_numpy_counts() -> None:
    b = MultiplierRedeliveryBackoff(100, 1000)
    assert b.next(np.int64(2)) == b.next(2) == 400 and b.next(np.uint8(0)) == 100  # type: ignore[arg-type]


BACKOFF_CONFIGS = [
    (1000, 600_000, 2.0),  # Go's default policy's numbers (which goes negative for counts 34-54)
    (1, 2**63 - 1, 2.0),
    (1, 2**63 - 1, 1e308),
    (7, 2**63 - 1, 1.0000001),
    (3, 2**53 + 1, 3.0),
    (100, 100, 5.0),
    (0, 2**40, 2.0),
    (1000, 3_600_000, 1.0),
    (999, 1000, 1.0005),
]


@pytest.mark.parametrize(("low", "high", "multiplier"), BACKOFF_CONFIGS, ids=str)
def test_backoff_is_monotone_bounded_and_finite_for_counts_0_to_200(
    low: int, high: int, multiplier: float
) -> None:
    backoff = MultiplierRedeliveryBackoff(low, high, multiplier)
    delays = [backoff.next(n) for n in range(201)]
    assert all(type(d) is int for d in delays)
    assert all(low <= d <= high for d in delays), [d for d in delays if not low <= d <= high][:3]
    assert all(a <= b for a, b in itertools.pairwise(delays)), "non-decreasing"
    assert delays[-1] <= backoff.next(10**100) == (high if multiplier > 1 and low else low)
    assert backoff_delay(backoff, 200, NAME) == float(delays[-1])


def test_backoff_jitter_is_off_by_default() -> None:
    b = MultiplierRedeliveryBackoff(1000, 600_000)
    assert b.jitter_percent == 0.0
    assert {b.next(3) for _ in range(100)} == {8000}


@pytest.mark.parametrize("percent", [1, 10, 50, 100])
def test_backoff_jitter_is_plus_minus_half_the_percent(percent: float) -> None:
    """PIP-468's shape: delay · U[1 - p/200, 1 + p/200), on every call, the first included."""
    b = MultiplierRedeliveryBackoff(1000, 600_000, jitter_percent=percent, seed=42)
    plain = MultiplierRedeliveryBackoff(1000, 600_000)
    for count in (0, 1, 5, 50):
        base = plain.next(count)
        samples = [b.next(count) for _ in range(2000)]
        low, high = base * (1 - percent / 200), base * (1 + percent / 200)
        assert all(low - 0.5 <= s <= high + 0.5 for s in samples)
        assert min(samples) < base < max(samples), "both sides of the delay"
        assert min(samples) <= low + (high - low) * 0.05 and max(samples) >= high - (high - low) * 0.05
        assert abs(sum(samples) / len(samples) - base) < (high - low) * 0.05, "centered on the delay"


def test_backoff_jitter_is_deterministic_with_a_seed() -> None:
    def series(seed: int) -> list[int]:
        b = MultiplierRedeliveryBackoff(100, 10_000, jitter_percent=20, seed=seed)
        return [b.next(n % 10) for n in range(50)]

    assert series(7) == series(7)
    assert series(7) != series(8)
