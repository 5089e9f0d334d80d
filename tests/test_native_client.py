"""pulsar_nack.native.client: whole-entry ids rebuilt for forwards and entry acks (real
``_pulsar.MessageId``s)."""

from __future__ import annotations

import pulsar_nack.native.client as native
from pulsar_nack.native.client import entry_message_id


def test_entry_message_id_reads_the_partition_from_the_topic_each_time_the_same() -> None:
    topics = {
        "persistent://public/default/t-partition-3": 3,
        "persistent://public/default/t-partition-12": 12,
        "persistent://public/default/t": -1,
        "persistent://public/default/t-partition-x": -1,
        "": -1,
    }
    for _ in range(3):  # the first call parses the name, later ones use the cache: same answer
        for topic, partition in topics.items():
            message_id = entry_message_id(topic, 7, 11)
            assert (message_id.partition(), message_id.ledger_id(), message_id.entry_id()) == (
                partition,
                7,
                11,
            )
            assert message_id.batch_index() == -1


def test_partition_cache_is_bounded() -> None:
    native._PARTITIONS.clear()
    bound = native._MAX_PARTITIONS
    for n in range(bound + 10):
        assert (
            entry_message_id(f"persistent://public/default/t{n}-partition-{n % 7}", 1, 2).partition() == n % 7
        )
        assert len(native._PARTITIONS) <= bound
