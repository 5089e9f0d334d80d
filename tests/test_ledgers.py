"""The ledger registry: one numbering of a tracker's ledgers, shared by the index's packed tier and the
arrival filter's entry sets, each ledger released when no structure holds it."""

from __future__ import annotations

import pytest

from pulsar_nack.entry_sets import EntrySets
from pulsar_nack.index import TimeBucketIndex
from pulsar_nack.ledgers import LedgerRegistry, ledger_key


def test_holders_are_counted_and_a_ledger_goes_with_its_last() -> None:
    registry = LedgerRegistry()
    a = registry.acquire(("t", 7))
    assert registry.acquire(("t", 7)) == a  # a second holder: the same ordinal
    b = registry.acquire(("t", 8))
    assert a != b and registry.holders(("t", 7)) == 2 and len(registry) == 2
    registry.release(a)
    assert registry.ordinal(("t", 7)) == a and registry.key(a) == ("t", 7)  # one holder left
    registry.release(a)
    assert registry.ordinal(("t", 7)) is None and registry.holders(("t", 7)) == 0
    with pytest.raises(KeyError):
        registry.key(a)
    assert registry.acquire(("u", 1)) == a  # the smallest free ordinal is reused
    assert registry.span == 2


def test_releasing_an_ordinal_nobody_holds_is_refused_unchanged() -> None:
    registry = LedgerRegistry()
    ordinal = registry.acquire(5)
    for bad in (ordinal + 1, -1):
        with pytest.raises(ValueError, match="ordinal"):
            registry.release(bad)
    assert registry.holders(5) == 1 and registry.key(ordinal) == 5
    registry.release(ordinal)
    assert len(registry) == 0 and registry.span == 0  # emptied: numbering starts again from 0


def test_ordinals_stay_below_the_most_ledgers_held_at_once() -> None:
    """A long run of ledgers coming and going (rolled over) does not grow the numbering."""
    registry = LedgerRegistry()
    held: list[int] = []
    for ledger in range(5_000):
        held.append(registry.acquire(("t", ledger)))
        if len(held) > 3:
            registry.release(held.pop(0))
    assert len(registry) == 3 and registry.span <= 4


def test_the_packed_tier_and_the_entry_sets_number_a_ledger_once() -> None:
    """Ledgers both structures keep something of have one ordinal, two holders; each structure's
    release leaves the other's hold, and the last release empties the registry."""
    registry = LedgerRegistry()
    index = TimeBucketIndex(0, "floor", ledgers=registry)
    sets = EntrySets(2, registry)
    for ledger in range(40):
        for entry_id in range(3):
            index.add(10_000 + 5 * ledger + entry_id, ledger, entry_id, topic="t")
            sets.add(0, ("t", ledger), entry_id)
    index.add(99_999, 999, 0, topic="t")  # the add path moves on: the buckets before are left behind
    index.compact()
    assert index.structure()["tier_ledgers"] == 40, "the buckets went to the packed tier"
    assert len(registry) == 40 + int(registry.ordinal(ledger_key("t", 999)) is not None)
    for ledger in range(40):
        assert registry.holders(("t", ledger)) == 2
    # the packed tier drains: the filter still holds every ledger
    assert sum(len(due.entry_ids) for due in index.pop_due(20_000)) == 120
    assert all(registry.holders(("t", ledger)) == 1 for ledger in range(40))
    for ledger in range(40):
        for entry_id in range(3):
            assert sets.discard(0, ("t", ledger), entry_id)
    assert all(registry.ordinal(("t", ledger)) is None for ledger in range(40))
    index.clear()
    assert len(registry) == 0 and registry.span == 0


def test_a_topic_less_ledger_is_one_key_for_both() -> None:
    """The filter names a topic-less ledger ("", id); the index, by its id: one registry key."""
    registry = LedgerRegistry()
    sets = EntrySets(1, registry)
    sets.add(0, ("", 12), 3)
    assert registry.ordinal(12) is not None and registry.ordinal(("", 12)) is None
    assert sets.contains(0, ("", 12), 3) and [key for key, _ in sets.ledgers(0)] == [("", 12)]
    sets.clear()
    assert len(registry) == 0


def test_ledgers_passing_through_the_packed_tier_are_released_as_they_go() -> None:
    """A long run at constant pending: each ledger's ids go to the packed tier and come due later, while
    newer ledgers keep it from emptying. Its sweeps release the drained ledgers: the numbering stays near
    the ledgers pending at once (10), not the 600 that went through."""
    registry = LedgerRegistry()
    index = TimeBucketIndex(0, "floor", ledgers=registry)
    for ledger in range(600):
        for entry_id in range(3):
            index.add(10_000 + 10 * ledger + entry_id, ledger, entry_id, topic="t")
        index.compact()
        index.pop_due(10_000 + 10 * (ledger - 10))
        assert len(index) <= 11 * 3
    assert index.structure()["tier_ledgers"] > 0, "the packed tier held ledgers"
    assert registry.span <= 64 and len(registry) <= 64


def test_the_live_tier_holds_its_ledgers_and_shares_their_keys() -> None:
    """The index's live tier holds a ledger while it has ids pending there (its key object the
    registry's: one per ledger, whoever named it first), and releases it when they are popped."""
    registry = LedgerRegistry()
    sets = EntrySets(1, registry)
    named = ("t", 4)
    sets.add(0, named, 9)  # the filter names the ledger first
    index = TimeBucketIndex(8, "floor", ledgers=registry)
    index.add(1_000, 4, 9, topic="t")
    index.add(1_000, 5, 9, topic="t")
    assert registry.holders(named) == 2 and registry.holders(("t", 5)) == 1
    assert all(
        record.key is registry.key(registry.ordinals[record.key]) for record in index._hot._ledgers.values()
    )
    assert registry.key(registry.ordinals[named]) is named
    index.pop_due(2_000)
    assert registry.holders(named) == 1 and registry.ordinal(("t", 5)) is None
    sets.clear()
    index.add(3_000, 6, 1, topic="t")
    index.clear()
    assert len(registry) == 0
