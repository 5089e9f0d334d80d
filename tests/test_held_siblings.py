"""Held batch siblings (issue 24): per-message delays must not cost the broker more than one fixed delay.

In a batch of 10, the application nacks m0, m1 and m2 with delays of 0.3, 2.3 and 1.3 s, then m0 again
for 1 s and m1 for 0.5 s, and acks the rest. The broker redelivers whole entries, so the forward of m0
brings m1 and m2 along; the wrapper used to hold those copies back and forward m1 and m2 later, each
forward making the broker dispatch the whole entry again (5 redeliveries of the entry where the official
consumer, at one fixed delay, needs 2). Now it keeps the copies that came early (in memory, under
``max_held_chunked_bytes``) and hands them out at their due time: no forward of their own; and m0's second
redelivery, which brings m1 while m1 is still kept, leaves a copy of m1 that serves m1's second nack.

Side by side on one broker and topic (two subscriptions), on both brokers: the official consumer nacks the
same messages at a fixed delay; the wrapper, with per-message delays, must make the broker dispatch no
more messages than it does, hand every nacked message out once per nack — never before its due time —
and nothing else again, and leave every entry acked at the broker. For each way of handing messages out:
``receive``, ``batch_receive``, a ``message_listener`` and the asyncio consumer.
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from collections import defaultdict
from typing import Any

import pulsar
import pytest
from fake_clock import FakeClock
from messaging import leftover, produce_bursts, receive_into

import pulsar_nack
from pulsar_nack import aio
from pulsar_nack.arrivals import ArrivalFilter, Verdict
from pulsar_nack.index import TimeBucketIndex
from pulsar_nack.testing import Broker

BATCHES = 5
# batch index → the wrapper's per-call delay of each nack (then acked); the other messages are acked. m0's
# redelivery brings m1 and m2 (kept until due); m0's second one brings m1 again while m1 is still kept (a
# copy parked, which then serves m1's second nack)
DELAYS_MS = {0: (300, 1_000), 1: (2_300, 500), 2: (1_300,)}
FIXED_DELAY_MS = 1_300  # the official consumer's
CLOCK_TOLERANCE_MS = 5.0  # reading the clocks (ceil rounding: never early)
LATE_MS = 3_000  # generous: a shared machine
TIMEOUT_S = 30.0
SUB_OFFICIAL, SUB_WRAPPED = "official", "wrapped"


def _dispatched(broker: Broker, topic: str, subscription: str) -> int:
    """Messages the broker dispatched to the subscription's consumers, counted by the broker."""
    metrics_url = getattr(broker, "metrics_url", None)
    if metrics_url:
        text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
        short = topic.rsplit("/", 1)[1]
        return sum(
            int(float(line.rsplit(" ", 1)[1]))
            for line in text.splitlines()
            if line.startswith("pulsar_out_messages_total")
            and f'topic="{short}"' in line
            and f'subscription="{subscription}"' in line
        )
    stats = broker.admin("GET", f"/admin/v2/persistent/{topic.removeprefix('persistent://')}/stats")  # type: ignore[attr-defined]
    return int(stats["subscriptions"][subscription]["msgOutCounter"])


class Journal:
    """One consumer's hand-outs and nacks; decides for each hand-out: nack at first sight (m0..m2 of each
    batch), else ack."""

    def __init__(self, per_message: bool) -> None:
        self.per_message = per_message
        self.handouts: dict[bytes, list[float]] = defaultdict(list)
        self.nacked: dict[bytes, list[tuple[float, float]]] = defaultdict(
            list
        )  # payload → (nack s, delay ms)
        self.lock = threading.Lock()

    def decide(self, message: Any) -> float | None:
        """Record a hand-out; the delay to nack it with (ms), or None to ack it."""
        payload = message.data()
        with self.lock:
            seen = self.handouts[payload]
            seen.append(time.monotonic())
            delays = DELAYS_MS.get(int(payload[1:]) % 10, ())
            if len(seen) > len(delays):
                return None
            delay = delays[len(seen) - 1]
            self.nacked[payload].append(
                (time.monotonic(), float(delay if self.per_message else FIXED_DELAY_MS))
            )
            return delay

    def done(self) -> bool:
        with self.lock:
            return len(self.nacked) == len(DELAYS_MS) * BATCHES and all(
                len(self.handouts[p]) > len(DELAYS_MS[int(p[1:]) % 10]) for p in self.nacked
            )


def _handle(consumer: Any, journal: Journal, message: Any) -> None:
    delay = journal.decide(message)
    if delay is None:
        consumer.acknowledge(message)
    elif journal.per_message:
        consumer.negative_acknowledge(message, delay_ms=delay)
    else:
        consumer.negative_acknowledge(message)


def _receive_loop(consumer: Any, journal: Journal, stop: threading.Event, batched: bool) -> None:
    while not stop.is_set():
        try:
            messages = consumer.batch_receive() if batched else [consumer.receive(100)]
        except pulsar.Timeout:
            continue
        for message in messages:
            _handle(consumer, journal, message)


