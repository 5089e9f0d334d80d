"""SegmentStore: restore against a model, the memory bound, merge/delete ordering, storage failures,
corrupt segments, and the three broker bug fixes (#26230, #26080, #26117) as client-side tests."""

from __future__ import annotations

import logging
import random
import threading
import time
from pathlib import Path

import pytest
from pyroaring import BitMap

from pulsar_nack.index import TimeBucketIndex
from pulsar_nack.snapshot import segments
from pulsar_nack.snapshot.format import Segment, decode_segment, encode_segment, groups_from_rows
from pulsar_nack.snapshot.segments import WATERMARK_NAME, SegmentConfig, SegmentStore, segment_name
from pulsar_nack.snapshot.storage import (
    InMemoryStorage,
    LocalDirectoryStorage,
    SnapshotStorage,
    SnapshotStorageError,
)

K = 4  # precision bits: 16-ms buckets
STEP = 1 << K


def bucket(due: int) -> int:
    return due & ~(STEP - 1)


class Flaky:
    """A storage whose operations can be made to fail."""

    def __init__(self, inner: SnapshotStorage) -> None:
        self.inner = inner
        self.fail: set[str] = set()
        self.calls: list[tuple[str, str]] = []

    def _op(self, op: str, name: str = "") -> None:
        self.calls.append((op, name))
        if op in self.fail:
            raise SnapshotStorageError(5, f"injected {op} failure")

    def put(self, name: str, data: bytes) -> None:
        self._op("put", name)
        self.inner.put(name, data)

    def get(self, name: str) -> bytes:
        self._op("get", name)
        return self.inner.get(name)

    def delete(self, name: str) -> None:
        self._op("delete", name)
        self.inner.delete(name)

    def list(self) -> list[str]:
        self._op("list")
        return self.inner.list()


