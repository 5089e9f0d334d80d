"""NackConsumer against real brokers: the behaviours the official clients' suites assert, ported.

Shared subscriptions, non-partitioned and multi-topic, batching on and off (pulsar-lite serves these;
each test runs against Apache Pulsar too). Timing bounds are generous: these machines are shared.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pulsar
import pytest
from messaging import nothing_more, produce, receive_all

import pulsar_nack
from pulsar_nack import Client, DelayLimitExceeded, MultiplierRedeliveryBackoff, NackConsumer

SHARED = pulsar.ConsumerType.Shared


def subscribe(nack_client: Client, topic: str | list[str], **kwargs: Any) -> NackConsumer:
    kwargs.setdefault("consumer_type", SHARED)
    return nack_client.subscribe(topic, "sub", **kwargs)


@pytest.mark.parametrize("batching", [False, True], ids=["single", "batched"])
@pytest.mark.parametrize("delay_ms", [100, 0])
def test_nack_by_message_and_by_id_all_come_back_once(
    nack_client: Client, unique_topic: str, batching: bool, delay_ms: int
) -> None:
    """Java J1: 20 messages, 10 nacked by message and 10 by id; all 20 back as a set, then nothing."""
    consumer = subscribe(nack_client, unique_topic, negative_ack_redelivery_delay_ms=delay_ms)
    produce(nack_client, unique_topic, 20, batching)
    first = receive_all(consumer, 20)
    for i, message in enumerate(first):
        consumer.negative_acknowledge(message if i % 2 else message.message_id())
    again = receive_all(consumer, 20)
    assert sorted(m.data() for m in again) == sorted(m.data() for m in first)
    for message in again:
        consumer.acknowledge(message)
    nothing_more(consumer)
    stats = consumer.nack_stats()
    assert stats.nacked == 20 and stats.pending == 0 and stats.redelivered == 20
    consumer.close()


def test_nack_stats_measures_memory_only_when_asked(
    nack_client: Client, unique_topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``nack_stats()`` is cheap: it never walks the index, and says so (``memory_bytes`` None, not 0);
    ``with_memory=True`` measures."""
    consumer = subscribe(nack_client, unique_topic, negative_ack_redelivery_delay_ms=60_000)
    produce(nack_client, unique_topic, 3, batching=False)
    for message in receive_all(consumer, 3):
        consumer.negative_acknowledge(message)
    measured = consumer.nack_stats(with_memory=True).memory_bytes
    assert measured is not None and measured > 0
    index = consumer._nacks.tracker.index

    def no_walk() -> None:
        raise AssertionError("nack_stats() walked the index")

    monkeypatch.setattr(index, "memory_usage", no_walk)
    stats = consumer.nack_stats()
    assert stats.memory_bytes is None and stats.pending == 3
    with pytest.raises(AssertionError, match="walked"):
        consumer.nack_stats(with_memory=True)
    consumer.close()


def test_nacked_messages_come_back_in_order_then_nothing(nack_client: Client, unique_topic: str) -> None:
    """C++/Python: 10 nacked messages come back in order."""
    consumer = subscribe(nack_client, unique_topic, negative_ack_redelivery_delay_ms=300)
    produce(nack_client, unique_topic, 10, batching=False)
    for message in receive_all(consumer, 10):
        consumer.negative_acknowledge(message)
    again = receive_all(consumer, 10)
    assert [m.data() for m in again] == [f"m{i}".encode() for i in range(10)]
    for message in again:
        consumer.acknowledge(message)
    nothing_more(consumer)
    consumer.close()


