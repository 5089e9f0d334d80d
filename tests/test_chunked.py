"""Issue 15: a nacked chunked (large) message comes back whole, exactly once, at its time — where the
official consumer (pulsar-client 3.13, C++ core 4.2.0) loses it.

Chunking needs a message above the ``maxMessageSize`` the client knows: Apache standalone runs here with
``maxMessageSize`` 1 MiB (2.5 MB messages: 3 chunks); pulsar-lite 0.2 announces none (its
``max_message_size_bytes`` only makes it refuse larger sends) and the client's value is at most 5 MiB, so
its messages are 6.4 MB (2 chunks, or 7 once this module's Apache announced 1 MiB). Few messages per test:
each is megabytes.

*Redelivery counts* are asserted relative to the first hand-out's: under load pulsar-lite sometimes
dispatches a chunk twice, the native consumer drops the half-built message and asks for it again, and the
first hand-out already carries count 1 (a held message counts on from the broker's count).

*pulsar-lite's size limit is raised a little* (:data:`LITE_MAX_MESSAGE_SIZE`): the C++ client sizes chunks
by a process-wide value, the ``maxMessageSize`` the last broker that announced one announced (pulsar-lite
announces none; the client's default is 5 MiB - 10 KiB). After any test connected to an Apache broker with
the default 5 MiB, the chunks for pulsar-lite were 5 MiB of payload plus metadata (5,242,907 bytes), which
pulsar-lite 0.2 refuses ("Exceed maximum message size: 5242907 > 5242880"); the client reconnects and
re-sends for ever, send timeout or not — the hang that made ``make test`` run this file on its own
(docs/chunked.md, known issues).

*Never early* here is exact: a held chunked message is handed out from memory no sooner than nack time +
delay (no bucket rounding), up to ``CLOCK_TOLERANCE_S`` for reading the clocks.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import _pulsar
import pulsar
import pytest
from fake_clock import FakeClock
from messaging import leftover, nothing_more, receive_all, receive_into

from harness.standalone import PulsarStandalone
from pulsar_nack import Client, MultiplierRedeliveryBackoff, aio
from pulsar_nack.chunks import ORIGIN_MESSAGE_ID, REAL_TOPIC, ChunkHold, HeldDelivery, HeldMessage
from pulsar_nack.native.client import chunk_first_entry
from pulsar_nack.stats import NackStats
from pulsar_nack.testing import Broker, PulsarLite
from pulsar_nack.timer import TimerWheel

SHARED = pulsar.ConsumerType.Shared
SUB = "sub"
CLOCK_TOLERANCE_S = 0.005
APACHE_MAX_MESSAGE_SIZE = 1 << 20
#: pulsar-lite's limit here: 5 MiB + 64 KiB, so that a 5 MiB chunk with its metadata (sized by a 5 MiB an
#: Apache broker of another test announced to this process) is accepted, as Apache accepts it.
LITE_MAX_MESSAGE_SIZE = 5 * 2**20 + 64 * 2**10
SIZES = {"lite": 6_400_000, "apache": 2_600_000}  # payload bytes: 2 chunks on lite, 3 on Apache
OFFICIAL_FIXED = (
    "pulsar-client now redelivers a nacked chunked message (apache/pulsar-client-cpp #604 released?): "
    "update the comparison rows 'nacked chunked message' in docs/chunked.md and README.md, and this test"
)


# -- brokers whose clients chunk -------------------------------------------------------------------


@pytest.fixture(scope="module")
def apache_chunking(require_apache: None) -> Iterator[PulsarStandalone]:
    """An Apache standalone of this module's own, with ``maxMessageSize`` 1 MiB."""
    broker = PulsarStandalone(settings={"maxMessageSize": APACHE_MAX_MESSAGE_SIZE})
    try:
        broker.start()
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="module")
def lite_chunking() -> Iterator[PulsarLite]:
    """A pulsar-lite of this module's own, accepting chunks of up to 5 MiB plus metadata (see the module
    docstring: the chunk size is the last announced ``maxMessageSize`` in this process, not its own)."""
    with PulsarLite(extra_config={"max_message_size_bytes": LITE_MAX_MESSAGE_SIZE}) as broker:
        yield broker


#: pulsar-lite 0.2 now and then loses a chunked message (docs/chunked.md, Known issues: 3 of ~70 runs under
#: load; in CI once the *official* consumer's copy of a plain message sent after a chunked one): a lite test
#: that fails by a receive timing out — and only that way — is run again, at most twice. pytest reports
#: every rerun (R); Apache tests are never rerun.
LITE_RERUN = pytest.mark.flaky(reruns=2, only_rerun=["AssertionError: timed out with"])


@pytest.fixture(
    params=[pytest.param("lite", marks=LITE_RERUN), pytest.param("apache", marks=pytest.mark.apache)]
)
def chunk_broker(request: pytest.FixtureRequest) -> Broker:
    if request.param == "apache":
        apache: PulsarStandalone = request.getfixturevalue("apache_chunking")
        return apache
    lite: PulsarLite = request.getfixturevalue("lite_chunking")
    return lite


@pytest.fixture
def size(chunk_broker: Broker) -> int:
    return SIZES[chunk_broker.kind]


def _client(broker: Broker, kind: Any = Client) -> Any:
    return kind(
        broker.service_url,
        operation_timeout_seconds=30,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )


@pytest.fixture
def client(chunk_broker: Broker) -> Iterator[Client]:
    nack_client = _client(chunk_broker)
    yield nack_client
    nack_client.close()