def _wait(journals: list[Journal]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline and not all(j.done() for j in journals):
        time.sleep(0.05)
    time.sleep(1.0)  # copies handed out twice would show up meanwhile; the broker's counters settle


def _problems(journal: Journal) -> dict[str, Any]:
    """What the wrapper's hand-outs break: every nacked message once more, no sooner than due, nothing
    else again."""
    problems: dict[str, Any] = {}
    counts = {
        p: len(t)
        for p, t in journal.handouts.items()
        if len(t) != 1 + len(DELAYS_MS.get(int(p[1:]) % 10, ()))
    }
    if counts or len(journal.handouts) != 10 * BATCHES:
        problems["hand-outs (payload: count), 1 + its nacks"] = counts
        problems["messages seen"] = len(journal.handouts)
    early, late = {}, {}
    for payload, nacks in journal.nacked.items():
        for (nacked_at, delay), handed_at in zip(nacks, journal.handouts[payload][1:], strict=False):
            off_ms = (handed_at - nacked_at) * 1000 - delay
            if off_ms < -CLOCK_TOLERANCE_MS:
                early[payload] = round(-off_ms, 1)
            if off_ms > LATE_MS:
                late[payload] = round(off_ms, 1)
    if early:
        problems["handed out early (ms before due)"] = early
    if late:
        problems["handed out late (ms after due)"] = late
    return problems


@pytest.mark.parametrize("mode", ["receive", "batch_receive", "listener"])
def test_siblings_due_later_cost_the_broker_no_more_than_one_fixed_delay(
    broker: Broker, nack_client: pulsar_nack.Client, pulsar_client: Any, unique_topic: str, mode: str
) -> None:
    wrapped_journal, official_journal = Journal(per_message=True), Journal(per_message=False)
    options: dict[str, Any] = {"consumer_type": pulsar.ConsumerType.Shared}
    wrapped_options = dict(options)
    if mode == "listener":
        wrapped_options["message_listener"] = lambda c, m: _handle(c, wrapped_journal, m)
    wrapped = nack_client.subscribe(unique_topic, SUB_WRAPPED, **wrapped_options)
    official = pulsar_client.subscribe(
        unique_topic, SUB_OFFICIAL, negative_ack_redelivery_delay_ms=FIXED_DELAY_MS, **options
    )
    produce_bursts(pulsar_client, unique_topic, 10 * BATCHES, batch_size=10)
    stop = threading.Event()
    threads = [threading.Thread(target=_receive_loop, args=(official, official_journal, stop, False))]
    if mode != "listener":
        args = (wrapped, wrapped_journal, stop, mode == "batch_receive")
        threads.append(threading.Thread(target=_receive_loop, args=args))
    for thread in threads:
        thread.start()
    try:
        _wait([wrapped_journal, official_journal])
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    stats = wrapped.nack_stats()
    wrapped_out = _dispatched(broker, unique_topic, SUB_WRAPPED)
    official_out = _dispatched(broker, unique_topic, SUB_OFFICIAL)
    wrapped.close()
    official.close()
    problems = _problems(wrapped_journal)
    if wrapped_out > official_out:
        problems["broker messages dispatched: wrapper > official at a fixed delay"] = (
            wrapped_out,
            official_out,
        )
    if not official_journal.done():
        problems["the official consumer did not get its nacked messages back"] = len(official_journal.nacked)
    if stats.chunked_redelivered == 0:
        problems["no sibling handed out from the hold"] = stats
    if leftovers := leftover(pulsar_client, unique_topic, SUB_WRAPPED):
        problems["a fresh consumer of the wrapper's subscription got"] = sorted(leftovers)[:10]
    assert not problems, problems


def test_asyncio_consumer_hands_held_siblings_out_at_their_time(
    broker: Broker, pulsar_client: Any, unique_topic: str
) -> None:
    journal, official_journal = Journal(per_message=True), Journal(per_message=False)
    official = pulsar_client.subscribe(
        unique_topic,
        SUB_OFFICIAL,
        consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_redelivery_delay_ms=FIXED_DELAY_MS,
    )

    async def run() -> tuple[Any, int]:
        client = aio.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
        try:
            consumer = await client.subscribe(
                unique_topic, SUB_WRAPPED, consumer_type=pulsar.ConsumerType.Shared
            )
            await asyncio.to_thread(produce_bursts, pulsar_client, unique_topic, 10 * BATCHES, None, 100, 10)
            deadline = time.monotonic() + TIMEOUT_S
            quiet_until: float | None = None
            while time.monotonic() < deadline:
                if journal.done() and official_journal.done():
                    quiet_until = quiet_until or time.monotonic() + 1.0
                    if time.monotonic() >= quiet_until:
                        break
                try:
                    message = await asyncio.wait_for(consumer.receive(), 0.2)
                except TimeoutError:
                    continue
                delay = journal.decide(message)
                if delay is None:
                    await consumer.acknowledge(message)
                else:
                    await consumer.negative_acknowledge(message, delay_ms=delay)
            stats = consumer.nack_stats()
            out = _dispatched(broker, unique_topic, SUB_WRAPPED)
            await consumer.close()
            return stats, out
        finally:
            await client.close()

    stop = threading.Event()
    thread = threading.Thread(target=_receive_loop, args=(official, official_journal, stop, False))
    thread.start()
    try:
        stats, out = asyncio.run(run())
    finally:
        stop.set()
        thread.join(10)
    official_out = _dispatched(broker, unique_topic, SUB_OFFICIAL)
    official.close()
    problems = _problems(journal)
    if out > official_out:
        problems["broker messages dispatched: wrapper > official at a fixed delay"] = (out, official_out)
    if not official_journal.done():
        problems["the official consumer did not get its nacked messages back"] = len(official_journal.nacked)
    if stats.chunked_redelivered == 0:
        problems["no sibling handed out from the hold"] = stats
    if leftovers := leftover(pulsar_client, unique_topic, SUB_WRAPPED):
        problems["a fresh consumer of the wrapper's subscription got"] = sorted(leftovers)[:10]
    assert not problems, problems


# m0 is nacked to come back soon, m1 later: m0's redelivery brings m1 early (kept until due), then m2
# (acked already) — the last copies the broker sends
LAST_DELAYS_MS = {0: 0, 1: 3_000}
LAST_FIXED_DELAY_MS = 1_000  # the official consumer's


def _receive_forever(consumer: Any, per_message: bool, back: dict[bytes, float], errors: list[str]) -> None:
    """``receive()`` without a timeout, as an application's loop does: nack m0 and m1 on first sight (the
    wrapper with per-call delays), ack everything else, until m0 and m1 are back (their times in
    ``back``)."""
    nacked: set[bytes] = set()
    try:
        while len(back) < len(LAST_DELAYS_MS):
            message = consumer.receive()
            payload = message.data()
            index = int(payload[1:])
            if index in LAST_DELAYS_MS and payload not in nacked:
                nacked.add(payload)
                if per_message:
                    consumer.negative_acknowledge(message, delay_ms=LAST_DELAYS_MS[index])
                else:
                    consumer.negative_acknowledge(message)
                continue
            if payload in nacked:
                back.setdefault(payload, time.monotonic())
            consumer.acknowledge(message)
    except Exception as error:  # the consumer closed under a receive that never returned
        errors.append(repr(error))


def test_receive_without_a_timeout_hands_out_a_sibling_kept_from_the_last_copies(
    nack_client: pulsar_nack.Client, pulsar_client: Any, unique_topic: str
) -> None:
    """A sibling kept from the last copies the broker sends comes back through ``receive()`` without a
    timeout. ``receive`` went back to the native receive after an arrival it kept, and with no timeout
    that waits for the broker's next message — after the last one, for ever: the kept copies were never
    handed out (bench/consumer_cost.py, scenario B, batches of 1,000: 18-49 nacked messages of 2,000
    never came back within 180 s on a loaded machine). Side by side with the official consumer, which
    gets both nacked messages back from the broker."""
    options: dict[str, Any] = {"consumer_type": pulsar.ConsumerType.Shared}
    wrapped = nack_client.subscribe(unique_topic, SUB_WRAPPED, **options)
    official = pulsar_client.subscribe(
        unique_topic, SUB_OFFICIAL, negative_ack_redelivery_delay_ms=LAST_FIXED_DELAY_MS, **options
    )
    produce_bursts(pulsar_client, unique_topic, 3, batch_size=3)  # one batch: m0, m1, m2
    backs: list[dict[bytes, float]] = [{}, {}]
    errors: list[str] = []
    threads = [
        threading.Thread(target=_receive_forever, args=(c, c is wrapped, b, errors), daemon=True)
        for c, b in zip((wrapped, official), backs, strict=True)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + TIMEOUT_S
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    stats = wrapped.nack_stats()
    wrapped.close()  # (wakes a receive still waiting: it raises)
    official.close()
    for thread in threads:
        thread.join(10)
    wrapped_back, official_back = backs
    assert sorted(official_back) == [b"m0", b"m1"], ("the official consumer", official_back, errors)
    assert sorted(wrapped_back) == [b"m0", b"m1"], ("the wrapper", wrapped_back, stats, errors)
    assert stats.chunked_redelivered >= 1, ("m1 was not kept: the case is not exercised", stats)
    assert not leftover(pulsar_client, unique_topic, SUB_WRAPPED)


BACKLOG = 20_000  # messages queued behind the nacked batch: ~6 s of the application's work below
WORK_S = 0.00025  # the application's work per message


def _through_backlog(consumer: Any, delays: dict[bytes, int], per_call: bool) -> tuple[float, int]:
    """Receive every message once (``delays``' once more, nacked at first sight; the rest acked), working
    ``WORK_S`` on each: how late m1 came back (ms past its nack time + delay) and how many backlog
    messages were handed out after it."""
    nacked: dict[bytes, float] = {}
    back_ms, after = None, 0
    deadline = time.monotonic() + 90
    received = 0
    while received < BACKLOG + 3 + len(delays) and time.monotonic() < deadline:
        try:
            message = consumer.receive(100)
        except pulsar.Timeout:
            continue
        received += 1
        payload = message.data()
        if payload in nacked:
            if payload == b"m1":
                back_ms = time.monotonic() * 1000 - nacked[payload]
            consumer.acknowledge(message)
        elif payload in delays:
            nacked[payload] = time.monotonic() * 1000 + delays[payload]
            if per_call:
                consumer.negative_acknowledge(message, delay_ms=delays[payload])
            else:
                consumer.negative_acknowledge(message)
        else:
            if back_ms is not None:
                after += 1
            consumer.acknowledge(message)
        time.sleep(WORK_S)
    assert back_ms is not None, f"m1 never came back ({received} received)"
    return back_ms, after


def test_a_kept_sibling_due_while_a_backlog_is_queued_is_not_held_back_until_it_drains(
    nack_client: pulsar_nack.Client, pulsar_client: Any, unique_topic: str
) -> None:
    """m0 and m1 of one batch nacked with 200 and 1,000 ms, 20,000 messages queued behind them. m0's
    forward brings m1, kept until due; ``receive`` handed the native queue's messages out first, so m1
    waited until the broker had nothing more to queue — the whole backlog: 7.0–7.2 s late, where the
    official consumer's m1 (nacked at its fixed delay of 1,000 ms, back from the broker behind at most a
    receiver queue of messages) was 547–585 ms late (both brokers). A due held message and the native
    queue now take turns: m1 not more than 2^k + 500 ms late, with the backlog still queued."""
    options: dict[str, Any] = {"consumer_type": pulsar.ConsumerType.Shared}
    wrapped = nack_client.subscribe(unique_topic, SUB_WRAPPED, **options)
    official = pulsar_client.subscribe(
        unique_topic, SUB_OFFICIAL, negative_ack_redelivery_delay_ms=1_000, **options
    )
    produce_bursts(pulsar_client, unique_topic, 3, batch_size=3)  # one batch: m0, m1, m2
    produce_bursts(pulsar_client, unique_topic, BACKLOG, batch_size=100, prefix="b")
    late_ms, after = _through_backlog(wrapped, {b"m0": 200, b"m1": 1_000}, per_call=True)
    official_late_ms, official_after = _through_backlog(official, {b"m1": 1_000}, per_call=False)
    stats = wrapped.nack_stats()
    bound_ms = (1 << wrapped.nack_options.precision_bits) + 500
    wrapped.close()
    official.close()
    assert stats.chunked_redelivered >= 1, ("m1 was not kept: the case is not exercised", stats)
    assert late_ms <= bound_ms, (
        f"m1 {late_ms:.0f} ms late, {after} backlog messages after it (official: {official_late_ms:.0f} ms "
        f"late, {official_after} after it)"
    )
    assert after > 1_000, f"the backlog was drained when m1 came back ({after} after it): no case"


def test_a_nack_from_another_thread_comes_back_to_a_receive_blocked_without_a_timeout(
    nack_client: pulsar_nack.Client, pulsar_client: Any, unique_topic: str
) -> None:
    """Thread R waits in ``receive()`` without a timeout (in the native receive: the broker has nothing
    more to send) while this thread nacks m1, of which a copy is parked (it came with m0's redelivery
    while the application held m1). The nack used to keep that copy in the hold, which R — blocked in
    the native receive — never looks at: m1 did not come back while the consumer lived. Now a nack keeps
    no copy while a receive waits there; it is filed, and the broker's redelivery wakes R. Side by side
    with the official consumer, which gets m1 back from the broker."""
    options: dict[str, Any] = {"consumer_type": pulsar.ConsumerType.Shared}
    wrapped = nack_client.subscribe(unique_topic, SUB_WRAPPED, **options)
    official = pulsar_client.subscribe(
        unique_topic, SUB_OFFICIAL, negative_ack_redelivery_delay_ms=LAST_FIXED_DELAY_MS, **options
    )
    produce_bursts(pulsar_client, unique_topic, 2, batch_size=2)  # one batch: m0, m1
    firsts = []
    for consumer in (wrapped, official):
        m0, m1 = consumer.receive(10_000), consumer.receive(10_000)
        assert (m0.data(), m1.data()) == (b"m0", b"m1")
        # m0's redelivery brings m1 along, which the application holds: the wrapper parks that copy
        if consumer is wrapped:
            consumer.negative_acknowledge(m0, delay_ms=0)
        else:
            consumer.negative_acknowledge(m0)
        back = consumer.receive(10_000)
        assert back.data() == b"m0"
        consumer.acknowledge(back)
        firsts.append(m1)
    gots: list[list[bytes]] = [[], []]
    errors: list[str] = []
    threads = [
        threading.Thread(target=receive_into, args=(c, got, errors), daemon=True)
        for c, got in zip((wrapped, official), gots, strict=True)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + TIMEOUT_S
    time.sleep(1.0)  # both R threads are in the native receive (the broker has nothing to send them)
    assert wrapped._nacks._arrivals.has_parked, "no copy of m1 parked: the case is not exercised"
    wrapped.negative_acknowledge(firsts[0], delay_ms=0)
    official.negative_acknowledge(firsts[1])
    while not all(gots) and time.monotonic() < deadline:
        time.sleep(0.05)
    stats = wrapped.nack_stats()
    wrapped.close()  # (wakes a receive still waiting: it raises)
    official.close()
    for thread in threads:
        thread.join(10)
    wrapped_got, official_got = gots
    assert official_got == [b"m1"], ("the official consumer", official_got, errors)
    assert wrapped_got == [b"m1"], ("the wrapper", wrapped_got, stats, errors)
    assert not leftover(pulsar_client, unique_topic, SUB_WRAPPED)


def test_take_pending_message_takes_a_batch_message_pending_on_its_own_only() -> None:
    """The filter's side, without a broker: a sibling's pending nack leaves the filter and the index, and
    a later copy of it is a duplicate (the kept copy is the application's); one forwarded already, one
    covered by a whole-entry nack, or with an ack timeout set, stays as it is."""

    def make() -> tuple[ArrivalFilter, TimeBucketIndex]:
        index = TimeBucketIndex(0, "floor")
        arrivals = ArrivalFilter(
            lambda *ids: None,
            clock=lambda: 1_000.0,
            batch_size=lambda _: 10,
            index=index,
        )
        for i in range(10):
            assert arrivals.admit(7, 1, i, "t", None) is Verdict.DELIVER
        return arrivals, index

    arrivals, index = make()
    for i in (0, 1, 2):
        arrivals.file(2_000 + i, 7, 1, i, "t")
    arrivals.forwarded("t", 7, [1], {1: (0,)}, 1_000.0, 2_000)
    assert arrivals.admit(7, 1, 1, "t", None) is Verdict.HOLD
    assert arrivals.take_pending_message(7, 1, 1, "t") is True
    assert index.due_of(7, 1, 1, "t") is None and index.due_of(7, 1, 2, "t") == 2_002
    assert arrivals.admit(7, 1, 1, "t", None) is Verdict.DUPLICATE, "the kept copy is the application's"
    assert arrivals.take_pending_message(7, 1, 1, "t") is False, "taken already"
    assert arrivals.take_pending_message(7, 1, 0, "t") is False, "in flight: its forward's copy decides"
    assert arrivals.take_pending_message(7, 1, 5, "t") is False, "not nacked"

    # A quiet entry (every message acked or pending: one bit) whose copy comes: the taken message's ack,
    # its last, must ack the entry at the broker (the copy's acked siblings are covered by that ack).
    arrivals, index = make()
    for i in range(8):
        assert arrivals.acked_plain(("t", 7, 1), i)
    arrivals.file(2_000, 7, 1, 8, "t")
    arrivals.file(3_000, 7, 1, 9, "t")
    assert arrivals.counts().open_entries == 1 and not arrivals._entries, "kept as one bit"
    assert arrivals.admit(7, 1, 9, "t", None) is Verdict.HOLD
    assert arrivals.take_pending_message(7, 1, 9, "t") is True
    assert arrivals.acked(7, 1, 8, "t")[2] is False, "9 is not acked yet"
    assert arrivals.acked(7, 1, 9, "t")[2] is True, "the last ack acks the entry"

    arrivals, index = make()
    arrivals.file(2_000, 7, 1, -1, "t")  # the whole entry
    arrivals.file(2_000, 7, 1, 3, "t")
    assert arrivals.take_pending_message(7, 1, 3, "t") is False, "a whole-entry nack covers it"

    arrivals, index = make()
    arrivals.expect_ack_timeout(10_000)
    arrivals.file(2_000, 7, 1, 3, "t")
    assert arrivals.take_pending_message(7, 1, 3, "t") is False, "with an ack timeout"
    assert index.due_of(7, 1, 3, "t") == 2_000


def test_take_parked_gives_a_parked_copy_of_a_message_the_application_holds_once() -> None:
    """A copy that came while the application held the message (parked, to be acked with its own) serves
    the application's nack of it: taken once, counted as a nack kept in memory; none once the application
    acked the message (its parked copies went with that ack), nor with an ack timeout."""
    index = TimeBucketIndex(0, "floor")
    arrivals = ArrivalFilter(
        lambda *ids: None,
        clock=lambda: 1_000.0,
        batch_size=lambda _: 10,
        index=index,
    )
    for i in range(10):
        assert arrivals.admit(7, 1, i, "t", None) is Verdict.DELIVER
    assert not arrivals.has_parked and arrivals.take_parked(7, 1, 5, "t") is None
    for i in (5, 6):
        assert arrivals.admit(7, 1, i, "t", None) is Verdict.DUPLICATE
        assert arrivals.park(7, 1, i, "t", f"copy {i}")
    assert arrivals.has_parked
    assert arrivals.take_parked(7, 1, 5, "t") == "copy 5"
    assert arrivals.take_parked(7, 1, 5, "t") is None, "taken already"
    assert arrivals.counts().kept == 1 and len(index) == 0, "no nack filed"
    assert arrivals.acked(7, 1, 6, "t")[0] == ["copy 6"]
    assert arrivals.take_parked(7, 1, 6, "t") is None, "acked: its parked copy went with the ack"
    arrivals.expect_ack_timeout(10_000)
    assert arrivals.admit(7, 1, 7, "t", None) is Verdict.DUPLICATE and arrivals.park(7, 1, 7, "t", "copy 7")
    assert arrivals.take_parked(7, 1, 7, "t") is None, "with an ack timeout"


def _filter_at(now: FakeClock, coalesce: bool) -> tuple[ArrivalFilter, TimeBucketIndex]:
    """A filter over a k = 0 index (bucket = due time) on the clock ``now``, entry 1 of ledger 7 (a
    batch of 10) handed out; ``coalesce`` as a consumer that keeps copies sets it."""
    index = TimeBucketIndex(0, "ceil")
    arrivals = ArrivalFilter(
        lambda *ids: None,
        clock=now,
        batch_size=lambda _: 10,
        index=index,
    )
    arrivals.coalesce = coalesce
    for i in range(10):
        assert arrivals.admit(7, 1, i, "t", None) is Verdict.DELIVER
    return arrivals, index


def _learn(arrivals: ArrivalFilter, index: TimeBucketIndex, until: int, now: float) -> set[int] | None:
    """A flush's pop and forwarded() (the tracker's), labelled ``until``: the entries not to forward."""
    waiting: set[int] = set()
    for ids in index.pop_due(until):
        waiting |= (
            arrivals.forwarded(ids.topic, ids.ledger_id, ids.entry_ids, ids.batch_indexes, now, until)
            or set()
        )
    return waiting or None


def test_a_message_due_while_its_entry_is_on_its_way_waits_for_that_copy() -> None:
    """m0 is forwarded; m1 falls due before m0's copy has come: m1 is not forwarded (a second dispatch of
    the whole entry) but filed again, and the copy that comes is kept for it (take_pending_message) — if
    the consumer keeps copies. Without that (the default), or once the forward is older than
    COALESCE_WITHIN_MS, m1 is forwarded as before."""
    from pulsar_nack.arrivals import COALESCE_WITHIN_MS

    now = FakeClock(1_000.0)
    arrivals, index = _filter_at(now, coalesce=True)
    arrivals.file(2_000, 7, 1, 0, "t")
    arrivals.file(2_100, 7, 1, 1, "t")
    now.now = 1_900.0
    assert _learn(arrivals, index, 2_000, now.now) is None, "m0 goes"
    now.now = 2_050.0
    assert _learn(arrivals, index, 2_150, now.now) == {1}, "m1 waits for m0's copy"
    assert index.due_of(7, 1, 1, "t") == 2_150, "filed again, no earlier than its bucket"
    now.now = 2_120.0  # m0's copy comes, with m1's
    assert arrivals.admit(7, 1, 0, "t", None) is Verdict.DELIVER
    assert arrivals.admit(7, 1, 1, "t", None) is Verdict.HOLD
    assert arrivals.take_pending_message(7, 1, 1, "t") is True, "kept: no forward of its own"
    assert index.pop_due(10_000) == []

    arrivals, index = _filter_at(now, coalesce=False)
    arrivals.file(2_000, 7, 1, 0, "t")
    arrivals.file(2_100, 7, 1, 1, "t")
    assert _learn(arrivals, index, 2_000, 1_900.0) is None
    assert _learn(arrivals, index, 2_150, 2_050.0) is None, "forwarded: the consumer keeps no copies"

    arrivals, index = _filter_at(now, coalesce=True)
    arrivals.file(2_000, 7, 1, 0, "t")
    arrivals.file(2_000 + COALESCE_WITHIN_MS, 7, 1, 1, "t")
    assert _learn(arrivals, index, 2_000, 1_900.0) is None
    late = 1_900.0 + COALESCE_WITHIN_MS
    assert _learn(arrivals, index, 2_000 + COALESCE_WITHIN_MS, late) is None, "m0's copy is overdue"


def test_a_message_that_waits_again_after_its_kept_copy_waits_at_its_new_bucket() -> None:
    """A message made to wait for its entry's copy is filed again at the bucket it first waited at
    (ArrivalFilter._waiting), on every flush until it leaves pending. Once its copy is kept, or it is
    acked, that bucket is forgotten: nacked again and made to wait again, it waits at its new bucket — the
    old one would hand its next copy out early."""
    now = FakeClock(1_000.0)
    arrivals, index = _filter_at(now, coalesce=True)
    arrivals.file(2_000, 7, 1, 0, "t")
    arrivals.file(2_100, 7, 1, 1, "t")
    assert _learn(arrivals, index, 2_000, 1_900.0) is None, "m0 goes"
    assert _learn(arrivals, index, 2_150, 2_050.0) == {1}, "m1 waits for m0's copy"
    assert _learn(arrivals, index, 2_400, 2_300.0) == {1}, "a later flush: m1 still waits"
    assert index.due_of(7, 1, 1, "t") == 2_150, "at the bucket it first waited at, not the later flush's"
    now.now = 2_320.0  # m0's copy comes, with m1's: kept
    assert arrivals.admit(7, 1, 0, "t", None) is Verdict.DELIVER
    assert arrivals.admit(7, 1, 1, "t", None) is Verdict.HOLD
    assert arrivals.take_pending_message(7, 1, 1, "t") is True
    arrivals.file(2_900, 7, 1, 0, "t")  # both nacked again
    arrivals.file(3_000, 7, 1, 1, "t")
    assert _learn(arrivals, index, 2_900, 2_800.0) is None, "m0 goes"
    assert _learn(arrivals, index, 3_000, 2_950.0) == {1}, "m1 waits for m0's copy again"
    assert index.due_of(7, 1, 1, "t") == 3_000, "at its new bucket"
    now.now = 3_100.0
    assert arrivals.acked(7, 1, 1, "t")[1] is True, "acked while waiting: no longer pending"
    assert index.pop_due(10_000) == []


def test_a_copy_that_comes_while_a_flush_has_popped_its_message_is_kept() -> None:
    """The race of a flush: m1 popped from the index, its copy (with m0's forward) comes before the flush
    tells forwarded(): take_popped_message keeps it and forwarded() leaves m1 out (not forwarded, not in
    flight: a later copy is the application's duplicate). Not for a message not pending, nor without
    coalescing."""
    now = FakeClock(1_000.0)
    arrivals, index = _filter_at(now, coalesce=True)
    arrivals.file(2_000, 7, 1, 0, "t")
    arrivals.file(2_100, 7, 1, 1, "t")
    assert _learn(arrivals, index, 2_000, 1_900.0) is None
    popped = index.pop_due(2_150)  # the flush under way
    assert arrivals.take_popped_message(7, 1, 1, "t") is True
    assert arrivals.take_popped_message(7, 1, 1, "t") is False, "taken already"
    assert arrivals.take_popped_message(7, 1, 5, "t") is False, "not nacked"
    ids = popped[0]
    waiting = arrivals.forwarded(ids.topic, ids.ledger_id, ids.entry_ids, ids.batch_indexes, 2_050.0, 2_150)
    assert waiting == {1}, "not forwarded again"
    now.now = 2_300.0
    assert arrivals.admit(7, 1, 1, "t", None) is Verdict.DUPLICATE, "the kept copy is the application's"

    arrivals, index = _filter_at(now, coalesce=False)
    arrivals.file(2_100, 7, 1, 1, "t")
    index.pop_due(2_150)
    assert arrivals.take_popped_message(7, 1, 1, "t") is False


def _quiet_entry(now: FakeClock, m1_due: int) -> tuple[ArrivalFilter, TimeBucketIndex]:
    """:func:`_filter_at` (coalescing) with m0 nacked due at 2,000, m1 at ``m1_due`` and every other
    message of the entry acked: the entry is one bit (quiet)."""
    arrivals, index = _filter_at(now, coalesce=True)
    arrivals.file(2_000, 7, 1, 0, "t")
    arrivals.file(m1_due, 7, 1, 1, "t")
    for i in range(2, 10):
        arrivals.acked(7, 1, i, "t")
    return arrivals, index


def test_a_quiet_entry_expanded_while_a_flush_has_popped_one_of_its_messages_keeps_that_message() -> None:
    """The filter keeps an entry whose messages are all acked or pending as one bit, and rebuilds its
    record from the index: what the index no longer has pending counts as acked, but what the flush just
    popped. A flush pops m0 (the index no longer has it) and, before it tells forwarded(), a copy of the
    entry comes for m1 (a re-dispatch, a copy the client hands out twice): the record rebuilt then must not
    take m0 for acked — its forward would make no flight, and the copy it brings would be acked at the
    broker and never handed out."""
    now = FakeClock(1_000.0)
    arrivals, index = _quiet_entry(now, 3_000)
    now.now = 1_900.0
    # a flush under way (as the tracker pops): m0 leaves the index
    popped = arrivals.pop(index.pop_due_by_bucket, 2_000)
    assert arrivals.admit(7, 1, 1, "t", None) is Verdict.HOLD, "m1's copy comes: m1 is pending"
    assert arrivals.take_pending_message(7, 1, 1, "t") is True, "kept until due"
    for bucket, ids in popped:  # the flush tells the filter
        arrivals.forwarded(ids.topic, ids.ledger_id, ids.entry_ids, ids.batch_indexes, now.now, bucket)
    now.now = 2_100.0  # m0's forward brings its copy
    assert arrivals.admit(7, 1, 0, "t", None) is Verdict.DELIVER, "m0 handed out, not taken for acked"
    assert arrivals.admit(7, 1, 1, "t", None) is Verdict.DUPLICATE, "m1: the kept copy is the application's"


def test_a_quiet_entry_rebuilt_between_two_buckets_of_one_pop_keeps_the_later_one_pending() -> None:
    """A flush pops two buckets at once — m0 due at 2,000, m1 at 2,040 — and tells the filter of them one
    by one. The entry (quiet: every other message acked) is rebuilt when the filter learns m0's forward:
    m1, popped but not yet learned, is still pending then — its copy (with m0's forward) is kept until
    due, and its own bucket's forwarded() leaves it out — not taken for acked, which would make its copy
    a duplicate and lose it."""
    now = FakeClock(1_000.0)
    arrivals, index = _quiet_entry(now, 2_040)
    now.now = 1_950.0
    popped = arrivals.pop(index.pop_due_by_bucket, 2_050)
    assert [(bucket, ids.batch_indexes) for bucket, ids in popped] == [(2_000, {1: (0,)}), (2_040, {1: (1,)})]
    (first, m0), (second, m1) = popped
    assert arrivals.forwarded("t", 7, m0.entry_ids, m0.batch_indexes, now.now, first) is None
    assert arrivals.admit(7, 1, 1, "t", None) is Verdict.HOLD, "m1's copy comes: m1 is pending"
    assert arrivals.take_popped_message(7, 1, 1, "t") is True, "kept until due"
    assert arrivals.forwarded("t", 7, m1.entry_ids, m1.batch_indexes, now.now, second) == {1}, "not again"
    now.now = 2_100.0
    assert arrivals.admit(7, 1, 0, "t", None) is Verdict.DELIVER, "m0 handed out"
    assert arrivals.admit(7, 1, 1, "t", None) is Verdict.DUPLICATE, "m1: the kept copy is the application's"


def test_two_flushes_at_once_each_leave_the_others_popped_messages_pending() -> None:
    """Two flushes of one ledger at once (a close that flushes while the timer does): A pops m0, B pops m1
    and learns it first. The quiet entry rebuilt then must still have m0 pending — A has not told the
    filter — so that m0's copy is held for it, not taken for acked."""
    now = FakeClock(1_000.0)
    arrivals, index = _quiet_entry(now, 2_040)
    now.now = 1_950.0
    assert len(arrivals.pop(index.pop_due_by_bucket, 2_000)) == 1  # flush A: m0
    ((bucket, m1),) = arrivals.pop(index.pop_due_by_bucket, 2_050)  # flush B
    assert arrivals.forwarded("t", 7, m1.entry_ids, m1.batch_indexes, now.now, bucket) is None
    assert arrivals.admit(7, 1, 0, "t", None) is Verdict.HOLD, "m0: popped by A, still pending"


def test_a_message_kept_while_a_pop_of_two_buckets_is_learned_is_left_out_of_its_own() -> None:
    """The race of a flush over two buckets: m0 due at 2,000 and m1 at 2,040 popped at once, and m1's
    copy kept (take_popped_message) before the filter learns either. Learning m0's bucket leaves m1's
    record alone; m1's own bucket leaves m1 out (not forwarded: the copy kept is the one it would ask
    for)."""
    now = FakeClock(1_000.0)
    arrivals, index = _filter_at(now, coalesce=True)
    arrivals.file(2_000, 7, 1, 0, "t")
    arrivals.file(2_040, 7, 1, 1, "t")
    now.now = 1_950.0
    (first, m0), (second, m1) = arrivals.pop(index.pop_due_by_bucket, 2_050)
    assert arrivals.take_popped_message(7, 1, 1, "t") is True
    assert arrivals.forwarded("t", 7, m0.entry_ids, m0.batch_indexes, now.now, first) is None, "m0 goes"
    assert arrivals.forwarded("t", 7, m1.entry_ids, m1.batch_indexes, now.now, second) == {1}, "m1 kept"


def test_kept_copies_count_in_the_memory_figures() -> None:
    """A kept copy counts in ``nack_stats(with_memory=True).memory_bytes`` (part 'held chunked') at what it
    pins — batch size × payload + KEPT_COPY_BYTES, the figure bounded by max_held_chunked_bytes — and
    ``chunked_held_bytes``; none once it is gone."""
    from pulsar_nack.bridge import KEPT_COPY_BYTES
    from pulsar_nack.chunks import ChunkHold
    from pulsar_nack.stats import NackStats

    base = NackStats(
        0, 0, 0, 0, 0, 0, 0, 0, 0, None, None, memory_bytes=1_000, memory_parts=(("index", 1_000),)
    )
    hold = ChunkHold(10 * 2**20)
    empty = hold.stats(base, with_memory=True)
    pinned = 10 * 4 + KEPT_COPY_BYTES  # a 4-byte message of a batch of 10
    for i in range(100):
        assert hold.hold(("t", 7, i, 3), object(), 5_000.0, 1, pinned, copy=True)
    kept = hold.stats(base, with_memory=True)
    assert kept.chunked_held == 100 and kept.chunked_held_bytes == 100 * pinned
    assert kept.memory_bytes is not None and empty.memory_bytes is not None
    assert kept.memory_bytes - empty.memory_bytes >= 100 * pinned
    assert dict(kept.memory_parts or ())["held chunked"] >= 100 * pinned
    for i in range(100):
        assert hold.discard(("t", 7, i, 3))
    assert hold.stats(base, with_memory=True).chunked_held_bytes == 0
