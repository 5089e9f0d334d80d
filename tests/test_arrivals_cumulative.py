"""ArrivalFilter.acked_cumulative without a broker: a cumulative ack settles every pending nack, forward and
batch record of its topic up to the acked message, and nothing after it or of another topic. (Against
Apache Pulsar, beside the official consumer: tests/test_cumulative_ack.py.)"""

from __future__ import annotations

from fake_clock import FakeClock

from pulsar_nack.arrivals import ArrivalFilter, Verdict
from pulsar_nack.index import TimeBucketIndex
from pulsar_nack.native import NATIVE_MIN_DELAY_MS

LINGER_MS = 1_000
DUE = 60_000



class Setup:
    """A filter on a real index, wired as the tracker wires them."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.index = TimeBucketIndex(0, "floor")
        self.refiled: list[tuple[float, int, int, int, str]] = []
        self.arrivals = ArrivalFilter(
            lambda *ids: self.refiled.append(ids),
            clock=self.clock,
            linger_ms=LINGER_MS,
            index=self.index,
        )

    def nack(self, ledger: int, entry: int, index: int = -1, topic: str = "t") -> None:
        assert self.arrivals.file(int(self.clock.now) + DUE, ledger, entry, index, topic) is not None

    def pending(self, ledger: int, entry: int, index: int = -1, topic: str = "t") -> bool:
        return self.index.due_of(ledger, entry, index, topic) is not None


def test_pending_whole_entries_up_to_the_position_are_dropped() -> None:
    s = Setup()
    for ledger in (6, 7, 8):
        for entry in range(1, 11):
            s.nack(ledger, entry)
    s.nack(6, 3, topic="other")
    assert s.arrivals.acked_cumulative(7, 5, -1, "t") == 10 + 5
    assert [e for e in range(1, 11) if s.pending(6, e)] == []
    assert [e for e in range(1, 11) if s.pending(7, e)] == [6, 7, 8, 9, 10]
    assert [e for e in range(1, 11) if s.pending(8, e)] == list(range(1, 11))
    assert s.pending(6, 3, topic="other"), "another topic's nack stays"
    assert len(s.index) == 5 + 10 + 1
    # the arrival filter agrees: a copy of a settled entry is a first delivery (no nack holds it back)
    assert s.arrivals.admit_entry(7, 5, "t") is Verdict.DELIVER
    assert s.arrivals.admit_entry(7, 6, "t") is Verdict.HOLD


def test_batched_entries_up_to_the_acked_message_are_settled() -> None:
    """Batches of 4 in entries 1-3: nacks of (1,0), (2,1), (2,3), (3,2); the app holds the rest. A
    cumulative ack of (2,1) drops the nacks of (1,0) and (2,1); (2,3) and (3,2) stay pending."""
    s = Setup()
    for entry in (1, 2, 3):
        for index in range(4):
            assert s.arrivals.admit(7, entry, index, "t", 4) is Verdict.DELIVER
    for entry, index in ((1, 0), (2, 1), (2, 3), (3, 2)):
        s.nack(7, entry, index)
    assert s.arrivals.acked_cumulative(7, 2, 1, "t") == 2
    assert not s.pending(7, 1, 0) and not s.pending(7, 2, 1)
    assert s.pending(7, 2, 3) and s.pending(7, 3, 2)
    # entry 2: 0 and 1 acked, 2 held, 3 pending; entry 3 as it was
    assert s.arrivals.admit(7, 2, 0, "t", 4) in (Verdict.ACKED, Verdict.COVERED)
    assert s.arrivals.admit(7, 2, 2, "t", 4) is Verdict.DUPLICATE
    assert s.arrivals.admit(7, 2, 3, "t", 4) is Verdict.HOLD
    assert s.arrivals.admit(7, 3, 0, "t", 4) is Verdict.DUPLICATE
    assert s.arrivals.counts().open_entries == 2, "entry 1 settled and gone"
    # acking the rest of entry 2 and entry 3 one by one leaves nothing
    for entry, index in ((2, 2), (2, 3), (3, 0), (3, 1), (3, 2), (3, 3)):
        s.arrivals.acked(7, entry, index, "t")
    assert s.arrivals.idle and len(s.index) == 0


def test_quiet_entries_up_to_the_position_are_dropped() -> None:
    """PIP-393's case: one message of each batch nacked, the others acked (each entry kept as one bit)."""
    s = Setup()
    for entry in range(1, 6):
        for index in range(4):
            s.arrivals.admit(7, entry, index, "t", 4)
        s.nack(7, entry, 0)
        for index in (1, 2, 3):
            s.arrivals.acked(7, entry, index, "t")
    assert s.arrivals.counts().open_entries == 5
    assert s.arrivals.acked_cumulative(7, 3, 3, "t") == 3
    assert [e for e in range(1, 6) if s.pending(7, e, 0)] == [4, 5]
    assert s.arrivals.counts().open_entries == 2


def test_forwards_up_to_the_position_are_not_repeated() -> None:
    """Forwarded (a non-batched entry and a batch message) and cumulatively acked before their copy came:
    no copy will come, and no forward is repeated or abandoned for them."""
    s = Setup()
    assert s.arrivals.admit_entry(7, 1, "t") is Verdict.DELIVER
    for index in range(4):
        s.arrivals.admit(7, 2, index, "t", 4)
    s.arrivals.admit_entry(7, 9, "t")
    s.nack(7, 1)
    s.nack(7, 2, 1)
    s.nack(7, 9)
    target = int(s.clock.now)
    s.arrivals.forwarded("t", 7, [1, 9], {}, s.clock.now, target)
    s.arrivals.forwarded("t", 7, [2], {2: (1,)}, s.clock.now, target)
    assert s.arrivals.counts().in_flight == 3
    s.arrivals.acked_cumulative(7, 2, 3, "t")
    s.clock.now += LINGER_MS + NATIVE_MIN_DELAY_MS
    again = s.arrivals.sweep()
    assert [(e[1], e[2]) for e in again] == [(7, 9)], "only the forward past the position is repeated"
    assert s.arrivals.counts().abandoned == 0


def test_nothing_after_the_position_or_of_another_topic_changes() -> None:
    s = Setup()
    for entry in range(5, 8):
        for index in range(3):
            s.arrivals.admit(7, entry, index, "t", 3)
            s.arrivals.admit(7, entry, index, "u", 3)
        s.nack(7, entry, 1)
        s.nack(7, entry, 1, topic="u")
    before = s.arrivals.counts()
    assert s.arrivals.acked_cumulative(7, 4, 2, "t") == 0
    assert s.arrivals.acked_cumulative(6, 100, -1, "t") == 0
    assert s.arrivals.counts() == before
    assert s.arrivals.acked_cumulative(7, 7, 2, "u") == 3
    assert len(s.index) == 3 and all(s.pending(7, e, 1) for e in range(5, 8))
