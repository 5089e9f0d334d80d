"""Every public parameter, good and bad values (docs/parameters.md is the table of them).

Bad values raise the exception type the official client raises for the same argument (``ValueError`` from
``pulsar.Client.subscribe``'s type check for ``negative_ack_redelivery_delay_ms``; compared with the
official client itself below), else ``TypeError`` (wrong type) / ``ValueError`` (wrong value) naming the
parameter, and leave nothing behind: no consumer created, nothing filed. numpy integers are accepted
wherever ints are. Most tests need no broker (the checks run before anything is sent: a client on a
closed port will do); those that need a consumer use the session's pulsar-lite.
"""

from __future__ import annotations

import datetime
import itertools
import logging
import math
import re
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pulsar
import pytest
from messaging import produce, receive_all

import pulsar_nack
from pulsar_nack import (
    DelayLimitedProducer,
    DelayLimitExceeded,
    MultiplierRedeliveryBackoff,
    NackConsumer,
    NackOptions,
    NativeTiming,
    TimeBucketIndex,
)
from pulsar_nack.consumer import _wrap_lateness_ms
from pulsar_nack.testing import PulsarLite

NAN, INF = math.nan, math.inf
#: Not-a-number-of-ms values every ms parameter rejects by type (bool is no number here).
WRONG_TYPES: list[Any] = [True, False, "1000", b"1000", None, [1000], complex(1, 0), object()]


def ids(value: Any) -> str:
    return re.sub(r"\W+", "_", f"{type(value).__name__}_{value!r}")[:40]


def kwargs_id(kwargs: dict[str, Any]) -> str:
    return "-".join(f"{k}={ids(v)}" for k, v in kwargs.items())


@pytest.fixture(scope="module")
def offline_client() -> Iterator[pulsar_nack.Client]:
    """A client on a closed port: enough for every check that runs before anything is sent."""
    client = pulsar_nack.Client(
        "pulsar://127.0.0.1:9",
        operation_timeout_seconds=1,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )
    yield client
    client.close()


@pytest.fixture(scope="module")
def lite_client(pulsar_lite: PulsarLite) -> Iterator[pulsar_nack.Client]:
    client = pulsar_nack.Client(
        pulsar_lite.service_url,
        operation_timeout_seconds=30,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn),
    )
    yield client
    client.close()


def new_topic() -> str:
    return f"persistent://public/default/inputs-{uuid.uuid4().hex}"


# -- the nack options of Client.subscribe (and wrap(), which takes the same names) -------------------

OPTION_BAD: list[tuple[str, Any, type[Exception]]] = [
    # the official client's parameter: a wrong type is ValueError, as pulsar.Client.subscribe raises
    *(("negative_ack_redelivery_delay_ms", v, ValueError) for v in [*WRONG_TYPES, 1.5, 100.0, INF, NAN]),
    ("negative_ack_redelivery_delay_ms", np.float64(100), ValueError),
    ("negative_ack_redelivery_delay_ms", -1, ValueError),
    ("negative_ack_redelivery_delay_ms", np.int64(-1), ValueError),
    ("negative_ack_redelivery_delay_ms", 2**63, TypeError),  # the official C++ binding: TypeError
    *(("negative_ack_precision_bits", v, TypeError) for v in [*WRONG_TYPES, 8.0, INF, NAN]),
    *(("negative_ack_precision_bits", v, ValueError) for v in [-1, 31, np.int8(-1), 2**70]),
    *(("negative_ack_rounding", v, ValueError) for v in ["up", "FLOOR", None, True, 0, ["floor"]]),
    *(("negative_ack_backoff", v, TypeError) for v in [5, "1000", True, object(), lambda n: 1000]),
    *(("max_redelivery_delay_ms", v, TypeError) for v in [*WRONG_TYPES, 1.5, INF, NAN]),
    *(("max_redelivery_delay_ms", v, ValueError) for v in [-1, np.int32(-5)]),
    *(("on_delay_limit", v, ValueError) for v in ["ignore", None, True, 1, ["error"]]),
    *(("on_close", v, ValueError) for v in ["keep", None, True, 1, ["drop"]]),
    *(("on_redelivery", v, TypeError) for v in [5, "hook", True, object()]),
]


