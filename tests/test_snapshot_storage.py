"""Snapshot storages: the contract (both storages), atomic and durable local writes, permissions, name
checks, leftover temp files, and a writer process killed with SIGKILL mid-write."""

from __future__ import annotations

import os
import random
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pulsar_nack.snapshot.format import decode_segment
from pulsar_nack.snapshot.storage import (
    InMemoryStorage,
    LocalDirectoryStorage,
    SnapshotStorage,
    SnapshotStorageError,
    check_name,
)


@pytest.fixture(params=["directory", "memory"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> SnapshotStorage:
    if request.param == "memory":
        return InMemoryStorage()
    return LocalDirectoryStorage(tmp_path / "snapshots")


def test_contract_put_get_list_delete(storage: SnapshotStorage) -> None:
    assert isinstance(storage, SnapshotStorage)
    assert storage.list() == []
    storage.put("b.pnk", b"two")
    storage.put("a.pnk", b"one")
    storage.put("a.pnk", b"one again")
    assert storage.list() == ["a.pnk", "b.pnk"]
    assert storage.get("a.pnk") == b"one again"
    storage.delete("a.pnk")
    storage.delete("a.pnk")  # missing: not an error
    assert storage.list() == ["b.pnk"]
    with pytest.raises(SnapshotStorageError):
        storage.get("a.pnk")


@pytest.mark.parametrize(
    "name", ["", "..", "../x", "a/b", "/etc/passwd", ".hidden", "x.tmp", "a..b", "a\0b", "é"]
)
def test_bad_names_are_rejected(storage: SnapshotStorage, name: str) -> None:
    with pytest.raises(SnapshotStorageError):
        storage.put(name, b"x")
    with pytest.raises(SnapshotStorageError):
        check_name(name)


def test_files_0600_directory_0700(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        store = LocalDirectoryStorage(tmp_path / "new")
        store.put("s.pnk", b"data")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "new").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "new" / "s.pnk").st_mode) == 0o600
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    os.chmod(loose, 0o755)
    LocalDirectoryStorage(loose)
    assert stat.S_IMODE(os.stat(loose).st_mode) == 0o700


def test_crash_between_write_and_rename_keeps_previous_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalDirectoryStorage(tmp_path)
    store.put("s.pnk", b"previous")

    def failing_replace(src: str, dst: str) -> None:
        raise OSError(5, "simulated crash before rename")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(SnapshotStorageError):
        store.put("s.pnk", b"next" * 1000)
    monkeypatch.undo()
    assert store.get("s.pnk") == b"previous"
    assert sorted(os.listdir(tmp_path)) == ["s.pnk"]  # the temp file was removed


def test_process_death_between_write_and_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer that dies after writing its temp file (no cleanup runs): the old file is intact, the temp
    file is invisible to list() and removed by the next storage on the directory."""
    store = LocalDirectoryStorage(tmp_path)
    store.put("s.pnk", b"previous")

    class Died(BaseException):
        pass

    def die(temp: str, final: str) -> None:
        raise Died

    monkeypatch.setattr(store, "_commit", die)
    with pytest.raises(Died):
        store.put("s.pnk", b"next")
    leftovers = [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    assert len(leftovers) == 1
    # make it look like another, dead process's temp file
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    os.rename(tmp_path / leftovers[0], tmp_path / f".s.pnk.{dead.pid}.{'0' * 16}.tmp")
    alive = tmp_path / f".s.pnk.{os.getppid()}.{'1' * 16}.tmp"
    alive.write_bytes(b"a live writer's")
    assert store.list() == ["s.pnk"] and store.get("s.pnk") == b"previous"
    fresh = LocalDirectoryStorage(tmp_path)
    assert fresh.removed_temp_files == 1
    assert sorted(os.listdir(tmp_path)) == sorted(["s.pnk", alive.name])


def test_get_refuses_symlinks_and_oversized_files(tmp_path: Path) -> None:
    store = LocalDirectoryStorage(tmp_path, max_bytes=100)
    (tmp_path / "target").write_bytes(b"secret")
    os.symlink(tmp_path / "target", tmp_path / "link.pnk")
    with pytest.raises(SnapshotStorageError):
        store.get("link.pnk")
    (tmp_path / "big.pnk").write_bytes(b"x" * 101)
    with pytest.raises(SnapshotStorageError, match="more than 100"):
        store.get("big.pnk")


def test_fsync_calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    LocalDirectoryStorage(tmp_path).put("s.pnk", b"data")
    assert len(synced) == 2  # the file, then the directory
    synced.clear()
    LocalDirectoryStorage(tmp_path, fsync=False).put("s.pnk", b"data")
    assert synced == []


_WRITER = r"""
import sys
from pulsar_nack.snapshot.storage import LocalDirectoryStorage
from snapshot_helpers import big_segment_bytes
store = LocalDirectoryStorage(sys.argv[1])
seq = int(sys.argv[2])
while True:
    store.put("snap.pnk", big_segment_bytes(seq))
    print(seq, flush=True)
    seq += 1
"""


def test_kill_9_mid_write_leaves_last_complete_snapshot(tmp_path: Path) -> None:
    """SIGKILL a process that rewrites a ~2 MB segment in a loop, at random moments: each time the file
    that is left decodes and is one the writer completed (its last acknowledged put or the one after)."""
    from snapshot_helpers import big_segment_bytes

    root = Path(__file__).resolve().parents[1]
    rng = random.Random(1234)
    seq = 1
    deadline = time.monotonic() + 15
    kills = 0
    while kills < 6 and time.monotonic() < deadline:
        proc = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(tmp_path), str(seq)],
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root / "tests")},
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        first = proc.stdout.readline()  # at least one complete write before the kill
        assert first.strip() == str(seq)
        time.sleep(rng.uniform(0.0, 0.3))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        done = [int(line) for line in [first, *proc.stdout.read().split()] if str(line).strip()]
        last_acked = max(done)
        data = LocalDirectoryStorage(tmp_path).get("snap.pnk")
        segment = decode_segment(data)
        assert segment.seq in (last_acked, last_acked + 1)  # killed after the rename, before the print
        assert data == big_segment_bytes(segment.seq)
        assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]  # cleaned by the storage above
        seq = segment.seq + 1
        kills += 1
    assert kills >= 3
