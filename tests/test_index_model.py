"""The nack index against a plain reference model (hypothesis state machine), run against both
implementations of :class:`~pulsar_nack.index.NackIndex`: :class:`TimeBucketIndex` and the snapshot's
:class:`~pulsar_nack.snapshot.segments.SegmentStore` (over an in-memory storage, sealing, loading and
merging segments as it goes).

The model keeps one due bucket per id in dicts and states the semantics directly:

* an id keeps its earliest bucket (re-adding never delays it);
* ``batch_index`` -1 is the whole entry and covers its batch messages: a message added while its whole
  entry is pending no later is a no-op, and a whole entry added at bucket b drops messages pending at >= b;
* ``pop_due(now)`` returns every id whose bucket is <= now, once; an entry comes whole if its whole id is
  due, else with the due batch indexes.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pulsar_nack.index import PROMOTE_AT, STAGE_UP_TO
from pulsar_nack.lowlevel import NackIndex, TimeBucketIndex
from pulsar_nack.snapshot.redispatch import RedispatchStore
from pulsar_nack.snapshot.segments import SegmentConfig, SegmentStore
from pulsar_nack.snapshot.storage import InMemoryStorage

TOPICS = ("", "persistent://public/default/t-partition-1")
#: 2 topics × 3 ledger ids = 6 ledger keys: the shared bitmaps' codes go through 0 to 3 low ordinal bits
#: and back (index._Layout) as ledgers come and go.
LEDGERS = (3, 7, 11)
ENTRIES = st.integers(0, 6)
BATCH = st.integers(-1, 2)


def model_bucket(due: int, k: int, rounding: str) -> int:
    width = 1 << k
    return due - due % width if rounding == "floor" else -(-due // width) * width


@dataclass
class Model:
    k: int
    rounding: str
    whole: dict[tuple[str, int, int], int] = field(default_factory=dict)
    member: dict[tuple[str, int, int, int], int] = field(default_factory=dict)

    def add(self, due: int, topic: str, ledger: int, entry: int, bi: int) -> None:
        b = model_bucket(due, self.k, self.rounding)
        entry_key = (topic, ledger, entry)
        whole = self.whole.get(entry_key)
        if whole is not None and whole <= b:
            return
        if bi < 0:
            self.whole[entry_key] = b
            for key in [m for m, mb in self.member.items() if m[:3] == entry_key and mb >= b]:
                del self.member[key]
            return
        key = (topic, ledger, entry, bi)
        if key in self.member and self.member[key] <= b:
            return
        self.member[key] = b

    def remove(self, topic: str, ledger: int, entry: int, bi: int) -> bool:
        entry_key = (topic, ledger, entry)
        if bi >= 0:
            return self.member.pop((topic, ledger, entry, bi), None) is not None
        removed = self.whole.pop(entry_key, None) is not None
        for key in [m for m in self.member if m[:3] == entry_key]:
            del self.member[key]
            removed = True
        return removed

    def due_of(self, topic: str, ledger: int, entry: int, bi: int) -> int | None:
        entry_key = (topic, ledger, entry)
        candidates = [self.whole[entry_key]] if entry_key in self.whole else []
        candidates += [b for m, b in self.member.items() if m[:3] == entry_key and (bi < 0 or m[3] == bi)]
        return min(candidates, default=None)

    def pop_due(self, now: int) -> dict[tuple[str, int, int], tuple[int, ...] | None]:
        """{entry: None if due whole, else the due batch indexes}."""
        out: dict[tuple[str, int, int], tuple[int, ...] | None] = {}
        for key in [k for k, b in self.whole.items() if b <= now]:
            del self.whole[key]
            out[key] = None
        due_members = sorted(m for m, b in self.member.items() if b <= now)
        for m in due_members:
            del self.member[m]
            if m[:3] in out and out[m[:3]] is None:
                continue
            out[m[:3]] = (*(out.get(m[:3]) or ()), m[3])
        return out

    def slots(self) -> set[tuple[int, str, int, int]]:
        return {(b, *k) for k, b in self.whole.items()} | {(b, *m[:3]) for m, b in self.member.items()}


class NackIndexRules(RuleBasedStateMachine):
    """The rules every :class:`NackIndex` follows; a subclass builds the index in its ``setup``."""

    index: NackIndex
    model: Model
    now: int
    added_since_pop: bool

    def start(self, index: NackIndex, k: int, rounding: str) -> None:
        self.index = index
        self.model = Model(k, rounding)
        self.now = 0
        self.added_since_pop = False

    @rule(
        delay=st.integers(0, 80),
        topic=st.sampled_from(TOPICS),
        ledger=st.sampled_from(LEDGERS),
        entry=ENTRIES,
        bi=BATCH,
    )
    def add(self, delay: int, topic: str, ledger: int, entry: int, bi: int) -> None:
        # fresh=True (no dedupe scan) whenever the model says nothing the id would merge with is pending,
        # as the consumer's arrival filter does: both paths must give the same index.
        entry_key = (topic, ledger, entry)
        members = self.model.member
        if bi < 0:
            fresh = entry_key not in self.model.whole and not any(m[:3] == entry_key for m in members)
        else:
            fresh = entry_key not in self.model.whole and (topic, ledger, entry, bi) not in members
        self.index.add(self.now + delay, ledger, entry, bi, topic, fresh=fresh)
        self.added_since_pop = True
        self.model.add(self.now + delay, topic, ledger, entry, bi)

    @rule(
        ids=st.lists(
            st.tuples(st.integers(0, 80), st.sampled_from(TOPICS), st.sampled_from(LEDGERS), ENTRIES, BATCH),
            min_size=2,
            max_size=24,
        )
    )
    def add_burst(self, ids: list[tuple[int, str, int, int, int]]) -> None:
        """Nacks one after the other with no read in between (each with its ``fresh`` as in :meth:`add`):
        a staging log of several rows, filed together at the next read (in bulk, see the machines'
        ``bulk_from``)."""
        for delay, topic, ledger, entry, bi in ids:
            self.add(delay, topic, ledger, entry, bi)

    @precondition(lambda self: bool(self.model.whole or self.model.member))
    @rule(data=st.data(), bi=BATCH)
    def renack_pending(self, data: st.DataObject, bi: int) -> None:
        """A re-nack of a pending entry (the whole entry or one of its messages), due just before, at, just
        after or between the due times of its pending parts: ``add``'s uniform draws seldom hit one id
        two or three times, and the orders that matter are there (message 0 due at 10 and the whole entry
        at 30 sealed and loaded, then the whole entry re-nacked due at 20: the store popped message 0
        only at 20)."""
        model = self.model
        pending = sorted({*model.whole, *(m[:3] for m in model.member)})
        topic, ledger, entry = data.draw(st.sampled_from(pending), label="entry")
        dues = sorted(
            {
                model.whole.get((topic, ledger, entry), -1),
                *(b for m, b in model.member.items() if m[:3] == (topic, ledger, entry)),
            }
            - {-1}
        )
        near = {d + step for d in dues for step in (-1, 0, 1)}
        near |= {(a + b) // 2 for a, b in itertools.pairwise(dues)}
        due = data.draw(st.sampled_from(sorted(d for d in near if d >= self.now) or [self.now]), label="due")
        self.add(due - self.now, topic, ledger, entry, bi)

    @rule(topic=st.sampled_from(TOPICS), ledger=st.sampled_from(LEDGERS), entry=ENTRIES, bi=BATCH)
    def remove(self, topic: str, ledger: int, entry: int, bi: int) -> None:
        assert self.index.remove(ledger, entry, bi, topic) == self.model.remove(topic, ledger, entry, bi)

    @rule(step=st.integers(0, 40))
    def advance_and_pop(self, step: int) -> None:
        self.now += step
        got: dict[tuple[str, int, int], tuple[int, ...] | None] = {}
        for due in self.index.pop_due(self.now):
            entries = due.entry_ids.tolist()
            assert entries == sorted(set(entries)), "entry ids sorted, each once per call"
            assert set(due.batch_indexes) <= set(entries)
            for entry in entries:
                key = (due.topic, due.ledger_id, entry)
                assert key not in got, "one DueIds per ledger per call"
                got[key] = due.batch_indexes.get(entry)
        assert got == self.model.pop_due(self.now)
        self.added_since_pop = False

    @rule(step=st.integers(0, 40))
    def advance_and_pop_by_bucket(self, step: int) -> None:
        """``pop_due_by_bucket(now)``: what ``pop_due`` of each due bucket in turn returns, labelled with
        that bucket, in bucket order (a segment store loads the segments due first: its labels are exact
        too)."""
        self.now += step
        model, now = self.model, self.now
        expected: dict[tuple[int, str, int, int], tuple[int, ...] | None] = {
            (b, *key): None for key, b in model.whole.items() if b <= now
        }
        for (topic, ledger, entry, bi), b in sorted(model.member.items()):
            if b <= now:
                key = (b, topic, ledger, entry)
                expected[key] = (*(expected.get(key) or ()), bi)
        got: dict[tuple[int, str, int, int], tuple[int, ...] | None] = {}
        labels = []
        for label, due in self.index.pop_due_by_bucket(now):
            labels.append(label)
            entries = due.entry_ids.tolist()
            assert entries == sorted(set(entries)), "entry ids sorted, each once per group"
            assert set(due.batch_indexes) <= set(entries)
            for entry in entries:
                key = (label, due.topic, due.ledger_id, entry)
                assert key not in got, "one DueIds per bucket and ledger"
                got[key] = due.batch_indexes.get(entry)
        assert labels == sorted(labels), "in bucket order"
        assert got == expected
        model.pop_due(now)
        self.added_since_pop = False

    @rule()
    def compact(self) -> None:
        self.index.compact()

    @rule(topic=st.sampled_from(TOPICS), ledger=st.sampled_from(LEDGERS), entry=ENTRIES)
    def pending_mask(self, topic: str, ledger: int, entry: int) -> None:
        model = self.model
        expected = -1 if (topic, ledger, entry) in model.whole else 0
        if not expected:
            for member in model.member:
                if member[:3] == (topic, ledger, entry):
                    expected |= 1 << member[3]
        assert self.index.pending_mask(ledger, entry, topic) == expected

    @rule(topic=st.sampled_from(TOPICS), ledger=st.sampled_from(LEDGERS), entry=ENTRIES, bi=BATCH)
    def due_of(self, topic: str, ledger: int, entry: int, bi: int) -> None:
        self.check_due_of(topic, ledger, entry, bi)

    @precondition(lambda self: hasattr(self, "index"))
    @invariant()
    def every_pending_id_is_due_when_filed(self) -> None:
        """``due_of`` of every id the model holds pending: the entry and each of its batch messages."""
        model = self.model
        for topic, ledger, entry in {*model.whole, *(m[:3] for m in model.member)}:
            for bi in (-1, *(m[3] for m in model.member if m[:3] == (topic, ledger, entry))):
                self.check_due_of(topic, ledger, entry, bi)

    def check_due_of(self, topic: str, ledger: int, entry: int, bi: int) -> None:
        assert self.index.due_of(ledger, entry, bi, topic) == self.model.due_of(topic, ledger, entry, bi)

    @precondition(lambda self: hasattr(self, "index"))
    @invariant()
    def sizes_agree(self) -> None:
        slots = self.model.slots()
        assert len(self.index) == len(slots)
        assert self.index.bucket_count == len({s[0] for s in slots})
        assert self.index.next_due_ms() == min((s[0] for s in slots), default=None)

    @precondition(lambda self: hasattr(self, "index"))
    @invariant()
    def nothing_overdue(self) -> None:
        """After a pop at `now`, nothing pending is due at or before `now` (never late)."""
        next_due = self.index.next_due_ms()
        # Ids added since the last pop may already be due; they come out at the next pop.
        assert next_due is None or next_due > self.now or self.added_since_pop


class IndexMachine(NackIndexRules):
    """:class:`TimeBucketIndex`, with the rules of its own API (``add_many``, iteration, ordinal bits)."""

    index: TimeBucketIndex

    @initialize(
        k=st.integers(0, 4),
        rounding=st.sampled_from(["floor", "ceil"]),
        promote_at=st.sampled_from([1, 2, 3, PROMOTE_AT]),
        pack_below=st.sampled_from([0, 2, 4, PROMOTE_AT]),
        stage_up_to=st.sampled_from([0, 3, STAGE_UP_TO]),
        bulk_from=st.sampled_from([1, 4, 16]),
    )
    def setup(
        self, k: int, rounding: str, promote_at: int, pack_below: int, stage_up_to: int, bulk_from: int
    ) -> None:
        # promote_at: 1 = every slot has its own bitmap; 2, 3 = slots move from the bucket's shared
        # bitmap to their own while the machine runs; PROMOTE_AT = all shared (entries 0..6 per ledger).
        # pack_below: 0 = every bucket stays live; 2, 4 = compact() packs some buckets and keeps others
        # live (slots of 2+ / 4+ ids), so an entry has parts in both tiers; PROMOTE_AT = packs them all.
        index = TimeBucketIndex(
            k,
            rounding,  # type: ignore[arg-type]
            promote_at=promote_at,
            pack_below=pack_below,
            stage_up_to=stage_up_to,
        )
        # stage_up_to: 0 = nothing staged, 3 = the nack path files the log itself, else the reads do;
        # bulk_from: logs of this many rows or more are filed in bulk (1, 4: a burst's always or often).
        index._bulk_from = bulk_from
        self.start(index, k, rounding)

    @rule(
        ids=st.lists(
            st.tuples(st.integers(0, 80), st.sampled_from(LEDGERS), ENTRIES, BATCH), min_size=1, max_size=12
        ),
        topic=st.sampled_from(TOPICS),
        with_batches=st.booleans(),
    )
    def add_many(self, ids: list[tuple[int, int, int, int]], topic: str, with_batches: bool) -> None:
        due, ledgers, entries, batches = (np.array(column) for column in zip(*ids, strict=True))
        due = due + self.now
        self.index.add_many(due, ledgers, entries, batches if with_batches else None, topic)
        self.added_since_pop = True
        rows = zip(due.tolist(), ledgers.tolist(), entries.tolist(), batches.tolist(), strict=True)
        for d, led, e, bi in rows:
            self.model.add(d, topic, led, e, bi if with_batches else -1)

    @rule()
    def slots_agree(self) -> None:
        """Iterating the index yields each (bucket, ledger) slot once with its entries, both tiers merged."""
        got = {
            (bucket, topic, ledger, entry)
            for bucket, topic, ledger, entries in self.index
            for entry in entries.tolist()
        }
        assert got == self.model.slots()

    @rule(topic=st.sampled_from(TOPICS), ledger=st.sampled_from(LEDGERS), entry=ENTRIES)
    def parts(self, topic: str, ledger: int, entry: int) -> None:
        """Each bucket holding the entry, earliest first: its messages' mask, or None for the whole entry
        (its messages pending beside it are due earlier), both tiers merged."""
        expected: dict[int, int | None] = {}
        for member, bucket in self.model.member.items():
            if member[:3] == (topic, ledger, entry):
                expected[bucket] = (expected.get(bucket) or 0) | 1 << member[3]
        whole = self.model.whole.get((topic, ledger, entry))
        if whole is not None:
            assert all(bucket < whole for bucket in expected)
            expected[whole] = None
        assert self.index.parts(ledger, entry, topic) == sorted(expected.items())

    @precondition(lambda self: hasattr(self, "index"))
    @invariant()
    def ordinal_bits_number_the_ledgers(self) -> None:
        """The codes' low ordinal bits number every ledger pending (none needed for one ledger)."""
        shape = self.index.structure()
        assert shape["ledgers"] <= 1 << shape["ordinal_bits"]
        assert shape["ledgers"] <= shape["ordinals"] <= 1 << shape["ordinal_bits"]