@pytest.fixture
def official(chunk_broker: Broker) -> Iterator[pulsar.Client]:
    plain = _client(chunk_broker, pulsar.Client)
    yield plain
    plain.close()


@pytest.fixture
def topic() -> str:
    return f"persistent://public/default/chunked-{uuid.uuid4().hex}"


def payload(tag: int, size: int) -> bytes:
    """``size`` bytes that differ from every other tag's at every 256-byte block."""
    block = bytes((tag * 31 + i) % 256 for i in range(256))
    return block * (size // 256) + bytes([tag])


def send_chunked(client: Any, topic: str, payloads: list[bytes]) -> None:
    producer = client.create_producer(
        topic, chunking_enabled=True, batching_enabled=False, send_timeout_millis=60_000
    )
    for i, data in enumerate(payloads):
        producer.send(data, properties={"tag": str(i), "kind": "large"})
    producer.close()


def is_chunked(message: Any) -> bool:
    return chunk_first_entry(message.message_id()) is not None


# -- the mechanism: held in memory, handed out whole at its time --------------------------------------


@pytest.mark.parametrize("mode", ["per-call", "default", "backoff"])
def test_nacked_chunked_message_comes_back_whole_once_at_its_time(
    client: Client, chunk_broker: Broker, topic: str, size: int, mode: str
) -> None:
    options: dict[str, Any] = {"negative_ack_redelivery_delay_ms": 900}
    if mode == "backoff":  # redelivery count 0 → 700 ms
        options["negative_ack_redelivery_backoff"] = MultiplierRedeliveryBackoff(700, 10_000, 2.0)
    consumer = client.subscribe(topic, SUB, consumer_type=SHARED, **options)
    sent = [payload(i, size) for i in range(2)]
    send_chunked(client, topic, sent)
    first = receive_all(consumer, 2)
    assert all(is_chunked(m) for m in first), "the broker's size limit made these chunked"
    delay_s = {"per-call": 1.2, "default": 0.9, "backoff": 0.7}[mode]
    nacked_at: dict[bytes, float] = {}
    first_count = {m.data(): m.redelivery_count() for m in first}
    for message in first:
        nacked_at[message.data()] = time.monotonic()
        if mode == "per-call":
            consumer.negative_acknowledge(message, delay_ms=1200)
        else:
            consumer.negative_acknowledge(message)
    again = receive_all(consumer, 2)
    for message in again:
        arrived = time.monotonic()
        data = message.data()
        assert arrived >= nacked_at[data] + delay_s - CLOCK_TOLERANCE_S, "never early"
        assert arrived <= nacked_at[data] + delay_s + 5.0, "at its time (generous bound)"
        assert message.redelivery_count() == first_count[data] + 1
        assert message.properties() == {"tag": str(sent.index(data)), "kind": "large"}
    assert sorted(m.data() for m in again) == sorted(sent), "whole: the same bytes"
    nothing_more(consumer, 1000)  # exactly once
    for message in again:
        consumer.acknowledge(message)
    stats = consumer.nack_stats(with_memory=True)
    assert type(stats) is NackStats
    assert (stats.chunked_redelivered, stats.chunked_held, stats.chunked_native) == (2, 0, 0)
    consumer.close()
    assert leftover(client, topic, SUB) == [], "every chunk acked at the broker"


@pytest.mark.apache
@pytest.mark.parametrize("consumer_type", [pulsar.ConsumerType.Failover, pulsar.ConsumerType.Exclusive])
def test_failover_and_exclusive(apache_chunking: PulsarStandalone, topic: str, consumer_type: Any) -> None:
    """Apache only: pulsar-lite 0.2 dispatches a chunked message to a Failover/Exclusive consumer so that
    the official consumer itself often drops it ("Received a chunk whose chunk id is invalid"), before
    any nack."""
    client = _client(apache_chunking)
    consumer = client.subscribe(topic, SUB, consumer_type=consumer_type, negative_ack_redelivery_delay_ms=500)
    data = payload(7, SIZES["apache"])
    send_chunked(client, topic, [data])
    message = receive_all(consumer, 1)[0]
    nacked = time.monotonic()
    consumer.negative_acknowledge(message)
    back = receive_all(consumer, 1)[0]
    assert time.monotonic() - nacked >= 0.5 - CLOCK_TOLERANCE_S
    assert back.data() == data and back.redelivery_count() == message.redelivery_count() + 1
    nothing_more(consumer)
    consumer.acknowledge(back)
    consumer.close()
    assert leftover(client, topic, SUB) == []
    client.close()


def test_alongside_single_and_batched_messages(client: Client, topic: str, size: int) -> None:
    """One consumer, one topic: a chunked, a single and a batched message nacked; nothing else comes
    twice, nothing is lost, everything drains."""
    consumer = client.subscribe(topic, SUB, consumer_type=SHARED, negative_ack_redelivery_delay_ms=600)
    large = [payload(i, size) for i in range(2)]
    send_chunked(client, topic, large)
    single = client.create_producer(topic, batching_enabled=False)
    for i in range(3):
        single.send(f"s{i}".encode())
    single.close()
    batched = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=50)
    for i in range(5):
        batched.send_async(f"b{i}".encode(), None)
    batched.flush()
    batched.close()
    first = receive_all(consumer, 10)
    assert sorted(m.data() for m in first) == sorted(
        [*large, b"s0", b"s1", b"s2", *(f"b{i}".encode() for i in range(5))]
    )
    nack = {large[0], b"s1", b"b2"}
    for message in first:
        if message.data() in nack:
            consumer.negative_acknowledge(message)
        elif message.data() != large[1]:
            consumer.acknowledge(message)
    again = receive_all(consumer, 3)
    assert sorted(m.data() for m in again) == sorted(nack)
    count = next(m for m in first if m.data() == large[0]).redelivery_count()
    assert next(m for m in again if m.data() == large[0]).redelivery_count() == count + 1
    nothing_more(consumer, 1500)
    for message in again:
        consumer.acknowledge(message)
    consumer.acknowledge(next(m for m in first if m.data() == large[1]))  # held, unacked, until now
    consumer.close()
    assert leftover(client, topic, SUB) == []