class NotCallableNext:
    next = 5


OPTION_BAD.append(("negative_ack_backoff", NotCallableNext(), TypeError))


@pytest.mark.parametrize(
    ("name", "value", "error"), OPTION_BAD, ids=[f"{n}-{ids(v)}" for n, v, _ in OPTION_BAD]
)
def test_subscribe_rejects_bad_nack_options_before_subscribing(
    offline_client: pulsar_nack.Client, name: str, value: Any, error: type[Exception]
) -> None:
    with pytest.raises(error, match=name) as info:
        offline_client.subscribe("t", "s", **{name: value})
    assert type(info.value) is error
    assert offline_client._consumers == [], "no consumer created"


@pytest.mark.parametrize(
    ("name", "value", "error"), OPTION_BAD, ids=[f"{n}-{ids(v)}" for n, v, _ in OPTION_BAD]
)
def test_wrap_rejects_the_same_bad_options(name: str, value: Any, error: type[Exception]) -> None:
    consumer = pulsar.Consumer()  # never reached: the options are checked first
    with pytest.raises(error, match=name):
        pulsar_nack.wrap(consumer, native_delay_ms=pulsar_nack.NATIVE_DELAY_MS, **{name: value})


@pytest.mark.parametrize("value", [1.5, "1000", None, INF, NAN, 2**63, np.float64(100)], ids=ids)
def test_redelivery_delay_errors_are_the_official_clients(
    offline_client: pulsar_nack.Client, value: Any
) -> None:
    """The official subscribe rejects these too (before connecting): same exception type."""
    with pytest.raises(Exception) as official:
        pulsar.Client.subscribe(offline_client, "t", "s", negative_ack_redelivery_delay_ms=value)
    with pytest.raises(Exception) as ours:
        offline_client.subscribe("t", "s", negative_ack_redelivery_delay_ms=value)
    assert type(ours.value) is type(official.value), (ours.value, official.value)
    assert "negative_ack_redelivery_delay_ms" in str(ours.value)


def test_a_limit_below_the_default_delay_is_rejected(offline_client: pulsar_nack.Client) -> None:
    with pytest.raises(DelayLimitExceeded, match="10 milliseconds"):
        offline_client.subscribe("t", "s", max_redelivery_delay_ms=10, negative_ack_redelivery_delay_ms=50)
    assert offline_client._consumers == []


def test_unknown_arguments_are_named(offline_client: pulsar_nack.Client) -> None:
    with pytest.raises(TypeError, match="no_such_option"):
        offline_client.subscribe("t", "s", no_such_option=1)


def test_good_options_numpy_integers_become_ints() -> None:
    options = NackOptions(
        redelivery_delay_ms=np.int64(500),
        precision_bits=np.int32(4),
        max_redelivery_delay_ms=np.uint16(1000),
        native_delay_ms=np.int64(102),
        backoff=MultiplierRedeliveryBackoff(np.int64(100), np.uint32(1000)),
    )
    values = (options.redelivery_delay_ms, options.precision_bits, options.max_redelivery_delay_ms)
    assert values == (500, 4, 1000) and all(type(v) is int for v in values)
    assert type(options.native_delay_ms) is int and options.native.delay_ms == 102
    for good in (0, 1, 60_000, 2**63 - 1):
        assert NackOptions(redelivery_delay_ms=good).redelivery_delay_ms == good
    for bits in (0, 30):
        assert NackOptions(precision_bits=bits).precision_bits == bits
    assert NackOptions(rounding="ceil", on_delay_limit="clamp", on_close="flush", on_redelivery=print)


def test_subscribe_with_numpy_options_on_a_broker(lite_client: pulsar_nack.Client) -> None:
    topic = new_topic()
    consumer = lite_client.subscribe(
        topic,
        "s",
        consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_redelivery_delay_ms=np.int64(200),
        negative_ack_precision_bits=np.int8(4),
        max_redelivery_delay_ms=np.int64(5_000),
    )
    assert isinstance(consumer, NackConsumer) and consumer.nack_options.redelivery_delay_ms == 200
    produce(lite_client, topic, 1)
    consumer.negative_acknowledge(receive_all(consumer, 1)[0], delay_ms=np.int64(100))
    again = receive_all(consumer, 1)[0]
    assert again.data() == b"m0" and again.redelivery_count() == 1
    consumer.acknowledge(again)
    consumer.close()