@pytest.mark.parametrize("batching", [False, True], ids=["single", "batched"])
def test_ack_even_nack_odd_brings_back_exactly_the_odd_ones(
    nack_client: Client, unique_topic: str, batching: bool
) -> None:
    """Go: 100 messages, nack the odd ones, ack the even ones -> exactly the odd ones, in order.

    With batching, a redelivered batch must not hand out its acked (even) siblings again.
    """
    consumer = subscribe(nack_client, unique_topic, negative_ack_redelivery_delay_ms=300)
    produce(nack_client, unique_topic, 100, batching)
    for i, message in enumerate(receive_all(consumer, 100)):
        assert message.data() == f"m{i}".encode()
        if i % 2:
            consumer.negative_acknowledge(message)
        else:
            consumer.acknowledge(message)
    again = receive_all(consumer, 50)
    assert [m.data() for m in again] == [f"m{i}".encode() for i in range(1, 100, 2)]
    for message in again:
        consumer.acknowledge(message)
    nothing_more(consumer)
    consumer.close()
    successor = subscribe(nack_client, unique_topic)  # and every entry was acked at the broker
    nothing_more(successor, 1500)
    successor.close()


def test_batch_siblings_with_different_due_times_come_back_separately(
    nack_client: Client, unique_topic: str
) -> None:
    """Java J4, the PIP-393 headline case: nack msg0 at 0 and msg1 at 2 s, delay 3 s -> msg0 at ~3 s,
    msg1 at ~5 s, each exactly once (the native client brings both back twice, or both at 5 s)."""
    consumer = subscribe(nack_client, unique_topic, negative_ack_redelivery_delay_ms=3000)
    produce(nack_client, unique_topic, 2, batching=True)
    m0, m1 = receive_all(consumer, 2)
    assert m0.message_id().entry_id() == m1.message_id().entry_id(), "both in one batch"
    start = time.monotonic()
    consumer.negative_acknowledge(m0)
    time.sleep(2.0)
    nacked_m1 = time.monotonic()
    consumer.negative_acknowledge(m1)
    first = receive_all(consumer, 1)[0]
    first_at = time.monotonic() - start
    consumer.acknowledge(first)
    second = receive_all(consumer, 1)[0]
    second_at = time.monotonic() - nacked_m1
    consumer.acknowledge(second)
    assert first.data() == b"m0" and second.data() == b"m1"
    width = 2**8 / 1000
    assert 3.0 - width <= first_at <= 3.0 + 0.5
    assert 3.0 - width <= second_at <= 3.0 + 0.5
    nothing_more(consumer)
    consumer.close()


@pytest.mark.parametrize("rounding", ["floor", "ceil"])
def test_precision_bounds_for_k_1_to_12(nack_client: Client, unique_topic: str, rounding: str) -> None:
    """Java J6 / Go: with precision k and delay 5000 ms, floor rounding (Java's) redelivers at most 2^k ms
    early and (generous bound) not more than 500 ms late; ceil (the default) never early and at most 2^k ms
    + 500 late. All k run at once, one consumer each. The delay is above 2^12, so the lower bound means
    something for every k (the native minimum, 100 ms, is the floor in any case)."""
    delay = 5000
    consumers: dict[int, NackConsumer] = {}
    for k in range(1, 13):
        topic = f"{unique_topic}-k{k}"
        consumers[k] = subscribe(
            nack_client,
            topic,
            negative_ack_redelivery_delay_ms=delay,
            negative_ack_precision_bit_cnt=k,
            negative_ack_rounding=rounding,
        )
        produce(nack_client, topic, 2, batching=False)
    nacked_at: dict[tuple[int, bytes], float] = {}
    for k, consumer in consumers.items():
        for message in receive_all(consumer, 2):
            nacked_at[(k, message.data())] = time.monotonic()
            consumer.negative_acknowledge(message)
    for k, consumer in consumers.items():
        low, high = (delay - 2**k, delay + 500) if rounding == "floor" else (delay, delay + 2**k + 500)
        for message in receive_all(consumer, 2, timeout_s=30):
            elapsed_ms = (time.monotonic() - nacked_at[(k, message.data())]) * 1000
            assert max(low, 100) <= elapsed_ms <= high, (k, elapsed_ms)
            consumer.acknowledge(message)
    for consumer in consumers.values():
        consumer.close()