def _send_together(
    producer: Any, tags: list[int], size: int, barrier: threading.Barrier, errors: list[BaseException]
) -> None:
    """Producer thread: send ``tags``' payloads as soon as the other thread is ready too."""
    try:
        barrier.wait(10)
        for tag in tags:
            producer.send_async(payload(tag, size), None)
        producer.flush()
    except BaseException as error:  # recorded: asserted on the test thread
        errors.append(error)


@pytest.mark.apache
def test_interleaved_chunks_of_two_producers(apache_chunking: PulsarStandalone, topic: str) -> None:
    """Chunks of two producers interleave on Apache (one message's first..last chunk entries enclose
    another's). The nacked one comes back whole and once; the one whose chunks lie inside its range —
    held unacked by the application meanwhile — is not handed out again (a native nack of every entry
    first..last would have re-sent it)."""
    size = SIZES["apache"]
    client = _client(apache_chunking)
    consumer = client.subscribe(topic, SUB, consumer_type=SHARED, negative_ack_redelivery_delay_ms=500)
    producers_clients = [_client(apache_chunking, pulsar.Client) for _ in range(2)]
    ranges: dict[bytes, tuple[int, int]] = {}
    received: list[pulsar.Message] = []
    try:
        for attempt in range(4):  # interleaving is up to the broker: bounded retries until it happens
            producers = [
                c.create_producer(topic, chunking_enabled=True, batching_enabled=False)
                for c in producers_clients
            ]
            barrier = threading.Barrier(2)
            errors: list[BaseException] = []
            tags = [[10 * attempt + 3 * index + k for k in range(3)] for index in range(2)]
            threads = [
                threading.Thread(target=_send_together, args=(p, t, size, barrier, errors))
                for p, t in zip(producers, tags, strict=True)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            assert not errors
            for producer in producers:
                producer.close()
            batch = receive_all(consumer, 6, timeout_s=60)
            received += batch
            for message in batch:
                first = chunk_first_entry(message.message_id())
                assert first is not None
                ranges[message.data()] = (first[1], message.message_id().entry_id())
            if any(a[0] < b[0] <= b[1] < a[1] for a in ranges.values() for b in ranges.values() if a != b):
                break
        outer_data, inner_data = next(
            (x, y)
            for x, a in ranges.items()
            for y, b in ranges.items()
            if x != y and a[0] < b[0] <= b[1] < a[1]
        )
        for message in received:
            if message.data() == outer_data:
                consumer.negative_acknowledge(message)
            elif message.data() != inner_data:
                consumer.acknowledge(message)
        back = receive_all(consumer, 1)
        outer = next(m for m in received if m.data() == outer_data)
        assert back[0].data() == outer_data and back[0].redelivery_count() == outer.redelivery_count() + 1
        nothing_more(consumer, 2000)  # the enclosed message, still held by the app, is not handed out
        consumer.acknowledge(back[0])
        consumer.acknowledge(next(m for m in received if m.data() == inner_data))
        consumer.close()
        assert leftover(client, topic, SUB) == []
    finally:
        for plain in producers_clients:
            plain.close()
        client.close()


def test_dead_letter_policy_sends_the_chunked_message_whole(client: Client, topic: str, size: int) -> None:
    """max_redeliver_count=2: handed out with redelivery counts 0, 1, 2, then produced to the dead-letter
    topic whole (same bytes, the properties plus the official REAL_TOPIC / ORIGIN_MESSAGE_ID), acked."""
    dlq = f"{topic}-dlq"
    dead_letters = client.subscribe(dlq, "dlq-reader", consumer_type=SHARED)
    consumer = client.subscribe(
        topic, SUB, consumer_type=SHARED, negative_ack_redelivery_delay_ms=300,
        dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=2, dead_letter_topic=dlq),
    )  # fmt: skip
    data = payload(3, size)
    send_chunked(client, topic, [data])
    counts = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            message = consumer.receive(2000)
        except pulsar.Timeout:
            break
        assert message.data() == data
        counts.append(message.redelivery_count())
        consumer.negative_acknowledge(message)
    assert counts == list(range(counts[0], 3)) and counts[0] <= 1, (counts, consumer.nack_stats())
    dead = receive_all(dead_letters, 1, timeout_s=20)[0]
    assert dead.data() == data, "whole"
    properties = dead.properties()
    assert properties["tag"] == "0" and properties[REAL_TOPIC] == topic and properties[ORIGIN_MESSAGE_ID]
    dead_letters.acknowledge(dead)
    stats = consumer.nack_stats()
    assert stats.chunked_dead_lettered == 1, stats
    consumer.close()
    dead_letters.close()
    assert [len(m) for m in leftover(client, topic, SUB)] == [], stats