class SegmentStoreMachine(NackIndexRules):
    """:class:`SegmentStore` over an in-memory storage, with its life cycle as rules: seals (checkpoint)
    and timer work (maintain: seal, load ahead, rewrite, merge) put ids in segments on storage, loaded
    or not, between the index calls."""

    index: SegmentStore

    @initialize(
        k=st.integers(0, 4),
        rounding=st.sampled_from(["floor", "ceil"]),
        min_ids=st.sampled_from([2, 3, 5_000]),
        load_ahead_ms=st.sampled_from([0, 20, 60_000]),
        max_loaded_ids=st.sampled_from([0, 4, 1_000_000]),
        max_segments=st.sampled_from([1, 2, 64]),
        redispatch=st.booleans(),
    )
    def setup(
        self,
        k: int,
        rounding: str,
        min_ids: int,
        load_ahead_ms: int,
        max_loaded_ids: int,
        max_segments: int,
        redispatch: bool,
    ) -> None:
        # min_ids 2, 3: a seal cuts the mutable index into several segments; max_segments 1, 2: merges;
        # load_ahead_ms / max_loaded_ids 0: segments stay on storage until due.
        config = SegmentConfig(
            min_ids_per_segment=min_ids,
            max_segment_span_ms=40,
            checkpoint_interval_ms=30,
            max_loaded_ids=max_loaded_ids,
            load_ahead_ms=load_ahead_ms,
            max_segments=max_segments,
            max_merge_inputs=2,
        )
        # redispatch: the store a consumer with snapshots runs on (RedispatchStore), nothing restored — it
        # must answer as the plain store does
        store = (
            RedispatchStore(
                InMemoryStorage(),
                config,
                precision_bits=k,
                rounding=rounding,  # type: ignore[arg-type]
                clock=lambda: float(self.now),
            )
            if redispatch
            else SegmentStore(
                InMemoryStorage(),
                config,
                precision_bits=k,
                rounding=rounding,  # type: ignore[arg-type]
            )
        )
        self.start(store, k, rounding)

    @rule()
    def checkpoint(self) -> None:
        self.index.checkpoint(self.now)

    @rule(step=st.integers(0, 40))
    def maintain(self, step: int) -> None:
        self.index.maintain(self.now + step)

    def check_due_of(self, topic: str, ledger: int, entry: int, bi: int) -> None:
        """Exact but for an id in an unloaded segment: that segment's first bucket, a lower bound."""
        got, expected = (
            self.index.due_of(ledger, entry, bi, topic),
            self.model.due_of(topic, ledger, entry, bi),
        )
        assert (got is None) == (expected is None)
        assert got == expected or (got is not None and expected is not None and got < expected)
        assert got == expected or any(not loaded for *_, loaded in self.index.segments())

    @precondition(lambda self: hasattr(self, "index"))
    @invariant()
    def sizes_agree(self) -> None:
        """Exact while the store holds no segment; with segments, within its documented bounds: ``len``
        counts an entry pending in two places (indexes, segments) twice, ``bucket_count`` counts buckets
        in memory only, and ``next_due_ms`` takes an unloaded segment's first bucket (a lower bound, kept
        while the segment has ids not deleted whole: a wake-up that pops nothing)."""
        slots = self.model.slots()
        first = min((s[0] for s in slots), default=None)
        next_due = self.index.next_due_ms()
        if not self.index.segments():
            assert len(self.index) == len(slots)
            assert self.index.bucket_count == len({s[0] for s in slots})
            assert next_due == first
            return
        assert len(self.index) >= len(slots)
        assert first is None or (next_due is not None and next_due <= first)