def test_backoff_grows_with_redelivery_count(nack_client: Client, unique_topic: str) -> None:
    """Java J2: Multiplier(min 100, max 1000), 10 messages, 5 rounds of nacks: elapsed >= sum of
    next(0..4) = 2500 ms (ceil rounding: never early); the same set every round; nothing extra."""
    backoff = MultiplierRedeliveryBackoff(100, 1000)
    consumer = subscribe(
        nack_client, unique_topic, negative_ack_redelivery_backoff=backoff, negative_ack_rounding="ceil"
    )
    produce(nack_client, unique_topic, 10, batching=False)
    messages = receive_all(consumer, 10)
    start = time.monotonic()
    for round_ in range(5):
        for message in messages:
            assert message.redelivery_count() == round_
            consumer.negative_acknowledge(message)
        messages = receive_all(consumer, 10)
        assert sorted(m.data() for m in messages) == [f"m{i}".encode() for i in range(10)]
    elapsed_ms = (time.monotonic() - start) * 1000
    assert elapsed_ms >= sum(backoff.next(n) for n in range(5))
    for message in messages:
        consumer.acknowledge(message)
    nothing_more(consumer)
    consumer.close()


def test_redelivery_count_after_nacks_by_message_and_by_id(nack_client: Client, unique_topic: str) -> None:
    """C++/Python: nack 4 times, alternating the message and its id: the last copy has count 3."""
    consumer = subscribe(nack_client, unique_topic, negative_ack_redelivery_delay_ms=100)
    produce(nack_client, unique_topic, 1, batching=False)
    message = receive_all(consumer, 1)[0]
    for i in range(3):
        consumer.negative_acknowledge(message if i % 2 else message.message_id())
        message = receive_all(consumer, 1)[0]
    assert message.redelivery_count() == 3
    consumer.acknowledge(message)
    consumer.close()


def test_per_call_delay_overrides_default_and_backoff(nack_client: Client, unique_topic: str) -> None:
    consumer = subscribe(
        nack_client,
        unique_topic,
        negative_ack_redelivery_delay_ms=60_000,
        negative_ack_redelivery_backoff=MultiplierRedeliveryBackoff(30_000, 60_000),
    )
    produce(nack_client, unique_topic, 3, batching=False)
    nacked = time.monotonic()
    for i, message in enumerate(receive_all(consumer, 3)):
        consumer.negative_acknowledge(message, delay_ms=300 * (3 - i))  # m2 first, m0 last
    again = receive_all(consumer, 3)
    assert [m.data() for m in again] == [b"m2", b"m1", b"m0"]
    assert time.monotonic() - nacked < 5, "the per-call delay, not 30-60 s"
    for message in again:
        consumer.acknowledge(message)
    consumer.close()


def test_multi_topic_consumer_redelivers_with_topics(nack_client: Client, unique_topic: str) -> None:
    topics = [f"{unique_topic}-a", f"{unique_topic}-b", f"{unique_topic}-c"]
    consumer = subscribe(nack_client, topics, negative_ack_redelivery_delay_ms=200)
    for topic in topics:
        produce(nack_client, topic, 4, batching=False, prefix=topic[-1])
    first = receive_all(consumer, 12)
    for i, message in enumerate(first):  # by message and by id (the id's topic is known from delivery)
        consumer.negative_acknowledge(message if i % 2 else message.message_id())
    again = receive_all(consumer, 12)
    assert sorted((m.topic_name(), m.data()) for m in again) == sorted(
        (m.topic_name(), m.data()) for m in first
    )
    for message in again:
        consumer.acknowledge(message)
    nothing_more(consumer)
    consumer.close()


