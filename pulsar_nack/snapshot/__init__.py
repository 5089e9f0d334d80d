"""Pending nacks that survive a restart: immutable segment files (PIP-195's bucket snapshots, client side).

* :mod:`~pulsar_nack.snapshot.format` — the versioned, checksummed segment file and its defensive reader;
* :mod:`~pulsar_nack.snapshot.storage` — :class:`SnapshotStorage` and the atomic local-directory storage;
* :mod:`~pulsar_nack.snapshot.segments` — :class:`SegmentStore`: seal, load, merge, delete, restore;
* :mod:`~pulsar_nack.snapshot.namespace` — the key of a subscription's snapshot and its view of a shared
  storage (:class:`SubscriptionStorage`, locked while its consumer lives);
* :mod:`~pulsar_nack.snapshot.wiring` — what the consumers' ``snapshot_dir=`` / ``snapshot_storage=``
  options turn into: the subscription's storage, a store and an epoch clock for the tracker;
* :mod:`~pulsar_nack.snapshot.keeper` — :class:`~pulsar_nack.snapshot.keeper.SnapshotKeeper`: restores the
  pending nacks into the tracker after a restart, adopts a dead member's (docs/snapshots.md);
* :mod:`~pulsar_nack.snapshot.topic` — ``TopicSnapshotStorage``: segments as keyed messages of a Pulsar
  topic (imported from there: this package does not import the Pulsar client).
"""

from pulsar_nack.snapshot.format import ReadLimits, Segment, SnapshotCorrupt, decode_segment, encode_segment
from pulsar_nack.snapshot.namespace import SubscriptionStorage, snapshot_key
from pulsar_nack.snapshot.segments import RestoreReport, SegmentConfig, SegmentStore, SnapshotStats
from pulsar_nack.snapshot.storage import (
    InMemoryStorage,
    LocalDirectoryStorage,
    SnapshotStorage,
    SnapshotStorageError,
)

__all__ = [
    "InMemoryStorage",
    "LocalDirectoryStorage",
    "ReadLimits",
    "RestoreReport",
    "Segment",
    "SegmentConfig",
    "SegmentStore",
    "SnapshotCorrupt",
    "SnapshotStats",
    "SnapshotStorage",
    "SnapshotStorageError",
    "SubscriptionStorage",
    "decode_segment",
    "encode_segment",
    "snapshot_key",
]