def test_a_failed_dead_letter_send_keeps_the_message_held(client: Client, topic: str, size: int) -> None:
    """The send to the dead-letter topic fails (the policy names an invalid topic): the receive raises the
    producer's error, the message stays held (nothing is lost) and is tried again a second later."""
    consumer = client.subscribe(
        topic, SUB, consumer_type=SHARED, negative_ack_redelivery_delay_ms=300,
        dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(
            max_redeliver_count=1, dead_letter_topic="persistent://an invalid/topic name/dlq"
        ),
    )  # fmt: skip
    send_chunked(client, topic, [payload(4, size)])
    for count in (0, 1):  # handed out with redelivery counts 0 and 1, then past the policy
        message = consumer.receive(20_000)
        assert message.redelivery_count() == count
        consumer.negative_acknowledge(message)
    errors: list[Exception] = []
    deadline = time.monotonic() + 20
    while len(errors) < 2 and time.monotonic() < deadline:
        try:
            extra = consumer.receive(1000)
        except pulsar.Timeout:
            continue
        except Exception as error:  # the dead-letter producer's error, from the receive that tried it
            errors.append(error)
            stats = consumer.nack_stats()
            assert stats.chunked_held == 1 and stats.chunked_dead_lettered == 0, stats
            continue
        pytest.fail(f"handed out although past max_redeliver_count: {extra.redelivery_count()}")
    assert len(errors) == 2, f"tried {len(errors)} times in 20 s"
    consumer.close()


# -- bounds and the native fallback ------------------------------------------------------------------


def test_past_the_bound_the_nack_goes_to_the_broker_for_every_chunk(
    client: Client, topic: str, size: int
) -> None:
    """``max_held_chunked_bytes`` fits one message: the second nack is not held but sent to the broker as a
    nack of every chunk entry (counted), and it comes back whole too (its chunks are contiguous here)."""
    consumer = client.subscribe(
        topic,
        SUB,
        consumer_type=SHARED,
        negative_ack_redelivery_delay_ms=500,
        max_held_chunked_bytes=size + 10,
    )
    sent = [payload(i, size) for i in range(2)]
    send_chunked(client, topic, sent)
    first = receive_all(consumer, 2)
    for message in first:
        consumer.negative_acknowledge(message)
    stats = consumer.nack_stats()
    assert type(stats) is NackStats
    assert (stats.chunked_held, stats.chunked_over_bound, stats.chunked_native) == (1, 1, 1)
    assert stats.chunked_held_bytes <= size + 10
    again = receive_all(consumer, 2)
    assert sorted(m.data() for m in again) == sorted(sent)
    assert sorted(type(m) is HeldMessage for m in again) == [False, True], (
        "one from memory, one from the broker"
    )
    before = {m.data(): m.redelivery_count() for m in first}
    counts = {type(m) is HeldMessage: m.redelivery_count() - before[m.data()] for m in again}
    # the broker counts its own redeliveries: more than one if a copy came early and was asked for again
    assert counts[True] == 1 and counts[False] >= 1, counts
    nothing_more(consumer, 1500)
    for message in again:
        consumer.acknowledge(message)
    consumer.close()
    assert leftover(client, topic, SUB) == []


def test_a_nack_from_another_thread_reaches_a_receive_blocked_without_a_timeout(
    client: Client, topic: str, size: int
) -> None:
    """A thread waits in ``receive()`` without a timeout (in the native receive: nothing more to send)
    while this thread nacks the chunked message it got. Held in memory, the message would never reach
    that wait (it used to be lost while the consumer lived); with a receive waiting the nack goes to
    the broker as a nack of every chunk entry, and the broker's redelivery wakes the receive. (The
    official consumer never gets a nacked chunked message back:
    test_official_consumer_loses_the_nacked_chunked_message.)"""
    consumer = client.subscribe(topic, SUB, consumer_type=SHARED, negative_ack_redelivery_delay_ms=300)
    sent = payload(0, size)
    send_chunked(client, topic, [sent])
    first = consumer.receive(30_000)
    assert first.data() == sent
    got: list[bytes] = []
    errors: list[str] = []

    thread = threading.Thread(target=receive_into, args=(consumer, got, errors), daemon=True)
    thread.start()
    time.sleep(1.0)  # the thread is in the native receive
    consumer.negative_acknowledge(first)
    deadline = time.monotonic() + 60
    while not got and time.monotonic() < deadline:
        time.sleep(0.05)
    stats = consumer.nack_stats()
    consumer.close()  # (wakes the receive: it raises)
    thread.join(10)
    assert [data == sent for data in got] == [True], (len(got), stats, errors)
    assert stats.chunked_native == 1, ("not filed at the broker", stats)
    assert leftover(client, topic, SUB) == []