@pytest.fixture(params=["directory", "memory"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> SnapshotStorage:
    if request.param == "memory":
        return InMemoryStorage()
    return LocalDirectoryStorage(tmp_path / "segments", fsync=False)


def drain(store: SegmentStore, start: int, end: int, popped: dict[tuple[str, int, int], list[int]]) -> None:
    """Pop every STEP ms from start to end (inclusive), recording when each id came out."""
    t = start
    while t <= end:
        for ids in store.pop_due(t):
            for entry in ids.entry_ids.tolist():
                popped.setdefault((ids.topic, ids.ledger_id, entry), []).append(t)
        store.maintain(t)
        t += STEP


@pytest.mark.parametrize("seed", [7, 11, 23, 31])
def test_restore_matches_a_model(storage: SnapshotStorage, seed: int) -> None:
    """Random nacks, re-nacks and acks over many ledgers and topics, a restart in the middle: every id
    pending at the last checkpoint comes out exactly once, at its earliest due bucket (or at the first
    pop after the restart if that bucket passed while the consumer was down), never early. Ids acked or
    popped before the restart may come back once (removals from a segment are persisted only when it is
    rewritten, merged or fully popped) — never more than once."""
    rng = random.Random(seed)
    config = SegmentConfig(
        min_ids_per_segment=200,
        max_segment_span_ms=2_000,
        max_loaded_ids=300,
        load_ahead_ms=500,
        max_segments=6,
        checkpoint_interval_ms=100,
    )
    store = SegmentStore(storage, config, precision_bits=K)
    model: dict[tuple[str, int, int], int] = {}  # id → due bucket (earliest wins)
    popped: dict[tuple[str, int, int], list[int]] = {}
    gone: set[tuple[str, int, int]] = set()
    topics = ["", "persistent://a/b/one", "persistent://a/b/two"]
    now = 0
    for _ in range(40):
        for _ in range(rng.randint(0, 120)):
            key = (rng.choice(topics), rng.randrange(5), rng.randrange(400))
            due = now + rng.randint(0, 20_000)
            store.add(due, key[1], key[2], topic=key[0])
            model[key] = min(model.get(key, 2**62), bucket(due))
        for key in rng.sample(sorted(model), k=min(len(model), rng.randint(0, 10))):
            assert store.remove(key[1], key[2], topic=key[0])
            del model[key]
            gone.add(key)
        before = {k: len(v) for k, v in popped.items()}
        drain(store, now, now + 240, popped)
        for key, times in popped.items():
            if len(times) != before.get(key, 0):
                assert len(times) == before.get(key, 0) + 1
                assert times[-1] >= model[key]  # never early
                del model[key]
                gone.add(key)
        now += 256
    store.checkpoint(now)
    assert len(storage.list()) >= 2
    down_until = now + 5_000  # the consumer is down 5 s: some ids become due meanwhile
    restarted = SegmentStore(storage, config, precision_bits=K)
    report = restarted.restore(down_until)
    assert report.corrupt_segments == 0
    due_segments = sum(n for _, lo, _, n, _ in restarted.segments() if lo <= down_until)
    assert restarted.stats().ids_in_memory <= config.max_loaded_ids + due_segments  # due ones are forced
    after: dict[tuple[str, int, int], list[int]] = {}
    drain(restarted, down_until, now + 40_000, after)
    assert set(model) <= set(after) <= set(model) | gone
    for key, times in after.items():
        assert len(times) == 1, key
        if key not in model:
            continue
        expected = max(model[key], down_until)
        assert expected <= times[0] < expected + STEP, (key, model[key], times)
    assert len(restarted) == 0
    assert storage.list() == []  # every segment fully popped was deleted


def test_batch_members_survive_a_restart(storage: SnapshotStorage) -> None:
    store = SegmentStore(storage, SegmentConfig(load_ahead_ms=0, max_loaded_ids=0), precision_bits=K)
    store.add(1_000, 5, 10, batch_index=2)
    store.add(1_000, 5, 10, batch_index=1500)
    store.add(1_000, 5, 11)
    store.add(3_000, 5, 10, batch_index=3)
    store.checkpoint(0)
    again = SegmentStore(storage, SegmentConfig(load_ahead_ms=0, max_loaded_ids=0), precision_bits=K)
    again.restore(0)
    first = again.pop_due(1_000)
    assert [(d.ledger_id, d.entry_ids.tolist(), dict(d.batch_indexes)) for d in first] == [
        (5, [10, 11], {10: (2, 1500)})
    ]
    assert [dict(d.batch_indexes) for d in again.pop_due(3_000)] == [{10: (3,)}]


def test_pending_mask_is_exact_for_batch_members_on_storage(storage: SnapshotStorage) -> None:
    """Issue 27 item 4: the arrival filter expands an entry it kept as one bit from ``pending_mask`` and
    takes every message not pending for acked. A segment on storage answered -1 (whole) for an entry
    pending in part: the filter then took the members still pending for acked, and 571 of 10,000 batched
    nacks never came back after a restart. Now the members of unloaded segments are known exactly, before
    and after a restart, deletions applied; an entry pending whole is still -1."""
    config = SegmentConfig(load_ahead_ms=0, max_loaded_ids=0)
    store = SegmentStore(storage, config, precision_bits=K)
    store.add(5_000, 5, 10, batch_index=2)
    store.add(9_000, 5, 10, batch_index=7)
    store.add(9_000, 5, 10, batch_index=1500)  # a wide member
    store.add(5_000, 5, 11)  # a whole entry
    store.add(5_000, 5, 12, batch_index=0)
    store.add(9_000, 5, 12)  # the same entry whole in another bucket
    store.checkpoint(0)
    assert store.stats().segments_loaded == 0 and store.stats().ids_in_memory == 0, store.stats()
    again = SegmentStore(storage, config, precision_bits=K)
    again.restore(0)
    for view in (store, again):
        assert view.pending_mask(5, 10) == 1 << 2 | 1 << 7 | 1 << 1500
        assert view.pending_mask(5, 11) == -1
        assert view.pending_mask(5, 12) == -1
        assert view.pending_mask(5, 13) == 0
        assert view.pending_mask(6, 10) == 0
        view.remove(5, 10, 7)
        assert view.pending_mask(5, 10) == 1 << 2 | 1 << 1500
        assert view.stats().ids_in_memory == 0, "answered from memory, the segment still on storage"


def test_members_of_one_batch_in_several_segments_are_all_restored(storage: SnapshotStorage) -> None:
    """Issue 27 item 4: messages of one batched entry nacked with different delays land in different
    segments. Restore took an entry met in two segments for a second copy and kept the earliest
    segment's part only: every later member was dropped (577 of 10,000 batched nacks never came back
    after a restart). Second copies are per message: a member really pending twice still fires once,
    at its earliest bucket; a whole entry beside members of it keeps both."""
    config = SegmentConfig(min_ids_per_segment=1)
    store = SegmentStore(storage, config, precision_bits=K)
    store.add(1_000, 5, 10, batch_index=1)
    store.add(2_000, 5, 10, batch_index=2)
    store.add(3_000, 5, 10, batch_index=3)
    store.add(4_000, 5, 11, batch_index=0)
    store.add(5_000, 5, 11)  # whole, beside a member of it
    store.checkpoint(0)
    store.add(6_000, 5, 10, batch_index=2)  # a second copy of member 2, later: the earlier one wins
    store.checkpoint(0)
    assert store.stats().segments_total >= 4, store.stats()
    again = SegmentStore(storage, config, precision_bits=K)
    again.restore(0)
    popped = [
        (due, d.ledger_id, e, d.batch_indexes.get(e))
        for due in (1_000, 2_000, 3_000, 4_000, 5_000, 6_000)
        for d in again.pop_due(due)
        for e in d.entry_ids.tolist()
    ]
    assert popped == [
        (1_000, 5, 10, (1,)),
        (2_000, 5, 10, (2,)),
        (3_000, 5, 10, (3,)),
        (4_000, 5, 11, (0,)),
        (5_000, 5, 11, None),
    ]


Op = tuple[str, int, int, int, int]  # ("add" or "remove", due, ledger, entry, batch index)
Popped = tuple[int, int, int, tuple[int, ...] | None]  # (time, ledger, entry, batch indexes or None: whole)


def _replayed(ops: list[Op]) -> TimeBucketIndex:
    """An index that never went through a snapshot, after ``ops``."""
    index = TimeBucketIndex(K)
    for op, due, ledger, entry, batch_index in ops:
        if op == "add":
            index.add(due, ledger, entry, batch_index)
        else:
            index.remove(ledger, entry, batch_index)
    return index


def _all_pops(view: SegmentStore | TimeBucketIndex, end: int) -> list[Popped]:
    """Every pop every STEP ms up to ``end``, sorted (the order of ledgers in one pop is not a promise)."""
    popped = [
        (now, d.ledger_id, e, d.batch_indexes.get(e))
        for now in range(0, end + STEP, STEP)
        for d in view.pop_due(now)
        for e in d.entry_ids.tolist()
    ]
    return sorted(popped, key=lambda p: p[:3])


def _assert_same_pending(view: SegmentStore, reference: TimeBucketIndex, ops: list[Op]) -> None:
    for ledger, entry, index in {(led, e, bi) for _, _, led, e, bi in ops} | {
        (led, e, -1) for _, _, led, e, _ in ops
    }:
        assert view.pending_mask(ledger, entry) == reference.pending_mask(ledger, entry), (ledger, entry)
        assert view.due_of(ledger, entry, index) == reference.due_of(ledger, entry, index), (
            ledger,
            entry,
            index,
        )


@pytest.mark.parametrize("fill_ids", [None, 1])
def test_restored_batch_messages_are_all_due_at_their_times(
    storage: SnapshotStorage, fill_ids: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 27 item 4: segments' batch messages are filed in bulk (one by one, a restore of 10,000
    batched nacks took ~400 ms where 10,000 whole entries took ~5). Batches nacked message by message
    with their own delays, sealed into segments one second of nacks at a time (as the consumer does), so
    that every entry has messages in several segments; some messages nacked twice (the earlier wins),
    whole entries beside messages of theirs, wide batch indexes, acks of messages and whole entries (some
    persisted by a checkpoint). After a restart every message pending is pending (``pending_mask``), due
    at its bucket (``due_of``) and popped once, then, as an index that never went through a snapshot pops
    it. So too in the store that wrote the segments, after more acks while the segments are on storage
    (applied when each is loaded): the same pops. ``fill_ids`` 1: the restore fills its segments one at a
    time (as it does past 65,536 ids), each entry's messages settled against those filed before."""
    if fill_ids is not None:
        monkeypatch.setattr(segments, "_FILL_IDS", fill_ids)
    config = SegmentConfig(min_ids_per_segment=200, load_ahead_ms=0, max_loaded_ids=0)
    store = SegmentStore(storage, config, precision_bits=K)
    rng = random.Random(27)
    ops: list[Op] = []
    for second in range(4):
        for _ in range(400):
            entry = rng.randrange(30)
            index = rng.choice([*range(40), 1024, 2000]) if rng.random() > 0.03 else -1
            ops.append(("add", rng.randrange(2_000, 20_000), 5 + entry % 2, entry, index))
        for _, due, ledger, entry, index in ops[-400:]:
            store.add(due, ledger, entry, index)
        store.checkpoint(second * 1_000)
    for _, _, ledger, entry, index in rng.sample(ops, 60):
        store.remove(ledger, entry, index)
        ops.append(("remove", 0, ledger, entry, index))
    store.checkpoint(4_000)
    assert store.stats().segments_total >= 4, store.stats()
    copy = InMemoryStorage()  # the restart's view of the files (the writer goes on with them below)
    for name in storage.list():
        copy.put(name, storage.get(name))
    again = SegmentStore(copy, SegmentConfig(), precision_bits=K)
    again.restore(1_000)  # every segment loaded (its ids due within the default minute)
    assert again.stats().segments_loaded == again.stats().segments_total
    reference = _replayed(ops)
    _assert_same_pending(again, reference, ops)
    expected = _all_pops(reference, 20_000)
    assert _all_pops(again, 20_000) == expected and len(again) == 0
    assert len(expected) > 300 and any(p[3] is None for p in expected) and any(p[3] for p in expected)
    for _, _, ledger, entry, index in rng.sample(ops, 60):  # acks of ids on storage: applied at load
        store.remove(ledger, entry, index)
        ops.append(("remove", 0, ledger, entry, index))
    # (due_of is a lower bound for an id on storage: only the pops are compared)
    assert _all_pops(store, 20_000) == _all_pops(_replayed(ops), 20_000) and len(store) == 0


@pytest.mark.parametrize("fill_ids", [None, 1])
def test_messages_in_several_segments_restore_as_an_index_files_them(
    storage: SnapshotStorage, fill_ids: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Segments that overlap (as a crash between writes can leave them): the same batch messages and
    whole entries in several segments at different buckets. The restore files them in bulk — all at once,
    or (``fill_ids`` 1) one segment after the other, each entry's messages settled against the parts
    filed before — and the result is what an index makes of the same adds one by one: each message due
    at its earliest bucket, covered by its entry pending whole no later, a later copy gone."""
    if fill_ids is not None:
        monkeypatch.setattr(segments, "_FILL_IDS", fill_ids)
    rng = random.Random(5)
    reference = TimeBucketIndex(K)
    for seq in range(1, 7):
        rows: dict[int, tuple[BitMap, dict[int, int]]] = {}  # bucket → (entries, masks of partial ones)
        for entry in rng.sample(range(20), 12):
            whole = bucket(rng.randrange(3_000, 12_000)) if rng.random() < 0.3 else None
            if whole is not None:
                rows.setdefault(whole, (BitMap(), {}))[0].add(entry)
                reference.add(whole, 5, entry)
            for index in rng.sample([*range(12), 1500], 5):
                due = bucket(rng.randrange(1_000, whole if whole is not None else 12_000))
                if due == whole:
                    continue  # (the whole entry there covers it: not a message of its own in the file)
                entries, masks = rows.setdefault(due, (BitMap(), {}))
                entries.add(entry)
                masks[entry] = masks.get(entry, 0) | 1 << index
                reference.add(due, 5, entry, index)
        groups = groups_from_rows(
            (due, "", 5, entries, masks) for due, (entries, masks) in sorted(rows.items())
        )
        storage.put(segment_name(seq), encode_segment(Segment(seq, tuple(groups))))
    again = SegmentStore(storage, SegmentConfig(), precision_bits=K)
    again.restore(0)
    assert again.stats().segments_loaded == 6
    for entry in range(20):
        assert again.pending_mask(5, entry) == reference.pending_mask(5, entry), entry
        for index in (-1, *range(12), 1500):
            assert again.due_of(5, entry, index) == reference.due_of(5, entry, index), (entry, index)
    expected = _all_pops(reference, 12_000)
    assert _all_pops(again, 12_000) == expected and len(again) == 0
    assert any(p[3] is None for p in expected) and any(p[3] for p in expected)


def test_past_due_ids_are_due_at_once_and_keep_their_bucket(storage: SnapshotStorage) -> None:
    store = SegmentStore(storage, precision_bits=K)
    store.add(1_000, 1, 1)
    store.add(90_000, 1, 2)
    store.checkpoint(0)
    again = SegmentStore(storage, precision_bits=K)
    again.restore(50_000)  # long after 1,000
    assert again.due_of(1, 1) == bucket(1_000)
    assert again.next_due_ms() == bucket(1_000)
    assert [d.entry_ids.tolist() for d in again.pop_due(50_000)] == [[1]]


def test_memory_bound_leaves_later_segments_on_storage(storage: SnapshotStorage) -> None:
    config = SegmentConfig(
        min_ids_per_segment=100, max_loaded_ids=250, load_ahead_ms=10_000, max_segments=100
    )
    store = SegmentStore(storage, config, precision_bits=K)
    for i in range(2_000):
        store.add(10_000 + i * 50, 1, i)  # 100 s of nacks, 20 per second
    store.checkpoint(0)
    restarted = SegmentStore(storage, config, precision_bits=K)
    report = restarted.restore(0)
    assert report.ids == 2_000 and report.loaded_ids <= 250
    stats = restarted.stats()
    assert stats.segments_total == 20 and 0 < stats.segments_loaded < 20
    assert stats.ids_in_memory <= 250 and stats.ids_on_storage + stats.ids_in_memory == 2_000
    assert len(restarted) == 2_000
    popped: dict[tuple[str, int, int], list[int]] = {}
    drain(restarted, 0, 110_000, popped)
    assert len(popped) == 2_000 and restarted.stats().forced_loads == 0


def test_merge_picks_adjacent_segments_with_fewest_ids_and_deletes_after_writing(tmp_path: Path) -> None:
    flaky = Flaky(LocalDirectoryStorage(tmp_path, fsync=False))
    config = SegmentConfig(min_ids_per_segment=1, max_segments=4, load_ahead_ms=0, max_loaded_ids=0)
    store = SegmentStore(flaky, config, precision_bits=K)
    sizes = [50, 40, 3, 2, 1, 4, 60]  # the 4 adjacent with the fewest ids: 3, 2, 1, 4
    for n, size in enumerate(sizes):
        for i in range(size):
            store.add(100_000 * (n + 1), n, i)
        store.checkpoint(0)
    assert len(flaky.inner.list()) == 7
    flaky.fail = {"put"}
    store.maintain(0)  # the merged file cannot be written: nothing is deleted
    assert len(flaky.inner.list()) == 7 and ("delete", "") not in flaky.calls
    assert store.stats().merge.failed == 1
    flaky.fail = set()
    flaky.calls.clear()
    store.maintain(0)
    puts = [i for i, (op, _) in enumerate(flaky.calls) if op == "put"]
    deletes = [i for i, (op, _) in enumerate(flaky.calls) if op == "delete"]
    assert len(puts) == 1 and len(deletes) == 4 and puts[0] < min(deletes)
    live = store.segments()
    assert [n for _, _, _, n, _ in live] == [50, 40, 10, 60]
    merged = decode_segment(flaky.inner.get(live[2][0]))
    assert len(merged.supersedes) == 4 and merged.id_count == 10
    assert store.stats().merge.succeeded == 1


def test_crash_after_merge_write_before_deletes_restores_once(tmp_path: Path) -> None:
    flaky = Flaky(LocalDirectoryStorage(tmp_path, fsync=False))
    config = SegmentConfig(min_ids_per_segment=1, max_segments=1, load_ahead_ms=0, max_loaded_ids=0)
    store = SegmentStore(flaky, config, precision_bits=K)
    for n in range(3):
        store.add(10_000 * (n + 1), 1, n)
        store.checkpoint(0)
    flaky.fail = {"delete"}  # as if the process died right after writing the merged segment
    store.maintain(0)
    assert len(flaky.inner.list()) == 4 or len(flaky.inner.list()) == 5
    restarted = SegmentStore(flaky.inner, config, precision_bits=K)
    report = restarted.restore(0)
    assert report.superseded_removed >= 3 and report.ids == 3
    popped: dict[tuple[str, int, int], list[int]] = {}
    drain(restarted, 0, 40_000, popped)
    assert {k: len(v) for k, v in popped.items()} == {("", 1, 0): 1, ("", 1, 1): 1, ("", 1, 2): 1}


def test_storage_failure_falls_back_to_memory(caplog: pytest.LogCaptureFixture) -> None:
    flaky = Flaky(InMemoryStorage())
    store = SegmentStore(flaky, SegmentConfig(load_ahead_ms=0, max_loaded_ids=0), precision_bits=K)
    flaky.fail = {"put"}
    for i in range(10):
        store.add(60_000, 1, i)
    with caplog.at_level(logging.WARNING):
        store.checkpoint(0)
    assert "10 pending nacks are in memory only" in caplog.text
    stats = store.stats()
    assert stats.fallbacks == 1 and stats.segments_unpersisted == 1 and stats.ids_in_memory == 10
    flaky.fail = set()
    store.maintain(10)  # retried
    assert store.stats().segments_unpersisted == 0 and len(flaky.inner.list()) == 1
    assert [d.entry_ids.tolist() for d in store.pop_due(60_000)] == [list(range(10))]


def test_corrupt_segment_is_dropped_with_a_count(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    storage = LocalDirectoryStorage(tmp_path, fsync=False)
    store = SegmentStore(storage, SegmentConfig(min_ids_per_segment=10), precision_bits=K)
    for i in range(30):
        store.add(1_000 * (i // 10 + 1), 1, i)
    store.checkpoint(0)
    names = storage.list()
    assert len(names) == 3
    path = tmp_path / names[1]
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x40
    path.write_bytes(bytes(data))
    restarted = SegmentStore(storage, precision_bits=K)
    with caplog.at_level(logging.WARNING):
        report = restarted.restore(0)
    assert report.corrupt_segments == 1 and report.lost_ids == 10 and report.ids == 20
    assert "10 pending nacks lost" in caplog.text
    assert names[1] not in storage.list()


def test_stats_count_operations(storage: SnapshotStorage) -> None:
    store = SegmentStore(storage, SegmentConfig(min_ids_per_segment=5), precision_bits=K)
    for i in range(20):
        store.add(1_000, i, 1)  # 20 groups (one per ledger), cut every 5 ids
    store.checkpoint(0)
    store.pop_due(1_000)
    assert store.stats().delete.succeeded == 0, "the timer's pop deletes no file: the next maintain does"
    store.maintain(1_000)
    stats = store.stats()
    assert stats.create.succeeded == 4 and stats.delete.succeeded == 4 and stats.segments_total == 0
    assert sum(stats.create.histogram) == 4 and stats.create.total_ms >= 0


# -- the broker's 2026 bug fixes, client side -----------------------------------------------------------


def test_due_time_checked_before_membership_26230(storage: SnapshotStorage) -> None:
    """broker #26230: a sealed segment's membership bitmap says an id is *in* the segment, not that it is
    still pending — once its bucket was popped it is not. A new nack of that id, due now, must not be
    taken for a duplicate of the popped copy (the message would never come back)."""
    store = SegmentStore(storage, SegmentConfig(load_ahead_ms=0), precision_bits=K)
    store.add(1_000, 1, 42)
    store.add(9_000, 1, 43)  # keeps the segment alive after 42 is popped
    store.checkpoint(0)
    assert [d.entry_ids.tolist() for d in store.pop_due(1_000)] == [[42]]
    store.add(1_100, 1, 42)  # nacked again, due at once
    assert [d.entry_ids.tolist() for d in store.pop_due(1_200)] == [[42]]
    # and an id whose unloaded segment copy is later: the earlier new nack wins, the old copy is dropped
    store.add(50_000, 2, 7)
    store.checkpoint(1_200)
    store.add(2_000, 2, 7)
    popped: dict[tuple[str, int, int], list[int]] = {}
    drain(store, 1_200, 60_000, popped)
    assert popped[("", 2, 7)] == [bucket(2_000)]


def test_next_due_time_while_segments_are_unloaded_26080(storage: SnapshotStorage) -> None:
    """broker #26080: with the in-memory queues empty and every pending id in unloaded segments, the
    next due time is the earliest unloaded segment's first bucket — not None, not an error."""
    config = SegmentConfig(load_ahead_ms=0, max_loaded_ids=0, min_ids_per_segment=3)
    store = SegmentStore(storage, config, precision_bits=K)
    for i in range(6):
        store.add(20_000 + 10_000 * (i // 3), 1, i)
    store.checkpoint(0)
    assert store.stats().segments_loaded == 0 and store.stats().ids_in_memory == 0
    assert store.next_due_ms() == 20_000
    restarted = SegmentStore(storage, config, precision_bits=K)
    restarted.restore(0)
    assert restarted.stats().ids_in_memory == 0 and restarted.next_due_ms() == 20_000
    assert restarted.pop_due(19_999) == []
    assert [d.entry_ids.tolist() for d in restarted.pop_due(20_000)] == [[0, 1, 2]]
    assert restarted.next_due_ms() == 30_000


def test_deletions_trimmed_at_rewrite_live_bitmaps_never_optimized_26117(storage: SnapshotStorage) -> None:
    """broker #26117: removals go to a deletion bitmap that is mutated and therefore never run-optimized;
    the frozen membership bitmap is; a rewrite trims the removed ids out of the file and the bitmaps."""
    config = SegmentConfig(
        load_ahead_ms=0, max_loaded_ids=0, rewrite_deleted_ratio=0.5, min_ids_per_segment=10_000
    )
    store = SegmentStore(storage, config, precision_bits=K)
    for i in range(4_000):
        store.add(100_000, 1, i)
    store.checkpoint(0)
    (rec,) = store._records.values()
    assert rec.membership[("", 1)].get_statistics()["n_run_containers"] == 1  # frozen: optimized
    for i in range(1_000):
        assert store.remove(1, i)
    store.maintain(1)  # 25 % deleted: no rewrite yet
    assert rec.deleted[("", 1)].get_statistics()["n_run_containers"] == 0  # live: never optimized
    assert len(storage.list()) == 1 and len(store) == 3_000
    assert not store.remove(1, 5)  # already removed: not pending anywhere
    for i in range(1_000, 2_500):
        store.remove(1, i)
    store.maintain(2)  # 62 % deleted: rewritten
    (new,) = store._records.values()
    assert new.seq != rec.seq and new.deleted == {} and new.count == 1_500
    assert list(new.membership[("", 1)]) == list(range(2_500, 4_000))
    (name,) = storage.list()
    assert list(decode_segment(storage.get(name)).groups[0].entries) == list(range(2_500, 4_000))
    assert [len(d.entry_ids) for d in store.pop_due(100_000)] == [1_500]


def test_renack_earlier_than_a_loaded_copy_wins_once(storage: SnapshotStorage) -> None:
    store = SegmentStore(storage, SegmentConfig(load_ahead_ms=100_000), precision_bits=K)
    store.add(5_000, 1, 1)
    store.checkpoint(0)
    assert store.stats().segments_loaded == 1
    store.add(1_000, 1, 1)  # earlier: moves
    store.add(9_000, 1, 1)  # later: no-op
    popped: dict[tuple[str, int, int], list[int]] = {}
    drain(store, 0, 10_000, popped)
    assert popped == {("", 1, 1): [bucket(1_000)]}


def test_whole_entry_renack_between_its_loaded_message_and_its_loaded_whole_copy(
    storage: SnapshotStorage,
) -> None:
    """Loaded: message 0 of an entry due at 10, the whole entry due at 30. The whole entry re-nacked due
    at 20 moves the whole copy to 20, as in the index (earliest wins, per id): the earlier message is no
    copy of the whole entry. (The store took the loaded index's earliest part, message 0, for an earlier
    whole copy and dropped the re-nack: pop_due(20) handed out message 0 only, the rest at 30.)"""
    store = SegmentStore(storage, SegmentConfig(load_ahead_ms=60_000), precision_bits=0)
    store.add(10, 3, 0, 0)
    store.add(30, 3, 0, -1)
    store.checkpoint(0)
    assert store.segments()[0][-1], "the segment is loaded"
    assert store.add(20, 3, 0, -1) == 20
    assert store.due_of(3, 0, -1) == 10 and store.pending_mask(3, 0) == -1 and store.added == 3
    store.checkpoint(1)
    restarted = SegmentStore(storage, SegmentConfig(load_ahead_ms=60_000), precision_bits=0)
    restarted.restore(2)
    for place in (store, restarted):  # and so after a restart: the files hold what memory does
        (due,) = place.pop_due(20)
        assert (due.ledger_id, due.entry_ids.tolist(), due.batch_indexes) == (3, [0], {})  # whole
        assert place.pop_due(1_000) == [] and len(place) == 0 and place.next_due_ms() is None


def test_a_copy_in_an_unloaded_segment_is_retired_when_the_other_pops(storage: SnapshotStorage) -> None:
    """A re-nack inside an unloaded segment's time range cannot know whether the stored copy is earlier:
    both stay, the first to pop retires the other — the id comes out once, at the earlier time."""
    config = SegmentConfig(load_ahead_ms=0, max_loaded_ids=0)
    store = SegmentStore(storage, config, precision_bits=K)
    store.add(10_000, 1, 1)
    store.add(30_000, 1, 2)
    store.checkpoint(0)
    store.add(20_000, 1, 1)  # inside [10 s, 30 s]: later than the stored copy, which the store cannot see
    store.add(15_000, 1, 2)  # earlier than the stored copy
    popped: dict[tuple[str, int, int], list[int]] = {}
    drain(store, 0, 40_000, popped)
    assert popped == {("", 1, 1): [bucket(10_000)], ("", 1, 2): [bucket(15_000)]}


def test_restart_keeps_earliest_copy_across_segments(storage: SnapshotStorage) -> None:
    config = SegmentConfig(load_ahead_ms=0, max_loaded_ids=0)
    store = SegmentStore(storage, config, precision_bits=K)
    store.add(10_000, 1, 1)
    store.add(30_000, 1, 3)
    store.checkpoint(0)
    store.add(20_000, 1, 1)
    store.checkpoint(1)
    restarted = SegmentStore(storage, config, precision_bits=K)
    restarted.restore(2)
    popped: dict[tuple[str, int, int], list[int]] = {}
    drain(restarted, 0, 40_000, popped)
    assert popped == {("", 1, 1): [bucket(10_000)], ("", 1, 3): [bucket(30_000)]}


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        SegmentConfig(max_merge_inputs=1)
    with pytest.raises(ValueError):
        SegmentConfig(rewrite_deleted_ratio=0)
    with pytest.raises(ValueError):
        SegmentConfig(min_ids_per_segment=0)
    assert SegmentConfig().min_ids_per_segment == 5_000 and SegmentConfig().max_segment_span_ms == 300_000
    with pytest.raises(RuntimeError):
        store = SegmentStore(InMemoryStorage())
        store.add(1, 1, 1)
        store.restore(0)


def test_pops_are_covered_by_the_watermark_not_by_rewrites(
    storage: SnapshotStorage, caplog: pytest.LogCaptureFixture
) -> None:
    store = SegmentStore(storage, precision_bits=0)
    for entry in range(100):
        store.add(10_000 + entry * 100, 1, entry)  # due 10.0 .. 19.9 s: one segment
    store.checkpoint(0)
    popped = {e for ids in store.pop_due(15_000) for e in ids.entry_ids.tolist()}
    assert popped == set(range(51))
    store.checkpoint(15_000)
    assert store.stats().merge.succeeded == 0, "a pop rewrote the segment"
    assert WATERMARK_NAME in storage.list()
    restarted = SegmentStore(storage, precision_bits=0)
    report = restarted.restore(16_000)
    assert report.ids == 49
    assert {e for e in range(100) if restarted.due_of(1, e) is not None} == set(range(51, 100))
    restarted.add(15_500, 1, 500)  # a later life's nack, due after the old watermark: kept
    restarted.checkpoint(16_000)
    assert SegmentStore(storage, precision_bits=0).restore(16_100).ids == 50
    # a damaged watermark: the popped ids come again (at once), with a warning
    data = bytearray(storage.get(WATERMARK_NAME))
    data[10] ^= 1
    storage.put(WATERMARK_NAME, bytes(data))
    with caplog.at_level(logging.WARNING):
        again = SegmentStore(storage, precision_bits=0).restore(16_100)
    assert again.ids == 101 and "watermark is corrupt" in caplog.text


def test_the_watermark_goes_with_the_last_segment(storage: SnapshotStorage) -> None:
    store = SegmentStore(storage)
    store.add(10_000, 1, 1)
    store.add(20_000, 1, 2)
    store.checkpoint(0)
    store.pop_due(10_000)
    store.checkpoint(10_000)
    assert WATERMARK_NAME in storage.list()
    store.pop_due(20_000)
    store.checkpoint(20_000)
    assert storage.list() == []


def test_seals_while_fresh_nacks_arrive_from_another_thread() -> None:
    """Fresh nacks take no store lock: a bucket may fill again while a seal pops it. Each id is sealed
    once, in one group per bucket and ledger (the format refuses two). The nacking thread runs until the
    test has sealed ``seals`` times, each after it added more: the seals overlap the nacks by construction,
    not by how the threads were scheduled (how often a seal met a nack in flight is not asserted)."""
    seals = 5
    storage = InMemoryStorage()
    store = SegmentStore(storage, SegmentConfig(min_ids_per_segment=10**6), precision_bits=0)
    added: list[int] = []
    done = threading.Event()
    errors: list[BaseException] = []
    # The nacking thread adds up to ``budget`` ids, then waits for the next round: it never runs out of
    # work before the last seal however slowly the seals go (a fixed count ran out on a loaded machine).
    budget = [0]

    def nack() -> None:
        entry = 0
        deadline = time.monotonic() + 300  # a bound for a stuck test, not a timing assertion
        try:
            while not done.is_set() and time.monotonic() < deadline:
                if entry >= budget[0]:
                    time.sleep(0.0005)
                    continue
                store.add(1_000 + entry % 3_000, 1, entry, fresh=True)
                added.append(entry)
                entry += 1
                if entry % 200 == 0:
                    time.sleep(0.001)  # let the seals run meanwhile
        except BaseException as error:  # asserted below
            errors.append(error)

    thread = threading.Thread(target=nack)
    thread.start()
    failures: list[Exception] = []
    sealed_while_alive = 0
    try:
        for _ in range(seals):
            mark = len(added)
            budget[0] = mark + 2_000  # the nacks of this round: one before the seal, the rest may meet it
            deadline = time.monotonic() + 60  # a safety net for a stuck thread, not a timing assertion
            while len(added) <= mark and thread.is_alive() and time.monotonic() < deadline:
                time.sleep(0.002)
            try:
                store.checkpoint(0)
            except Exception as error:  # recorded: asserted below, after the thread is stopped
                failures.append(error)
            sealed_while_alive += thread.is_alive()
    finally:
        done.set()
        thread.join(60)
    store.checkpoint(100)
    assert not errors and not failures, (errors, failures[:3])
    assert sealed_while_alive == seals, "the nacking thread ended before the seals did"
    assert len(store) == len(added)
    assert SegmentStore(storage, precision_bits=0).restore(100).ids == len(added)


# -- storage writes outside the store's lock ------------------------------------------------------------


class GatedStorage:
    """A real in-memory storage whose writes (put, delete) wait at a gate: a disk flush that does not
    end until the test opens it. ``blocked`` counts the writes waiting there now."""

    def __init__(self) -> None:
        self.inner = InMemoryStorage()
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.blocked = 0
        self._count = threading.Lock()

    def _wait(self) -> None:
        with self._count:
            self.blocked += 1
        self.entered.set()
        self.gate.wait(60)
        with self._count:
            self.blocked -= 1

    def put(self, name: str, data: bytes) -> None:
        self._wait()
        self.inner.put(name, data)

    def delete(self, name: str) -> None:
        self._wait()
        self.inner.delete(name)

    def get(self, name: str) -> bytes:
        return self.inner.get(name)

    def list(self) -> list[str]:
        return self.inner.list()


def test_acks_and_re_nacks_never_wait_for_a_storage_write() -> None:
    """While a checkpoint's write hangs (the gate closed: one write blocked), a re-nack of an id held by
    a segment, an ack of one and a timer pop — every call that takes the store's lock — return: each
    records, when it returned, that the write was still blocked. The bound on the wait is a safety
    net: the assertion is on the count of blocked writes, not on time."""
    storage = GatedStorage()
    store = SegmentStore(storage, SegmentConfig(load_ahead_ms=0, max_loaded_ids=0), precision_bits=K)
    for entry in range(10):
        store.add(60_000, 1, entry)
    store.checkpoint(0)  # ledger 1 in a segment on storage (the gate open)
    assert len(storage.inner.list()) == 1
    storage.gate.clear()
    for entry in range(10):
        store.add(90_000, 2, entry, fresh=True)  # for the next checkpoint to write
    writer = threading.Thread(target=store.checkpoint, args=(10,), daemon=True)
    writer.start()
    assert storage.entered.wait(30) and storage.blocked == 1
    returned_while_blocked: dict[str, int] = {}

    def calls() -> None:  # record only: the assertions run on the test's thread
        store.add(30_000, 1, 3)  # a re-nack, earlier than its copy in the segment
        returned_while_blocked["re-nack"] = storage.blocked
        store.remove(1, 4)  # an ack
        returned_while_blocked["ack"] = storage.blocked
        store.pop_due(20)  # the timer
        returned_while_blocked["pop"] = storage.blocked

    caller = threading.Thread(target=calls, daemon=True)
    caller.start()
    caller.join(10)  # a safety net only
    storage.gate.set()
    caller.join(30)
    writer.join(30)
    assert returned_while_blocked == {"re-nack": 1, "ack": 1, "pop": 1}
    store.maintain(100)
    popped: dict[tuple[str, int, int], list[int]] = {}
    drain(store, 100, 100_000, popped)
    (when,) = popped[("", 1, 3)]
    assert bucket(30_000) <= when < bucket(30_000) + STEP, "the re-nack kept its earlier due time"
    assert ("", 1, 4) not in popped, "the acked id never came out"
    assert len(popped) == 19 and all(len(v) == 1 for v in popped.values())


def test_a_seal_loaded_at_once_files_every_id_at_its_own_bucket(storage: SnapshotStorage) -> None:
    """The fill's fast path (whole entries, nothing removed, no second copy): a seal whose segments are
    loaded at once puts each id into the loaded index at its own bucket, across ledgers and topics, and
    each comes out exactly once, at its bucket."""
    config = SegmentConfig(min_ids_per_segment=50, load_ahead_ms=60_000)
    store = SegmentStore(storage, config, precision_bits=K)
    rng = random.Random(5)
    due = {
        (topic, ledger, entry): 1_000 + rng.randrange(0, 5_000)
        for topic in ("a", "b")
        for ledger in (1, 2, 3)
        for entry in range(0, 400, 3)
    }
    for (topic, ledger, entry), at in due.items():
        store.add(at, ledger, entry, topic=topic, fresh=True)
    store.checkpoint(0)
    stats = store.stats()
    assert stats.segments_total > 1 and stats.segments_loaded == stats.segments_total
    assert stats.ids_unsealed == 0 and stats.ids_in_memory == len(due)
    for (topic, ledger, entry), at in due.items():
        assert store.due_of(ledger, entry, topic=topic) == bucket(at)
    popped: dict[tuple[str, int, int], list[int]] = {}
    drain(store, 0, 7_000, popped)
    assert popped == {key: [bucket(at)] for key, at in due.items()}


def test_ids_removed_before_a_load_stay_removed(storage: SnapshotStorage) -> None:
    """An id acked while its segment is on storage, and not yet trimmed from its file (no checkpoint in
    between), is not filed when the segment is loaded — the fill's slow path, not its fast one — nor is a
    removed message of a batch entry."""
    config = SegmentConfig(min_ids_per_segment=1_000, max_loaded_ids=0, load_ahead_ms=0)
    store = SegmentStore(storage, config, precision_bits=K)
    for entry in range(100):
        store.add(5_000 + entry, 1, entry, topic="t", fresh=True)
    store.add(5_000, 2, 7, 3, topic="t")  # a batch entry: messages 3 and 4 of entry 7 of ledger 2
    store.add(5_000, 2, 7, 4, topic="t")
    store.checkpoint(0)
    assert store.stats().segments_loaded == 0
    assert store.remove(1, 42, topic="t") and store.remove(2, 7, 4, topic="t")
    due = store.pop_due(6_000)  # loads the segment (due) with its deletions, pops all
    assert store.stats().load.succeeded == 1
    popped = {(d.ledger_id, e) for d in due for e in d.entry_ids.tolist()}
    assert popped == {(1, e) for e in range(100) if e != 42} | {(2, 7)}
    assert [dict(d.batch_indexes) for d in due if d.ledger_id == 2] == [{7: (3,)}]
    assert len(store) == 0


def test_a_load_keeps_the_earlier_of_two_copies_once(storage: SnapshotStorage) -> None:
    """A segment loaded while a later re-nack of one of its ids waits in the mutable index (a second
    copy: the fill's slow path, not its fast one): the earlier copy is the one filed, and the id comes out
    once, at it."""
    config = SegmentConfig(min_ids_per_segment=1_000, max_loaded_ids=0, load_ahead_ms=0)
    store = SegmentStore(storage, config, precision_bits=K)
    for entry in range(100):
        store.add(5_000 + entry * 40, 1, entry, fresh=True)  # 5,000-8,960 ms
    store.checkpoint(0)
    store.add(6_000, 1, 0)  # later than the sealed copy (5,000), inside the segment's time range
    assert store.due_of(1, 0) == bucket(5_000)
    first = store.pop_due(5_000)  # the segment is due: loaded, its copy of entry 0 popped
    assert [(d.ledger_id, d.entry_ids.tolist()) for d in first] == [(1, [0])]
    later = [e for d in store.pop_due(20_000) for e in d.entry_ids.tolist()]
    assert sorted(later) == list(range(1, 100)) and len(store) == 0


def _on_storage(storage: SnapshotStorage) -> SegmentStore:
    """1-ms buckets, every segment left on storage until due."""
    config = SegmentConfig(min_ids_per_segment=2, max_loaded_ids=0, load_ahead_ms=0)
    return SegmentStore(storage, config, precision_bits=0)


def test_a_message_nack_covered_by_its_whole_entry_on_storage_is_not_pending_on_its_own(
    storage: SnapshotStorage,
) -> None:
    """The whole entry due at 2 and its message 0 at 1 sealed on storage, then message 1 nacked due at 2:
    the whole entry covers it (the index's rule), so an ack of message 1 removes nothing (remove() said
    True: the store had filed it on its own beside a segment with batch members), the entry stays
    pending whole, and it comes out as message 0 at 1, whole at 2."""
    store = _on_storage(storage)
    store.add(2, 1, 0)
    store.add(1, 1, 0, 0)
    store.checkpoint(0)
    assert store.stats().segments_loaded == 0
    store.add(2, 1, 0, 1)
    assert store.remove(1, 0, 1) is False
    assert store.pending_mask(1, 0) == -1
    assert [dict(d.batch_indexes) for d in store.pop_due(1)] == [{0: (0,)}]
    assert [(d.entry_ids.tolist(), dict(d.batch_indexes)) for d in store.pop_due(2)] == [([0], {})]
    assert len(store) == 0


def test_a_whole_entry_on_storage_keeps_its_bucket_beside_an_earlier_message_and_a_later_copy(
    storage: SnapshotStorage,
) -> None:
    """The whole entry due at 2 and its message 0 at 1 sealed on storage; then message 0 re-nacked due at
    0 and the whole entry due at 3. The whole entry is due at 2 (earliest wins): after the pop at 1 (the
    segment loaded, message 0 popped) due_of said 3 and the pop at 2 handed out nothing — the load took
    the earliest part pending in the mutable index (message 0 at 0) for its whole copy's bucket, and
    dropped the segment's whole entry for the later copy."""
    store = _on_storage(storage)
    store.add(2, 1, 0)
    store.add(1, 1, 0, 0)
    store.checkpoint(0)
    store.add(0, 1, 0, 0)
    store.add(3, 1, 0)
    assert store.due_of(1, 0) == 0 and store.due_of(1, 0, 0) == 0
    assert [dict(d.batch_indexes) for d in store.pop_due(1)] == [{0: (0,)}]
    assert store.due_of(1, 0) == 2 and store.due_of(1, 0, 1) == 2
    assert [(d.entry_ids.tolist(), dict(d.batch_indexes)) for d in store.pop_due(2)] == [([0], {})]
    assert store.pop_due(10) == [] and len(store) == 0


def test_a_load_compares_a_second_copy_with_the_whole_copy_not_the_earliest_message(
    storage: SnapshotStorage,
) -> None:
    """Entry 0 due whole at 2 sealed on storage (with entry 1 at 5: the segment spans 2-5), re-nacked
    whole due at 3 (a second copy: either may be the earlier), then its message 0 nacked due at 0. The
    pop at 2 loads the segment: the whole entry is due at 2 and comes whole. The load compared the
    segment's copy with the earliest part in the mutable index (message 0 at 0), dropped it, and handed
    out message 0 alone at 2, the whole entry again at 3."""
    store = _on_storage(storage)
    store.add(2, 1, 0)
    store.add(5, 1, 1)
    store.checkpoint(0)
    store.add(3, 1, 0)
    store.add(0, 1, 0, 0)
    assert store.due_of(1, 0) == 0 and store.pending_mask(1, 0) == -1
    assert [(d.entry_ids.tolist(), dict(d.batch_indexes)) for d in store.pop_due(2)] == [([0], {})]
    assert store.due_of(1, 0) is None
    assert [d.entry_ids.tolist() for d in store.pop_due(10)] == [[1]] and len(store) == 0


def test_a_message_renack_inside_a_stored_segments_range_is_filed_by_its_whole_entrys_bucket(
    storage: SnapshotStorage,
) -> None:
    """Entries 0 (due whole at 1), 2 (at 4) and 1 (at 5) in one segment on storage; message 1 of entries 0
    and 2 nacked due at 3 — inside the segment's range, so only the file says whether the whole entry is
    due earlier. The store reads it (a forced load): entry 0's message is covered (an ack of it removes
    nothing; it was filed on its own beside the segment and remove() said True), entry 2's is pending on
    its own before its whole entry."""
    config = SegmentConfig(max_loaded_ids=0, load_ahead_ms=0)
    store = SegmentStore(storage, config, precision_bits=0)
    for due, entry in ((1, 0), (4, 2), (5, 1)):
        store.add(due, 1, entry)
    store.checkpoint(0)
    assert store.stats().segments_loaded == 0
    store.add(3, 1, 0, 1)
    store.add(3, 1, 2, 1)
    assert store.remove(1, 0, 1) is False and store.pending_mask(1, 0) == -1
    assert store.stats().forced_loads == 1
    assert store.due_of(1, 0, 1) == 1 and store.due_of(1, 2, 1) == 3 and store.due_of(1, 2) == 3
    popped = {
        t: [(d.entry_ids.tolist(), dict(d.batch_indexes)) for d in store.pop_due(t)] for t in range(1, 6)
    }
    assert popped == {1: [([0], {})], 2: [], 3: [([2], {2: (1,)})], 4: [([2], {})], 5: [([1], {})]}
    assert store.remove(1, 2, 1) is False and len(store) == 0
