"""pulsar-nack: PIP-393 negative-acknowledgement tracking for the Apache Pulsar Python client."""

from pulsar_nack.index import DueIds, TimeBucketIndex
from pulsar_nack.memory import MemoryUsage

__all__ = ["DueIds", "MemoryUsage", "TimeBucketIndex"]
__version__ = "0.1.0"