def test_nack_accepts_constructed_and_deserialized_ids(
    client: Client, official: pulsar.Client, topic: str, size: int
) -> None:
    """``negative_acknowledge`` takes a ``pulsar.MessageId`` the app built or deserialized; the official
    consumer raises TypeError for both. A deserialized chunked id cannot be held (no payload): it is nacked
    at the broker chunk by chunk and comes back whole."""
    consumer = client.subscribe(topic, SUB, consumer_type=SHARED, negative_ack_redelivery_delay_ms=400)
    plain = official.subscribe(topic, "official", consumer_type=SHARED, negative_ack_redelivery_delay_ms=400)
    large = payload(5, size)
    send_chunked(client, topic, [large])
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"small")
    producer.close()
    mine = {m.data(): m for m in receive_all(consumer, 2)}
    theirs = {m.data(): m for m in receive_all(plain, 2)}
    small_id = mine[b"small"].message_id()
    built = pulsar.MessageId(small_id.partition(), small_id.ledger_id(), small_id.entry_id(), -1)
    stored = pulsar.MessageId.deserialize(mine[large].message_id().serialize())
    assert isinstance(built, pulsar.MessageId) and isinstance(stored, _pulsar.MessageId)
    official_built = pulsar.MessageId(small_id.partition(), small_id.ledger_id(), small_id.entry_id(), -1)
    with pytest.raises(TypeError):
        plain.negative_acknowledge(official_built)
    consumer.negative_acknowledge(built)
    consumer.negative_acknowledge(pulsar.MessageId.wrap(stored))
    again = receive_all(consumer, 2)
    assert sorted(m.data() for m in again) == sorted([large, b"small"])
    assert consumer.nack_stats().chunked_native == 1
    nothing_more(consumer, 1500)
    for message in again:
        consumer.acknowledge(message)
    for message in theirs.values():
        plain.acknowledge(message)
    consumer.close()
    plain.close()
    assert leftover(client, topic, SUB) == []


def test_official_consumer_loses_the_nacked_chunked_message(
    client: Client, official: pulsar.Client, topic: str, size: int
) -> None:
    """Side by side on one topic: the official consumer's nacked chunked message never comes back while it
    lives (only its last chunk is re-sent, and dropped); the wrapper's does. Fails, naming the docs to
    update, the day a pulsar-client release fixes it."""
    plain = official.subscribe(topic, "official", consumer_type=SHARED, negative_ack_redelivery_delay_ms=300)
    consumer = client.subscribe(topic, SUB, consumer_type=SHARED, negative_ack_redelivery_delay_ms=300)
    data = payload(9, size)
    send_chunked(client, topic, [data])
    plain.negative_acknowledge(receive_all(plain, 1)[0])
    consumer.negative_acknowledge(receive_all(consumer, 1)[0])
    assert receive_all(consumer, 1)[0].data() == data
    try:
        back = plain.receive(5000)
    except pulsar.Timeout:
        back = None
    assert back is None, OFFICIAL_FIXED
    plain.close()
    consumer.close()
    assert leftover(official, topic, "official") == [data], "still unacked at the broker: out of reach"


# -- the parts, without a broker ----------------------------------------------------------------------


def test_chunk_first_entry_reads_the_serialized_id() -> None:
    # (ledger 3, entry 2) whose first chunk is (ledger 3, entry 0): what a chunked id serializes to
    chunked = pulsar.MessageId.deserialize(bytes.fromhex("080310023a0408031000"))
    assert chunk_first_entry(chunked) == (3, 0)
    assert chunk_first_entry(_pulsar.MessageId(-1, 3, 2, -1)) is None
    assert chunk_first_entry(_pulsar.MessageId(-1, 3, 2, 4)) is None


def test_hold_bound_order_and_replacement() -> None:
    hold = ChunkHold(max_bytes=100)
    a, b, c = ("t", 1, 2), ("t", 1, 5), ("t", 1, 9)
    assert hold.hold(a, "A", 200.0, 1, 60)
    assert not hold.hold(b, "B", 100.0, 1, 50), "over the bound: refused, counted"
    assert hold.over_bound == 1 and len(hold) == 1
    assert hold.hold(b, "B", 100.0, 1, 40)
    assert hold.wait_ms(50.0) == 50.0
    assert hold.pop_due(99.0) is None
    assert hold.pop_due(100.0) == ("B", 1, b)
    assert hold.hold(a, "A2", 300.0, 2, 60), "held again: replaced, bytes not counted twice"
    assert hold.pop_due(250.0) is None, "the replaced entry's old time no longer counts"
    assert hold.discard(a) and not hold.discard(a)
    assert hold.wait_ms(0.0) is None and len(hold) == 0
    assert hold.hold(c, "C", 1.0, 1, 100)
    hold.count("native")
    base = NackStats(0, 0, 0, 0, 0, 0, 0, 0, 0, None, None, memory_bytes=1000)
    stats = hold.stats(base, with_memory=True)
    assert (stats.chunked_held, stats.chunked_held_bytes, stats.chunked_native, stats.chunked_over_bound) == (
        1, 100, 1, 1,
    )  # fmt: skip
    assert stats.memory_bytes is not None and stats.memory_bytes >= 1000 + 100
    assert hold.clear() == 1 and hold.pop_due(10.0) is None


def test_held_delivery_is_woken_by_the_trackers_wheel_and_hands_out_on_a_thread_of_its_own() -> None:
    """A listener's held messages: one wheel timeout for the earliest (no thread before it is due), the
    hand-out on the delivery's own thread, then the wheel armed again for the next one; stop() cancels."""
    clock = FakeClock(0.0)
    wheel = TimerWheel(clock=clock, start=False)
    hold = ChunkHold(max_bytes=100)
    handed: list[tuple[str, float, str]] = []
    delivered = threading.Semaphore(0)

    def deliver() -> None:
        while (due := hold.pop_due(clock.now)) is not None:
            handed.append((due[0], clock.now, threading.current_thread().name))
        delivered.release()

    delivery = HeldDelivery(hold, wheel, clock, deliver, "held-test")
    hold.on_hold = delivery.wake
    assert hold.hold(("t", 1, 2), "A", 1_000.0, 1, 10) and hold.hold(("t", 1, 3), "B", 3_000.0, 1, 10)
    assert len(wheel) == 1, "one wake-up, for the earliest"
    clock.now = 999.0
    wheel.run_due()
    assert not delivered.acquire(timeout=0.2) and handed == [], "nothing before it is due"
    clock.now = 1_000.0
    wheel.run_due()
    assert delivered.acquire(timeout=10)
    assert handed == [("A", 1_000.0, "held-test")], "on the delivery's thread, not the wheel's"
    deadline = time.monotonic() + 10
    while len(wheel) != 1 and time.monotonic() < deadline:  # the thread arms the next one as it ends
        time.sleep(0.01)
    assert len(wheel) == 1, "armed again for B"
    delivery.stop()
    assert len(wheel) == 0, "stop cancels the wake-up"
    clock.now = 3_000.0
    wheel.run_due()
    assert not delivered.acquire(timeout=0.2) and len(hold) == 1, "stopped: B stays held"
    wheel.close(0.0)


