"""Every public parameter, good and bad values (docs/parameters.md is the table of them).

Bad values raise the exception type the official client raises for the same argument (``ValueError`` from
``pulsar.Client.subscribe``'s type check for ``negative_ack_redelivery_delay_ms``; compared with the
official client itself below), else ``TypeError`` (wrong type) / ``ValueError`` (wrong value) naming the
parameter, and leave nothing behind: no consumer created, nothing filed. numpy integers are accepted
wherever ints are. Most tests need no broker (the checks run before anything is sent: a client on a
closed port will do); those that need a consumer use the session's pulsar-lite.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import math
import re
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pulsar
import pytest
from messaging import produce, receive_all

import pulsar_nack
from pulsar_nack import DelayLimitExceeded, MultiplierRedeliveryBackoff, NackConsumer, NackOptions, aio
from pulsar_nack.lowlevel import TimeBucketIndex
from pulsar_nack.testing import PulsarLite

NAN, INF = math.nan, math.inf
#: Not-a-number-of-ms values every ms parameter rejects by type (bool is no number here).
WRONG_TYPES: list[Any] = [True, False, "1000", b"1000", None, [1000], complex(1, 0), object()]


def ids(value: Any) -> str:
    return re.sub(r"\W+", "_", f"{type(value).__name__}_{value!r}")[:40]


def kwargs_id(kwargs: dict[str, Any]) -> str:
    return "-".join(f"{k}={ids(v)}" for k, v in kwargs.items())


def new_topic() -> str:
    return f"persistent://public/default/inputs-{uuid.uuid4().hex}"


# -- the nack options of Client.subscribe (and wrap() and aio.Client.subscribe: the same names) -------

OPTION_BAD: list[tuple[str, Any, type[Exception]]] = [
    # the official client's parameter: a wrong type is ValueError, as pulsar.Client.subscribe raises
    *(("negative_ack_redelivery_delay_ms", v, ValueError) for v in [*WRONG_TYPES, 1.5, 100.0, INF, NAN]),
    ("negative_ack_redelivery_delay_ms", np.float64(100), ValueError),
    ("negative_ack_redelivery_delay_ms", -1, ValueError),
    ("negative_ack_redelivery_delay_ms", np.int64(-1), ValueError),
    ("negative_ack_redelivery_delay_ms", 2**63, TypeError),  # the official C++ binding: TypeError
    *(("negative_ack_precision_bit_cnt", v, TypeError) for v in [*WRONG_TYPES, 8.0, INF, NAN]),
    *(("negative_ack_precision_bit_cnt", v, ValueError) for v in [-1, 31, np.int8(-1), 2**70]),
    *(("negative_ack_rounding", v, ValueError) for v in ["up", "FLOOR", None, True, 0, ["floor"]]),
    *(("negative_ack_redelivery_backoff", v, TypeError) for v in [5, "1000", True, object(), lambda n: 1000]),
    *(("max_redelivery_delay_ms", v, TypeError) for v in [*WRONG_TYPES, 1.5, INF, NAN]),
    *(("max_redelivery_delay_ms", v, ValueError) for v in [-1, np.int32(-5)]),
    *(("on_delay_limit", v, ValueError) for v in ["ignore", None, True, 1, ["error"]]),
    *(("on_close", v, ValueError) for v in ["keep", None, True, 1, ["drop"]]),
    *(("on_redelivery", v, TypeError) for v in [5, "hook", True, object()]),
    *(("max_held_chunked_bytes", v, TypeError) for v in [*WRONG_TYPES, 1.5, INF, NAN]),
    *(("max_held_chunked_bytes", v, ValueError) for v in [-1, np.int64(-1)]),
    *(("fast_receive", v, TypeError) for v in [1, 0, "yes", None, np.bool_(True)]),
]


class NotCallableNext:
    next = 5


OPTION_BAD.append(("negative_ack_redelivery_backoff", NotCallableNext(), TypeError))


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


@pytest.fixture(scope="module")
def offline_aio_client() -> Iterator[aio.Client]:
    client = aio.Client(
        "pulsar://127.0.0.1:9",
        operation_timeout_seconds=1,
        logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
    )
    yield client
    asyncio.run(client.close())


@pytest.mark.parametrize(
    ("name", "value", "error"), OPTION_BAD, ids=[f"{n}-{ids(v)}" for n, v, _ in OPTION_BAD]
)
def test_aio_subscribe_rejects_the_same_bad_options(
    offline_aio_client: aio.Client, name: str, value: Any, error: type[Exception]
) -> None:
    with pytest.raises(error, match=name) as info:
        asyncio.run(offline_aio_client.subscribe("t", "s", **{name: value}))
    assert type(info.value) is error
    assert offline_aio_client._nack_consumers == [], "no consumer created"


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
    with pytest.raises(TypeError, match=r"wrap\(\) got an unexpected keyword argument 'no_such_option'"):
        pulsar_nack.wrap(pulsar.Consumer(), native_delay_ms=pulsar_nack.NATIVE_DELAY_MS, no_such_option=1)
    assert offline_client._consumers == []


# -- the deprecated names of nack options: still accepted, with a DeprecationWarning ------------------

#: (deprecated name, its new name, a good value, the NackOptions field it sets)
ALIASES: list[tuple[str, str, Any, str]] = [
    ("negative_ack_precision_bits", "negative_ack_precision_bit_cnt", 4, "precision_bits"),
    (
        "negative_ack_backoff",
        "negative_ack_redelivery_backoff",
        MultiplierRedeliveryBackoff(100, 1000),
        "backoff",
    ),
]


def our_deprecations(caught: Any, alias: str) -> list[warnings.WarningMessage]:
    return [w for w in caught if w.category is DeprecationWarning and alias in str(w.message)]


@pytest.mark.parametrize(("alias", "name", "value", "field"), ALIASES, ids=[a[0] for a in ALIASES])
def test_a_deprecated_name_still_sets_its_option_and_warns_at_the_callers_line(
    pulsar_lite: PulsarLite, lite_client: pulsar_nack.Client, alias: str, name: str, value: Any, field: str
) -> None:
    """Each entry point: the option is set, one DeprecationWarning names the new name and points at the
    line that used the old one (the warning's stacklevel through subscribe, wrap and the coroutine)."""
    topic = new_topic()
    shared = pulsar.ConsumerType.Shared
    with pytest.warns(DeprecationWarning, match=f"{alias} is deprecated: use {name}") as caught:
        consumer = lite_client.subscribe(topic, "sync", consumer_type=shared, **{alias: value})
    native = pulsar.Client.subscribe(
        lite_client, topic, "wrapped", consumer_type=shared, negative_ack_redelivery_delay_ms=102
    )
    with pytest.warns(DeprecationWarning, match=f"{alias} is deprecated: use {name}") as caught_wrap:
        wrapped = pulsar_nack.wrap(native, native_delay_ms=102, **{alias: value})

    async def aio_subscribe() -> Any:
        client = aio.Client(pulsar_lite.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
        try:
            with pytest.warns(DeprecationWarning, match=f"{alias} is deprecated: use {name}") as caught_aio:
                aio_consumer = await client.subscribe(topic, "aio", consumer_type=shared, **{alias: value})
            return aio_consumer.nack_options, caught_aio
        finally:
            await client.close()

    aio_options, caught_aio = asyncio.run(aio_subscribe())
    for options, warned in ((consumer.nack_options, caught), (wrapped.nack_options, caught_wrap)):
        assert getattr(options, field) == value
        assert [w.filename for w in our_deprecations(warned, alias)] == [__file__]
    assert getattr(aio_options, field) == value
    assert [w.filename for w in our_deprecations(caught_aio, alias)] == [__file__]
    consumer.close()
    wrapped.close()


@pytest.mark.parametrize(("alias", "name", "value", "field"), ALIASES, ids=[a[0] for a in ALIASES])
def test_a_name_and_its_deprecated_alias_together_are_a_type_error(
    offline_client: pulsar_nack.Client,
    offline_aio_client: aio.Client,
    alias: str,
    name: str,
    value: Any,
    field: str,
) -> None:
    both = {alias: value, name: value}
    message = f"both {name} and its deprecated alias {alias}"
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # rejected before any warning
        with pytest.raises(TypeError, match=message):
            offline_client.subscribe("t", "s", **both)
        with pytest.raises(TypeError, match=message):
            pulsar_nack.wrap(pulsar.Consumer(), native_delay_ms=pulsar_nack.NATIVE_DELAY_MS, **both)
        with pytest.raises(TypeError, match=message):
            asyncio.run(offline_aio_client.subscribe("t", "s", **both))
    assert offline_client._consumers == [] and offline_aio_client._nack_consumers == []


def test_good_options_numpy_integers_become_ints() -> None:
    options = NackOptions(
        redelivery_delay_ms=np.int64(500),  # type: ignore[arg-type]
        precision_bits=np.int32(4),  # type: ignore[arg-type]
        max_redelivery_delay_ms=np.uint16(1000),  # type: ignore[arg-type]
        native_delay_ms=np.int64(102),  # type: ignore[arg-type]
        backoff=MultiplierRedeliveryBackoff(np.int64(100), np.uint32(1000)),  # type: ignore[arg-type]
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
        negative_ack_precision_bit_cnt=np.int8(4),
        max_redelivery_delay_ms=np.int64(5_000),
    )
    assert isinstance(consumer, NackConsumer) and consumer.nack_options.redelivery_delay_ms == 200
    produce(lite_client, topic, 1)
    message = receive_all(consumer, 1)[0]
    consumer.negative_acknowledge(message, delay_ms=np.int64(100))  # type: ignore[arg-type]
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
    consumer.negative_acknowledge(message, delay_ms=np.int64(100))  # type: ignore[arg-type]
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


def test_a_bad_backoff_result_files_nothing_on_a_real_consumer(lite_client: pulsar_nack.Client) -> None:
    backoff = Returns(-5)
    topic = new_topic()
    consumer = lite_client.subscribe(
        topic, "s", consumer_type=pulsar.ConsumerType.Shared, negative_ack_redelivery_backoff=backoff
    )
    produce(lite_client, topic, 1)
    message = receive_all(consumer, 1)[0]
    for value, error in BACKOFF_RESULT_BAD:
        backoff.value = value
        with pytest.raises(error, match=r"negative_ack_redelivery_backoff\.next\(0\)"):
            consumer.negative_acknowledge(message)
    assert consumer.nack_stats().pending == 0
    backoff.value = np.int64(100)
    consumer.negative_acknowledge(message)
    again = receive_all(consumer, 1)[0]
    consumer.acknowledge(again)
    consumer.close()


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
    index = TimeBucketIndex(np.int64(4), "ceil")  # type: ignore[arg-type]
    assert index.precision_bits == 4 and type(index.precision_bits) is int
    assert index.add(np.int64(17), np.int64(1), np.uint32(2)) == 32  # type: ignore[arg-type]


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


@pytest.mark.parametrize("pop", ["pop_due", "pop_due_by_bucket"])
@pytest.mark.parametrize(
    ("now", "error"),
    [(-1, ValueError), (True, TypeError), (1.5, TypeError), ("5", TypeError), (None, TypeError)],
)
def test_index_pops_reject_a_bad_time(pop: str, now: Any, error: type[Exception]) -> None:
    """Both pops name ``now_ms`` and leave the index as it was."""
    index = TimeBucketIndex(8)
    index.add(5000, 1, 1)
    with pytest.raises(error, match="now_ms"):
        getattr(index, pop)(now)
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
        index = TimeBucketIndex(8, rounding)
        bucket = index.add(due, 1, 1)
        assert bucket == index.bucket_of(due) and len(index) == 1


def test_index_add_many_rejects_bools_and_negatives() -> None:
    index = TimeBucketIndex(8, "ceil")
    with pytest.raises(TypeError, match="due_ms"):
        index.add_many(np.array([True, False]), 1, [1, 2])
    with pytest.raises(ValueError, match="due_ms"):
        index.add_many([-1, 5], 1, [1, 2])
    assert len(index) == 0 and index.bucket_count == 0


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


def test_wrap_warns_truthfully_and_takes_numpy(
    pulsar_lite: PulsarLite, caplog: pytest.LogCaptureFixture
) -> None:
    client = pulsar.Client(pulsar_lite.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        topic = new_topic()
        slow = client.subscribe(topic, "slow", negative_ack_redelivery_delay_ms=3000)
        with caplog.at_level(logging.WARNING, logger="pulsar_nack.options"):
            wrapped = pulsar_nack.wrap(slow, native_delay_ms=np.int64(3000))  # type: ignore[arg-type]
        assert wrapped.nack_options.native_delay_ms == 3000
        (record,) = [r for r in caplog.records if "native nack delay" in r.getMessage()]
        text = record.getMessage()
        assert "3000 ms native nack delay" in text and "~2000 ms after they are due" in text
        assert "~5000 ms for delays near 0" in text and "~68 ms" in text
        assert "1000 ms" not in text, "not the check interval: that is not the precision"
        wrapped.close()
        caplog.clear()
        fast = client.subscribe(topic, "fast", negative_ack_redelivery_delay_ms=pulsar_nack.NATIVE_DELAY_MS)
        with caplog.at_level(logging.WARNING, logger="pulsar_nack.options"):
            pulsar_nack.wrap(fast, native_delay_ms=pulsar_nack.NATIVE_DELAY_MS).close()
        assert not [r for r in caplog.records if "native nack delay" in r.getMessage()]
    finally:
        client.close()