def test_message_listener_gets_the_nack_consumer(nack_client: Client, unique_topic: str) -> None:
    seen: list[tuple[bytes, int]] = []
    done = threading.Event()

    def listener(consumer: Any, message: pulsar.Message) -> None:
        assert isinstance(consumer, NackConsumer)
        seen.append((message.data(), message.redelivery_count()))
        if message.redelivery_count() == 0:
            consumer.negative_acknowledge(message, delay_ms=200)
        else:
            consumer.acknowledge(message)
            if len(seen) == 6:
                done.set()

    consumer = subscribe(nack_client, unique_topic, message_listener=listener)
    produce(nack_client, unique_topic, 3, batching=False)
    assert done.wait(15)
    assert sorted(seen) == sorted([(f"m{i}".encode(), c) for i in range(3) for c in (0, 1)])
    assert consumer.nack_stats().redelivered == 3
    consumer.close()


def test_early_redelivery_is_held_back_until_due(nack_client: Client, unique_topic: str) -> None:
    """The broker redelivering everything unacked (as after a reconnect) must not bring a pending nack
    back early: it comes back when due, once."""
    consumer = subscribe(nack_client, unique_topic, negative_ack_redelivery_delay_ms=2500)
    produce(nack_client, unique_topic, 3, batching=False)
    messages = receive_all(consumer, 3)
    nacked = time.monotonic()
    consumer.negative_acknowledge(messages[0])
    consumer.redeliver_unacknowledged_messages()
    early = receive_all(consumer, 2, timeout_s=5)  # m1 and m2 were unacked, not nacked: they come again
    assert sorted(m.data() for m in early) == [b"m1", b"m2"]
    assert time.monotonic() - nacked < 2.0
    for message in early:
        consumer.acknowledge(message)
    late = receive_all(consumer, 1)[0]
    assert late.data() == b"m0" and time.monotonic() - nacked >= 2.5 - 0.256
    consumer.acknowledge(late)
    nothing_more(consumer)
    assert consumer.nack_stats().held_back >= 1
    consumer.close()


def test_wrap_an_existing_consumer(nack_client: Client, unique_topic: str) -> None:
    native = pulsar.Client.subscribe(
        nack_client,
        unique_topic,
        "sub",
        consumer_type=SHARED,
        negative_ack_redelivery_delay_ms=pulsar_nack.NATIVE_DELAY_MS,
    )
    consumer = pulsar_nack.wrap(
        native, negative_ack_redelivery_delay_ms=300, native_delay_ms=pulsar_nack.NATIVE_DELAY_MS
    )
    assert isinstance(consumer, pulsar.Consumer)
    produce(nack_client, unique_topic, 2, batching=False)
    for message in receive_all(consumer, 2):
        consumer.negative_acknowledge(message)
    again = receive_all(consumer, 2)
    assert sorted(m.data() for m in again) == [b"m0", b"m1"]
    for message in again:
        consumer.acknowledge(message)
    consumer.close()
    with pytest.raises(TypeError):
        pulsar_nack.wrap("not a consumer", native_delay_ms=pulsar_nack.NATIVE_DELAY_MS)


