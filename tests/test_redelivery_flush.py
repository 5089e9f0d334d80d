"""The flush (pulsar_nack.tracker): due ids are popped bucket by bucket, each labelled with its own bucket
time — below which no copy of it is handed out, and from which its lateness is measured when its exact due
time was not sampled (pulsar_nack.lateness)."""

from __future__ import annotations

from collections.abc import Sequence

from fake_clock import FakeClock

from pulsar_nack.arrivals import Verdict
from pulsar_nack.index import DueIds
from pulsar_nack.timer import TimerWheel
from pulsar_nack.tracker import NackTracker

K = 8
WIDTH = 1 << K


def _tracker() -> tuple[NackTracker, FakeClock, list[list[tuple[int, int]]]]:
    clock = FakeClock()
    clock.now = 1_024_000.0  # a bucket boundary
    forwards: list[list[tuple[int, int]]] = []

    def record(due: Sequence[DueIds]) -> None:
        forwards.append([(d.ledger_id, e) for d in due for e in d.entry_ids.tolist()])

    tracker = NackTracker(
        record,
        precision_bits=K,
        clock=clock,
        wheel=TimerWheel(clock=clock, start=False),
        batch_size=lambda _: 10,
        compact_after_ms=1e9,
        linger_ms=1e9,
    )
    tracker.arrivals.coalesce = True  # as a consumer that keeps copies
    return tracker, clock, forwards


def test_a_bucket_filed_again_to_wait_for_a_copy_does_not_hold_back_a_later_bucket() -> None:
    """Entry 1's m0 is forwarded; its m1 falls due while m0's copy is on its way, so the filter files m1
    again for its bucket (it waits for that copy). A late flush that also covers the next bucket still
    forwards that bucket's ids (entry 2) — the bucket filed again comes first in the index, and stopping
    there held every later bucket back until the copy came (seconds, under load)."""
    tracker, clock, forwards = _tracker()
    start = clock.now
    for entry in (1, 2):
        for index in range(10):
            assert tracker.arrivals.admit(7, entry, index, "", None) is Verdict.DELIVER
    tracker.schedule(start + 500, 7, 1, 0)  # bucket start + 512
    clock.now = start + 512 - tracker.lead_ms
    tracker.flush()
    assert forwards == [[(7, 1)]], "m0 forwarded"
    tracker.schedule(start + 700, 7, 1, 1)  # bucket start + 768
    tracker.schedule(start + 1_000, 7, 2, 0)  # bucket start + 1,024
    clock.now = start + 1_024 - tracker.lead_ms + 10  # a late flush: both buckets due
    tracker.flush()
    assert forwards[1:] == [[(7, 2)]], "entry 2 forwarded; entry 1's m1 waits for m0's copy"
    assert tracker.index.due_of(7, 1, 1) is not None, "m1 still pending"


def test_each_id_is_labelled_with_its_own_bucket() -> None:
    """Ids of two buckets popped by one late flush are labelled each with its bucket time: a copy is
    handed out from its own bucket time on (with the armed bucket's, ids of a later bucket came out up to
    2^k ms early; with the flush's limit, the earlier bucket's copies were held back), and the lateness of
    those not sampled is measured from it."""
    tracker, clock, _ = _tracker()
    start = clock.now
    for entry in (1, 2):
        assert tracker.arrivals.admit(7, entry, -1, "", None) is Verdict.DELIVER
    tracker.schedule(start + 700, 7, 1)  # bucket start + 768: offset 68
    tracker.schedule(start + 1_000, 7, 2)  # bucket start + 1,024: offset 24
    tracker.arrivals.dues.clear()  # neither due time sampled (a busy consumer's)
    clock.now = start + 1_024 - 50  # late: both buckets due
    tracker.flush()
    clock.now = start + 1_024 - 50 + 100  # the copies come, 100 ms after the forward (start + 1,074)
    assert tracker.arrivals.admit(7, 1, -1, "", None) is Verdict.DELIVER
    assert tracker.arrivals.admit(7, 2, -1, "", None) is Verdict.DELIVER
    stats = tracker.stats()
    # 1,074 - 700 = 374 and 1,074 - 1,000 = 74 ms late; from their buckets 306 and 50 ms, plus either
    # offset (68, 24): 374, 330, 118 and 74, whose middle lies between 118 and 330 (labelled with the
    # flush's time, both read 0 ms after their bucket: p50 46 ms)
    assert stats.lateness_samples == 2
    assert stats.lateness_p50_ms is not None and 118 <= stats.lateness_p50_ms <= 330, stats


