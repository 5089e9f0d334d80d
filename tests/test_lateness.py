"""pulsar_nack.lateness: the fixed-size lateness histogram and the sample of exact due times."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pulsar_nack.lateness import MAX_EVERY, DueSample, LatenessHistogram


def test_percentiles_agree_with_numpy_within_the_bucket_precision() -> None:
    """Late values to 1 h and early ones (floor rounding): each percentile within 0.8 % of its value
    (half a bucket: 64 sub-buckets a power of two; early ones 3.2 %: 16) plus 1 ms of numpy's."""
    rng = random.Random(7)
    values = [rng.uniform(0, 300) + rng.expovariate(1 / 20) for _ in range(3_000)]
    values += [-rng.uniform(0, 255) for _ in range(400)] + [rng.uniform(10_000, 3_600_000) for _ in range(50)]
    histogram = LatenessHistogram(window=10_000)
    for value in values:
        histogram.add(value)
    quantiles = [0.0, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 1.0]
    reported = histogram.percentiles(quantiles)
    assert reported is not None
    wanted = np.percentile(values, [100 * q for q in quantiles])
    for quantile, got, want in zip(quantiles, reported, wanted, strict=True):
        assert got == pytest.approx(want, rel=0.008 if want >= 0 else 0.032, abs=1.0), quantile
    assert histogram.early_share == pytest.approx(400 / len(values))
    assert len(histogram) == len(values)


def test_nothing_before_the_first_redelivery() -> None:
    histogram = LatenessHistogram()
    assert histogram.percentiles([0.5]) is None and histogram.early_share is None and len(histogram) == 0


def test_old_redeliveries_fade_and_the_size_stays_fixed() -> None:
    """Counts halve at 2 × window: after a shift from ~10 ms to ~500 ms lateness the median follows;
    the histogram's bytes do not grow with the samples."""
    histogram = LatenessHistogram(window=1_000)
    histogram.add(10.0)
    size = histogram.nbytes
    for _ in range(5_000):
        histogram.add(10.0)
    for _ in range(3_000):
        histogram.add(500.0)
    reported = histogram.percentiles([0.5])
    assert reported is not None and reported[0] == pytest.approx(500, rel=0.01)
    assert len(histogram) < 2_000
    assert histogram.nbytes == size < 8_192


def test_a_sampled_due_time_is_taken_once_and_the_earlier_of_two_kept() -> None:
    sample = DueSample(capacity=8)
    sample.note(12345, 1_000.0)
    sample.note(12345, 900.0)  # a re-nack due sooner: kept
    sample.note(12345, 5_000.0)  # later: the earlier stays
    assert sample.take(12345) == 900.0
    assert sample.take(12345) is None, "taken once"
    assert sample.take(999) is None


def test_a_full_sample_offers_fewer_nacks_and_more_again_once_emptied() -> None:
    """Every key taken by another id: ``every`` grows (a sparser sample, one bit test a nack); as the
    sampled ids are forwarded it shrinks back to 0 (every nack sampled)."""
    sample = DueSample(capacity=8)
    kept = []
    for key in range(64):
        before = sample.used
        sample.note(key, 1_000.0 + key)
        if sample.used > before:
            kept.append(key)
    assert sample.used == len(kept) == 8
    assert 0 < sample.every <= MAX_EVERY
    for key in kept:
        assert sample.take(key) == 1_000.0 + key
    assert sample.used == 0 and sample.every == 0


def test_an_overdue_sampled_id_gives_way() -> None:
    """An id sampled but never forwarded (acked meanwhile) does not hold its slot for ever."""
    sample = DueSample(capacity=4, horizon_ms=60_000)
    for key in range(100):
        sample.note(key, 1_000.0)
    assert sample.used == 4
    newcomer = 1_000
    sample.note(newcomer, 2_000.0)  # its slots hold ids due 1 s before: kept
    assert sample.take(newcomer) is None
    sample.note(newcomer, 70_000.0)  # 69 s after them: one gives way
    assert sample.take(newcomer) == 70_000.0
