"""Snapshot storage faults (issue 27): the application is told once per state change, with the true count
of nacks at risk; ``stats()`` and the Prometheus collector show it meanwhile; writes resume when the storage
is back, a removed directory is created again."""

from __future__ import annotations

import logging
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from fake_clock import FakeClock
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from test_snapshot_segments import Flaky

from pulsar_nack import NackStats
from pulsar_nack.lowlevel import TimerWheel
from pulsar_nack.metrics import NackCollector
from pulsar_nack.snapshot.segments import SegmentConfig, SegmentStore
from pulsar_nack.snapshot.storage import InMemoryStorage, LocalDirectoryStorage, SnapshotStorageError
from pulsar_nack.tracker import NackTracker

K = 8
CONFIG = SegmentConfig(min_ids_per_segment=100, load_ahead_ms=0, max_loaded_ids=0)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_told_once_per_state_change_with_every_nack_at_risk(caplog: pytest.LogCaptureFixture) -> None:
    """1,500 nacks sealed while puts fail: one warning naming 1,500; 1,500 more: no new warning, and the
    gauge says 3,000 (the old message named one segment's count); healed: one warning; failing again:
    one warning naming what is at risk then."""
    flaky = Flaky(InMemoryStorage())
    store = SegmentStore(flaky, CONFIG, precision_bits=K)
    flaky.fail = {"put"}
    with caplog.at_level(logging.WARNING):
        for entry in range(1_500):
            store.add(60_000 + entry, 1, entry)
        store.checkpoint(0)
        assert _warnings(caplog) == [_warnings(caplog)[0]] and "1500 pending nacks" in _warnings(caplog)[0]
        for entry in range(1_500, 3_000):
            store.add(60_000 + entry, 1, entry)
        store.checkpoint(10)
        store.maintain(20)
        assert len(_warnings(caplog)) == 1, _warnings(caplog)
        stats = store.stats()
        assert stats.storage_failing and stats.ids_not_durable == 3_000
        assert stats.create.failed >= 2
        caplog.clear()
        flaky.fail = set()
        store.maintain(30)
        assert len(_warnings(caplog)) == 1 and "writes again" in _warnings(caplog)[0]
        stats = store.stats()
        assert not stats.storage_failing and stats.ids_not_durable == 0 and stats.segments_unpersisted == 0
        caplog.clear()
        store.add(90_000, 1, 5_000)
        flaky.fail = {"put"}
        store.checkpoint(40)
        store.checkpoint(50)
        assert len(_warnings(caplog)) == 1 and "1 pending nacks" in _warnings(caplog)[0]


def test_failing_deletes_and_watermark_writes_are_told_once_too(caplog: pytest.LogCaptureFixture) -> None:
    """Segments on storage, then every write and delete fails while nacks are popped (each checkpoint would
    write the pop watermark, delete emptied segments): one warning for the lot, one when it heals."""
    flaky = Flaky(InMemoryStorage())
    store = SegmentStore(flaky, CONFIG, precision_bits=K)
    for entry in range(1_000):
        store.add(10_000 + entry * 10, 1, entry)
    store.checkpoint(0)
    assert len(flaky.inner.list()) >= 2
    flaky.fail = {"put", "delete"}
    with caplog.at_level(logging.WARNING):
        for now in range(10_000, 21_000, 1_000):
            store.pop_due(now)
            store.checkpoint(now)
        assert len(_warnings(caplog)) == 1, _warnings(caplog)
        assert store.stats().storage_failing and store.stats().delete.failed + store.stats().create.failed
        flaky.fail = set()
        store.checkpoint(21_000)
        assert len(_warnings(caplog)) == 2 and "writes again" in _warnings(caplog)[1]
    assert not store.stats().storage_failing and flaky.inner.list() == []