def test_close_during_a_blocked_flush_does_not_deadlock(nack_client: Client, unique_topic: str) -> None:
    """apache/pulsar #23650 and the C++ hook test: the redelivery hook blocks 500 ms holding a lock the
    application needs to nack; nacking and closing meanwhile must not deadlock or hang."""
    app_lock = threading.Lock()
    in_hook = threading.Event()

    def hook(_due: object) -> None:
        with app_lock:
            in_hook.set()
            time.sleep(0.5)

    consumer = subscribe(nack_client, unique_topic, negative_ack_redelivery_delay_ms=0, on_redelivery=hook)
    produce(nack_client, unique_topic, 2, batching=False)
    first, second = receive_all(consumer, 2)
    consumer.negative_acknowledge(first)
    assert in_hook.wait(5)
    started = time.monotonic()
    consumer.negative_acknowledge(second)  # while the hook runs
    with app_lock:
        pass
    consumer.close()
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("on_close", ["drop", "flush"])
def test_close_with_pending_nacks(nack_client: Client, unique_topic: str, on_close: str) -> None:
    """Either way the messages come back to the subscription (the broker redelivers what was unacked)."""
    consumer = subscribe(
        nack_client, unique_topic, negative_ack_redelivery_delay_ms=60_000, on_close=on_close
    )
    produce(nack_client, unique_topic, 3, batching=False)
    for message in receive_all(consumer, 3):
        consumer.negative_acknowledge(message)
    assert consumer.nack_stats().pending == 3
    consumer.close()
    other = subscribe(nack_client, unique_topic)
    again = receive_all(other, 3)
    assert sorted(m.data() for m in again) == [b"m0", b"m1", b"m2"]
    for message in again:
        other.acknowledge(message)
    other.close()


def test_bad_inputs_name_the_problem_and_change_nothing(nack_client: Client, unique_topic: str) -> None:
    consumer = subscribe(
        nack_client, unique_topic, max_redelivery_delay_ms=10_000, negative_ack_redelivery_delay_ms=1000
    )
    produce(nack_client, unique_topic, 1, batching=False)
    message = receive_all(consumer, 1)[0]
    with pytest.raises(TypeError, match=r"pulsar\.Message"):
        consumer.negative_acknowledge("m0")
    with pytest.raises(ValueError, match="delay_ms"):
        consumer.negative_acknowledge(message, delay_ms=-1)
    with pytest.raises(TypeError, match="delay_ms"):
        consumer.negative_acknowledge(message, delay_ms="soon")  # type: ignore[arg-type]
    with pytest.raises(DelayLimitExceeded, match="Exceeds max allowed delivery delay of 10000 milliseconds"):
        consumer.negative_acknowledge(message, delay_ms=20_000)
    assert consumer.nack_stats().pending == 0, "nothing filed by a rejected nack"
    consumer.negative_acknowledge(message, delay_ms=100)
    assert receive_all(consumer, 1)[0].data() == b"m0"
    consumer.close()
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"negative_ack_precision_bit_cnt": 31}, ValueError, "negative_ack_precision_bit_cnt"),
        ({"negative_ack_rounding": "up"}, ValueError, "rounding"),
        ({"negative_ack_redelivery_delay_ms": -5}, ValueError, "negative_ack_redelivery_delay_ms"),
        ({"max_redelivery_delay_ms": -1}, ValueError, "max_redelivery_delay_ms"),
        ({"on_delay_limit": "ignore"}, ValueError, "on_delay_limit"),
        (
            {"max_redelivery_delay_ms": 10, "negative_ack_redelivery_delay_ms": 50},
            DelayLimitExceeded,
            "10 milli",
        ),
        ({"negative_ack_redelivery_backoff": 5}, TypeError, "negative_ack_redelivery_backoff"),
        ({"no_such_option": 1}, TypeError, "no_such_option"),
    ]
    for kwargs, error, text in cases:
        with pytest.raises(error, match=text):
            subscribe(nack_client, unique_topic, **kwargs)


def test_clamp_mode_caps_delays(nack_client: Client, unique_topic: str) -> None:
    consumer = subscribe(nack_client, unique_topic, max_redelivery_delay_ms=300, on_delay_limit="clamp")
    produce(nack_client, unique_topic, 1, batching=False)
    nacked = time.monotonic()
    consumer.negative_acknowledge(receive_all(consumer, 1)[0], delay_ms=3_600_000)
    consumer.acknowledge(receive_all(consumer, 1)[0])
    assert time.monotonic() - nacked < 3
    consumer.close()