def test_bad_bound_is_refused_before_subscribing(offline_client: Client) -> None:
    with pytest.raises(ValueError, match="max_held_chunked_bytes must be >= 0"):
        offline_client.subscribe("t", SUB, max_held_chunked_bytes=-1)
    with pytest.raises(TypeError, match="max_held_chunked_bytes must be an int"):
        offline_client.subscribe("t", SUB, max_held_chunked_bytes=1.5)


def test_broker_restart_while_held_is_not_handed_out_early_or_twice() -> None:
    """pulsar-lite re-dispatches every unacked message when the consumer reconnects: the copy of the held
    chunked message is dropped (counted); the held one comes at its time, once."""
    with PulsarLite() as broker:
        client = _client(broker)
        topic = f"persistent://public/default/restart-{uuid.uuid4().hex[:8]}"
        consumer = client.subscribe(topic, SUB, consumer_type=SHARED)
        data = payload(4, SIZES["lite"])
        send_chunked(client, topic, [data])
        nacked = time.monotonic()
        consumer.negative_acknowledge(receive_all(consumer, 1)[0], delay_ms=6000)
        broker.restart()
        back = receive_all(consumer, 1, timeout_s=30)[0]
        assert time.monotonic() - nacked >= 6.0 - CLOCK_TOLERANCE_S, "not the broker's early copy"
        assert back.data() == data and type(back) is HeldMessage
        assert consumer.nack_stats().chunked_copies_dropped >= 1
        nothing_more(consumer, 1500)
        consumer.acknowledge(back)
        consumer.close()
        assert leftover(client, topic, SUB) == []
        client.close()


def test_redeliver_unacknowledged_brings_a_held_message_back_at_once(
    client: Client, topic: str, size: int
) -> None:
    """Like the official call: every unacked message comes again now — the held one from the broker, whole
    (the hold is forgotten, so it is not handed out a second time at its due time)."""
    consumer = client.subscribe(topic, SUB, consumer_type=SHARED)
    data = payload(6, size)
    send_chunked(client, topic, [data])
    consumer.negative_acknowledge(receive_all(consumer, 1)[0], delay_ms=60_000)
    assert consumer.nack_stats().chunked_held == 1
    consumer.redeliver_unacknowledged_messages()
    back = receive_all(consumer, 1, timeout_s=10)[0]
    assert back.data() == data and type(back) is not HeldMessage
    assert consumer.nack_stats().chunked_held == 0
    consumer.acknowledge(back)
    nothing_more(consumer, 1500)
    consumer.close()
    assert leftover(client, topic, SUB) == []


def _send_small_and_batched(client: Any, topic: str) -> None:
    """``s0``, ``s1`` (one entry each) and ``b0`` .. ``b3`` (one batch entry) on ``topic``."""
    single = client.create_producer(topic, batching_enabled=False)
    for i in range(2):
        single.send(f"s{i}".encode())
    single.close()
    batched = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=50)
    for i in range(4):
        batched.send_async(f"b{i}".encode(), None)
    batched.flush()
    batched.close()


class ListenerLog:
    """What a ``message_listener`` saw, recorded on its thread and asserted on the test's: every call's
    message and time, and whether two calls ever overlapped (the listener must be called one at a time)."""

    def __init__(self, hold_s: float = 0.0) -> None:
        self.calls: list[tuple[pulsar.Message, float]] = []
        self.nacked_at: dict[bytes, float] = {}
        self.overlaps = 0
        self.errors: list[BaseException] = []
        self._active = 0
        self._lock = threading.Lock()
        self._hold_s = hold_s  # each call lasts this long: overlapping calls would be seen
        self.changed = threading.Condition(self._lock)

    def __call__(self, consumer: Any, message: Any, decide: Any) -> None:
        with self._lock:
            self._active += 1
            self.overlaps += self._active > 1
            self.calls.append((message, time.monotonic()))
        try:
            time.sleep(self._hold_s)
            decide(consumer, message)
        except BaseException as error:  # recorded: asserted on the test thread
            self.errors.append(error)
        finally:
            with self._lock:
                self._active -= 1
                self.changed.notify_all()

    def wait_for(self, count: int, timeout_s: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: len(self.calls) >= count and not self._active, timeout_s)


