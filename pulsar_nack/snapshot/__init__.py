"""Pending nacks that survive a restart: immutable segment files (PIP-195's bucket snapshots, client side).

* :mod:`~pulsar_nack.snapshot.format` — the versioned, checksummed segment file and its defensive reader;
* :mod:`~pulsar_nack.snapshot.storage` — :class:`SnapshotStorage` and the atomic local-directory storage;
* :mod:`~pulsar_nack.snapshot.segments` — :class:`SegmentStore`: seal, load, merge, delete, restore.

Not wired into the consumer yet.
"""

from pulsar_nack.snapshot.format import ReadLimits, Segment, SnapshotCorrupt, decode_segment, encode_segment
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
    "decode_segment",
    "encode_segment",
]
