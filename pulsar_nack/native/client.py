"""The calls into the official client's native (C++) objects and its private attributes.

Besides this module, only the per-message paths read a message's ``_message`` (and ``_schema``) directly
— :mod:`pulsar_nack.bridge` and the receives of :mod:`pulsar_nack.consumer` and :mod:`pulsar_nack.aio` —
because a call here costs a Python frame a message (~0.1 µs); and the two consumers, being
``pulsar.Consumer`` subclasses, set their own ``_consumer``/``_client``/``_schema`` from the official
consumer they take over. ``tests/test_public_api.py`` keeps it so.

* :func:`message_of` — a ``pulsar.Message`` around a native message (the official receive's own step);
  :func:`share_message` — a message object made another's (a held message handed out again);
  :func:`payload_size` — a message's payload size, not copied out;
* :func:`list_in_client` — a wrapping consumer in the native one's place in its client's list;
* :func:`subscribe_exclusive_async` — a bare Exclusive subscription (the snapshot locks on a topic);

* :func:`message_id_of` — the ``_pulsar.MessageId`` behind whatever the official consumers accept;
* :func:`batch_size` — a batch's size, from the id's serialized ``MessageIdData`` (field 6), because no
  getter exposes it and arrival order cannot tell it (several threads receive from one queue);
* :func:`forward` — due entries → one native ``negative_acknowledge`` per entry, the only per-id
  redelivery request the Python client has (ids rebuilt with their topic: a multi-topic consumer
  silently drops a rebuilt id without one);
* :func:`entry_message_id` — such a rebuilt whole-entry id, also acked to complete a batch at the broker;
* :func:`chunk_first_entry` — the first chunk of a chunked message (its id names only the last one), read
  from the serialized id's ``first_chunk_message_id`` (field 7): with pulsar-client 3.13 a native nack of
  the assembled id re-sends the last chunk only, which the consumer drops; a native nack of *every* chunk
  entry brings the message back whole (measured on both brokers, docs/parameters.md, chunked messages).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import _pulsar
import pulsar

from pulsar_nack.index import DueIds

__all__ = [
    "MIN_CHUNKED_BYTES",
    "OK",
    "REFUSED",
    "batch_size",
    "chunk_first_entry",
    "chunk_of",
    "entry_message_id",
    "forward",
    "list_in_client",
    "message_id_of",
    "message_of",
    "payload_size",
    "share_message",
    "subscribe_exclusive_async",
]

#: A native call's result when it succeeded.
OK = _pulsar.Result.Ok
#: The results of a subscription the broker did not grant: another consumer holds it, or no answer in time.
REFUSED = (_pulsar.Result.ConsumerBusy, _pulsar.Result.Timeout)

_PARTITION_SUFFIX = re.compile(r"-partition-(\d+)$")
_BATCH_SIZE_FIELD = 6  # MessageIdData.batch_size
_FIRST_CHUNK_FIELD = 7  # MessageIdData.first_chunk_message_id (a MessageIdData)
_FIRST_CHUNK_TAG = bytes([_FIRST_CHUNK_FIELD << 3 | 2])  # field 7, length-delimited
_LEDGER_FIELD, _ENTRY_FIELD = 1, 2
ChunkFirsts = Mapping[tuple[str, int, int], int]  # (topic, ledger, last chunk's entry) → first chunk's entry


def message_id_of(message: Any) -> tuple[Any, Any] | None:
    """``(_pulsar.MessageId, _pulsar.Message or None)`` of what the official consumers accept for (n)acks:
    a ``pulsar.Message``, ``_pulsar.Message``, ``pulsar.MessageId`` or ``_pulsar.MessageId``; None for
    anything else. O(1)."""
    if isinstance(message, pulsar.Message):
        message = message._message
    if isinstance(message, _pulsar.Message):
        return message.message_id(), message
    if isinstance(message, pulsar.MessageId):
        return message._msg_id, None
    if isinstance(message, _pulsar.MessageId):
        return message, None
    return None


def batch_size(message_id: Any) -> int:
    """The number of messages in the batch of a batched ``_pulsar.MessageId``, from its serialized
    ``MessageIdData``; 0 if the id does not carry it. O(length of the id)."""
    return _varint_field(message_id.serialize(), _BATCH_SIZE_FIELD)


#: A message shorter than this is taken as not chunked without reading its id (two native calls, ~1.5 µs on
#: the nack path): chunking starts above the broker's ``maxMessageSize`` (5 MiB by default), and a broker
#: configured below 16 KiB is not a case this wrapper serves (docs/chunked.md).
MIN_CHUNKED_BYTES = 16 * 1024


def chunk_of(message: Any) -> tuple[Any, Any, tuple[int, int]] | None:
    """``(_pulsar.MessageId, _pulsar.Message or None, first chunk's (ledger, entry))`` if ``message`` (what
    :func:`message_id_of` accepts) is a chunked message or its id; None otherwise. O(1): one native call
    for a message shorter than :data:`MIN_CHUNKED_BYTES`, three otherwise (two for a bare id)."""
    inner = message._message if isinstance(message, pulsar.Message) else message
    if isinstance(inner, _pulsar.Message) and inner.length() < MIN_CHUNKED_BYTES:
        return None
    target = message_id_of(message)
    if target is None:
        return None
    first = chunk_first_entry(target[0])
    return None if first is None else (target[0], target[1], first)


def chunk_first_entry(message_id: Any) -> tuple[int, int] | None:
    """``(ledger id, entry id)`` of the first chunk of a chunked message's ``_pulsar.MessageId`` (whose own
    ledger and entry ids are the last chunk's); None for any other id. O(length of the id)."""
    data = message_id.serialize()
    if _FIRST_CHUNK_TAG not in data:  # no byte of it can be field 7's tag: no need to parse (the usual case)
        return None
    first = _field(data, _FIRST_CHUNK_FIELD)
    if not isinstance(first, bytes):
        return None
    return int(_field(first, _LEDGER_FIELD) or 0), int(_field(first, _ENTRY_FIELD) or 0)