# -- delay_ms of negative_acknowledge ------------------------------------------------------------------

DELAY_GOOD: list[tuple[Any, float]] = [
    (0, 0.0),
    (500, 500.0),
    (0.5, 0.5),
    (np.int64(500), 500.0),
    (np.uint32(500), 500.0),
    (np.float32(500), 500.0),
    (np.float64(2.5), 2.5),
    (datetime.timedelta(seconds=2), 2000.0),
    (datetime.timedelta(0), 0.0),
    (10**12, 1e12),
]
DELAY_BAD: list[tuple[Any, type[Exception]]] = [
    *((v, TypeError) for v in WRONG_TYPES if v is not None),  # None: "no per-call delay"
    (-1, ValueError),
    (-0.001, ValueError),
    (np.int64(-1), ValueError),
    (INF, ValueError),
    (-INF, ValueError),
    (NAN, ValueError),
    (np.float64(NAN), ValueError),
    (10**400, ValueError),
    (datetime.timedelta(milliseconds=-1), ValueError),
]


@pytest.mark.parametrize(("value", "ms"), DELAY_GOOD, ids=[ids(v) for v, _ in DELAY_GOOD])
def test_delay_ms_good(value: Any, ms: float) -> None:
    assert NackOptions().delay_for(value, 0) == ms


@pytest.mark.parametrize(("value", "error"), DELAY_BAD, ids=[ids(v) for v, _ in DELAY_BAD])
def test_delay_ms_bad(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="delay_ms"):
        NackOptions().delay_for(value, 0)


def test_delay_ms_none_means_the_backoff_or_the_default() -> None:
    assert NackOptions(redelivery_delay_ms=700).delay_for(None, 5) == 700.0
    assert NackOptions(backoff=MultiplierRedeliveryBackoff(100, 1000)).delay_for(None, 2) == 400.0


def test_bad_delays_file_nothing_on_a_real_consumer(lite_client: pulsar_nack.Client) -> None:
    topic = new_topic()
    consumer = lite_client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    produce(lite_client, topic, 1)
    message = receive_all(consumer, 1)[0]
    for value, error in DELAY_BAD:
        with pytest.raises(error, match="delay_ms"):
            consumer.negative_acknowledge(message, delay_ms=value)
    stats = consumer.nack_stats()
    assert (stats.pending, stats.nacked) == (0, 0), "nothing filed by a rejected nack"
    consumer.negative_acknowledge(message, delay_ms=np.int64(100))
    again = receive_all(consumer, 1)[0]
    assert again.data() == b"m0"
    consumer.acknowledge(again)
    consumer.close()


# -- what a backoff returns -----------------------------------------------------------------------


