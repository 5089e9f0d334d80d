"""pulsar_nack.lateness: the fixed-size lateness histogram and the sample of exact due times."""

from __future__ import annotations

import random

import numpy as np
import pytest
from fake_clock import FakeClock

from pulsar_nack.lateness import MAX_EVERY, DueSample, LatenessHistogram, offered


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
    epoch_ms = 1_795_000_000_000  # due times are kept modulo 2**32 ms and read back near a given time
    sample.note(12345, epoch_ms + 1_000)
    sample.note(12345, epoch_ms + 900)  # a re-nack due sooner: kept
    sample.note(12345, epoch_ms + 5_000)  # later: the earlier stays
    assert sample.take(12345, epoch_ms + 1_024) == (epoch_ms + 900, 1)
    assert sample.take(12345, epoch_ms) is None, "taken once"
    assert sample.take(999, epoch_ms) is None


def test_a_full_sample_is_thinned_evenly_over_a_burst_and_fills_again_once_emptied() -> None:
    """A burst of 2,000 nacks due 1 ms apart into 64 slots: the sample keeps due times from the whole
    burst (not its first 64), each passing the offer test, and offers fewer nacks from then on; as the
    sampled ids are taken it offers more again."""
    sample = DueSample(capacity=64)
    for key in range(2_000):
        due = 10_000 + key
        if not sample.every or offered(due, sample.every):  # as the nack path offers them
            sample.note(key, due)
    kept = [key for key in range(2_000) if sample.take(key, 10_000) is not None]
    assert 16 <= len(kept) <= 64
    assert min(kept) < 500 and max(kept) > 1_500, "spread over the burst"
    assert sample.used == 0 and sample.every < MAX_EVERY
    while sample.every:
        sample.note(5, 1_000)
        sample.take(5, 1_000)
    assert sample.every == 0


def test_a_thinned_sample_does_not_pick_due_times_by_their_offset_in_a_bucket() -> None:
    """With ceil rounding a due time's offset in its 2^k-ms bucket is how late it comes back: the offer
    test must not favour any offset. At every thinning rate, the offsets (k = 8) of the due times offered
    out of 100,000 consecutive ones average the bucket's middle, and cover it (the old test,
    ``due & every == 0``, offered only offset 0 at ``every`` = 255)."""
    dues = range(1_000_000, 1_100_000)
    every = 1
    while every <= MAX_EVERY:
        offsets = [-due % 256 for due in dues if offered(due, every)]
        assert len(offsets) > 100_000 / (every + 1) / 2, every
        assert abs(np.mean(offsets) - 127.5) < 10, (every, np.mean(offsets))
        assert len(set(offsets)) == 256, every
        every = every << 1 | 1


def test_an_overdue_sampled_id_gives_way() -> None:
    """An id sampled but never forwarded (acked meanwhile) does not hold its slot for ever."""
    sample = DueSample(capacity=4, horizon_ms=60_000)
    for key in range(100):
        sample.note(key, 1_000)
    assert sample.used > 0
    sample.note(1_000, 70_000)  # 69 s after them: one of its slots gives way, if taken
    taken = sample.take(1_000, 70_000)
    assert taken is not None and taken[0] == 70_000


def test_a_thinned_sample_weighs_each_redelivery_by_the_nacks_it_stands_for() -> None:
    """Issue 24: the sample is thinned, and more offered nacks find no room, while many nacks are
    pending: the busy part of a run, whose redeliveries are the late ones. A quiet phase (3,000 nacks,
    one pending at a time, 0–50 ms late), a burst of 20,000 nacks pending at once (200–400 ms late: the
    512 slots thin to 1 in 64) and a quiet phase again, filed and received as the nack path and the
    arrival filter do, on a fake clock. The reported p50 and p99 are those of every redelivery, not the
    quiet phases': unweighted the p50 read 25 ms where every redelivery's is 270 ms."""
    clock = FakeClock()
    rng = random.Random(24)
    sample = DueSample()
    histogram = LatenessHistogram()
    measured: list[float] = []
    thinned = [0]
    next_key = iter(range(1, 1_000_000))

    def run(nacks: int, late_from: float, late_to: float) -> None:
        filed = []
        for _ in range(nacks):
            key = next(next_key)
            due = int(clock()) + rng.randint(100, 10_000)
            if not sample.every or offered(due, sample.every):  # the nack path's offer test
                sample.note(key, due)
            thinned.append(sample.every)
            filed.append((due + rng.uniform(late_from, late_to), due, key))
        for arrival, due, key in sorted(filed):
            clock.now = arrival
            measured.append(clock() - due)
            sampled = sample.take(key, clock())
            if sampled is not None:
                histogram.add(clock() - sampled[0], sampled[1])

    for _ in range(3_000):
        run(1, 0, 50)
    run(20_000, 200, 400)
    assert max(thinned) >= 31, "the burst thins the sample"
    for _ in range(3_000):
        run(1, 0, 50)
    assert sample.every == 0 and sample.used == 0
    assert len(histogram) < 7_000, "a sample, not every redelivery"
    reported = histogram.percentiles([0.5, 0.99])
    assert reported is not None
    wanted = np.percentile(measured, [50, 99])
    assert reported[0] == pytest.approx(wanted[0], rel=0.05), (reported, wanted)
    assert reported[1] == pytest.approx(wanted[1], rel=0.02), (reported, wanted)


def test_a_thinning_reweighs_the_ids_it_keeps() -> None:
    """An id noted while every nack was offered (weight 1) that survives a thinning to 1 in 4 weighs 4:
    it passed that offer test too."""
    sample = DueSample(capacity=8)
    for key in range(100):
        due = 1_000 + key
        if not sample.every or offered(due, sample.every):
            sample.note(key, due)
    every = sample.every
    assert every > 0
    kept = [got for key in range(100) if (got := sample.take(key, 1_000)) is not None]
    assert kept and all(weight == every + 1 for _, weight in kept), (every, kept)


@pytest.mark.parametrize("nacks", [3_000, 20_000])
def test_the_weights_of_a_burst_sum_to_its_nacks(nacks: int) -> None:
    """Thinned, and with offered nacks that found both their slots taken (counted in an id that took
    one), the sampled ids of a burst stand for all of its nacks: their weights sum to the burst's size
    (within 15 %: a sample; without counting the nacks that found no room, 58–62 %)."""
    rng = random.Random(nacks)
    sample = DueSample()
    filed = []
    for _ in range(nacks):
        key, due = rng.getrandbits(64), 1_000_000 + rng.randint(100, 10_000)
        if not sample.every or offered(due, sample.every):
            sample.note(key, due)
        filed.append((due, key))
    assert sample.every > 0
    weights = [sampled[1] for due, key in sorted(filed) if (sampled := sample.take(key, due)) is not None]
    assert len(weights) < nacks / 4
    assert sum(weights) == pytest.approx(nacks, rel=0.15), (sum(weights), len(weights))