def test_a_removed_directory_is_created_again_and_writes_resume(tmp_path: Path) -> None:
    directory = tmp_path / "snapshots"
    storage = LocalDirectoryStorage(directory, fsync=False)
    store = SegmentStore(storage, CONFIG, precision_bits=K)
    store.add(60_000, 1, 1)
    store.checkpoint(0)
    shutil.rmtree(directory)
    store.add(70_000, 1, 2)
    store.checkpoint(10)
    assert directory.is_dir() and (directory.stat().st_mode & 0o777) == 0o700
    assert not store.stats().storage_failing
    again = SegmentStore(LocalDirectoryStorage(directory, fsync=False), CONFIG, precision_bits=K)
    assert again.restore(0).ids == 1, "the new segment is on disk (the first went with the directory)"


class SnapshotConsumer:
    """A consumer stand-in for the collector: a real NackTracker keeping snapshots in a Flaky storage."""

    def __init__(self, flaky: Flaky) -> None:
        self.clock = FakeClock()
        self.wheel = TimerWheel(clock=self.clock, start=False)
        self.store = SegmentStore(flaky, CONFIG, precision_bits=K)
        self.tracker = NackTracker(
            lambda _due: None, precision_bits=K, clock=self.clock, wheel=self.wheel, index=self.store
        )

    def nack_stats(self, *, with_memory: bool = False) -> NackStats:
        return replace(self.tracker.stats(with_memory=with_memory), snapshots=self.store.stats())

    def topic(self) -> str:
        return "persistent://public/default/t"

    def subscription_name(self) -> str:
        return "sub"


def _samples(registry: CollectorRegistry) -> dict[str, float]:
    text = generate_latest(registry).decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if "snapshot" in sample.name
    }


def test_the_collector_exports_what_is_at_risk_and_the_failed_writes() -> None:
    flaky = Flaky(InMemoryStorage())
    consumer = SnapshotConsumer(flaky)
    registry = CollectorRegistry()
    NackCollector(consumer, memory_ttl_s=None).register(registry)
    for entry in range(200):
        consumer.tracker.schedule(consumer.clock.now + 60_000, 1, entry)
    flaky.fail = {"put"}
    consumer.store.checkpoint(int(consumer.clock.now))
    samples = _samples(registry)
    assert samples["pulsar_nack_snapshot_ids_not_durable"] == 200
    assert samples["pulsar_nack_snapshot_storage_failing"] == 1
    assert samples["pulsar_nack_snapshot_write_failures_total"] >= 1
    flaky.fail = set()
    consumer.store.maintain(int(consumer.clock.now))
    samples = _samples(registry)
    assert samples["pulsar_nack_snapshot_ids_not_durable"] == 0
    assert samples["pulsar_nack_snapshot_storage_failing"] == 0


def test_a_consumer_without_snapshots_has_no_snapshot_samples() -> None:
    clock = FakeClock()
    tracker = NackTracker(lambda _due: None, clock=clock, wheel=TimerWheel(clock=clock, start=False))

    class Plain:
        def nack_stats(self, *, with_memory: bool = False) -> NackStats:
            return tracker.stats(with_memory=with_memory)

        def topic(self) -> str:
            return "t"

        def subscription_name(self) -> str:
            return "sub"

    registry = CollectorRegistry()
    NackCollector(Plain(), memory_ttl_s=None).register(registry)
    assert _samples(registry) == {}


def test_a_read_only_directory_is_refused_at_subscribe(tmp_path: Path) -> None:
    """docs/parameters.md: a directory that cannot be used raises ``SnapshotStorageError`` at subscribe —
    a read-only one too, even when its lock file exists from an earlier run (opening that needs no write).
    A read-only file system needs a mount: skipped where this process may not mount one."""
    directory = tmp_path / "ro"
    directory.mkdir(mode=0o700)
    mount = ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(directory)]
    if shutil.which("mount") is None or subprocess.run(mount, capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        storage = LocalDirectoryStorage(directory, fsync=False)
        assert storage.lock_member("member")
        storage.unlock_member("member")
        subprocess.run(["mount", "-o", "remount,ro", str(directory)], check=True)
        with pytest.raises(SnapshotStorageError, match="cannot write in"):
            LocalDirectoryStorage(directory, fsync=False)
    finally:
        subprocess.run(["umount", str(directory)], check=False)