def test_listener_gets_the_nacked_chunked_message_back_whole_once_at_its_time(
    client: Client, topic: str, size: int
) -> None:
    """A ``message_listener`` consumer holds a nacked chunked message too: its HeldDelivery thread hands it
    to the listener once, whole (bytes, properties), at nack time + delay; alongside a non-chunked and a
    batched message nacked too, nothing else comes twice or is lost, and the listener is never called for
    two messages at once: each call lasts 300 ms, so the held message falls due while the native listener
    thread is busy with the small messages (calls begun before the first hand-out, and after it)."""
    nack = {b"s1", b"b2"}
    log = ListenerLog(hold_s=0.3)

    def decide(consumer: Any, message: Any) -> None:
        data = message.data()
        first = next(m for m, _ in log.calls if m.data() == data) is message
        if first and (data in nack or (is_chunked(message) and message.properties()["tag"] == "0")):
            log.nacked_at[data] = time.monotonic()
            consumer.negative_acknowledge(message, delay_ms=1000 if is_chunked(message) else 1500)
        else:
            consumer.acknowledge(message)

    consumer = client.subscribe(
        topic, SUB, consumer_type=SHARED, message_listener=lambda c, m: log(c, m, decide)
    )
    sent = [payload(i, size) for i in range(2)]
    send_chunked(client, topic, sent)
    _send_small_and_batched(client, topic)
    assert log.wait_for(8 + 3, 45), [(len(m.data()), type(m).__name__) for m, _ in log.calls]
    time.sleep(1.5)  # exactly once: nothing more comes
    assert not log.errors and log.overlaps == 0, (log.errors, log.overlaps)
    datas = [m.data() for m, _ in log.calls]
    assert sorted(datas) == sorted(
        [*sent, sent[0], b"s0", b"s1", b"s1", *(f"b{i}".encode() for i in range(4)), b"b2"]
    )
    first, again = [(m, t) for m, t in log.calls if m.data() == sent[0]]
    assert type(again[0]) is HeldMessage, "handed out from memory, not nacked at the broker"
    assert again[1] >= log.nacked_at[sent[0]] + 1.0 - CLOCK_TOLERANCE_S, "never early"
    assert again[1] <= log.nacked_at[sent[0]] + 1.0 + 5.0, "at its time (generous bound, calls take turns)"
    assert again[0].properties() == {"tag": "0", "kind": "large"}
    assert again[0].redelivery_count() == first[0].redelivery_count() + 1
    stats = consumer.nack_stats()
    assert type(stats) is NackStats
    assert (stats.chunked_redelivered, stats.chunked_held, stats.chunked_native) == (1, 0, 0), stats
    consumer.close()
    assert leftover(client, topic, SUB) == []


def test_listener_dead_letters_the_chunked_message_after_n_nacks(
    client: Client, topic: str, size: int
) -> None:
    """``dead_letter_policy(max_redeliver_count=2)`` with a listener that nacks every time: the listener
    sees the chunked message with counts first, +1, +2, then it is produced to the dead-letter topic whole
    and acked; the listener is not called again."""
    dlq = f"{topic}-dlq"
    dead_letters = client.subscribe(dlq, "dlq-reader", consumer_type=SHARED)
    log = ListenerLog()

    def nack(consumer: Any, message: Any) -> None:
        consumer.negative_acknowledge(message)

    consumer = client.subscribe(
        topic, SUB, consumer_type=SHARED, negative_ack_redelivery_delay_ms=300,
        dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=2, dead_letter_topic=dlq),
        message_listener=lambda c, m: log(c, m, nack),
    )  # fmt: skip
    data = payload(2, size)
    send_chunked(client, topic, [data])
    dead = receive_all(dead_letters, 1, timeout_s=30)[0]
    assert dead.data() == data, "whole"
    assert dead.properties()["tag"] == "0" and dead.properties()[REAL_TOPIC] == topic
    dead_letters.acknowledge(dead)
    time.sleep(1.0)  # no further hand-out
    assert not log.errors
    counts = [m.redelivery_count() for m, _ in log.calls]
    assert counts == list(range(counts[0], 3)) and counts[0] <= 1, counts
    assert all(m.data() == data for m, _ in log.calls)
    assert consumer.nack_stats().chunked_dead_lettered == 1
    consumer.close()
    dead_letters.close()
    assert leftover(client, topic, SUB) == []


# -- the asyncio consumer ------------------------------------------------------------------------------


def _aio_client(broker: Broker) -> aio.Client:
    return aio.Client(
        broker.service_url,
        operation_timeout_seconds=30,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )


async def _receive_n(consumer: aio.NackConsumer, count: int, timeout_s: float = 30.0) -> list[pulsar.Message]:
    got: list[pulsar.Message] = []
    try:
        async with asyncio.timeout(timeout_s):
            while len(got) < count:
                got.append(await consumer.receive())
    except TimeoutError:
        pytest.fail(f"timed out with {len(got)} of {count}: {[len(m.data()) for m in got]}")
    return got


async def _nothing_more(consumer: aio.NackConsumer, wait_s: float) -> None:
    try:
        extra = await asyncio.wait_for(consumer.receive(), wait_s)
    except TimeoutError:
        return
    pytest.fail(f"unexpected extra message of {len(extra.data())} bytes")


