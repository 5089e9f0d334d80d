"""pulsar_nack.delay_limit: PIP-315's max delivery delay on the producer side (``DelayLimitedProducer``,
``Client.create_producer(max_delivery_delay_ms=...)``).

The limited producer binds ``send``/``send_async`` arguments to the official methods' signatures, so
``deliver_at``/``deliver_after`` are checked wherever they are passed; it holds the official producer and
forwards everything else to it. The binding and the forwarding need no broker (a recording stand-in for the
official producer); sending and refusing are checked on the real brokers.
"""

from __future__ import annotations

import datetime
import inspect
import math
import time
import uuid
from typing import Any

import numpy as np
import pulsar
import pytest
from messaging import nothing_more

import pulsar_nack
from pulsar_nack import DelayLimitedProducer, DelayLimitExceeded

LIMIT_MS = 60_000
WRONG_TYPES: list[Any] = [True, False, "1000", b"1000", None, [1000], complex(1, 0), object()]


class RecordingProducer(pulsar.Producer):  # type: ignore[misc]  # pulsar is untyped
    """The official producer without a broker: ``send``/``send_async`` record what would have been sent."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def send(self, *args: Any, **kwargs: Any) -> str:
        self.calls.append(("send", args, kwargs))
        return "message id"

    def send_async(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append(("send_async", args, kwargs))

    def topic(self) -> str:
        return "persistent://public/default/recorded"


def delay_value(name: str, over: bool) -> Any:
    """A ``deliver_after``/``deliver_at`` 10 minutes beyond the limit (``over``), else 1 s from now."""
    delay_ms = LIMIT_MS + 600_000 if over else 1_000
    if name == "deliver_after":
        return datetime.timedelta(milliseconds=delay_ms)
    return int(time.time() * 1000) + delay_ms


def call_arguments(
    method: str, name: str, value: Any, positional: bool
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Arguments of ``pulsar.Producer.<method>`` that pass ``name=value``, by keyword or in its position
    (every parameter before it given its default)."""
    required: tuple[Any, ...] = (b"payload", None) if method == "send_async" else (b"payload",)
    if not positional:
        return required, {name: value}
    parameters = list(inspect.signature(getattr(pulsar.Producer, method)).parameters.values())[1:]
    position = [p.name for p in parameters].index(name)
    defaults = tuple(p.default for p in parameters[len(required) : position])
    return (*required, *defaults, value), {}


@pytest.mark.parametrize("positional", [False, True], ids=["keyword", "positional"])
@pytest.mark.parametrize("name", ["deliver_after", "deliver_at"])
@pytest.mark.parametrize("method", ["send", "send_async"])
def test_a_delay_beyond_the_limit_is_refused_wherever_it_is_passed(
    method: str, name: str, positional: bool
) -> None:
    official = RecordingProducer()
    limited = DelayLimitedProducer(official, LIMIT_MS)
    args, kwargs = call_arguments(method, name, delay_value(name, over=True), positional)
    with pytest.raises(DelayLimitExceeded, match=f"{LIMIT_MS} milliseconds"):
        getattr(limited, method)(*args, **kwargs)
    assert official.calls == [], "refused before the official producer saw it"
    args, kwargs = call_arguments(method, name, delay_value(name, over=False), positional)
    getattr(limited, method)(*args, **kwargs)
    assert official.calls == [(method, args, kwargs)], "within the limit: passed on unchanged"


def test_send_returns_what_the_official_send_returns() -> None:
    limited = DelayLimitedProducer(RecordingProducer(), LIMIT_MS)
    assert limited.send(b"x") == "message id"
    assert limited.send(content=b"x", deliver_after=datetime.timedelta(seconds=1)) == "message id"


