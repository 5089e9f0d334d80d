"""Issue 9, "what must hold": every nack brings its message back exactly once, never early, and everything
the application acked is acked at the broker — with batches, several receiver threads, listeners,
``batch_receive``, multi-topic / partitioned / regex consumers, ``seek`` and
``redeliver_unacknowledged_messages``. Public API only; the official ``pulsar.Client`` runs side by side on
the same broker wherever the issue compares behaviour.

Conventions of every test here:

* a *hand-out* is a message ``receive`` / ``batch_receive`` / the listener gives the application;
* *never early*: a redelivery is handed out no sooner than nack time + delay − 2^k ms (k = 8, floor
  rounding; with ceil: no sooner than nack time + delay), up to ``CLOCK_TOLERANCE_MS`` for reading clocks
  (the nack time is read just before the call, the hand-out time just after ``receive`` returns, so both
  readings only ever make a redelivery look later);
* *drained*: after the wrapper closed, a fresh official consumer of the subscription gets nothing within
  ~2 s, i.e. every entry was acked at the broker.

Measured with the official client (pulsar-client 3.13, both brokers), the baselines asserted against:

* ack then nack: nothing comes back for a non-batched message or for a batch whose messages are all
  acked; with an unacked sibling in its batch the whole entry comes back, the acked message with it. The
  wrapper must not hand an acked message out again at all (issue 9: "no message the app acked is handed
  out again by this consumer") — so an ack-then-nack plan expects exactly one hand-out.
* ``seek(MessageId.earliest)`` (Apache) after acking m0..m14 of two batches of 10: all 20 again, at once.
  A nack pending at the seek is *not* dropped by the official client: the re-read copy of the nacked
  message is redelivered later (if unacked by then, with its whole batch).
* ``redeliver_unacknowledged_messages()`` after acking m0..m14: non-batched m15..m19; batched m10..m19
  (whole entries, acked messages included).

pulsar-lite 0.2 cannot serve seek, partitioned nacks, regex subscriptions and batch-index acks: those
tests run on Apache Pulsar only.
"""

from __future__ import annotations

import queue
import random
import re
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pulsar
import pytest
from messaging import leftover, produce_bursts, receive_all

from harness.standalone import PulsarStandalone
from pulsar_nack import Client
from pulsar_nack.index import Rounding

SHARED = pulsar.ConsumerType.Shared
SUB = "sub"
PRECISION_BITS = 8  # the wrapper's default
CLOCK_TOLERANCE_MS = 5.0
FLOOR_EARLY_MS = 2**PRECISION_BITS + CLOCK_TOLERANCE_MS  # floor rounding: up to 2^k ms early
CEIL_EARLY_MS = CLOCK_TOLERANCE_MS  # ceil rounding: never early