class Returns:
    """A backoff whose next() returns a fixed value (whatever it is)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def next(self, redelivery_count: int) -> Any:
        return self.value


BACKOFF_RESULT_BAD: list[tuple[Any, type[Exception]]] = [
    (-5, ValueError),
    (np.int64(-5), ValueError),
    (-0.5, ValueError),
    (NAN, ValueError),
    (INF, ValueError),
    (10**400, ValueError),
    ("1000", TypeError),
    (None, TypeError),
    (True, TypeError),
    (datetime.timedelta(seconds=1), TypeError),
    ([1000], TypeError),
]


@pytest.mark.parametrize(("result", "error"), BACKOFF_RESULT_BAD, ids=[ids(v) for v, _ in BACKOFF_RESULT_BAD])
def test_bad_backoff_results_name_the_backoff(result: Any, error: type[Exception]) -> None:
    options = NackOptions(backoff=Returns(result))
    with pytest.raises(error, match=re.escape(f"negative_ack_backoff.next(3) returned {result!r}")):
        options.delay_for(None, 3)


@pytest.mark.parametrize(
    ("result", "ms"),
    [(0, 0.0), (1000, 1000.0), (np.int64(7), 7.0), (np.float32(2.5), 2.5), (7.5, 7.5)],
    ids=ids,
)
def test_good_backoff_results(result: Any, ms: float) -> None:
    assert NackOptions(backoff=Returns(result)).delay_for(None, 0) == ms


def test_a_bad_backoff_result_files_nothing_on_a_real_consumer(lite_client: pulsar_nack.Client) -> None:
    backoff = Returns(-5)
    topic = new_topic()
    consumer = lite_client.subscribe(
        topic, "s", consumer_type=pulsar.ConsumerType.Shared, negative_ack_backoff=backoff
    )
    produce(lite_client, topic, 1)
    message = receive_all(consumer, 1)[0]
    for value, error in BACKOFF_RESULT_BAD:
        backoff.value = value
        with pytest.raises(error, match=r"negative_ack_backoff\.next\(0\)"):
            consumer.negative_acknowledge(message)
    assert consumer.nack_stats().pending == 0
    backoff.value = np.int64(100)
    consumer.negative_acknowledge(message)
    again = receive_all(consumer, 1)[0]
    consumer.acknowledge(again)
    consumer.close()


# -- MultiplierRedeliveryBackoff ------------------------------------------------------------------------

BACKOFF_ARGS_BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    *(({"min_delay_ms": v}, TypeError, "min_delay_ms") for v in [*WRONG_TYPES, 1.5, INF, NAN]),
    *(({"max_delay_ms": v}, TypeError, "max_delay_ms") for v in [*WRONG_TYPES, 1.5, INF, NAN]),
    ({"min_delay_ms": -1}, ValueError, "min_delay_ms"),
    ({"max_delay_ms": -1}, ValueError, "max_delay_ms"),
    ({"max_delay_ms": 2**63}, ValueError, "max_delay_ms"),
    ({"min_delay_ms": 2000, "max_delay_ms": 1000}, ValueError, "max_delay_ms"),
    *(({"multiplier": v}, TypeError, "multiplier") for v in WRONG_TYPES),
    *(({"multiplier": v}, ValueError, "multiplier") for v in [0.5, 0, -2, INF, NAN]),
    *(({"jitter_percent": v}, TypeError, "jitter_percent") for v in WRONG_TYPES),
    *(({"jitter_percent": v}, ValueError, "jitter_percent") for v in [-1, 100.5, INF, NAN]),
    *(({"seed": v}, TypeError, "seed") for v in [1.5, "7", True, b"7"]),
]


@pytest.mark.parametrize(
    ("kwargs", "error", "name"), BACKOFF_ARGS_BAD, ids=[kwargs_id(k) for k, _, _ in BACKOFF_ARGS_BAD]
)
def test_backoff_rejects_bad_arguments(kwargs: dict[str, Any], error: type[Exception], name: str) -> None:
    arguments: dict[str, Any] = {"min_delay_ms": 1000, "max_delay_ms": 60_000, **kwargs}
    with pytest.raises(error, match=name):
        MultiplierRedeliveryBackoff(**arguments)


def test_backoff_good_arguments() -> None:
    b = MultiplierRedeliveryBackoff(np.int64(100), np.uint32(1000), np.float32(2), jitter_percent=np.int8(0))
    assert (b.min_delay_ms, b.max_delay_ms, b.multiplier) == (100, 1000, 2.0)
    assert type(b.min_delay_ms) is int and type(b.max_delay_ms) is int
    assert MultiplierRedeliveryBackoff(0, 0).next(50) == 0
    assert MultiplierRedeliveryBackoff(5, 5, 1).next(10**9) == 5
    assert MultiplierRedeliveryBackoff(1, 2**63 - 1, 1e308).next(1) == 2**63 - 1
    assert MultiplierRedeliveryBackoff(1, 10, jitter_percent=100, seed=np.int64(3)).seed == 3


@pytest.mark.parametrize("count", [1.5, "3", None, True, NAN], ids=ids)
def test_backoff_next_rejects_a_bad_redelivery_count(count: Any) -> None:
    with pytest.raises(TypeError, match="redelivery_count"):
        MultiplierRedeliveryBackoff(100, 1000).next(count)


def test_backoff_next_takes_numpy_counts() -> None:
    b = MultiplierRedeliveryBackoff(100, 1000)
    assert b.next(np.int64(2)) == b.next(2) == 400 and b.next(np.uint8(0)) == 100


BACKOFF_CONFIGS = [
    (1000, 600_000, 2.0),  # Go's default policy's numbers (which goes negative for counts 34-54)
    (1, 2**63 - 1, 2.0),
    (1, 2**63 - 1, 1e308),
    (7, 2**63 - 1, 1.0000001),
    (3, 2**53 + 1, 3.0),
    (100, 100, 5.0),
    (0, 2**40, 2.0),
    (1000, 3_600_000, 1.0),
    (999, 1000, 1.0005),
]


@pytest.mark.parametrize(("low", "high", "multiplier"), BACKOFF_CONFIGS, ids=str)
def test_backoff_is_monotone_bounded_and_finite_for_counts_0_to_200(
    low: int, high: int, multiplier: float
) -> None:
    backoff = MultiplierRedeliveryBackoff(low, high, multiplier)
    delays = [backoff.next(n) for n in range(201)]
    assert all(type(d) is int for d in delays)
    assert all(low <= d <= high for d in delays), [d for d in delays if not low <= d <= high][:3]
    assert all(a <= b for a, b in itertools.pairwise(delays)), "non-decreasing"
    assert delays[-1] <= backoff.next(10**100) == (high if multiplier > 1 and low else low)
    assert NackOptions(backoff=backoff).delay_for(None, 200) == float(delays[-1])


def test_backoff_jitter_is_off_by_default() -> None:
    b = MultiplierRedeliveryBackoff(1000, 600_000)
    assert b.jitter_percent == 0.0
    assert {b.next(3) for _ in range(100)} == {8000}


@pytest.mark.parametrize("percent", [1, 10, 50, 100])
def test_backoff_jitter_is_plus_minus_half_the_percent(percent: float) -> None:
    """PIP-468's shape: delay · U[1 - p/200, 1 + p/200), on every call, the first included."""
    b = MultiplierRedeliveryBackoff(1000, 600_000, jitter_percent=percent, seed=42)
    plain = MultiplierRedeliveryBackoff(1000, 600_000)
    for count in (0, 1, 5, 50):
        base = plain.next(count)
        samples = [b.next(count) for _ in range(2000)]
        low, high = base * (1 - percent / 200), base * (1 + percent / 200)
        assert all(low - 0.5 <= s <= high + 0.5 for s in samples)
        assert min(samples) < base < max(samples), "both sides of the delay"
        assert min(samples) <= low + (high - low) * 0.05 and max(samples) >= high - (high - low) * 0.05
        assert abs(sum(samples) / len(samples) - base) < (high - low) * 0.05, "centered on the delay"