@pytest.mark.parametrize(
    ("method", "args", "kwargs"),
    [
        ("send", (), {}),  # no content
        ("send", (b"x",), {"deliver_afterr": datetime.timedelta(hours=1)}),  # misspelt
        ("send", (b"x", *[None] * 10), {}),  # one positional too many
        ("send", (b"x",), {"content": b"y"}),  # content twice
        ("send_async", (b"x",), {}),  # no callback
        ("send_async", (b"x", None), {"delay": 5}),
    ],
    ids=[
        "send-no-content",
        "send-misspelt",
        "send-too-many",
        "send-content-twice",
        "async-no-callback",
        "async-unknown",
    ],
)
def test_arguments_the_official_method_does_not_take_are_a_type_error_before_sending(
    method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    official = RecordingProducer()
    with pytest.raises(TypeError):
        getattr(DelayLimitedProducer(official, LIMIT_MS), method)(*args, **kwargs)
    assert official.calls == []


@pytest.mark.parametrize(
    ("name", "value"),
    [("deliver_after", 5), ("deliver_after", "1s"), ("deliver_at", 1.5), ("deliver_at", np.int64(5))],
)
def test_a_wrong_type_is_a_value_error_naming_it_before_sending(name: str, value: Any) -> None:
    """As the official ``send`` (compared with it on a broker below)."""
    official = RecordingProducer()
    for positional in (False, True):
        args, kwargs = call_arguments("send", name, value, positional)
        with pytest.raises(ValueError, match=name):
            DelayLimitedProducer(official, LIMIT_MS).send(*args, **kwargs)
    assert official.calls == []


def test_everything_else_is_the_official_producers() -> None:
    """Composition: the official producer is held, not copied; what the limited producer does not define
    is the official one's (methods, attributes set later too)."""
    official = RecordingProducer()
    limited = DelayLimitedProducer(official, LIMIT_MS)
    assert limited.producer is official
    assert limited.topic() == "persistent://public/default/recorded"
    assert limited.flush == official.flush and limited.close == official.close
    official.extra = "set after wrapping"
    assert limited.extra == "set after wrapping"
    assert {"topic", "flush", "close", "send", "producer"} <= set(dir(limited))
    with pytest.raises(AttributeError, match="no_such_attribute"):
        _ = limited.no_such_attribute
    assert f"max_delivery_delay_ms={LIMIT_MS}" in repr(limited)
    # The documented choice: not a pulsar.Producer subclass.
    assert not isinstance(limited, pulsar.Producer) and isinstance(limited, DelayLimitedProducer)


@pytest.mark.parametrize(
    ("producer", "limit", "error"),
    [
        ("a producer", LIMIT_MS, TypeError),
        (None, LIMIT_MS, TypeError),
        (RecordingProducer(), 0, ValueError),
        (RecordingProducer(), -1, ValueError),
        (RecordingProducer(), 1.5, TypeError),
        (RecordingProducer(), True, TypeError),
    ],
    ids=["str", "none", "zero", "negative", "float", "bool"],
)
def test_the_constructor_checks_its_arguments(producer: Any, limit: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        DelayLimitedProducer(producer, limit)


def test_the_constructor_takes_numpy_limits_as_ints() -> None:
    limit: Any = np.uint32(LIMIT_MS)
    limited = DelayLimitedProducer(RecordingProducer(), limit)
    assert limited.max_delivery_delay_ms == LIMIT_MS and type(limited.max_delivery_delay_ms) is int


# -- Client.create_producer(max_delivery_delay_ms=...) ------------------------------------------------


def new_topic() -> str:
    return f"persistent://public/default/delay-limit-{uuid.uuid4().hex}"


@pytest.mark.parametrize(
    ("value", "error"),
    [
        *((v, TypeError) for v in [*WRONG_TYPES, 1.5, math.inf, math.nan, np.float64(5)]),
        (-1, ValueError),
        (np.int64(-1), ValueError),
    ],
    ids=lambda v: f"{type(v).__name__}_{v!r}"[:40],
)
def test_create_producer_rejects_a_bad_limit(
    offline_client: pulsar_nack.Client, value: Any, error: type[Exception]
) -> None:
    with pytest.raises(error, match="max_delivery_delay_ms"):
        offline_client.create_producer("t", max_delivery_delay_ms=value)


@pytest.mark.parametrize("value", [0, 60_000, np.int64(60_000), np.uint32(60_000)], ids=repr)
def test_create_producer_takes_a_good_limit(lite_client: pulsar_nack.Client, value: Any) -> None:
    producer = lite_client.create_producer(new_topic(), max_delivery_delay_ms=value)
    assert isinstance(producer, DelayLimitedProducer) == bool(value)
    if value:
        assert type(producer.max_delivery_delay_ms) is int
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


def test_producer_rejects_delivery_delays_beyond_the_limit_before_sending(
    nack_client: pulsar_nack.Client, unique_topic: str
) -> None:
    """On each broker: delays beyond the limit (by keyword or by position, sync or async) are refused and
    never reach the topic; a delay within it is sent and delivered."""
    producer = nack_client.create_producer(unique_topic, max_delivery_delay_ms=LIMIT_MS)
    assert isinstance(producer, DelayLimitedProducer)
    consumer = nack_client.subscribe(unique_topic, "sub", consumer_type=pulsar.ConsumerType.Shared)
    hour = datetime.timedelta(hours=1)
    with pytest.raises(
        DelayLimitExceeded, match=f"Exceeds max allowed delivery delay of {LIMIT_MS} milliseconds"
    ):
        producer.send(b"late", deliver_after=hour)
    with pytest.raises(DelayLimitExceeded):
        producer.send(*call_arguments("send", "deliver_after", hour, positional=True)[0])
    with pytest.raises(DelayLimitExceeded):
        producer.send_async(b"late", None, deliver_at=int(time.time() * 1000) + 3_600_000)
    producer.send(b"ok", deliver_after=datetime.timedelta(milliseconds=10))
    assert consumer.receive(10_000).data() == b"ok"
    nothing_more(consumer, 500)
    producer.close()
    consumer.close()
