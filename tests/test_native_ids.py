"""native_ids/ (issue 28 prototype): the extension reads the same ids as pulsar-client's getters, batch size
included, from messages received from a real broker; it refuses anything else by name. Skipped where the
extension is not built (``cd native_ids && python setup.py build_ext --inplace``): it is optional."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import _pulsar
import pulsar
import pytest

from pulsar_nack.native.client import batch_size
from pulsar_nack.testing import PulsarLite

NATIVE_DIR = Path(__file__).resolve().parent.parent / "native_ids"


@pytest.fixture(scope="module")
def ids_module() -> Any:
    sys.path.insert(0, str(NATIVE_DIR))
    try:
        return importlib.import_module("_pulsar_nack_ids")
    except ImportError as error:
        pytest.skip(f"native_ids not built: {error}")
    finally:
        sys.path.remove(str(NATIVE_DIR))


def _received(broker: PulsarLite, topic: str, batch: int, count: int) -> list[Any]:
    client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        consumer = client.subscribe(topic, "s")
        producer = client.create_producer(
            topic,
            batching_enabled=batch > 1,
            batching_max_messages=max(batch, 2),
            batching_max_publish_delay_ms=500,
        )
        for i in range(count):
            producer.send_async(str(i).encode(), None)
        producer.flush()
        messages = [consumer.receive(timeout_millis=30_000) for _ in range(count)]
        for message in messages:
            consumer.acknowledge(message)
        return messages
    finally:
        client.close()  # (the messages stay readable: each holds its own C++ message)


@pytest.mark.parametrize("batch", [1, 7])
def test_ids_match_the_getters_and_the_serialized_batch_size(
    ids_module: Any, pulsar_lite: PulsarLite, unique_topic: str, batch: int
) -> None:
    messages = _received(pulsar_lite, unique_topic, batch, 21)
    expected = []
    for message in messages:
        mid = message.message_id()
        expected.append((mid.ledger_id(), mid.entry_id(), mid.batch_index(), batch_size(mid)))
    assert ids_module.ids_all(messages) == expected
    assert ids_module.ids_all([m._message for m in messages]) == expected  # the inner _pulsar.Message too
    assert [ids_module.ids(m) for m in messages] == expected
    assert [ids_module.generic_ids(m) for m in messages] == expected
    if batch > 1:
        assert {e[3] for e in expected} == {batch}  # (3 entries of 7: the sizes are real, not defaults)
        assert len({e[:2] for e in expected}) == 3
    else:
        assert {e[2:] for e in expected} == {(-1, 0)}


def test_anything_but_a_message_is_refused_by_name(ids_module: Any) -> None:
    message = _pulsar.MessageBuilder().content(b"x").build()
    for bad in (1, None, _pulsar.MessageId(0, 1, 2, 3), "m"):
        with pytest.raises(TypeError, match=r"expected a pulsar\.Message or _pulsar\.Message"):
            ids_module.ids(bad)
        with pytest.raises(TypeError, match=r"expected a pulsar\.Message or _pulsar\.Message"):
            ids_module.ids_all([message, bad])
    with pytest.raises(TypeError, match="messages: expected a sequence"):
        ids_module.ids_all(3)