def test_asyncio_consumer_gets_the_nacked_chunked_message_back_whole_once_at_its_time(
    chunk_broker: Broker, topic: str, size: int
) -> None:
    """``await receive()`` hands a nacked chunked message out again whole, once, at its time — also to a
    ``receive()`` that was already waiting on the broker when the message was nacked (the loop timer wakes
    it) — alongside a non-chunked and a batched message nacked with it."""

    async def scenario() -> None:
        client = _aio_client(chunk_broker)
        consumer = await client.subscribe(topic, SUB, consumer_type=SHARED)
        sent = [payload(i, size) for i in range(2)]
        await asyncio.to_thread(send_chunked, pulsar_sync, topic, sent)
        await asyncio.to_thread(_send_small_and_batched, pulsar_sync, topic)
        first = await _receive_n(consumer, 8)
        by_data = {m.data(): m for m in first}
        assert sorted(by_data) == sorted([*sent, b"s0", b"s1", *(f"b{i}".encode() for i in range(4))])
        for data, message in by_data.items():
            if data not in (sent[0], b"s1", b"b2"):
                await consumer.acknowledge(message)
        waiting = asyncio.create_task(consumer.receive())  # waits on the broker: nothing is due
        await asyncio.sleep(0.3)
        assert not waiting.done()
        nacked_at = time.monotonic()
        await consumer.negative_acknowledge(by_data[sent[0]], delay_ms=1200)
        held = await asyncio.wait_for(waiting, 30)  # nothing else arrives: only the loop timer wakes it
        arrived = time.monotonic()
        assert type(held) is HeldMessage and held.data() == sent[0]
        assert held.properties() == {"tag": "0", "kind": "large"}
        assert held.redelivery_count() == by_data[sent[0]].redelivery_count() + 1
        assert arrived >= nacked_at + 1.2 - CLOCK_TOLERANCE_S, "never early"
        assert arrived <= nacked_at + 1.2 + 5.0, "at its time (generous bound)"
        # alongside: the held message nacked again, with a non-chunked and a batched message
        await consumer.negative_acknowledge(held, delay_ms=800)
        await consumer.negative_acknowledge(by_data[b"s1"], delay_ms=800)
        await consumer.negative_acknowledge(by_data[b"b2"], delay_ms=800)
        again = await _receive_n(consumer, 3)
        assert sorted(m.data() for m in again) == sorted([sent[0], b"s1", b"b2"])
        second = next(m for m in again if m.data() == sent[0])
        assert type(second) is HeldMessage and second.redelivery_count() == held.redelivery_count() + 1
        await _nothing_more(consumer, 1.5)
        for message in again:
            await consumer.acknowledge(message)
        stats = consumer.nack_stats()
        assert type(stats) is NackStats
        assert (stats.chunked_redelivered, stats.chunked_held, stats.chunked_native) == (2, 0, 0), stats
        await consumer.close()
        await client.close()

    pulsar_sync = _client(chunk_broker, pulsar.Client)
    try:
        asyncio.run(asyncio.wait_for(scenario(), 90))
        assert leftover(pulsar_sync, topic, SUB) == []
    finally:
        pulsar_sync.close()


def test_asyncio_async_for_and_dead_letters(chunk_broker: Broker, topic: str, size: int) -> None:
    """``async for`` with ``dead_letter_policy(max_redeliver_count=1)``: the chunked message comes with
    counts first, +1, then goes to the dead-letter topic whole; the loop sees it no more."""

    async def scenario() -> None:
        client = _aio_client(chunk_broker)
        dlq = f"{topic}-dlq"
        dead_letters = await client.subscribe(dlq, "dlq-reader", consumer_type=SHARED)
        consumer = await client.subscribe(
            topic, SUB, consumer_type=SHARED, negative_ack_redelivery_delay_ms=300,
            dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(max_redeliver_count=1, dead_letter_topic=dlq),
        )  # fmt: skip
        data = payload(4, size)
        await asyncio.to_thread(send_chunked, pulsar_sync, topic, [data])
        counts: list[int] = []

        async def loop() -> None:
            async for message in consumer:
                assert message.data() == data
                counts.append(message.redelivery_count())
                await consumer.negative_acknowledge(message)

        task = asyncio.create_task(loop())
        dead = (await _receive_n(dead_letters, 1))[0]
        assert dead.data() == data and dead.properties()[REAL_TOPIC] == topic
        await dead_letters.acknowledge(dead)
        await asyncio.sleep(1.0)
        assert counts == list(range(counts[0], 2)) and counts[0] <= 1, counts
        assert consumer.nack_stats().chunked_dead_lettered == 1
        await consumer.close()
        await asyncio.wait_for(task, 10)  # the loop ends at close
        await dead_letters.close()
        await client.close()

    pulsar_sync = _client(chunk_broker, pulsar.Client)
    try:
        asyncio.run(asyncio.wait_for(scenario(), 90))
        assert leftover(pulsar_sync, topic, SUB) == []
    finally:
        pulsar_sync.close()


@pytest.mark.apache
def test_seek_forgets_held_messages(apache_chunking: PulsarStandalone, topic: str) -> None:
    """Apache only (pulsar-lite 0.2 cannot seek): after ``seek(earliest)`` the application receives every
    message again from the broker, the held one included, once."""
    client = _client(apache_chunking)
    consumer = client.subscribe(topic, SUB, consumer_type=SHARED)
    sent = [payload(i, SIZES["apache"]) for i in range(2)]
    send_chunked(client, topic, sent)
    first = receive_all(consumer, 2)
    consumer.negative_acknowledge(first[0], delay_ms=60_000)
    consumer.seek(pulsar.MessageId.earliest)
    again = receive_all(consumer, 2)
    assert sorted(m.data() for m in again) == sorted(sent)
    assert not any(type(m) is HeldMessage for m in again)
    nothing_more(consumer, 1500)
    for message in again:
        consumer.acknowledge(message)
    consumer.close()
    assert leftover(client, topic, SUB) == []
    client.close()