def test_a_late_forward_does_not_delay_the_buckets_after_it() -> None:
    """The forward of bucket B is armed one native latency before B, and those of B + 2^k, B + 2^(k+1) 2^k
    ms later. When the timer thread runs B's 60 ms late (a loaded machine: 10-150 ms measured in the
    demo), the next forward still comes at its own time, 2^k - 60 ms after the late one — that is the
    gap under 2^k ms the benchmark sees. Holding it to 2^k ms after the late one would add the timer's
    lateness to every later bucket, and the next late run's on top (the forwards drift). One forward per
    bucket, each id once."""
    tracker, clock, forwards = _tracker()
    wheel = tracker._wheel
    times: list[float] = []
    record = tracker._forward

    def timed(due: Sequence[DueIds]) -> None:
        times.append(clock.now)
        record(due)

    tracker._forward = timed
    start = clock.now
    buckets = [start + 1_024 + WIDTH * i for i in range(3)]
    for i, bucket in enumerate(buckets):
        for entry in range(3):
            tracker.schedule(bucket - 10 * entry, 7, 10 * i + entry)
    clock.now = buckets[0] - tracker.lead_ms + 60  # the timer thread comes 60 ms late
    wheel.run_due()
    while clock.now < buckets[-1]:
        clock.now += 1
        wheel.run_due()
    assert times == [
        buckets[0] - tracker.lead_ms + 60,
        buckets[1] - tracker.lead_ms,
        buckets[2] - tracker.lead_ms,
    ]
    assert sorted(e for ids in forwards for _, e in ids) == [0, 1, 2, 10, 11, 12, 20, 21, 22]


def test_a_message_waiting_for_its_entrys_copy_keeps_its_own_bucket_across_flushes() -> None:
    """Entry 1's m0 is forwarded; m1 falls due while m0's copy is on its way, and the copy takes three
    buckets to come. Each flush meanwhile makes m1 wait again (ArrivalFilter.forwarded): it stays filed at
    its own bucket — where its kept copy is handed out, and its lateness measured from — never earlier
    (ceil: not before its due time). Filing it again at each flush's limit pushed it one bucket later per
    flush (the 1 % of kept copies handed out one to six buckets late, issue 24). Its bucket being past does
    not make the timer spin: one forward timeout per bucket."""
    tracker, clock, forwards = _tracker()
    wheel = tracker._wheel
    flushes: list[float] = []
    flush = tracker.flush

    def counted(now: float | None = None, everything: bool = False) -> int:
        flushes.append(clock.now)
        return flush(now, everything)

    tracker.flush = counted  # type: ignore[method-assign]
    start = clock.now
    for index in range(10):
        assert tracker.arrivals.admit(7, 1, index, "", None) is Verdict.DELIVER
    tracker.schedule(start + 500, 7, 1, 0)  # bucket start + 512
    tracker.schedule(start + 700, 7, 1, 1)  # bucket start + 768
    clock.now = start + 300
    wheel.run_due()
    while clock.now < start + 1_500:  # m0's copy takes ~1 s: flushes at 768, 1,024 and 1,280 pass
        clock.now += 1
        wheel.run_due()
    assert forwards == [[(7, 1)]], "m0 forwarded once; m1 waits for its copy"
    assert len(flushes) <= 6, f"the timer spun: {len(flushes)} flushes"
    bucket = tracker.index.due_of(7, 1, 1)
    assert bucket == start + 768, f"m1 drifted {(bucket or 0) - (start + 768):.0f} ms past its bucket"
    # m0's copy comes with m1's: m1's is kept (the consumer hands it out at that bucket: at once)
    assert tracker.arrivals.admit(7, 1, 0, "", None) is Verdict.DELIVER
    assert tracker.arrivals.admit(7, 1, 1, "", None) is Verdict.HOLD
    assert tracker.arrivals.take_pending_message(7, 1, 1, "") is True
    assert tracker.index.next_due_ms() is None
