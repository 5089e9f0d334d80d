"""ArrivalFilter with an ack timeout (``expect_ack_timeout``), without a broker: a copy of a message the
application has held for the timeout is the native tracker's redelivery and is handed out again, once per
timeout; any sooner copy stays a duplicate; pending and acked messages are not affected. (Against real
brokers, beside the official consumer: tests/test_ack_timeout.py.)"""

from __future__ import annotations

import pytest
from fake_clock import FakeClock

from pulsar_nack.arrivals import ACK_TIMEOUT_SLACK_MS, ArrivalFilter, Verdict
from pulsar_nack.native import NATIVE_MIN_DELAY_MS

TIMEOUT_MS = 10_000
D, H = Verdict.DELIVER, Verdict.DUPLICATE



def make(timeout_ms: int | None = TIMEOUT_MS) -> tuple[ArrivalFilter, FakeClock]:
    clock = FakeClock()
    arrivals = ArrivalFilter(lambda *ids: None, clock=clock, linger_ms=30_000)
    arrivals.expect_ack_timeout(timeout_ms)
    return arrivals, clock


def copies(arrivals: ArrivalFilter, indexes: range | list[int]) -> list[Verdict]:
    """A copy of each of these messages of entry 1 (a batch of 4)."""
    return [arrivals.admit(7, 1, index, "t", 4) for index in indexes]


def test_held_batch_messages_come_back_once_at_each_timeout() -> None:
    arrivals, clock = make()
    assert copies(arrivals, range(4)) == [D] * 4
    clock.now += 5_000  # a copy of the whole entry for another reason (a sibling's nack, a reconnect)
    assert copies(arrivals, range(4)) == [H] * 4
    clock.now += TIMEOUT_MS - 5_000 - ACK_TIMEOUT_SLACK_MS  # the timeout's copy, as early as allowed
    assert copies(arrivals, range(4)) == [D] * 4, "every held message once at the timeout"
    assert copies(arrivals, range(4)) == [H] * 4, "and once only"
    clock.now += TIMEOUT_MS - ACK_TIMEOUT_SLACK_MS - 1
    assert copies(arrivals, range(4)) == [H] * 4, "sooner than the next timeout: duplicates"
    clock.now += 1
    assert copies(arrivals, [2, 0, 3, 1]) == [D] * 4, "the next timeout, in any order"


def test_acked_and_pending_messages_are_not_handed_out_at_a_timeout() -> None:
    """Message 0 acked, 1 nacked (pending), 2 and 3 held: only 2 and 3 come back at the timeout."""
    arrivals, clock = make()
    assert copies(arrivals, range(4)) == [D] * 4
    arrivals.acked(7, 1, 0, "t")
    assert arrivals.pending(7, 1, 1, "t") is not None
    clock.now += TIMEOUT_MS
    verdicts = copies(arrivals, range(4))
    assert verdicts[0] in (Verdict.ACKED, Verdict.COVERED) and verdicts[1] is Verdict.HOLD
    assert verdicts[2:] == [D, D]
    assert copies(arrivals, [2, 3]) == [H, H]


def test_a_message_of_an_entry_handed_out_in_parts_comes_with_the_entry() -> None:
    """The native tracker times an entry from its first receive and redelivers it whole: a message of it
    handed out later (its nack came back) comes back with the rest at the entry's timeout, as the official
    consumer hands out every unacked message of a redelivered entry."""
    arrivals, clock = make()
    assert copies(arrivals, [0, 1, 2]) == [D] * 3
    assert arrivals.pending(7, 1, 3, "t") is not None
    assert copies(arrivals, [3]) == [Verdict.HOLD]
    clock.now += 2_000
    arrivals.forwarded("t", 7, [1], {1: (3,)}, clock.now, int(clock.now))
    clock.now += NATIVE_MIN_DELAY_MS
    assert copies(arrivals, range(4)) == [H, H, H, D], "the nack's copy: only the nacked message"
    clock.now += TIMEOUT_MS - 2_000 - NATIVE_MIN_DELAY_MS
    assert copies(arrivals, range(4)) == [D] * 4


def test_without_an_ack_timeout_a_held_message_is_never_handed_out_twice() -> None:
    for timeout in (None, 0):
        arrivals, clock = make(timeout)
        assert copies(arrivals, range(4)) == [D] * 4
        for _ in range(3):
            clock.now += TIMEOUT_MS
            assert copies(arrivals, range(4)) == [H] * 4


def test_a_redelivered_non_batched_message_held_comes_back_at_the_timeout() -> None:
    """A non-batched message handed out for its nack's forward, then held: a copy sooner than the timeout
    is a duplicate (a repeated forward, a reconnect), the timeout's copy is handed out, once."""
    arrivals, clock = make()
    assert arrivals.admit_entry(7, 5, "t") is D
    assert arrivals.pending(7, 5, -1, "t") is not None
    assert arrivals.admit_entry(7, 5, "t") is Verdict.HOLD
    arrivals.forwarded("t", 7, [5], {}, clock.now, int(clock.now))
    clock.now += NATIVE_MIN_DELAY_MS
    assert arrivals.admit_entry(7, 5, "t") is D, "back for its nack"
    clock.now += 3_000
    assert arrivals.admit_entry(7, 5, "t") is H
    clock.now += TIMEOUT_MS - 3_000 - ACK_TIMEOUT_SLACK_MS
    assert arrivals.admit_entry(7, 5, "t") is D, "the timeout's copy"
    assert arrivals.admit_entry(7, 5, "t") is H
    arrivals.acked_entry(7, 5, "t")
    clock.now += TIMEOUT_MS
    assert arrivals.admit_entry(7, 5, "t") is Verdict.ACKED


@pytest.mark.parametrize("bad", [-1, float("nan")])
def test_a_bad_timeout_is_refused(bad: float) -> None:
    arrivals, _ = make()
    with pytest.raises(ValueError, match="timeout_ms"):
        arrivals.expect_ack_timeout(bad)