# -- the plan per payload and the record of what happened ----------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What the application does with one payload: nack its first ``len(delays_ms)`` hand-outs (each
    with its per-call delay), ack the next; ``nack_after_ack_ms``: nack it again right after that ack."""

    delays_ms: tuple[int, ...] = ()
    nack_after_ack_ms: int | None = None

    @property
    def handouts(self) -> int:
        return len(self.delays_ms) + 1


def random_plans(
    payloads: Iterable[bytes], rng: random.Random, low_ms: int = 100, high_ms: int = 1500
) -> dict[bytes, Plan]:
    """Ack / nack once then ack / nack twice then ack / ack then nack, with random per-call delays."""
    plans = {}
    for payload in payloads:
        kind = rng.choices(["ack", "nack", "nack2", "ack-then-nack"], weights=[35, 25, 20, 20])[0]
        delays = tuple(rng.randint(low_ms, high_ms) for _ in range(2))
        if kind == "ack":
            plans[payload] = Plan()
        elif kind == "nack":
            plans[payload] = Plan(delays[:1])
        elif kind == "nack2":
            plans[payload] = Plan(delays)
        else:
            plans[payload] = Plan(nack_after_ack_ms=delays[0])
    return plans


class Journal:
    """Acts on each hand-out according to the plans and records it; thread-safe. Nothing is asserted on
    the threads that call :meth:`handle` (errors are collected); :meth:`problems` is for the test thread."""

    def __init__(self, plans: dict[bytes, Plan]) -> None:
        self.plans = plans
        self.lock = threading.Lock()
        self.handouts: dict[bytes, list[float]] = defaultdict(list)  # monotonic s, per hand-out
        self.nacks: dict[bytes, list[tuple[float, int]]] = defaultdict(list)  # (s before the call, delay)
        self.acked_at: dict[bytes, float] = {}  # s before the final ack call
        self.topics: set[str] = set()  # of the messages handed out
        self.errors: list[str] = []
        self.finished = threading.Event()
        self._open = len(plans)
        if not plans:
            self.finished.set()

    def handle(self, consumer: Any, message: Any, received_at: float) -> None:
        try:
            self._handle(consumer, message, received_at)
        except Exception as exc:  # recorded, asserted on the test thread
            self.errors.append(f"{message.data()!r}: {exc!r}")

    def _handle(self, consumer: Any, message: Any, received_at: float) -> None:
        payload = message.data()
        plan = self.plans.get(payload)
        topic = message.topic_name()
        with self.lock:
            self.topics.add(topic)
            handouts = self.handouts[payload]
            n = len(handouts)
            handouts.append(received_at)
            if plan is None or n > len(plan.delays_ms):
                action, delay = "extra", 0  # handed out once too often: ack it, counted as a problem
            elif n < len(plan.delays_ms):
                action, delay = "nack", plan.delays_ms[n]
                self.nacks[payload].append((time.monotonic(), delay))
            else:
                action, delay = "ack", 0
                self.acked_at[payload] = time.monotonic()
        if action == "nack":
            consumer.negative_acknowledge(message, delay_ms=delay)
            return
        consumer.acknowledge(message)
        if action == "ack":
            if plan is not None and plan.nack_after_ack_ms is not None:
                consumer.negative_acknowledge(message, delay_ms=plan.nack_after_ack_ms)
            with self.lock:
                self._open -= 1
                if self._open == 0:
                    self.finished.set()

    def problems(
        self, early_ms: float = FLOOR_EARLY_MS, leftovers: list[bytes] | None = None
    ) -> dict[str, Any]:
        """Everything that broke exactly-once / never-early / drained, by kind (empty: all held)."""
        found: dict[str, Any] = {}
        if self.errors:
            found["errors on the consumer threads"] = self.errors[:5]
        counts = {p: len(self.handouts.get(p, ())) for p in self.plans}
        fewer = {p: (c, plan.handouts) for p, plan in self.plans.items() if (c := counts[p]) < plan.handouts}
        more = {p: (c, plan.handouts) for p, plan in self.plans.items() if (c := counts[p]) > plan.handouts}
        strangers = sorted(set(self.handouts) - set(self.plans))
        if fewer:
            found[f"{len(fewer)} payloads handed out fewer times than 1 + nacks (got, expected)"] = _some(
                fewer
            )
        if more:
            found[f"{len(more)} payloads handed out more times than 1 + nacks (got, expected)"] = _some(more)
        if strangers:
            found[f"{len(strangers)} unknown payloads handed out"] = strangers[:5]
        after_ack = {
            p: [round((t - acked) * 1000) for t in self.handouts[p] if t > acked]
            for p, acked in self.acked_at.items()
        }
        after_ack = {p: ms for p, ms in after_ack.items() if ms}
        if after_ack:
            found[f"{len(after_ack)} payloads handed out after the app acked them (ms after the ack)"] = (
                _some(after_ack)
            )
        early = {}
        for payload, nacks in self.nacks.items():
            for (nacked_at, delay), handed_at in zip(nacks, self.handouts[payload][1:], strict=False):
                too_early_ms = (nacked_at + delay / 1000 - handed_at) * 1000
                if too_early_ms > early_ms:
                    early[payload] = (delay, round(too_early_ms, 1))
        if early:
            found[
                f"{len(early)} redeliveries handed out more than {early_ms:g} ms early (delay ms, ms early)"
            ] = _some(early)
        if leftovers:
            acked = sum(1 for p in leftovers if p in self.acked_at)
            found[
                f"a fresh consumer of the subscription got {len(leftovers)} messages "
                f"({acked} of them acked by the app)"
            ] = sorted(leftovers)[:10]
        return found


def _some(mapping: dict[Any, Any], count: int = 8) -> dict[Any, Any]:
    return dict(sorted(mapping.items())[:count])


def describe(problems: dict[str, Any]) -> str:
    return "\n".join(f"{kind}: {detail}" for kind, detail in problems.items())


# -- how the application consumes ---------------------------------------------------------------------


def run_threads(
    consumer: Any, journal: Journal, receivers: int = 8, ackers: int = 2, timeout_s: float = 30.0,
    grace_s: float = 2.0,
) -> float:  # fmt: skip
    """``receivers`` threads ``receive(timeout)`` and hand messages to ``ackers`` threads through a queue,
    which act on them by the plan; until every payload's final ack plus ``grace_s`` (late duplicates and
    redeliveries of nacks after acks would show up then), or ``timeout_s``. Returns the elapsed seconds."""
    work: queue.Queue[tuple[Any, float]] = queue.Queue()
    stop = threading.Event()

    def receive_loop() -> None:
        while not stop.is_set():
            try:
                message = consumer.receive(100)
            except pulsar.Timeout:
                continue
            except Exception as exc:  # recorded, asserted on the test thread
                journal.errors.append(f"receive: {exc!r}")
                return
            work.put((message, time.monotonic()))

    def ack_loop() -> None:
        while not (stop.is_set() and work.empty()):
            try:
                message, received_at = work.get(timeout=0.1)
            except queue.Empty:
                continue
            journal.handle(consumer, message, received_at)

    threads = [threading.Thread(target=receive_loop, daemon=True) for _ in range(receivers)]
    threads += [threading.Thread(target=ack_loop, daemon=True) for _ in range(ackers)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    journal.finished.wait(timeout_s)
    time.sleep(grace_s)
    stop.set()
    for thread in threads:
        thread.join(10)
    return time.monotonic() - started


def entries_of(messages: Iterable[Any]) -> dict[tuple[str, int, int], list[int]]:
    """(topic, ledger, entry) → batch indexes seen."""
    entries: dict[tuple[str, int, int], list[int]] = defaultdict(list)
    for message in messages:
        mid = message.message_id()
        entries[(message.topic_name(), mid.ledger_id(), mid.entry_id())].append(mid.batch_index())
    return entries


def close_then_leftover(consumer: Any, official_client: Any, topic: str | list[str]) -> list[bytes]:
    """Close the wrapper, then what a fresh official consumer of its subscription gets (should be none)."""
    consumer.close()
    return leftover(official_client, topic, SUB)


# -- 1. exactly once under concurrency ----------------------------------------------------------------


def _exactly_once_under_threads(
    nack_client: Client, pulsar_client: Any, topic: str, batching: bool, count: int, seed: int,
    **subscribe_kwargs: Any,
) -> None:  # fmt: skip
    rng = random.Random(seed)
    plans = random_plans((f"m{i}".encode() for i in range(count)), rng)
    journal = Journal(plans)
    consumer = nack_client.subscribe(topic, SUB, consumer_type=SHARED, **subscribe_kwargs)
    if batching:
        bursts = produce_bursts(nack_client, topic, count, rng, max_batch=100)
        assert max(bursts) > 90 and min(bursts) < 5, f"batch sizes from 1 to 100: {bursts}"
    else:
        producer = nack_client.create_producer(topic, block_if_queue_full=True)
        for i in range(count):
            producer.send_async(f"m{i}".encode(), None)
        producer.flush()
        producer.close()
    elapsed = run_threads(consumer, journal)
    leftovers = close_then_leftover(consumer, pulsar_client, topic)
    problems = journal.problems(leftovers=leftovers)
    assert not problems, f"after {elapsed:.1f} s:\n{describe(problems)}"


@pytest.mark.parametrize("batching", [False, True], ids=["single", "batched"])
def test_exactly_once_with_8_receivers_and_2_ackers(
    nack_client: Client, pulsar_client: Any, unique_topic: str, batching: bool
) -> None:
    """3,000 payloads (batched: bursts of 1-100 messages), Shared; 8 threads receive, 2 threads ack or
    nack by a seeded plan — ack, nack once / twice then ack, ack then nack — with per-call delays of
    0.1-1.5 s. Every payload is handed out exactly 1 + (its nacks before the ack) times, never after the
    app acked it (an ack-then-nack included: the official client brings such a message back with its
    batch when a sibling is unacked; the wrapper must not), never early; then the backlog is empty."""
    _exactly_once_under_threads(nack_client, pulsar_client, unique_topic, batching, count=3000, seed=9)


@pytest.mark.apache_only
def test_exactly_once_with_8_receivers_and_batch_index_acks(
    nack_client: Client, pulsar_client: Any, unique_topic: str
) -> None:
    """The same with ``batch_index_ack_enabled=True`` (the broker acks single messages of a batch;
    pulsar-lite loses messages with it)."""
    _exactly_once_under_threads(
        nack_client, pulsar_client, unique_topic, True, count=3000, seed=93, batch_index_ack_enabled=True
    )


# -- 2. a message listener that nacks ------------------------------------------------------------------


def test_message_listener_that_nacks_first_sight_hands_out_each_message_twice(
    nack_client: Client, pulsar_client: Any, unique_topic: str
) -> None:
    """1,000 messages in batches of 1-100; the listener nacks the first sight of each (0.1-0.8 s) and acks
    the second: exactly two hand-outs per message, the second not early; drained afterwards."""
    rng = random.Random(2)
    count = 1000
    journal = Journal({f"m{i}".encode(): Plan((rng.randint(100, 800),)) for i in range(count)})
    consumer = nack_client.subscribe(
        unique_topic,
        SUB,
        consumer_type=SHARED,
        message_listener=lambda c, m: journal.handle(c, m, time.monotonic()),
    )
    produce_bursts(nack_client, unique_topic, count, rng)
    journal.finished.wait(30)
    time.sleep(1.5)  # duplicates would show up meanwhile
    problems = journal.problems(leftovers=close_then_leftover(consumer, pulsar_client, unique_topic))
    assert not problems, describe(problems)


# -- 3. batch_receive ---------------------------------------------------------------------------------


def test_batch_receive_exactly_once(nack_client: Client, pulsar_client: Any, unique_topic: str) -> None:
    """1,500 messages in batches of 1-100, ``batch_receive`` with a policy of up to 50 messages / 100 ms;
    the seeded mix of ack / nack once or twice / ack then nack: exactly once, never early, drained."""
    rng = random.Random(3)
    count = 1500
    journal = Journal(random_plans((f"m{i}".encode() for i in range(count)), rng, 100, 1000))
    consumer = nack_client.subscribe(
        unique_topic,
        SUB,
        consumer_type=SHARED,
        batch_receive_policy=pulsar.ConsumerBatchReceivePolicy(50, 1024 * 1024, 100),
    )
    produce_bursts(nack_client, unique_topic, count, rng)
    deadline = time.monotonic() + 30
    end = float("inf")
    sizes: Counter[int] = Counter()
    while (now := time.monotonic()) < min(deadline, end):
        messages = consumer.batch_receive()
        received_at = time.monotonic()
        sizes[len(messages)] += 1
        for message in messages:
            journal.handle(consumer, message, received_at)
        if end == float("inf") and journal.finished.is_set():
            end = now + 2.0
    assert max(sizes) > 1, f"batch_receive handed out one message at a time: {sizes}"
    problems = journal.problems(leftovers=close_then_leftover(consumer, pulsar_client, unique_topic))
    assert not problems, describe(problems)


# -- 4. siblings of a batch are never early (issue 9, finding 2) --------------------------------------

#: m0's delays, one consumer each (twice: one receiving promptly, one busy). A sibling's copy handed out
#: shortly before m0's due time is what must not count as m0's redelivery; these delays put m1's copy
#: (~100 ms after its nack) at every distance from it.
SIBLING_DELAYS_MS = [*range(110, 471, 20), 1500]
SIBLING_TRIALS = 6  # batches per consumer, nacked 300 ms apart
BUSY_PAUSE_S = 0.25  # a busy application: each time its queue is empty, it comes back 250 ms later


@pytest.mark.parametrize("rounding", ["floor", "ceil"])
def test_batch_siblings_are_never_handed_out_early(
    nack_client: Client, pulsar_client: Any, unique_topic: str, rounding: Rounding
) -> None:
    """Two consumers per delay D (110-470 ms in steps of 20, and 1500), each on a topic of 6 batches of 10;
    one receives promptly, one is busy (it receives only every 250 ms, so copies wait in its queue). In
    each batch m1 is nacked with ``delay_ms=0``, then m0 with D; the other 8 are acked. The copy of the
    entry that m1's nack brings back must not count as m0's redelivery: m0 is handed out no sooner than
    its nack + D − 2^k ms (floor) / + D (ceil). Batches are nacked 300 ms apart and consumers 13 ms apart,
    so due times fall at all points of the 2^k-ms buckets. Every m0 and m1 comes back exactly once,
    nothing else does; drained afterwards."""
    setups = [(delay, mode) for mode in ("prompt", "busy") for delay in SIBLING_DELAYS_MS]
    topics = [f"{unique_topic}-{mode}-{delay}" for delay, mode in setups]
    consumers = [
        nack_client.subscribe(topic, SUB, consumer_type=SHARED, negative_ack_rounding=rounding)
        for topic in topics
    ]
    firsts: list[dict[bytes, Any]] = []
    schedule: list[tuple[float, int, bytes, int]] = []  # (s from the start, consumer, payload, delay ms)
    for c, (topic, consumer, (delay, _)) in enumerate(zip(topics, consumers, setups, strict=True)):
        produce_bursts(nack_client, topic, 10 * SIBLING_TRIALS, batch_size=10)
        first = {m.data(): m for m in receive_all(consumer, 10 * SIBLING_TRIALS)}
        assert len(entries_of(first.values())) == SIBLING_TRIALS, "batches of 10"
        firsts.append(first)
        for b in range(SIBLING_TRIALS):
            for i in range(2, 10):
                consumer.acknowledge(first[f"m{10 * b + i}".encode()])
            at = 0.3 * b + 0.013 * c
            schedule += [(at, c, f"m{10 * b + 1}".encode(), 0), (at, c, f"m{10 * b}".encode(), delay)]
    handouts: list[dict[bytes, list[float]]] = [defaultdict(list) for _ in consumers]
    errors: list[str] = []
    stop = threading.Event()

    def receive_loop(c: int) -> None:
        consumer, busy = consumers[c], setups[c][1] == "busy"
        while not stop.is_set():
            try:
                message = consumer.receive(20 if busy else 100)
            except pulsar.Timeout:
                if busy:
                    time.sleep(BUSY_PAUSE_S)
                continue
            except Exception as exc:  # recorded, asserted on the test thread
                errors.append(repr(exc))
                return
            handouts[c][message.data()].append(time.monotonic())
            consumer.acknowledge(message)

    threads = [threading.Thread(target=receive_loop, args=(c,), daemon=True) for c in range(len(consumers))]
    for thread in threads:
        thread.start()
    nacked: dict[tuple[int, bytes], tuple[float, int]] = {}
    start = time.monotonic() + 0.05
    for at, c, payload, delay in sorted(schedule, key=lambda s: s[0]):  # stable: m1 before m0
        while (wait := start + at - time.monotonic()) > 0:
            time.sleep(min(wait, 0.002))
        nacked[(c, payload)] = (time.monotonic(), delay)
        consumers[c].negative_acknowledge(firsts[c][payload], delay_ms=delay)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(p not in handouts[c] for c, p in nacked):
        time.sleep(0.05)
    time.sleep(1.0)  # duplicates would show up meanwhile
    stop.set()
    for thread in threads:
        thread.join(10)
    bound_ms = FLOOR_EARLY_MS if rounding == "floor" else CEIL_EARLY_MS
    problems: dict[str, Any] = {}
    if errors:
        problems["errors on the receiving threads"] = errors[:5]
    counts = {
        (*setups[c], p): len(times)
        for c, received in enumerate(handouts)
        for p, times in received.items()
        if len(times) != 1 or (c, p) not in nacked
    }
    counts.update({(*setups[c], p): 0 for c, p in nacked if p not in handouts[c]})
    if counts:
        problems["hand-outs ((m0's delay, mode, payload): count), once per nacked message, else never"] = (
            _some(counts, 12)
        )
    early = {}
    for (c, payload), (nacked_at, delay) in nacked.items():
        for handed_at in handouts[c].get(payload, ()):
            if (too_early_ms := (nacked_at + delay / 1000 - handed_at) * 1000) > bound_ms:
                early[(delay, setups[c][1], payload)] = round(too_early_ms, 1)
    if early:
        kind = f"{len(early)} handed out more than {bound_ms:g} ms early ({rounding})"
        problems[f"{kind}; (m0's delay, mode, payload): ms early"] = _some(early, 12)
    for consumer in consumers:
        consumer.close()
    if leftovers := leftover(pulsar_client, topics, SUB):
        problems["a fresh consumer of the subscriptions got"] = sorted(leftovers)[:10]
    assert not problems, describe(problems)


# -- 5. multi-topic, partitioned and regex consumers ------------------------------------------------


def _exactly_once_on_topics(
    nack_client: Client, pulsar_client: Any, subscribe_to: Any, produce_to: list[str], drain_from: Any,
    per_topic: int, seed: int, **subscribe_kwargs: Any,
) -> None:  # fmt: skip
    rng = random.Random(seed)
    consumer = nack_client.subscribe(subscribe_to, SUB, consumer_type=SHARED, **subscribe_kwargs)
    payloads: list[bytes] = []
    for t, topic in enumerate(produce_to):
        prefix = f"{'abcdefgh'[t]}-"
        produce_bursts(nack_client, topic, per_topic, rng, prefix=prefix)
        payloads += [f"{prefix}{i}".encode() for i in range(per_topic)]
    journal = Journal(random_plans(payloads, rng))
    elapsed = run_threads(consumer, journal)
    problems = journal.problems(leftovers=close_then_leftover(consumer, pulsar_client, drain_from))
    assert not problems, f"after {elapsed:.1f} s:\n{describe(problems)}"
    assert len(journal.topics) == 3, f"messages from 3 topics / partitions: {journal.topics}"


def test_multi_topic_consumer_exactly_once(
    nack_client: Client, pulsar_client: Any, unique_topic: str
) -> None:
    """A consumer of a list of 3 topics, 600 messages each in batches of 1-100, the threads and mixed plan
    of the first test: exactly once, never early, drained."""
    topics = [f"{unique_topic}-{c}" for c in "abc"]
    _exactly_once_on_topics(nack_client, pulsar_client, topics, topics, topics, per_topic=600, seed=5)


@pytest.mark.apache_only
def test_partitioned_topic_exactly_once(
    nack_client: Client, pulsar_client: Any, apache_pulsar: PulsarStandalone, unique_topic: str
) -> None:
    """A topic of 3 partitions, 1,800 messages in batches of 1-100: exactly once, never early, drained."""
    apache_pulsar.create_partitioned_topic(unique_topic, 3)
    _exactly_once_on_topics(
        nack_client, pulsar_client, unique_topic, [unique_topic], unique_topic, per_topic=1800, seed=6
    )


@pytest.mark.apache_only
def test_regex_consumer_exactly_once(nack_client: Client, pulsar_client: Any, unique_topic: str) -> None:
    """A pattern subscription over 3 topics (created first, read from the earliest), 600 messages each in
    batches of 1-100: exactly once, never early, drained."""
    topics = [f"{unique_topic}-r{i}" for i in range(3)]
    for topic in topics:  # the pattern consumer finds existing topics only
        nack_client.create_producer(topic).close()
    _exactly_once_on_topics(
        nack_client, pulsar_client, re.compile(re.escape(unique_topic) + "-r.*"), topics, topics,
        per_topic=600, seed=7, initial_position=pulsar.InitialPosition.Earliest,
    )  # fmt: skip


# -- 6. seek --------------------------------------------------------------------------------------------


def collect(consumer: Any, count: int, timeout_s: float, idle_s: float = 0.0) -> list[tuple[bytes, float]]:
    """(payload, hand-out time) of up to ``count`` messages, each acked, within ``timeout_s`` — or until
    nothing arrived for ``idle_s`` (if given)."""
    got: list[tuple[bytes, float]] = []
    deadline = time.monotonic() + timeout_s
    quiet_until = time.monotonic() + idle_s if idle_s else deadline
    while len(got) < count and (remaining := min(deadline, quiet_until) - time.monotonic()) > 0:
        try:
            message = consumer.receive(max(1, min(int(remaining * 1000), 200)))
        except pulsar.Timeout:
            continue
        got.append((message.data(), time.monotonic()))
        consumer.acknowledge(message)
        if idle_s:
            quiet_until = time.monotonic() + idle_s
    return got


def in_order(messages: Iterable[Any]) -> list[Any]:
    return sorted(messages, key=lambda m: int(m.data()[1:]))


def side_by_side(
    pulsar_client: Any, nack_client: Client, topic: str, run: Callable[[str, Any, str], dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """``run(name, client, topic)`` for the official client and the wrapper at once, each on a topic of its
    own; each result also gets what a fresh official consumer of that subscription receives afterwards
    (``"leftover"``). Assertions belong on the test thread, after this returns."""

    def one(name: str, client: Any) -> dict[str, Any]:
        result = run(name, client, f"{topic}-{name}")
        result["leftover"] = leftover(pulsar_client, f"{topic}-{name}", SUB)
        return result

    sides = {"official": pulsar_client, "wrapper": nack_client}
    with ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(one, name, client) for name, client in sides.items()}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.apache_only
def test_seek_to_earliest_hands_out_everything_again_like_the_official_consumer(
    nack_client: Client, pulsar_client: Any, unique_topic: str
) -> None:
    """Issue 9, finding 3: two batches of 10, ack m0..m14, ``seek(MessageId.earliest)``: the official
    consumer gets all 20 again, once each; so must the wrapper (run side by side on one broker). Acking
    them all then drains both subscriptions."""

    def run(name: str, client: Any, topic: str) -> dict[str, Any]:
        consumer = client.subscribe(topic, SUB, consumer_type=SHARED)
        produce_bursts(client, topic, 20, batch_size=10)
        first = in_order(receive_all(consumer, 20))
        for message in first[:15]:
            consumer.acknowledge(message)
        consumer.seek(pulsar.MessageId.earliest)
        got = collect(consumer, 40, 10.0, idle_s=1.5)  # then duplicates would show up (all acked by now)
        consumer.close()
        return {"entries": len(entries_of(first)), "again": dict(Counter(p for p, _ in got))}

    results = side_by_side(pulsar_client, nack_client, unique_topic, run)
    everything = dict(Counter(f"m{i}".encode() for i in range(20)))
    official, wrapper = results["official"], results["wrapper"]
    assert official == {"entries": 2, "again": everything, "leftover": []}, f"premise: official {official}"
    assert wrapper == official, f"wrapper {wrapper}"


@pytest.mark.apache_only
def test_seek_drops_pending_nacks(nack_client: Client, pulsar_client: Any, unique_topic: str) -> None:
    """m4 of two batches of 10 is nacked with a 3 s delay, the other 19 acked, then
    ``seek(MessageId.earliest)``: all 20 are handed out again at once (m4 is not held back for the nack
    from before the seek), once each; after acking them, nothing comes back (not when the old nack would
    have been due, 3 s + margin), and the subscription is drained. The official consumer, side by side,
    does the same (its pending nack survives the seek, but m4 is acked by then)."""

    def run(name: str, client: Any, topic: str) -> dict[str, Any]:
        if name == "official":
            consumer = client.subscribe(
                topic, SUB, consumer_type=SHARED, negative_ack_redelivery_delay_ms=3000
            )
        else:
            consumer = client.subscribe(topic, SUB, consumer_type=SHARED)
        produce_bursts(client, topic, 20, batch_size=10)
        first = in_order(receive_all(consumer, 20))
        nacked_at = time.monotonic()
        if name == "official":
            consumer.negative_acknowledge(first[4])
        else:
            consumer.negative_acknowledge(first[4], delay_ms=3000)
        for message in first[:4] + first[5:]:
            consumer.acknowledge(message)
        consumer.seek(pulsar.MessageId.earliest)
        got = collect(consumer, 20, 2.0)  # well before the old nack's due time (3 s after nacked_at)
        later = collect(consumer, 20, nacked_at + 3.0 + 1.5 - time.monotonic())
        consumer.close()
        return {"again": dict(Counter(p for p, _ in got)), "later": [p for p, _ in later]}

    results = side_by_side(pulsar_client, nack_client, unique_topic, run)
    expected = {"again": dict(Counter(f"m{i}".encode() for i in range(20))), "later": [], "leftover": []}
    official, wrapper = results["official"], results["wrapper"]
    assert official == expected, f"premise: official {official}"
    assert wrapper == expected, f"wrapper {wrapper}"


# -- 7. redeliver_unacknowledged_messages -----------------------------------------------------------


@pytest.mark.parametrize("batching", [False, True], ids=["single", "batched"])
def test_redeliver_unacknowledged_messages_like_the_official_consumer(
    nack_client: Client, pulsar_client: Any, unique_topic: str, batching: bool
) -> None:
    """20 messages (batched: two batches of 10), ack m0..m14, ``redeliver_unacknowledged_messages()``:
    the official consumer gets m15..m19 again (batched: m10..m19, whole entries). The wrapper must hand
    out m15..m19 again, once each, and nothing the official consumer does not; acking them drains."""

    def run(name: str, client: Any, topic: str) -> dict[str, Any]:
        consumer = client.subscribe(topic, SUB, consumer_type=SHARED)
        if batching:
            produce_bursts(client, topic, 20, batch_size=10)
        else:
            producer = client.create_producer(topic)
            for i in range(20):
                producer.send(f"m{i}".encode())
            producer.close()
        first = in_order(receive_all(consumer, 20))
        for message in first[:15]:
            consumer.acknowledge(message)
        time.sleep(0.3)  # the acks reach the broker (grouped for 100 ms)
        consumer.redeliver_unacknowledged_messages()
        got = collect(consumer, 40, 10.0, idle_s=1.5)
        consumer.close()
        return {"again": dict(Counter(p for p, _ in got))}

    results = side_by_side(pulsar_client, nack_client, unique_topic, run)
    official, wrapper = results["official"], results["wrapper"]
    unacked = {f"m{i}".encode() for i in range(15, 20)}
    assert set(official["again"]) >= unacked and official["leftover"] == [], f"premise: official {official}"
    assert (
        unacked <= set(wrapper["again"]) <= set(official["again"])
        and max(wrapper["again"].values()) == 1
        and wrapper["leftover"] == []
    ), f"wrapper {wrapper}, official {official}"


# -- 8. many open batches, no silent limit ------------------------------------------------------------


def test_many_open_batches_drain_without_a_silent_limit(
    nack_client: Client, pulsar_client: Any, unique_topic: str
) -> None:
    """Issue 9, finding 4, sized for a test: 20,000 messages in 2,000 batches of 10, all received first
    (9 of each batch acked, m…7 held), then the 2,000 held ones nacked (0.5 s) — 2,000 batches open at once.
    Each nacked message comes back exactly once, not early, and is acked; nothing acked comes back;
    a fresh consumer afterwards gets nothing."""
    count, batch, nacked_index = 20_000, 10, 7
    consumer = nack_client.subscribe(unique_topic, SUB, consumer_type=SHARED)
    produce_bursts(nack_client, unique_topic, count, batch_size=batch)
    deadline = time.monotonic() + 60
    first: Counter[bytes] = Counter()
    held = []
    while sum(first.values()) < count and time.monotonic() < deadline:
        try:
            message = consumer.receive(1000)
        except pulsar.Timeout:
            continue
        payload = message.data()
        first[payload] += 1
        if int(payload[1:]) % batch == nacked_index:
            held.append(message)
        else:
            consumer.acknowledge(message)
    assert len(first) == count and max(first.values()) == 1, (
        f"first pass: {len(first)} of {count} distinct, max {max(first.values())} copies"
    )
    assert {m.message_id().batch_index() for m in held} == {nacked_index}, "batches of 10, as produced"
    nacked_at = time.monotonic()
    for message in held:
        consumer.negative_acknowledge(message, delay_ms=500)
    expected = {m.data() for m in held}
    handouts: dict[bytes, list[float]] = defaultdict(list)
    deadline = time.monotonic() + 30
    end = float("inf")
    while (now := time.monotonic()) < min(deadline, end):
        try:
            message = consumer.receive(100)
        except pulsar.Timeout:
            pass
        else:
            handouts[message.data()].append(time.monotonic())
            consumer.acknowledge(message)
        if end == float("inf") and len(handouts) >= len(expected):
            end = now + 1.5  # duplicates and acked siblings would show up meanwhile
    problems: dict[str, Any] = {}
    missing = sorted(expected - set(handouts))
    if missing:
        problems[f"{len(missing)} nacked messages never came back"] = missing[:10]
    twice = {p: len(ts) for p, ts in handouts.items() if p in expected and len(ts) > 1}
    if twice:
        problems[f"{len(twice)} nacked messages came back more than once"] = _some(twice)
    acked_again = sorted(p for p in handouts if p not in expected)
    if acked_again:
        problems[f"{len(acked_again)} acked messages handed out again"] = acked_again[:10]
    early = sorted(p for p, ts in handouts.items() if (ts[0] - nacked_at) * 1000 < 500 - FLOOR_EARLY_MS)
    if early:
        problems[f"{len(early)} redeliveries more than {FLOOR_EARLY_MS:g} ms early"] = early[:10]
    leftovers = close_then_leftover(consumer, pulsar_client, unique_topic)
    if leftovers:
        problems[f"a fresh consumer of the subscription got {len(leftovers)}"] = sorted(leftovers)[:10]
    assert not problems, describe(problems)


def test_closing_right_after_the_last_ack_leaves_nothing_unacked(
    nack_client: Client, pulsar_client: Any, unique_topic: str
) -> None:
    """The application acks the redelivered message of a batch and closes at once, before the other
    messages of the redelivered copy are even taken from the queue: the entry is still acked at the
    broker (the wrapper acks the whole entry once every message of it is acked)."""
    consumer = nack_client.subscribe(unique_topic, "sub", consumer_type=SHARED)
    produce_bursts(pulsar_client, unique_topic, 10, batch_size=10)
    first = receive_all(consumer, 10)
    for message in first:
        if message.data().endswith(b"3"):
            consumer.negative_acknowledge(message, delay_ms=0)
        else:
            consumer.acknowledge(message)
    again = receive_all(consumer, 1, timeout_s=10)
    assert again[0].data().endswith(b"3")
    consumer.acknowledge(again[0])
    consumer.close()
    left = leftover(pulsar_client, unique_topic, "sub")
    assert not left, f"a fresh consumer of the subscription got {left}"
