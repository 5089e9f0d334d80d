"""EntrySets against a model: sets of (ledger, entry id) sharing one numbering of ledgers."""

from __future__ import annotations

from fresh_process import run_probe
from hypothesis import given, settings
from hypothesis import strategies as st
from pyroaring import BitMap

from pulsar_nack.entry_sets import MAX_LOW_BITS, EntrySets
from pulsar_nack.ledgers import LedgerRegistry

_LEDGERS = [("t", ledger) for ledger in range(60)] + [("u", 3)]
_op = st.tuples(
    st.sampled_from(["add", "discard", "update"]),
    st.integers(0, 2),
    st.sampled_from(_LEDGERS),
    st.integers(0, (1 << 32) - 1) | st.integers(0, 70),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_op, max_size=300))
def test_entry_sets_hold_what_a_set_per_ledger_holds(
    ops: list[tuple[str, int, tuple[str, int], int]],
) -> None:
    """Adds and removals across three sets and 61 ledgers (ordinals collected, reused, and re-coded as
    they need more low bits) answer every lookup as plain Python sets do."""
    sets = EntrySets(3)
    model: list[set[tuple[tuple[str, int], int]]] = [set(), set(), set()]
    for kind, which, ledger, entry_id in ops:
        if kind == "add":
            sets.add(which, ledger, entry_id)
            model[which].add((ledger, entry_id))
        elif kind == "discard":
            assert sets.discard(which, ledger, entry_id) == ((ledger, entry_id) in model[which])
            model[which].discard((ledger, entry_id))
        else:
            sets.update(which, {ledger: BitMap([entry_id, entry_id // 2])})
            model[which] |= {(ledger, entry_id), (ledger, entry_id // 2)}
        for w in range(3):
            assert sets.any(w) == bool(model[w]) and sets.size(w) == len(model[w])
    for w in range(3):
        for ledger in _LEDGERS:
            assert sorted(sets.ids(w, ledger)) == sorted(e for k, e in model[w] if k == ledger)
        assert {(k, e) for k, ids in sets.ledgers(w) for e in ids} == model[w]
        for ledger, entry_id in model[w]:
            assert sets.contains(w, ledger, entry_id)
    live = {k for m in model for k, _ in m}
    assert live <= {k for k in _LEDGERS if sets.layout.code(k, 0) is not None}, (
        "a ledger is numbered while a set holds an entry of it"
    )
    assert sets.layout.low <= MAX_LOW_BITS


def test_ordinals_are_reused_so_nothing_grows_with_ledgers_come_and_gone() -> None:
    """Ledgers that come and go (a topic rolling its ledgers over) reuse collected ordinals: the
    numbering stays within twice the most ledgers held at once (and 16)."""
    registry = LedgerRegistry()
    sets = EntrySets(2, registry)
    for ledger in range(10_000):
        sets.add(0, ("t", ledger), 5)
        sets.add(1, ("t", ledger), 6)
        if ledger:
            sets.discard(0, ("t", ledger - 1), 5)
            sets.discard(1, ("t", ledger - 1), 6)
    assert len(registry) <= 16 and registry.span <= 17 and sets.layout.low <= 5
    assert sets.contains(0, ("t", 9_999), 5) and not sets.contains(0, ("t", 9_998), 5)


def test_an_entry_id_out_of_range_is_refused_unchanged() -> None:
    sets = EntrySets(1)
    for bad in (-1, 1 << 32):
        try:
            sets.add(0, ("t", 1), bad)
        except ValueError as error:
            assert "entry_id" in str(error)
        else:
            raise AssertionError("accepted")
    assert not sets.any(0) and not sets.held_ordinals
    assert not sets.contains(0, ("t", 1), 1 << 32)


class _CountingSets(EntrySets):
    """EntrySets counting its passes over the values held: re-codes (new low bits) and collections."""

    __slots__ = ("passes",)
    passes: list[str]

    def _recode(self, low: int) -> None:
        if any(self.layout.bitmaps):
            self.passes.append("recode")
        super()._recode(low)

    def _collect(self) -> None:
        if any(self.layout.bitmaps):
            self.passes.append("collect")
        super()._collect()


_UPDATE = st.dictionaries(
    st.sampled_from([("t", ledger) for ledger in range(300)]),
    st.sets(st.integers(0, 70) | st.integers(0, (1 << 32) - 1), max_size=4).map(BitMap),
    max_size=300,
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_op, max_size=120), _UPDATE, st.lists(_op, max_size=40))
def test_an_update_of_many_ledgers_holds_what_their_adds_hold_and_passes_over_values_once(
    before: list[tuple[str, int, tuple[str, int], int]],
    update: dict[tuple[str, int], BitMap],
    after: list[tuple[str, int, tuple[str, int], int]],
) -> None:
    """An update of up to 300 ledgers (a restore teaching the arrival filter), after and before other
    changes (ordinals held, freed, reused): the sets hold what one add per entry gives, the numbering
    stays within twice the most ledgers held at once (and 16), and the values already held are passed
    over at most once by a re-code and once by a collection — numbered one by one, each new ordinal
    bit re-coded them all (8 passes at 200 ledgers: bench/snapshot_cost.py --restore)."""
    sets, each = _CountingSets(3), EntrySets(3)
    sets.passes = []
    most = 0

    def apply(ops: list[tuple[str, int, tuple[str, int], int]]) -> None:
        nonlocal most
        for kind, which, ledger, entry_id in ops:
            for target in (sets, each):
                if kind == "discard":
                    target.discard(which, ledger, entry_id)
                else:
                    target.add(which, ledger, entry_id)
            most = max(most, len({k for w in range(3) for k, _ in each.ledgers(w)}))

    apply(before)
    sets.passes.clear()
    sets.update(1, update)
    assert sets.passes.count("recode") <= 1 and sets.passes.count("collect") <= 1, sets.passes
    for ledger, ids in update.items():
        for entry_id in ids:
            each.add(1, ledger, entry_id)
    most = max(most, len({k for w in range(3) for k, _ in each.ledgers(w)}))
    apply(after)
    for w in range(3):
        assert {(k, e) for k, ids in sets.ledgers(w) for e in ids} == {
            (k, e) for k, ids in each.ledgers(w) for e in ids
        }
    assert sets._registry.span <= max(16, 2 * most) + 1, (sets._registry.span, most)


def test_a_set_holds_no_bitmap_of_its_own_until_its_first_value_nor_once_the_sets_empty() -> None:
    """An unused set reads as empty and costs its pointer only (the filter's nine sets, each an empty
    BitMap64 of ~265 bytes, were 2.4 KB of every consumer's fixed memory, most of them never used); a set
    gets its bitmap with its first value, and every one goes when the sets empty."""
    sets = EntrySets(9)
    fresh = sets.memory_bytes()
    assert fresh < 1_000, fresh
    assert not sets.contains(4, ("t", 7), 5) and not sets.any(4) and sets.size(4) == 0
    assert list(sets.ledgers(4)) == [] and sets.ids(4, ("t", 7)) == BitMap()
    assert not sets.discard(4, ("t", 7), 5)
    sets.add(4, ("t", 7), 5)
    assert sets.contains(4, ("t", 7), 5) and not sets.contains(5, ("t", 7), 5)
    one = sets.memory_bytes()
    assert one - fresh >= 200, "one bitmap made"
    sets.empty(5)  # (nothing to empty: stays without a bitmap)
    assert sets.memory_bytes() == one
    assert sets.discard(4, ("t", 7), 5)
    assert sets.memory_bytes() <= fresh, "emptied: every bitmap released"


_SHRINK_PROBE = """
import gc, json, random
from pulsar_nack.entry_sets import EntrySets
from pulsar_nack.memory import heap_in_use
rng = random.Random(23)
sets = EntrySets(1)
# pending nacks at 100 topics, filed one by one as entries advance; then a random half fall due (delays
# spread): containers keep the room of their fullest
added = []
for entry in range(0, 60_000, 30):
    for ledger in range(100):
        added.append((ledger, entry + rng.randrange(30)))
        sets.add(0, ("t", ledger), added[-1][1])
for ledger, entry_id in rng.sample(added, len(added) // 2):
    sets.discard(0, ("t", ledger), entry_id)
del added
gc.collect()
grown, reported_grown = heap_in_use(), sets.memory_bytes()
sets.shrink()
gc.collect()
shrunk, reported_shrunk = heap_in_use(), sets.memory_bytes()
values = sets.size(0)
sets.layout.bitmaps[0].clear()  # (the containers go: what is left is the sets' fixed part)
gc.collect()
cleared = heap_in_use()
fixed = sets.memory_bytes()
print(json.dumps({"grown": grown - cleared, "shrunk": shrunk - cleared, "values": values,
                  "reported_grown": reported_grown - fixed, "reported_shrunk": reported_shrunk - fixed}))
"""


def test_shrink_gives_back_the_room_containers_grew_and_the_report_follows() -> None:
    """Issue 23: a set of pending nacks grows its containers value by value (by steps of 1.25-2x) and
    drains as nacks fall due; ``shrink`` (the tracker's compaction) gives the unused room back — a fifth
    of the heap or more here — and ``memory_bytes`` then reports the shrunk sets within 15 % (measured in
    a fresh process set up for heap measurement)."""
    result = run_probe(_SHRINK_PROBE)
    assert result["values"] == 100_000
    assert result["shrunk"] < 0.8 * result["grown"], result
    assert abs(result["reported_shrunk"] / result["shrunk"] - 1) <= 0.15, result


def test_sets_emptied_after_a_shrink_count_as_grown_again() -> None:
    """The report counts the sets as shrunk once ``shrink`` ran — until every set is emptied (a seek, a
    drained consumer): the bitmaps made after that grow as values come, and count as grown."""
    sets = EntrySets(1)
    for entry in range(0, 3_000, 3):
        sets.add(0, ("t", 1), entry)
    grown = sets.memory_bytes()
    sets.shrink()
    assert sets.memory_bytes() < grown
    sets.clear()
    for entry in range(0, 3_000, 3):
        sets.add(0, ("t", 1), entry)
    assert sets.memory_bytes() == grown
