"""Fast mode (issue 28, direction b): while nothing is nacked, a consumer hands messages out without
reading their ids; the first nack after such a period takes the messages the application holds over, and
the filter infers every other message of their entries to be acked or not received yet.

The boundary, on both brokers and side by side with the official consumer: acks made before the first
nack still keep acked batch siblings from being handed out again; siblings still in the receiver queue at
that nack are handed out (their redelivery count says they are first deliveries). Without a broker: the
filter's side of it (ArrivalFilter.infer, first_copy, unwatch_arrivals).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pulsar
from fake_clock import FakeClock
from messaging import leftover, produce_bursts, receive_all, subscribe_fast

from pulsar_nack import Client
from pulsar_nack.arrivals import ArrivalFilter, Verdict
from pulsar_nack.index import TimeBucketIndex

SUB = "fast"
SHARED = pulsar.ConsumerType.Shared


def _collect(consumer: Any, idle_s: float = 1.5, limit_s: float = 15.0) -> Counter[bytes]:
    """Payloads handed out (each acked) until none came for ``idle_s``."""
    got: Counter[bytes] = Counter()
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            message = consumer.receive(int(idle_s * 1000))
        except pulsar.Timeout:
            break
        got[message.data()] += 1
        consumer.acknowledge(message)
    return got


def test_first_nack_after_a_quiet_period_hands_out_no_acked_sibling(
    nack_client: Client, pulsar_client: Any, unique_topic: str
) -> None:
    """Three batches of 10 received while nothing is nacked (the wrapper in fast mode); m3, m13, m23 are
    held, every other message acked, then the three are nacked. The official consumer hands the acked
    siblings out again with them; the wrapper hands out the three once each and nothing else, and leaves
    nothing unacked at the broker."""
    nacked = {b"m3", b"m13", b"m23"}
    results: dict[str, dict[str, Any]] = {}
    for name, client in (("official", pulsar_client), ("wrapper", nack_client)):
        topic = f"{unique_topic}-{name}"
        consumer = subscribe_fast(
            client, topic, SUB, consumer_type=SHARED, negative_ack_redelivery_delay_ms=100
        )
        produce_bursts(client, topic, 30, batch_size=10)
        first = {m.data(): m for m in receive_all(consumer, 30)}
        fast = getattr(getattr(consumer, "_nacks", None), "fast", None)
        for payload, message in first.items():
            if payload not in nacked:
                consumer.acknowledge(message)
        for payload in sorted(nacked):
            consumer.negative_acknowledge(first[payload])
        again = _collect(consumer)
        takeovers = getattr(getattr(consumer, "_nacks", None), "fast_takeovers", None)
        consumer.close()
        results[name] = {
            "again": again,
            "fast": fast,
            "takeovers": takeovers,
            "leftover": leftover(pulsar_client, topic, SUB),
        }
    official, wrapper = results["official"], results["wrapper"]
    assert set(official["again"]) > nacked, f"premise: the official consumer hands siblings out {official}"
    assert wrapper["fast"] is True and wrapper["takeovers"] == 1, f"fast mode, ended by the nacks: {wrapper}"
    assert wrapper["again"] == Counter(dict.fromkeys(nacked, 1)), f"wrapper {wrapper}, official {official}"
    assert wrapper["leftover"] == [] and official["leftover"] == [], results


def test_siblings_still_queued_at_the_first_nack_are_handed_out(
    nack_client: Client, pulsar_client: Any, unique_topic: str
) -> None:
    """Two batches of 10; the wrapper receives m0..m3 only (the rest waits in its receiver queue), acks
    m0..m2 and nacks m3: m4..m19 have never reached the application, and are inferred to be acked or
    queued. Each of m3..m19 must be handed out exactly once (m4..m9 from the queue, though the entry also
    comes back for m3), m0..m2 never again, nothing left unacked."""
    consumer = subscribe_fast(
        nack_client, unique_topic, SUB, consumer_type=SHARED, negative_ack_redelivery_delay_ms=100
    )
    produce_bursts(nack_client, unique_topic, 20, batch_size=10)
    first = [consumer.receive(10_000) for _ in range(4)]
    assert sorted(m.data() for m in first) == [b"m0", b"m1", b"m2", b"m3"], "premise: in order"
    assert consumer._nacks.fast, "handed out in fast mode"
    for message in first[:3]:
        consumer.acknowledge(message)
    consumer.negative_acknowledge(first[3], delay_ms=0)
    again = _collect(consumer)
    consumer.close()
    expected = Counter({f"m{i}".encode(): 1 for i in range(3, 20)})
    assert again == expected, f"extra: {again - expected}, missing: {expected - again}"
    assert leftover(pulsar_client, unique_topic, SUB) == []


def test_a_nack_after_a_redelivery_of_everything_unacked_hands_out_only_the_nacked_message(
    nack_client: Client, pulsar_client: Any, unique_topic: str
) -> None:
    """The broker sending unacked messages again while nothing is nacked (as after a reconnect; here
    ``redeliver_unacknowledged_messages()``): two batches of 10, m0..m14 acked, then the redelivery. In
    fast mode the wrapper hands out what the official consumer hands out (no more); then every copy but
    m17's is acked and m17 nacked: the wrapper hands m17 out once and nothing else, nothing left unacked."""
    results: dict[str, dict[str, Any]] = {}
    for name, client in (("official", pulsar_client), ("wrapper", nack_client)):
        topic = f"{unique_topic}-{name}"
        consumer = subscribe_fast(
            client, topic, SUB, consumer_type=SHARED, negative_ack_redelivery_delay_ms=100
        )
        produce_bursts(client, topic, 20, batch_size=10)
        first = {m.data(): m for m in receive_all(consumer, 20)}
        for i in range(15):
            consumer.acknowledge(first[f"m{i}".encode()])
        time.sleep(0.3)  # the acks reach the broker (grouped for 100 ms)
        consumer.redeliver_unacknowledged_messages()
        copies: dict[bytes, Any] = {}
        again: Counter[bytes] = Counter()
        while True:
            try:
                message = consumer.receive(1500)
            except pulsar.Timeout:
                break
            again[message.data()] += 1
            if message.data() == b"m17" and b"m17" not in copies:
                copies[b"m17"] = message
            else:
                consumer.acknowledge(message)
        for payload in (f"m{i}".encode() for i in range(15, 20)):
            if payload != b"m17":
                consumer.acknowledge(first[payload])
        consumer.negative_acknowledge(copies[b"m17"])
        after = _collect(consumer)
        consumer.acknowledge(first[b"m17"])
        consumer.close()
        results[name] = {"again": again, "after": after, "leftover": leftover(pulsar_client, topic, SUB)}
    official, wrapper = results["official"], results["wrapper"]
    assert set(wrapper["again"]) <= set(official["again"]) and b"m17" in wrapper["again"], results
    assert wrapper["after"] == Counter({b"m17": 1}), f"wrapper {wrapper}, official {official}"
    assert wrapper["leftover"] == [], results


