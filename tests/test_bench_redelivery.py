"""bench/redelivery.py's forward-gap figures (issue 24's "one forward per due bucket per entry"): two
forwards closer than 2^k ms are told apart by the application's own due times — an extra forward, before
its bucket's regular time (the defect), or one after a forward the timer ran late."""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ is a directory of scripts that import each other by name, as `python bench/x.py` lets them.
sys.path.append(str(Path(__file__).resolve().parent.parent / "bench"))

from redelivery import ForwardLog, K, NackLog, _bucket, _forward_gaps, _rank

WIDTH = 1 << K


def test_a_second_forward_for_a_bucket_already_forwarded_is_the_defect() -> None:
    """Entry (1, 5): message 0 due in bucket B, forwarded at B - 100; message 1, nacked after that
    forward with a due time in the same bucket, forwarded 60 ms later: an extra forward. Entry (1, 6):
    messages due in buckets a width apart, forwarded 180 ms apart because the first forward ran 76 ms
    late: the timer's lateness."""
    bucket = 100 * WIDTH
    nack_log: NackLog = {
        (1, 5, 0): [(bucket - 2_000.0, bucket - 10.0)],
        (1, 5, 1): [(bucket - 90.0, bucket - 5.0)],  # nacked after the first forward, same bucket
        (1, 6, 0): [(bucket - 2_000.0, bucket + 3 * WIDTH - 20.0)],
        (1, 6, 1): [(bucket - 2_000.0, bucket + 4 * WIDTH - 20.0)],
    }
    assert _bucket(bucket - 5.0) == bucket and _bucket(bucket + 4 * WIDTH - 20.0) == bucket + 4 * WIDTH
    forward_log: ForwardLog = [
        (bucket - 100.0, [(1, 5, (0,))]),  # on time (a native latency before its bucket)
        (bucket - 40.0, [(1, 5, (1,))]),  # 60 ms later, for the bucket just forwarded
        (bucket + 3 * WIDTH - 24.0, [(1, 6, (0,))]),  # 76 ms late
        (bucket + 4 * WIDTH - 100.0, [(1, 6, (1,))]),  # on time, 180 ms after it
    ]
    for entry in range(3):  # other entries' forwards, on time (the median forward's time)
        nack_log[(3, entry, 0)] = [(bucket - 2_000.0, bucket + (6 + entry) * WIDTH - 50.0)]
        forward_log.append((bucket + (6 + entry) * WIDTH - 100.0, [(3, entry, (0,))]))
    gaps = _forward_gaps(forward_log, nack_log)
    assert gaps["entry_gaps_below_bucket"] == 2
    assert gaps["entry_gaps_extra"] == 1
    assert gaps["entry_gaps_extra_min_ms"] == 60.0
    assert gaps["entry_gaps_after_a_late_one"] == 1
    assert gaps["min_entry_forward_gap_ms"] == 60.0
    # the median forward goes 100 ms before its bucket; the late one 24 ms before: 76 ms late
    assert gaps["entry_gaps_first_late_min_ms"] == 76.0
    assert gaps["forward_timer_late_max_ms"] == 76.0
    assert gaps["forwards_closer_extra"] == 1 and gaps["forwards_closer_after_a_late_one"] == 1


def test_a_nack_made_after_a_forward_counts_with_its_own_due_time() -> None:
    """A message nacked twice: a forward takes the due time of the nack before it, not a later one's. The
    first forward ran 50 ms late, the second (for the second nack, a bucket later) on time, 206 ms after
    it: the timer's lateness, not an extra forward. Three other forwards on time set the median."""
    bucket = 50 * WIDTH
    nack_log: NackLog = {(2, 1, 3): [(bucket - 500.0, bucket - 30.0), (bucket + 10.0, bucket + WIDTH - 30.0)]}
    forward_log: ForwardLog = [(bucket - 50.0, [(2, 1, (3,))]), (bucket + WIDTH - 100.0, [(2, 1, (3,))])]
    for entry in range(3):
        nack_log[(4, entry, 0)] = [(bucket - 500.0, bucket + (3 + entry) * WIDTH - 50.0)]
        forward_log.append((bucket + (3 + entry) * WIDTH - 100.0, [(4, entry, (0,))]))
    gaps = _forward_gaps(forward_log, nack_log)
    assert gaps["entry_gaps_below_bucket"] == 1
    assert gaps["entry_gaps_after_a_late_one"] == 1
    assert gaps["entry_gaps_extra"] == 0


def test_the_rank_of_a_reported_percentile_among_the_application_s_values() -> None:
    """Where nack_stats' p50 falls among the application's values: the share at or below it."""
    assert _rank([1.0, 2.0, 3.0, 4.0], 2.5) == 0.5
    assert _rank([1.0, 2.0, 3.0, 4.0], 4.0) == 1.0
    assert _rank([], 2.0) is None and _rank([1.0], None) is None