class CrowdedSegmentStoreMachine(SegmentStoreMachine):
    """The store with every add and remove on two entries of one ledger: each call meets the pending parts
    of the same entries — messages and whole entry at several due times, in the mutable index, loaded
    segments and segments on storage — the orders the wide draws seldom build (message 0 due at 10 and
    the whole entry at 30 sealed and loaded, then the whole entry re-nacked due at 20: the store popped
    message 0 only at 20, the rest at 30)."""

    @rule(delay=st.integers(0, 80), entry=st.integers(0, 1), bi=BATCH)
    def add_crowded(self, delay: int, entry: int, bi: int) -> None:
        self.add(delay, TOPICS[1], LEDGERS[0], entry, bi)

    @rule(entry=st.integers(0, 1), bi=BATCH)
    def remove_crowded(self, entry: int, bi: int) -> None:
        self.remove(TOPICS[1], LEDGERS[0], entry, bi)


#: HYPO_EXAMPLES raises the example count for a long soak run.
for machine in (IndexMachine, SegmentStoreMachine, CrowdedSegmentStoreMachine):
    machine.TestCase.settings = settings(
        max_examples=int(os.environ.get("HYPO_EXAMPLES", "300")), stateful_step_count=60, deadline=None
    )
TestIndexAgainstModel = IndexMachine.TestCase
TestSegmentStoreAgainstModel = SegmentStoreMachine.TestCase
TestCrowdedSegmentStoreAgainstModel = CrowdedSegmentStoreMachine.TestCase