# -- the filter's side, without a broker -------------------------------------------------------------


def _filter() -> tuple[ArrivalFilter, FakeClock]:
    clock = FakeClock()
    index = TimeBucketIndex(8)
    arrivals = ArrivalFilter(
        lambda *ids: None,
        clock=clock,
        batch_size=int,
        index=index,
        linger_ms=1_000,
    )
    return arrivals, clock


KEY = ("t", 7, 1)


def test_inferred_acks_drop_redelivered_copies_and_let_first_ones_through() -> None:
    """A batch of 10 taken over with m3 held: the redelivered copies of the others are dropped as acked;
    a first copy of one of them (still queued at the take-over) is handed out once, then is the
    application's (a later copy of it is a duplicate)."""
    arrivals, clock = _filter()
    arrivals.infer(KEY, 10, 1 << 3)
    assert arrivals.inferred == {KEY: 0b1111110111}
    arrivals.file(int(clock.now) + 10, 7, 1, 3, "t")
    verdicts = {i: arrivals.admit(7, 1, i, "t", 10) for i in range(10) if i != 3}
    assert set(verdicts.values()) == {Verdict.ACKED}, verdicts
    assert arrivals.first_copy(KEY, 5), "m5 was queued: its first copy is handed out"
    assert not arrivals.first_copy(KEY, 5), "once"
    assert arrivals.admit(7, 1, 5, "t", 10) is Verdict.DUPLICATE
    assert not arrivals.first_copy(KEY, 3), "m3 was held, never inferred"


def test_messages_seen_handed_out_are_acked_for_certain() -> None:
    """A batch of 10 taken over with m3 held and m0..m6 among the last messages handed out (seen): m0..m6
    but m3 were acked, not inferred — a copy of one is dropped even with redelivery count 0 (a broker
    restart re-sends with count 0); m7..m9 were still queued, and m4 comes as their first copy would."""
    arrivals, clock = _filter()
    arrivals.infer(KEY, 10, 1 << 3, queued=0b1110000000, seen=0b0001111111)
    assert arrivals.inferred == {}
    arrivals.file(int(clock.now) + 10, 7, 1, 3, "t")
    assert arrivals.admit(7, 1, 4, "t", 10) is Verdict.ACKED
    assert not arrivals.first_copy(KEY, 4), "m4 was handed out and acked: its copy is not a first"
    assert arrivals.admit(7, 1, 8, "t", 10) is Verdict.DELIVER, "m8 was queued"