def test_random_nacks_in_batches_lose_nothing_and_duplicate_nothing(
    nack_client: Client, unique_topic: str
) -> None:
    """Batches of 50, 30 % of deliveries nacked with random per-call delays (each message at most twice):
    every message is handed out exactly 1 + (its nacks) times and finally acked — no sibling lost while
    its first copy was still queued, none handed out twice by overlapping redeliveries of its entry."""
    import collections
    import random

    rng = random.Random(7)
    count = 300
    consumer = subscribe(nack_client, unique_topic, negative_ack_redelivery_delay_ms=500)
    producer = nack_client.create_producer(
        unique_topic, batching_enabled=True, batching_max_messages=50, block_if_queue_full=True
    )
    for i in range(count):
        producer.send_async(f"m{i}".encode(), None)
    producer.flush()
    deliveries: collections.Counter[bytes] = collections.Counter()
    nacks: collections.Counter[bytes] = collections.Counter()
    acked: set[bytes] = set()
    deadline = time.monotonic() + 60
    while len(acked) < count and time.monotonic() < deadline:
        try:
            message = consumer.receive(500)
        except pulsar.Timeout:
            continue
        key = message.data()
        deliveries[key] += 1
        if nacks[key] < 2 and rng.random() < 0.3:
            nacks[key] += 1
            consumer.negative_acknowledge(message, delay_ms=rng.randint(100, 1500))
        else:
            consumer.acknowledge(message)
            acked.add(key)
    assert len(acked) == count, f"lost: {sorted(set(f'm{i}'.encode() for i in range(count)) - acked)[:10]}"
    assert {k: deliveries[k] for k in deliveries if deliveries[k] != 1 + nacks[k]} == {}
    nothing_more(consumer, 1500)  # also lets the tracker ack the last copies it did not hand out
    stats = consumer.nack_stats()
    assert stats.redelivered == stats.nacked == sum(nacks.values())
    consumer.close()
    # Every entry was acked at the broker too: a new consumer of the subscription gets nothing.
    successor = subscribe(nack_client, unique_topic)
    nothing_more(successor, 2000)
    successor.close()


@pytest.mark.parametrize("timeout_ms", [0, 1, 5])
def test_receive_with_a_tiny_timeout_returns_queued_messages_like_the_official_consumer(
    nack_client: Client, pulsar_client: pulsar.Client, unique_topic: str, timeout_ms: int
) -> None:
    """Issue 10: a polling loop with receive(0)/receive(1) gets what is queued, as with pulsar.Client; and
    raises Timeout once nothing is."""
    official = pulsar_client.subscribe(unique_topic, "official", consumer_type=SHARED)
    wrapped = subscribe(nack_client, unique_topic, negative_ack_redelivery_delay_ms=60_000)
    produce(nack_client, unique_topic, 5, batching=True)
    time.sleep(1.0)  # both receiver queues filled
    got: dict[str, list[bytes]] = {"official": [], "wrapped": []}
    for name, consumer in (("official", official), ("wrapped", wrapped)):
        for _ in range(50):  # bounded: more polls than messages
            try:
                message = consumer.receive(timeout_ms)
            except pulsar.Timeout:
                break
            got[name].append(message.data())
            if name == "wrapped" and message.data() == b"m0":
                consumer.negative_acknowledge(message)  # its siblings stay acked-or-held: no copy leaks
            else:
                consumer.acknowledge(message)
    assert got["official"] == [f"m{i}".encode() for i in range(5)]
    assert got["wrapped"] == got["official"]
    with pytest.raises(pulsar.Timeout):
        wrapped.receive(timeout_ms)
    official.close()
    wrapped.close()