#: One entry's calls: adds of the whole entry or message 0 at three due times, removes, seals.
CALLS: tuple[tuple[str, int, int], ...] = (
    *(("add", due, bi) for due in (10, 20, 30) for bi in (-1, 0)),
    ("remove", 0, -1),
    ("remove", 0, 0),
    ("checkpoint", 0, 0),
)


def _index_kinds() -> dict[str, Callable[[], NackIndex]]:
    loaded = SegmentConfig(load_ahead_ms=60_000)  # a seal loads its segment at once
    stored = SegmentConfig(load_ahead_ms=0, max_loaded_ids=0)  # ... or leaves it on storage until due
    return {
        "index": lambda: TimeBucketIndex(0),
        "store, segments loaded": lambda: SegmentStore(InMemoryStorage(), loaded, precision_bits=0),
        "store, segments on storage": lambda: SegmentStore(InMemoryStorage(), stored, precision_bits=0),
        "redispatch store": lambda: RedispatchStore(
            InMemoryStorage(), loaded, precision_bits=0, clock=lambda: 0.0
        ),
    }


@pytest.mark.parametrize("kind", list(_index_kinds()))
def test_every_short_program_on_one_entry(kind: str) -> None:
    """Every sequence of up to four calls on one entry (:data:`CALLS`), then pops at 10, 20, 30 and 40,
    against the model: exhaustive where the machines draw at random, and the random draws seldom meet
    one entry's parts three times (message 0 due at 10 and the whole entry at 30 sealed and loaded, then
    the whole entry re-nacked due at 20: the store popped message 0 only at 20, the rest at 30)."""
    make = _index_kinds()[kind]
    for length in range(1, 5):
        for program in itertools.product(CALLS, repeat=length):
            index, model = make(), Model(0, "floor")
            for call, due, bi in program:
                if call == "add":
                    index.add(due, 3, 0, bi)
                    model.add(due, "", 3, 0, bi)
                elif call == "remove":
                    assert index.remove(3, 0, bi) == model.remove("", 3, 0, bi), program
                elif isinstance(index, SegmentStore):
                    index.checkpoint(0)
            for now in (10, 20, 30, 40):
                got = {
                    (d.topic, d.ledger_id, e): d.batch_indexes.get(e)
                    for d in index.pop_due(now)
                    for e in d.entry_ids.tolist()
                }
                assert got == model.pop_due(now), (program, now)


def test_both_implementations_are_nack_indexes() -> None:
    """Strict mypy checks these assignments against the protocol; at run time, the tracker's calls exist."""
    implementations: list[NackIndex] = [TimeBucketIndex(), SegmentStore(InMemoryStorage())]
    for index in implementations:
        index.add(5, 1, 2)
        assert index.due_of(1, 2) == 0 and len(index) == 1 and index.added == 1


def test_bucket_bounds_floor_and_ceil() -> None:
    """floor: up to 2**k - 1 ms early, never late; ceil: never early, up to 2**k - 1 ms late."""
    for k in range(0, 13):
        width = 1 << k
        for due in (0, 1, width - 1, width, 12345, 2**41 + 7):
            floor = TimeBucketIndex(k, "floor").bucket_of(due)
            ceil = TimeBucketIndex(k, "ceil").bucket_of(due)
            assert due - width < floor <= due
            assert due <= ceil < due + width
            assert floor % width == 0 and ceil % width == 0