def test_an_entry_with_inferred_acks_is_never_kept_as_one_bit() -> None:
    """m3 held and nacked, every other message inferred: all acked or pending, which would make the entry
    quiet (one bit, its acks taken as real) — then a queued sibling's first copy would be dropped."""
    arrivals, clock = _filter()
    arrivals.infer(KEY, 10, 1 << 3)
    arrivals.file(int(clock.now) + 10, 7, 1, 3, "t")
    assert arrivals.counts().open_entries == 1 and KEY in arrivals._entries, "a record, not a bit"
    assert arrivals.admit(7, 1, 4, "t", 10) is Verdict.ACKED and arrivals.first_copy(KEY, 4)


def test_a_settled_entry_keeps_its_inferred_messages_while_it_is_settled() -> None:
    """m3 nacked, forwarded and acked: the entry settles (copies of acked messages are acked, not handed
    out). A queued sibling's first copy that comes later is still let through."""
    arrivals, clock = _filter()
    arrivals.infer(KEY, 10, 1 << 3)
    arrivals.file(int(clock.now), 7, 1, 3, "t")
    arrivals.forwarded("t", 7, [1], {1: (3,)}, clock.now, int(clock.now))
    clock.now += 200
    assert arrivals.admit(7, 1, 3, "t", 10) is Verdict.DELIVER
    arrivals.acked(7, 1, 3, "t")
    assert KEY not in arrivals._entries, "settled"
    assert arrivals.admit(7, 1, 6, "t", 10) is Verdict.ACKED
    assert arrivals.first_copy(KEY, 6), "still inferred while settled"


def test_unwatch_arrivals_marks_what_was_not_handed_out_and_settles_done_entries() -> None:
    """Fast mode begins with two followed entries: one whose handed-out messages are all acked (gone),
    one with m0 held and m1 acked (its other messages inferred). Not while anything is pending."""
    arrivals, clock = _filter()
    for i in (0, 1):
        assert arrivals.admit(7, 1, i, "t", 10) is Verdict.DELIVER
    assert arrivals.admit(7, 2, 0, "t", 10) is Verdict.DELIVER
    arrivals.acked(7, 2, 0, "t")
    arrivals.acked(7, 1, 1, "t")
    assert arrivals.unwatch_arrivals()
    assert ("t", 7, 2) not in arrivals._entries and arrivals.inferred == {KEY: 0b1111111100}
    arrivals.acked(7, 1, 0, "t")
    assert arrivals.idle, "the last held message acked: settled"
    arrivals.admit(7, 3, 0, "t", 10)
    arrivals.file(int(clock.now) + 10, 7, 3, 0, "t")
    assert not arrivals.nack_free() and not arrivals.unwatch_arrivals()


def test_messages_known_queued_at_the_take_over_are_handed_out_whatever_their_copy() -> None:
    """m0..m4 handed out last (the highest index handed out is 4), m3 held: m5..m9 are still queued, so
    any copy of one (after a reconnect the receiver queue is gone and the broker's copy may carry a
    redelivery count above 0) is handed out, once; m0..m2 and m4 are inferred acked. A second take-over
    of the entry queues inferred messages again, but no message handed out meanwhile."""
    arrivals, _ = _filter()
    queued = 0b1111100000
    arrivals.infer(KEY, 10, 1 << 3, queued)
    assert arrivals.inferred == {KEY: 0b0000010111}
    assert {arrivals.admit(7, 1, i, "t", 10) for i in range(5, 10)} == {Verdict.DELIVER}
    assert arrivals.admit(7, 1, 6, "t", 10) is Verdict.DUPLICATE, "then it is the application's"
    assert arrivals.admit(7, 1, 1, "t", 10) is Verdict.ACKED
    arrivals.infer(KEY, 10, 0, 0b1111111110)  # m1, m2, m4 inferred: queued again; m3, m5..m9 out: kept
    assert arrivals.inferred == {KEY: 0b0000000001}
    assert arrivals.admit(7, 1, 2, "t", 10) is Verdict.DELIVER
    assert arrivals.admit(7, 1, 7, "t", 10) is Verdict.DUPLICATE


def test_a_followed_entry_infers_nothing_more() -> None:
    """A message numbered in fast mode but admitted after the take-over (another receiving thread) is
    followed alone: messages of its entry not seen yet are not inferred acked."""
    arrivals, _ = _filter()
    assert arrivals.admit(7, 1, 0, "t", 10) is Verdict.DELIVER
    arrivals.infer(KEY, 10, 1 << 1)
    assert arrivals.inferred == {}
    assert arrivals.admit(7, 1, 2, "t", 10) is Verdict.DELIVER