def _varint_field(data: bytes, field: int) -> int:
    """The value of varint ``field`` in a protobuf message (0 if absent)."""
    value = _field(data, field)
    return value if isinstance(value, int) else 0


def _field(data: bytes, field: int) -> int | bytes | None:
    """The value of ``field`` in a protobuf message: an int (varint) or the bytes of a length-delimited
    field; None if absent. Skips fixed-size fields."""
    position, end = 0, len(data)
    while position < end:
        tag, position = _varint(data, position)
        wire_type = tag & 7
        if wire_type == 0:
            value, position = _varint(data, position)
            if tag >> 3 == field:
                return value
        elif wire_type == 2:
            length, position = _varint(data, position)
            if tag >> 3 == field:
                return data[position : position + length]
            position += length
        elif wire_type == 1:
            position += 8
        elif wire_type == 5:
            position += 4
        else:
            raise ValueError(f"unexpected protobuf wire type {wire_type} in a message id")
    return None


def _varint(data: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7


def forward(consumer: Any, due: Sequence[DueIds], chunk_firsts: ChunkFirsts | None = None) -> int:
    """Ask the native ``consumer`` (a ``_pulsar.Consumer``) to redeliver every due entry, one native nack
    per entry; returns how many. A chunked message (its last chunk's entry in ``chunk_firsts``) is asked
    for by a nack of every entry from its first chunk to its last: the broker then re-sends all its chunks
    and the consumer reassembles it. O(due entries + chunks): the topic's partition is read once per
    ledger, and each id costs its construction and its topic (two native calls)."""
    nack = consumer.negative_acknowledge
    make = _pulsar.MessageId
    count = 0
    for ids in due:
        topic, ledger_id = ids.topic, ids.ledger_id
        partition = _partition(topic)
        for entry_id in ids.entry_ids.tolist():
            first = chunk_firsts.get((topic, ledger_id, entry_id)) if chunk_firsts else None
            for chunk_entry in range(entry_id if first is None else first, entry_id + 1):
                message_id = make(partition, ledger_id, chunk_entry, -1)
                if topic:
                    message_id.topic_name(topic)
                nack(message_id)
            count += 1
    return count


#: Topic name → its partition index (-1: not a partition), for :func:`entry_message_id`: a regex search
#: and an int conversion cost ~0.35 µs an id, a dict lookup 0.03. Bounded: cleared when full (a consumer
#: sees few topics; a regex consumer with more than this many just parses again).
_PARTITIONS: dict[str, int] = {}
_MAX_PARTITIONS = 4096


def _partition(topic: str) -> int:
    """The partition index in a topic's name (``...-partition-N``), -1 if none. O(1) amortized."""
    partition = _PARTITIONS.get(topic)
    if partition is None:
        match = _PARTITION_SUFFIX.search(topic)
        partition = int(match.group(1)) if match else -1
        if len(_PARTITIONS) >= _MAX_PARTITIONS:
            _PARTITIONS.clear()
        _PARTITIONS[topic] = partition
    return partition


def entry_message_id(topic: str, ledger_id: int, entry_id: int) -> Any:
    """A ``_pulsar.MessageId`` of a whole entry (no batch index), with its topic. A native nack of it
    redelivers the entry; a native ack of it acks every message of the entry at the broker. O(1)."""
    message_id = _pulsar.MessageId(_partition(topic), ledger_id, entry_id, -1)
    if topic:
        message_id.topic_name(topic)
    return message_id


def message_of(native_message: Any, schema: Any) -> pulsar.Message:
    """A ``pulsar.Message`` around ``native_message`` (a ``_pulsar.Message``) whose ``value()`` decodes
    with ``schema``: what the official ``receive`` builds (``pulsar.Message`` has no public constructor
    for it). O(1)."""
    message = pulsar.Message()
    message._message = native_message
    message._schema = schema
    return message


def share_message(message: pulsar.Message, original: pulsar.Message) -> None:
    """Make ``message`` (a fresh ``pulsar.Message``, or a subclass's) the same message as ``original``:
    its native message (bytes, properties, id) and its schema. O(1)."""
    message._message = original._message
    message._schema = original._schema


def payload_size(message: pulsar.Message) -> int:
    """The bytes of ``message``'s payload, without copying them out (``len(message.data())`` would copy
    a chunked message of many megabytes). O(1)."""
    return int(message._message.length())


def list_in_client(client: pulsar.Client, native: pulsar.Consumer, wrapping: Any) -> None:
    """Put ``wrapping`` in ``native``'s place in ``client``'s list of consumers: ``pulsar.Consumer.close()``
    removes itself from that list (a ``ValueError`` if it is not there), and ``Client.close()`` closes what
    it lists. O(consumers of the client)."""
    consumers = client._consumers
    consumers[:] = [wrapping if c is native else c for c in consumers]


def subscribe_exclusive_async(
    client: pulsar.Client, topic: str, subscription: str, settled: Callable[[Any, Any], object]
) -> None:
    """Subscribe to ``topic`` as the one Exclusive consumer of ``subscription`` (receiver queue 1) without
    waiting: ``settled(result, consumer)`` is called on a client thread with the native result
    (:data:`OK`, one of :data:`REFUSED`, or another failure) and the ``_pulsar.Consumer``."""
    conf = _pulsar.ConsumerConfiguration()
    conf.consumer_type(_pulsar.ConsumerType.Exclusive)
    conf.receiver_queue_size(1)
    client._client.subscribe_async(topic, subscription, conf, settled)