def test_backoff_jitter_is_deterministic_with_a_seed() -> None:
    def series(seed: int) -> list[int]:
        b = MultiplierRedeliveryBackoff(100, 10_000, jitter_percent=20, seed=seed)
        return [b.next(n % 10) for n in range(50)]

    assert series(7) == series(7)
    assert series(7) != series(8)


# -- TimeBucketIndex -------------------------------------------------------------------------------

INDEX_ARGS_BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    *(({"precision_bits": v}, TypeError, "precision_bits") for v in [*WRONG_TYPES, 8.0, INF, NAN]),
    *(({"precision_bits": v}, ValueError, "precision_bits") for v in [-1, 31, np.int64(31)]),
    *(({"rounding": v}, ValueError, "rounding") for v in ["up", None, True, 1, ["ceil"]]),
]


@pytest.mark.parametrize(
    ("kwargs", "error", "name"), INDEX_ARGS_BAD, ids=[kwargs_id(k) for k, _, _ in INDEX_ARGS_BAD]
)
def test_index_constructor_rejects_bad_arguments(
    kwargs: dict[str, Any], error: type[Exception], name: str
) -> None:
    with pytest.raises(error, match=name):
        TimeBucketIndex(**kwargs)


def test_index_constructor_takes_numpy_precision() -> None:
    index = TimeBucketIndex(np.int64(4), "ceil")
    assert index.precision_bits == 4 and type(index.precision_bits) is int
    assert index.add(np.int64(17), np.int64(1), np.uint32(2)) == 32