def test_after_close_nack_ack_and_receive_do_what_the_official_consumer_does(
    nack_client: Client, pulsar_client: pulsar.Client, unique_topic: str
) -> None:
    """Issue 10: a listener still running during close must not get exceptions it never got before: a
    nack after close does nothing, an ack raises AlreadyClosed — the official consumer's behaviour."""
    outcomes: dict[str, list[str]] = {}
    for name, client in (("official", pulsar_client), ("wrapped", nack_client)):
        consumer = client.subscribe(unique_topic, name, consumer_type=SHARED)
        produce(client, unique_topic, 2, batching=False, prefix=name)
        first, second = receive_all(consumer, 2)
        consumer.close()
        results = []
        for method, argument in (
            (consumer.negative_acknowledge, first),
            (consumer.negative_acknowledge, first.message_id()),
            (consumer.acknowledge, second),
            (consumer.receive, 100),
        ):
            try:
                method(argument)
                results.append("ok")
            except Exception as error:  # recorded and compared
                results.append(type(error).__name__)
        outcomes[name] = results
    assert outcomes["official"] == ["ok", "ok", "AlreadyClosed", "AlreadyClosed"]
    assert outcomes["wrapped"] == outcomes["official"]


@pytest.mark.parametrize("snapshots", [False, True], ids=["monotonic", "epoch"])
def test_a_nack_is_due_on_the_trackers_own_clock(
    nack_client: Client, unique_topic: str, tmp_path: Any, snapshots: bool
) -> None:
    """The nack path reads the tracker's clock (the monotonic one inlined, without a Python call): a
    consumer that keeps snapshots runs its tracker on epoch milliseconds, and its nacks must be due on
    that clock — on the monotonic one they would be decades early and come back at once."""
    extra: dict[str, Any] = {"snapshot_dir": tmp_path / "snapshots"} if snapshots else {}
    consumer = subscribe(nack_client, unique_topic, **extra)
    produce(nack_client, unique_topic, 2, batching=True)
    tracker = consumer._nacks.tracker
    first: float | None = None
    for message in receive_all(consumer, 2):
        before = tracker.now()
        first = before if first is None else first
        consumer.negative_acknowledge(message, delay_ms=60_000)
        after = tracker.now()
        due = tracker.index.next_due_ms()
        # (ceil rounding, the default: the bucket is at or after the due time, within 2^8 ms; the earliest
        # pending is the first nack's, which a loaded machine may have filed more than 2^8 ms before this)
        assert due is not None and first + 60_000 <= due <= after + 60_000 + 256, (first, due, after)
    consumer.close()


@pytest.mark.parametrize("batching", [False, True], ids=["single", "batched"])
def test_receive_without_a_timeout_hands_out_what_receive_with_one_does(
    nack_client: Client, unique_topic: str, batching: bool
) -> None:
    """``receive()`` without a timeout (its own inlined path): a nacked message comes back once, its
    batch siblings' copies are not handed out, and the ack of a message nacked for later drops its
    pending nack. A watchdog closes the consumer after 60 s, so a
    blocked receive() cannot hang the suite (it raises then)."""
    consumer = subscribe(nack_client, unique_topic, negative_ack_redelivery_delay_ms=60_000)
    watchdog = threading.Timer(60, consumer.close)
    watchdog.start()
    try:
        produce(nack_client, unique_topic, 10, batching=batching)
        got = []
        for _ in range(10):  # all ten are there: receive() returns each at once
            message = consumer.receive()
            got.append(message.data())
            if message.data() == b"m3":
                consumer.negative_acknowledge(message, delay_ms=0)
            elif message.data() == b"m7":
                consumer.negative_acknowledge(message, delay_ms=60_000)
                consumer.acknowledge(message)  # before it is due: its nack is dropped
            else:
                consumer.acknowledge(message)
        assert got == [f"m{i}".encode() for i in range(10)]
        again = consumer.receive()  # m3, once (its siblings' copies are held back or dropped)
        assert again.data() == b"m3"
        consumer.acknowledge(again)
        stats = consumer.nack_stats()
        assert (stats.pending, stats.nacked, stats.redelivered) == (0, 2, 1)  # m7's nack is gone
        nothing_more(consumer, 1500)
    finally:
        watchdog.cancel()
    consumer.close()