ADD_BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    *(({"due_ms": v}, TypeError, "due_ms") for v in [*WRONG_TYPES, 1000.0, INF, NAN, np.float64(1000)]),
    *(({"due_ms": v}, ValueError, "due_ms") for v in [-1, -255, -256, -(2**40), np.int64(-1)]),
    *(({"ledger_id": v}, TypeError, "ledger_id") for v in [True, 1.0, "1", None]),
    ({"ledger_id": -1}, ValueError, "ledger_id"),
    *(({"entry_id": v}, TypeError, "entry_id") for v in [True, 1.0, "1", None]),
    *(({"entry_id": v}, ValueError, "entry_id") for v in [-1, 2**32]),
    *(({"batch_index": v}, TypeError, "batch_index") for v in [True, 1.0, "1", None]),
    *(({"batch_index": v}, ValueError, "batch_index") for v in [-2, 2**31]),
    ({"topic": 5}, TypeError, "topic"),
]


@pytest.mark.parametrize("rounding", ["floor", "ceil"])
@pytest.mark.parametrize(("kwargs", "error", "name"), ADD_BAD, ids=[kwargs_id(k) for k, _, _ in ADD_BAD])
def test_index_add_rejects_bad_arguments_whatever_the_rounding(
    kwargs: dict[str, Any], error: type[Exception], name: str, rounding: str
) -> None:
    """Both roundings reject the same values (ceil once put negative due times into bucket 0)."""
    index = TimeBucketIndex(8, rounding)  # type: ignore[arg-type]
    index.add(5000, 1, 1)
    arguments: dict[str, Any] = {"due_ms": 1000, "ledger_id": 2, "entry_id": 3, **kwargs}
    with pytest.raises(error, match=name):
        index.add(**arguments)
    assert (len(index), index.bucket_count, index.added) == (1, 1, 1), "the index is unchanged"
    assert [(d.ledger_id, d.entry_ids.tolist()) for d in index.pop_due(2**40)] == [(1, [1])]


@pytest.mark.parametrize("rounding", ["floor", "ceil"])
@pytest.mark.parametrize("due", [-1, True, 1.5], ids=ids)
def test_index_bucket_of_agrees_with_add(rounding: str, due: Any) -> None:
    index = TimeBucketIndex(8, rounding)  # type: ignore[arg-type]
    with pytest.raises((TypeError, ValueError)) as add_error:
        index.add(due, 1, 1)
    with pytest.raises((TypeError, ValueError)) as bucket_error:
        index.bucket_of(due)
    assert type(add_error.value) is type(bucket_error.value)


@pytest.mark.parametrize(
    "due", [0, 1, 255, 256, 2**62, np.int64(300), np.uint64(300), np.int32(300)], ids=ids
)
def test_index_add_takes_good_due_times(due: Any) -> None:
    for rounding in ("floor", "ceil"):
        index = TimeBucketIndex(8, rounding)  # type: ignore[arg-type]
        bucket = index.add(due, 1, 1)
        assert bucket == index.bucket_of(due) and len(index) == 1


def test_index_add_many_rejects_bools_and_negatives() -> None:
    index = TimeBucketIndex(8, "ceil")
    with pytest.raises(TypeError, match="due_ms"):
        index.add_many(np.array([True, False]), 1, [1, 2])
    with pytest.raises(ValueError, match="due_ms"):
        index.add_many([-1, 5], 1, [1, 2])
    assert len(index) == 0 and index.bucket_count == 0


# -- Client.create_producer(max_delivery_delay_ms=...) ------------------------------------------------


@pytest.mark.parametrize(
    ("value", "error"),
    [
        *((v, TypeError) for v in [*WRONG_TYPES, 1.5, INF, NAN, np.float64(5)]),
        (-1, ValueError),
        (np.int64(-1), ValueError),
    ],
    ids=ids,
)
def test_create_producer_rejects_a_bad_limit(
    offline_client: pulsar_nack.Client, value: Any, error: type[Exception]
) -> None:
    with pytest.raises(error, match="max_delivery_delay_ms"):
        offline_client.create_producer("t", max_delivery_delay_ms=value)


@pytest.mark.parametrize("value", [0, 60_000, np.int64(60_000), np.uint32(60_000)], ids=ids)
def test_create_producer_takes_a_good_limit(lite_client: pulsar_nack.Client, value: Any) -> None:
    producer = lite_client.create_producer(new_topic(), max_delivery_delay_ms=value)
    assert isinstance(producer, DelayLimitedProducer) == bool(value)
    if value:
        with pytest.raises(DelayLimitExceeded, match="60000 milliseconds"):
            producer.send(b"x", deliver_after=datetime.timedelta(hours=1))
    producer.close()


@pytest.mark.parametrize(
    ("name", "value"), [("deliver_after", 5), ("deliver_after", "1s"), ("deliver_at", 1.5)]
)
def test_limited_producer_send_raises_what_the_official_send_raises(
    lite_client: pulsar_nack.Client, name: str, value: Any
) -> None:
    topic = new_topic()
    limited = lite_client.create_producer(topic, max_delivery_delay_ms=60_000)
    plain = pulsar.Client.create_producer(lite_client, topic)
    with pytest.raises(Exception) as official:
        plain.send(b"x", **{name: value})
    with pytest.raises(Exception) as ours:
        limited.send(b"x", **{name: value})
    assert type(ours.value) is type(official.value) and name in str(ours.value)
    limited.close()
    plain.close()


# -- wrap() ----------------------------------------------------------------------------------------


def test_wrap_requires_the_native_delay() -> None:
    with pytest.raises(TypeError, match="native_delay_ms"):
        pulsar_nack.wrap(pulsar.Consumer())  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("value", "error"),
    [
        *((v, TypeError) for v in [*WRONG_TYPES, 102.0, INF, NAN]),
        (-1, ValueError),
        (np.int64(-3), ValueError),
    ],
    ids=ids,
)
def test_wrap_rejects_a_bad_native_delay(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="native_delay_ms"):
        pulsar_nack.wrap(pulsar.Consumer(), native_delay_ms=value)


@pytest.mark.parametrize("consumer", ["a consumer", None, 5], ids=ids)
def test_wrap_rejects_what_is_no_consumer(consumer: Any) -> None:
    with pytest.raises(TypeError, match=r"pulsar\.Consumer"):
        pulsar_nack.wrap(consumer, native_delay_ms=102)


def test_wrap_states_its_precision_as_native_timing_gives_it() -> None:
    """A forward may wait two native check intervals (2·D/3) for its slot; a delay under D also waits for the
    native latency D. Measured on pulsar-lite (D = 3000): up to 2.0 s late for delays of 4-8 s, 3.0-4.9 s
    for delays under 0.1 s."""
    assert _wrap_lateness_ms(3000) == (2000, 5000)
    assert _wrap_lateness_ms(pulsar_nack.NATIVE_DELAY_MS) == (68, 170)
    timing = NativeTiming(999)
    assert _wrap_lateness_ms(999) == (2 * timing.interval_ms, timing.latency_ms + 2 * timing.interval_ms)


def test_wrap_warns_truthfully_and_takes_numpy(
    pulsar_lite: PulsarLite, caplog: pytest.LogCaptureFixture
) -> None:
    client = pulsar.Client(pulsar_lite.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        topic = new_topic()
        slow = client.subscribe(topic, "slow", negative_ack_redelivery_delay_ms=3000)
        with caplog.at_level(logging.WARNING, logger="pulsar_nack.consumer"):
            wrapped = pulsar_nack.wrap(slow, native_delay_ms=np.int64(3000))
        assert wrapped.nack_options.native_delay_ms == 3000
        (record,) = [r for r in caplog.records if "native nack delay" in r.getMessage()]
        text = record.getMessage()
        assert "3000 ms native nack delay" in text and "~2000 ms after they are due" in text
        assert "~5000 ms for delays near 0" in text and "~68 ms" in text
        assert "1000 ms" not in text, "not the check interval: that is not the precision"
        wrapped.close()
        caplog.clear()
        fast = client.subscribe(topic, "fast", negative_ack_redelivery_delay_ms=pulsar_nack.NATIVE_DELAY_MS)
        with caplog.at_level(logging.WARNING, logger="pulsar_nack.consumer"):
            pulsar_nack.wrap(fast, native_delay_ms=pulsar_nack.NATIVE_DELAY_MS).close()
        assert not [r for r in caplog.records if "native nack delay" in r.getMessage()]
    finally:
        client.close()
