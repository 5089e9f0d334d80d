"""ArrivalFilter without a broker: which copies are handed out, whatever the arrival order."""

from __future__ import annotations

import gc
import random
import sys
import threading
import time
import tracemalloc
import weakref
from typing import Any

import numpy as np
from fake_clock import FakeClock
from hypothesis import given, settings
from hypothesis import strategies as st

from pulsar_nack.arrivals import _PENDING, _QUIET, _WATCH, ArrivalFilter, Verdict
from pulsar_nack.entry_sets import EntrySets
from pulsar_nack.index import TimeBucketIndex
from pulsar_nack.native import NATIVE_MIN_DELAY_MS


def make() -> tuple[ArrivalFilter, FakeClock, list[tuple[float, int, int, int, str]]]:
    clock = FakeClock()
    refiled: list[tuple[float, int, int, int, str]] = []
    arrivals = ArrivalFilter(lambda *ids: refiled.append(ids), clock=clock, linger_ms=1_000)
    return arrivals, clock, refiled


def admit(arrivals: ArrivalFilter, entry: int, index: int = -1, size: int = 10, ledger: int = 7) -> Verdict:
    return arrivals.admit(ledger, entry, index, "t", size)


def forward(
    arrivals: ArrivalFilter, clock: FakeClock, entry: int, indexes: tuple[int, ...] | None, target: float
) -> None:
    arrivals.forwarded("t", 7, [entry], {entry: indexes} if indexes else {}, clock.now, int(target))


@settings(max_examples=200, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(1, 12), st.integers(1, 12))
def test_first_copies_are_handed_out_once_in_any_order(rng: random.Random, size_a: int, size_b: int) -> None:
    """Two batches admitted in any interleaving (several receiver threads), then a second copy of each
    message: every message is handed out exactly once; the second copies wait for the app's acks; once
    everything is acked nothing is left (no batch size is inferred from the order)."""
    arrivals, _, _ = make()
    sizes = {1: size_a, 2: size_b}
    firsts = [(e, i) for e, n in sizes.items() for i in range(n)]
    rng.shuffle(firsts)
    assert all(admit(arrivals, e, i, sizes[e]) is Verdict.DELIVER for e, i in firsts)
    seconds = list(firsts)
    rng.shuffle(seconds)
    assert all(admit(arrivals, e, i, sizes[e]) is Verdict.DUPLICATE for e, i in seconds)
    for e, i in seconds:
        assert arrivals.park(7, e, i, "t", ("copy", e, i))
    acks = list(firsts)
    rng.shuffle(acks)
    parked = [copy for e, i in acks for copy in arrivals.acked(7, e, i, "t")[0]]
    assert sorted(parked) == sorted(("copy", e, i) for e, i in firsts), "every parked copy acked along"
    assert arrivals.idle, "fully acked entries are forgotten"


def test_a_sibling_is_never_handed_out_before_its_own_time() -> None:
    """Issue 9, finding 2: m1 is due now, m0 later. The copy that comes for m1 holds m0 back; a copy
    arriving just after m0's forward (asked for by someone else) does too; m0's own copy hands it out."""
    arrivals, clock, refiled = make()
    for index in range(3):
        admit(arrivals, 1, index, size=3)
    assert arrivals.pending(7, 1, 1, "t") is True, "nothing of the entry pending: fresh"
    assert arrivals.pending(7, 1, 0, "t") is True, "a sibling pending does not merge with m0"
    assert arrivals.pending(7, 1, 0, "t") is False, "m0 itself pending: the index must dedupe"
    start = clock.now
    forward(arrivals, clock, 1, (1,), target=start + 102)
    clock.now = start + 103
    assert admit(arrivals, 1, 0, 3) is Verdict.HOLD, "m0's nack is pending"
    assert admit(arrivals, 1, 1, 3) is Verdict.DELIVER
    clock.now = start + 1_000
    forward(arrivals, clock, 1, (0,), target=start + 1_102)
    clock.now = start + 1_050  # a copy asked for before m0's forward (another sibling, a reconnect)
    assert admit(arrivals, 1, 0, 3) is Verdict.HOLD
    assert refiled == [], "not our forward's copy: ours follows"
    clock.now = start + 1_102
    assert admit(arrivals, 1, 0, 3) is Verdict.DELIVER
    assert admit(arrivals, 1, 0, 3) is Verdict.DUPLICATE, "once per nack"


def test_an_early_copy_of_our_own_forward_is_held_and_forwarded_again() -> None:
    """A wrapped consumer whose native delay is shorter than assumed: the copy comes before the bucket
    time. It is held back, and the message is filed again as much earlier as the copy came."""
    arrivals, clock, refiled = make()
    assert arrivals.pending(7, 3, -1, "t") is True
    start = clock.now
    forward(arrivals, clock, 3, None, target=start + 60_000)  # assumed latency 60 s
    clock.now = start + NATIVE_MIN_DELAY_MS + 2  # the native client asked after ~100 ms
    assert admit(arrivals, 3) is Verdict.HOLD
    assert refiled == [(start + 60_000 + NATIVE_MIN_DELAY_MS + 2, 7, 3, -1, "t")]
    assert arrivals.counts().reforwarded == 1
    assert admit(arrivals, 3) is Verdict.HOLD, "waiting for the new forward"
    arrivals.pending(7, 3, -1, "t")
    clock.now = start + 59_900
    forward(arrivals, clock, 3, None, target=start + 60_000)
    clock.now = start + 60_001
    assert admit(arrivals, 3) is Verdict.DELIVER


def test_copies_of_acked_and_nacked_messages() -> None:
    """ack-then-nack of a batch message files nothing; nack-then-ack drops the pending nack; a copy of a
    non-batched message acked while its forward was in flight is acked, not handed out."""
    arrivals, clock, _ = make()
    admit(arrivals, 1, 0, size=2)
    admit(arrivals, 1, 1, size=2)
    arrivals.acked(7, 1, 0, "t")
    assert arrivals.pending(7, 1, 0, "t") is None, "acked: nothing to redeliver"
    assert arrivals.pending(7, 1, 1, "t") is True
    assert arrivals.acked(7, 1, 1, "t") == ((), True, False), "the caller removes the pending nack"
    assert arrivals.idle
    arrivals.pending(7, 2, -1, "t")
    forward(arrivals, clock, 2, None, target=clock.now + 102)
    arrivals.acked(7, 2, -1, "t")
    clock.now += 200
    assert admit(arrivals, 2) is Verdict.ACKED


def test_no_silent_limit_on_open_batches() -> None:
    """More open batched entries than the old 100,000 limit: none is forgotten, so a copy of an acked
    message is still recognised."""
    arrivals, _, _ = make()
    entries = 120_000
    for entry in range(entries):
        admit(arrivals, entry, 0, size=2)
        arrivals.acked(7, entry, 0, "t")
    assert arrivals.counts().open_entries == entries
    assert admit(arrivals, 0, 0, size=2) is Verdict.ACKED
    assert admit(arrivals, 0, 1, size=2) is Verdict.DELIVER


def test_clear_and_forget_holdings() -> None:
    """After a seek (clear) every message is new; after redeliver_unacknowledged_messages the app's
    unacked copies are handed out again, acked ones are not."""
    arrivals, _, _ = make()
    admit(arrivals, 1, 0, size=2)
    admit(arrivals, 1, 1, size=2)
    arrivals.acked(7, 1, 0, "t")
    arrivals.forget_holdings()
    assert admit(arrivals, 1, 0, size=2) is Verdict.ACKED
    assert admit(arrivals, 1, 1, size=2) is Verdict.DELIVER
    arrivals.clear()
    assert arrivals.idle
    assert admit(arrivals, 1, 0, size=2) is Verdict.DELIVER


def test_a_later_copy_of_a_redelivered_message_is_not_handed_out_again() -> None:
    """After a broker restart the broker may re-dispatch a non-batched message that was just handed out
    for a forward: acked → acked again, held → dropped; forgotten after ``linger_ms``."""
    arrivals, clock, _ = make()
    for entry in (1, 2):
        arrivals.pending(7, entry, -1, "t")
        forward(arrivals, clock, entry, None, target=clock.now + 102)
    clock.now += 150
    assert admit(arrivals, 1) is Verdict.DELIVER and admit(arrivals, 2) is Verdict.DELIVER
    arrivals.acked(7, 1, -1, "t")
    assert admit(arrivals, 1) is Verdict.ACKED
    assert admit(arrivals, 2) is Verdict.DUPLICATE
    arrivals.forget_holdings()  # redeliver_unacknowledged_messages: the app's copy of 2 is void
    assert admit(arrivals, 2) is Verdict.DELIVER
    for _ in range(3):
        clock.now += arrivals.linger_ms / 2
        arrivals.sweep()
    assert arrivals.idle
    assert admit(arrivals, 1) is Verdict.DELIVER


def test_a_batch_acked_after_its_redelivery_is_one_bit_while_copies_may_come() -> None:
    """Once every message of a forwarded batch is acked its record goes; for ``linger_ms`` a late copy
    (another redelivery request, a reconnect) is still recognised and acked, then it is forgotten."""
    arrivals, clock, _ = make()
    admit(arrivals, 1, 0, size=2)
    admit(arrivals, 1, 1, size=2)
    arrivals.pending(7, 1, 0, "t")
    assert arrivals.acked(7, 1, 1, "t") == ((), False, False), "never forwarded: the first copy completes"
    forward(arrivals, clock, 1, (0,), target=clock.now + 102)
    clock.now += 150
    assert admit(arrivals, 1, 0, size=2) is Verdict.DELIVER
    assert arrivals.acked(7, 1, 0, "t") == ((), False, True), "all acked after a forward: ack the entry"
    assert arrivals.counts().open_entries == 0, "no record for a settled entry"
    assert admit(arrivals, 1, 1, size=2) is Verdict.ACKED, "a late copy: the entry ack may have been lost"
    assert admit(arrivals, 1, 0, size=2) is Verdict.ACKED
    for _ in range(3):
        clock.now += arrivals.linger_ms / 2
        arrivals.sweep()
    assert arrivals.idle


def test_copies_of_acked_siblings_of_a_forwarded_batch_need_no_ack_of_their_own() -> None:
    """Redelivering one message of a batch brings its acked siblings too. Those copies are COVERED —
    dropped without a native ack each (one per copy was ~1 µs a message in the 10 %-nacked benchmark) —
    because the entry is acked as a whole when its last message is (``acked`` → ``ack_entry``). Copies of
    an entry never forwarded (a reconnect) are ACKED: no entry ack will come, each copy must be acked; so
    are copies after the entry ack went (the broker may have lost it with its connection)."""
    arrivals, clock, _ = make()
    for index in range(3):
        admit(arrivals, 1, index, size=3)
        admit(arrivals, 2, index, size=3)
    arrivals.acked(7, 1, 0, "t")
    arrivals.acked(7, 1, 1, "t")
    arrivals.acked(7, 2, 0, "t")
    assert admit(arrivals, 2, 0, size=3) is Verdict.ACKED, "never forwarded: this copy needs its own ack"
    arrivals.pending(7, 1, 2, "t")
    forward(arrivals, clock, 1, (2,), target=clock.now + 102)
    clock.now += 150
    assert admit(arrivals, 1, 0, size=3) is Verdict.COVERED
    assert admit(arrivals, 1, 1, size=3) is Verdict.COVERED
    assert admit(arrivals, 1, 2, size=3) is Verdict.DELIVER
    assert arrivals.acked(7, 1, 2, "t") == ((), False, True), "the last ack acks the entry as a whole"
    assert admit(arrivals, 1, 0, size=3) is Verdict.ACKED, "after the entry ack a copy is acked"
    assert arrivals.counts().dropped == 4


def test_a_big_forward_leaves_no_table_behind_once_it_is_done() -> None:
    """CPython never shrinks a dict on deletion: after a forward of 50,000 non-batched ids whose copies
    all came, the emptied in-flight table must be released, not kept at its peak size."""
    arrivals, clock, _ = make()
    empty = arrivals.memory_bytes()
    entries = list(range(50_000))
    for entry in entries:
        arrivals.pending(7, entry, -1, "t")
    arrivals.forwarded("t", 7, entries, {}, clock.now, int(clock.now + 102))
    clock.now += 150
    assert all(admit(arrivals, entry) is Verdict.DELIVER for entry in entries)
    for entry in entries:
        arrivals.acked(7, entry, -1, "t")
    for _ in range(3):
        clock.now += arrivals.linger_ms / 2
        arrivals.sweep()
    assert arrivals.idle
    assert arrivals.memory_bytes() < empty + arrivals.lateness.nbytes + 10_000  # the window: fixed size


def test_a_forward_keeps_neither_the_callers_batch_indexes_nor_the_buffer_behind_its_ids() -> None:
    """A forward is remembered for ``linger_ms``: its record holds its entry ids in an array of its own,
    not the caller's mapping of batch indexes (~150 B per entry, in the entries' records already) nor a
    view that keeps a larger buffer alive."""

    class Indexes(dict[int, tuple[int, ...]]):  # a dict that can be referred to weakly
        pass

    arrivals, clock, _ = make()
    for entry in range(100):
        for index in range(10):
            admit(arrivals, entry, index)
        arrivals.pending(7, entry, 3, "t")
    buffer = np.arange(1_000, dtype=np.uint32)
    indexes = Indexes({entry: (3,) for entry in range(100)})
    kept_indexes, kept_buffer = weakref.ref(indexes), weakref.ref(buffer)
    arrivals.forwarded("t", 7, buffer[:100], indexes, clock.now, int(clock.now + 102))
    del buffer, indexes
    gc.collect()
    assert kept_indexes() is None, "the forward record holds the caller's batch indexes"
    assert kept_buffer() is None, "the forward record holds a view of the caller's buffer"
    clock.now += 150
    assert all(admit(arrivals, entry, 3) is Verdict.DELIVER for entry in range(100)), "still followed"


@settings(max_examples=300, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(1, 70), st.data())
def test_an_entry_acked_or_nacked_in_any_order_ends_as_one_bit(
    rng: random.Random, size: int, data: st.DataObject
) -> None:
    """PIP-393's case: every message of a batch acked or nacked, in any order (nacks and acks from any
    thread). Whichever comes last — an ack or a nack — the entry's record becomes one bit, and copies of
    it are still classified (nacked: held; acked: acked). The nack path tests this with a cheap necessary
    condition before the full one: it must never miss the moment."""
    index = TimeBucketIndex(8, "floor")
    clock = FakeClock()
    arrivals = ArrivalFilter(lambda *ids: None, clock=clock, linger_ms=1_000, index=index)
    nacked = set(data.draw(st.sets(st.integers(0, size - 1), min_size=1), label="nacked"))
    order = list(range(size))
    rng.shuffle(order)
    for batch_index in order:
        assert admit(arrivals, 1, batch_index, size) is Verdict.DELIVER
    rng.shuffle(order)
    for batch_index in order:
        if batch_index in nacked:
            fresh = arrivals.pending(7, 1, batch_index, "t")
            assert fresh is not None
            index.add(int(clock.now) + 60_000, 7, 1, batch_index, "t", fresh=fresh)
        else:
            copies, was_pending, _ = arrivals.acked(7, 1, batch_index, "t")
            assert copies == () and not was_pending
    assert arrivals.counts().open_entries == 1
    assert not arrivals._entries, "every message acked or pending: one bit, not a record"
    for batch_index in range(size):
        expected = Verdict.HOLD if batch_index in nacked else Verdict.ACKED
        assert admit(arrivals, 1, batch_index, size) is expected


def test_a_batch_size_is_read_once_per_entry_outside_the_lock() -> None:
    """``batch_size`` (a native call) is made only for an entry the filter does not follow yet, never
    under the filter's lock; an entry first known from a nack of a bare id (its size unknown) learns it
    at its first arrival — and, fully acked, is forgotten like any other."""
    calls: list[bool] = []

    def batch_size(size: int) -> int:
        calls.append(arrivals._lock.locked())
        return size

    arrivals = ArrivalFilter(lambda *ids: None, clock=FakeClock(), linger_ms=1_000, batch_size=batch_size)
    for batch_index in range(4):
        assert admit(arrivals, 1, batch_index, size=4) is Verdict.DELIVER
    assert calls == [False], "read once, for the new entry, without the lock"
    assert arrivals.pending(7, 2, 1, "t") is True  # a nack of a bare id: the entry's size is unknown
    for batch_index in range(3):
        expected = Verdict.HOLD if batch_index == 1 else Verdict.DELIVER
        assert admit(arrivals, 2, batch_index, size=3) is expected
    assert calls == [False, False], "the entry known from a nack learned its size at its first arrival"
    for entry, size in ((1, 4), (2, 3)):
        for batch_index in range(size):
            arrivals.acked(7, entry, batch_index, "t")
    assert arrivals.idle, "every message acked: both entries forgotten"


def test_concurrent_first_arrivals_of_one_batch_are_each_handed_out_once() -> None:
    """Several receiver threads admitting messages of the same new entries at once (each may find the
    entry new and read its size): every message is handed out exactly once, every second copy is a
    duplicate, and one record per entry remains."""

    def batch_size(size: int) -> int:
        time.sleep(0)  # let another receiver in between the two turns of the lock
        return size

    arrivals = ArrivalFilter(lambda *ids: None, clock=FakeClock(), linger_ms=1_000, batch_size=batch_size)
    size, entries, threads = 20, 50, 8
    messages = [(entry, index) for entry in range(entries) for index in range(size)] * 2
    random.Random(5).shuffle(messages)
    verdicts: dict[tuple[int, int], list[Verdict]] = {}
    lock = threading.Lock()

    def receiver(share: list[tuple[int, int]]) -> None:
        for entry, index in share:
            verdict = admit(arrivals, entry, index, size)
            with lock:
                verdicts.setdefault((entry, index), []).append(verdict)

    workers = [
        threading.Thread(target=receiver, args=(messages[i::threads],), daemon=True) for i in range(threads)
    ]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads take turns often: the interleavings the test is about
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=60)
    finally:
        sys.setswitchinterval(switch)
    assert not any(worker.is_alive() for worker in workers)
    assert len(verdicts) == size * entries
    assert all(
        sorted(v, key=lambda x: x.value) == [Verdict.DELIVER, Verdict.DUPLICATE] for v in verdicts.values()
    )
    assert arrivals.counts().open_entries == entries


class _Model:
    """A filter wired to an index as the tracker wires them (nacks filed, due ids popped and forwarded),
    recording the forwards it asks to repeat."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.index = TimeBucketIndex(4, "floor")
        self.refiled: list[tuple[float, int, int, int, str]] = []
        self.arrivals = ArrivalFilter(
            lambda *ids: self.refiled.append(ids),
            clock=clock,
            linger_ms=1_000,
            index=self.index,
        )

    def nack(self, entry: int, index: int, delay: int) -> None:
        self.arrivals.file(int(self.clock.now) + delay, 7, entry, index, "t")

    def flush(self, late: int = 0) -> None:
        """Forward what is due, for a bucket time ``late`` ms from now (a native delay longer than the
        tracker assumed: copies that come sooner are early ones of our own forward)."""
        now = self.clock.now
        for ids in self.index.pop_due(int(now)):
            target = int(now) + late
            self.arrivals.forwarded(ids.topic, ids.ledger_id, ids.entry_ids, ids.batch_indexes, now, target)


_SIZES = {1: 3, 2: 5, 3: 1}  # entry → batch size
_MESSAGE = st.sampled_from([(entry, index) for entry, size in _SIZES.items() for index in range(size)])
_ARRIVE = st.tuples(st.just("arrive"), st.lists(_MESSAGE, min_size=1, max_size=12))
_NACK = st.tuples(st.just("nack"), _MESSAGE, st.integers(0, 40))
_ACK = st.tuples(st.just("ack"), _MESSAGE)
_STEP = st.one_of(  # acks, nacks and arrivals three times as often as the rest
    *[_ARRIVE, _NACK, _ACK] * 3,
    st.tuples(st.just("flush"), st.integers(0, 150), st.sampled_from([0, 0, 300])),
    *[st.tuples(st.just("wait"), st.integers(0, 400))] * 2,  # time passes: copies may come early or late
    st.tuples(st.just("sweep"), st.integers(0, 700)),
    st.tuples(st.just("forget")),  # redeliver_unacknowledged_messages
)


@settings(max_examples=500, deadline=None)
@given(st.lists(_STEP, min_size=1, max_size=40), st.booleans())
def test_admit_batched_and_acked_plain_decide_as_admit_and_acked(
    steps: list[tuple[Any, ...]], fast_acks: bool
) -> None:
    """A batch_receive's messages classified together (one lock, each entry looked up once per run)
    get exactly the verdicts, counters, repeated forwards and acks of admitting them one after the
    other — whatever was nacked, forwarded, acked, swept or forgotten before, and with repeats in the
    list. With ``fast_acks`` the second filter takes acks as the consumer does, ``acked_plain`` first
    (other messages of the entry may be pending), and must still end in the same state. A third filter
    admits each message with ``admit_message`` (the consumer's per-message path) and takes acks as the
    second: same verdicts, same end state."""
    clock_one, clock_all, clock_each = FakeClock(), FakeClock(), FakeClock()
    one, together, each = _Model(clock_one), _Model(clock_all), _Model(clock_each)
    for step in steps:
        for model in (one, together, each):
            kind = step[0]
            if kind == "nack":
                (entry, index), delay = step[1], step[2]
                model.nack(entry, index, delay)
            elif kind == "ack":
                entry, index = step[1]
                plain = fast_acks and model is not one and model.arrivals.acked_plain(("t", 7, entry), index)
                if not plain:
                    model.arrivals.acked(7, entry, index, "t")
            elif kind == "flush":
                model.clock.now += step[1]
                model.flush(step[2])
            elif kind == "wait":
                model.clock.now += step[1]
            elif kind == "sweep":
                model.clock.now += step[1]
                for again in model.arrivals.sweep():
                    model.refiled.append(again)
            elif kind == "forget":
                model.arrivals.forget_holdings()
        if step[0] != "arrive":
            continue
        messages: list[tuple[int, int]] = step[1]
        expected = [one.arrivals.admit(7, e, i, "t", _SIZES[e]) for e, i in messages]
        tokens = [_SIZES[e] for e, _ in messages]
        withheld = together.arrivals.admit_batched([(7, e, i, "t") for e, i in messages], tokens.__getitem__)
        got = [Verdict.DELIVER] * len(messages)
        for position, verdict in withheld:
            assert verdict is not Verdict.DELIVER
            got[position] = verdict
        assert got == expected, messages
        assert [p for p, _ in withheld] == sorted(p for p, _ in withheld), "in order"
        singly = [each.arrivals.admit_message(("t", 7, e), i, _SIZES[e]) for e, i in messages]
        assert singly == expected, messages
    for model in (together, each):
        assert model.arrivals.counts() == one.arrivals.counts()
        assert model.refiled == one.refiled
        assert len(model.index) == len(one.index)
        assert list(model.arrivals._sets.ledgers(_QUIET)) == list(one.arrivals._sets.ledgers(_QUIET))
        for key, entry in one.arrivals._entries.items():
            other = model.arrivals._entries[key]
            assert (other.acked, other.pending, other.out) == (entry.acked, entry.pending, entry.out), key


_SIZED = {**_SIZES, 4: 6}  # entry 4: never seen before the restore (its size unknown to the filter)
_MEMBERS = st.dictionaries(  # (topic, ledger, entry) → mask of batch indexes of the entry's batch
    st.sampled_from(list(_SIZED)), st.integers(0, (1 << 6) - 1), max_size=4
).map(lambda masks: {("t", 7, entry): mask & (1 << _SIZED[entry]) - 1 for entry, mask in masks.items()})


def _view(model: _Model) -> dict[tuple[str, int, int], tuple[int, int, int]]:
    """(acked, pending, out) of every batched entry the filter follows, a quiet one as the record it
    expands to (every message it does not have pending in the index acked)."""
    arrivals = model.arrivals
    view = {key: (e.acked, e.pending, e.out) for key, e in arrivals._entries.items()}
    for (topic, ledger), entries in arrivals._sets.ledgers(_QUIET):
        for entry in entries:
            assert (topic, ledger, entry) not in view, "kept as a record and as one bit"
            pending = max(model.index.pending_mask(ledger, entry, topic), 0)
            view[(topic, ledger, entry)] = (~pending, pending, -1)
    return view


@settings(max_examples=500, deadline=None)
@given(
    st.none() | st.lists(st.booleans(), min_size=9, max_size=9),
    st.lists(_STEP, max_size=30),
    _MEMBERS,
    st.booleans(),
)
def test_pending_members_leave_the_state_of_pending_for_each_message(
    settle: list[bool] | None,
    steps: list[tuple[Any, ...]],
    members: dict[tuple[str, int, int], int],
    filed: bool,
) -> None:
    """A restore teaching the filter its partially pending batches an entry at a time (a mask of batch
    indexes) leaves it as pending() called for every message does — whatever was nacked, forwarded,
    acked (an acked message stays out), swept or forgotten before, an entry that becomes all acked or
    pending kept as one bit (expanded first if it was one) — with the messages filed in the index as a
    restore files them, or not (a segment not loaded): same records (a quiet entry as the record it
    expands to: one-by-one calls may leave a quiet entry expanded where the bulk keeps its bit), sets,
    counts, and the same verdicts for a copy of every message after. ``settle``: every message received,
    then each nacked or acked first (entries kept as one bit: PIP-393's case)."""
    one, bulk = _Model(FakeClock()), _Model(FakeClock())
    if settle is not None:
        messages = [(entry, index) for entry, size in _SIZES.items() for index in range(size)]
        for model in (one, bulk):
            for entry, index in messages:
                model.arrivals.admit(7, entry, index, "t", _SIZES[entry])
            for (entry, index), nack in zip(messages, settle, strict=True):
                if nack:
                    model.nack(entry, index, 50)
                else:
                    model.arrivals.acked(7, entry, index, "t")
    for step in steps:
        for model in (one, bulk):
            kind = step[0]
            if kind == "nack":
                (entry, index), delay = step[1], step[2]
                model.nack(entry, index, delay)
            elif kind == "ack":
                model.arrivals.acked(7, step[1][0], step[1][1], "t")
            elif kind == "arrive":
                for entry, index in step[1]:
                    model.arrivals.admit(7, entry, index, "t", _SIZES[entry])
            elif kind in ("flush", "wait", "sweep"):
                model.clock.now += step[1]
                if kind == "flush":
                    model.flush(step[2])
                elif kind == "sweep":
                    model.arrivals.sweep()
            else:
                model.arrivals.forget_holdings()
    for model in (one, bulk):
        if filed:
            for (_, _, entry), mask in members.items():
                for index in range(mask.bit_length()):
                    if mask >> index & 1:
                        model.index.add(int(model.clock.now) + 60_000, 7, entry, index, "t", fresh=False)
    for (topic, ledger, entry), mask in members.items():
        for index in range(mask.bit_length()):
            if mask >> index & 1:
                one.arrivals.pending(ledger, entry, index, topic)
    bulk.arrivals.pending_members(members)
    assert bulk.arrivals.counts() == one.arrivals.counts()
    assert _view(bulk) == _view(one)
    for which in (_PENDING, _WATCH):
        assert list(bulk.arrivals._sets.ledgers(which)) == list(one.arrivals._sets.ledgers(which))
    for entry, size in _SIZED.items():
        for index in range(size):
            assert bulk.arrivals.admit(7, entry, index, "t", size) is one.arrivals.admit(
                7, entry, index, "t", size
            )


def test_admit_batched_reads_each_new_entrys_size_once_outside_the_lock() -> None:
    """The batch size of an entry new to the filter is read once per call, without the filter's lock,
    however many of its messages the list holds, from the token of its first message there (asked for
    only then); a known entry's never."""
    calls: list[tuple[int, bool]] = []
    asked: list[int] = []

    def batch_size(token: tuple[int, int]) -> int:
        calls.append((token[0], arrivals._lock.locked()))
        return token[1]

    def token(position: int) -> tuple[int, int]:
        asked.append(position)
        return (first[position][1], 4)

    arrivals = ArrivalFilter(lambda *ids: None, clock=FakeClock(), linger_ms=1_000, batch_size=batch_size)
    first = [(7, entry, index, "t") for entry in (1, 2) for index in range(4)]
    assert arrivals.admit_batched(first, token) == []
    assert calls == [(1, False), (2, False)]
    assert asked == [0, 4], "the token of each new entry's first message, no other"
    again = arrivals.admit_batched(first[:3], token)
    assert again == [(0, Verdict.DUPLICATE), (1, Verdict.DUPLICATE), (2, Verdict.DUPLICATE)]
    assert calls == [(1, False), (2, False)], "known entries: no size read"
    assert asked == [0, 4]


class _WatchingSets(EntrySets):
    """The filter's sets, recording at each removal from the pending ones whether the entry was watched
    by then."""

    __slots__ = ("seen",)
    seen: list[bool]

    def discard(self, which: int, ledger: tuple[str, int], entry_id: int) -> bool:
        if which == _PENDING:
            self.seen.append(self.contains(_WATCH, ledger, entry_id))
        return super().discard(which, ledger, entry_id)


def test_a_forwarded_entry_is_watched_before_it_stops_being_pending() -> None:
    """The lock-free first look of admit_entry and acked_entry reads pending, then watched: forwarded()
    must watch a non-batched entry before it leaves pending, or a copy arriving in between (another
    thread) would be handed out as new, and an ack in between would not mark the flight acked."""
    arrivals, clock, _ = make()
    spy = arrivals._sets = _WatchingSets(3)
    spy.seen = []
    for entry in range(3):
        assert arrivals.pending(7, entry, -1, "t") is True
    forward(arrivals, clock, 0, None, target=clock.now)
    arrivals.forwarded("t", 7, [1, 2], {}, clock.now, int(clock.now))
    assert spy.seen == [True, True, True], "watched when it stopped being pending"
    assert admit(arrivals, 1) is Verdict.HOLD, "a copy right after the forward: asked for by someone else"


def test_watched_entries_are_forgotten_once_neither_in_flight_nor_recent() -> None:
    """The watch over non-batched entries (in flight, or redelivered within linger_ms) shrinks back:
    after linger_ms nothing is watched, the filter is idle again, and a first delivery of a new message
    takes the lock-free path; within linger_ms a late copy of a redelivered message is still caught."""
    arrivals, clock, _ = make()
    for entry in range(50):
        arrivals.pending(7, entry, -1, "t")
    arrivals.forwarded("t", 7, list(range(50)), {}, clock.now, int(clock.now))
    clock.now += NATIVE_MIN_DELAY_MS
    assert all(admit(arrivals, entry) is Verdict.DELIVER for entry in range(25)), "the copies asked for"
    arrivals.acked(7, 0, -1, "t")
    assert admit(arrivals, 0) is Verdict.ACKED and admit(arrivals, 1) is Verdict.DUPLICATE, "late copies"
    assert admit(arrivals, 99) is Verdict.DELIVER, "never nacked: a first delivery"
    assert len(arrivals._sets.ids(_WATCH, ("t", 7))) == 50
    clock.now += 600  # over half of linger_ms: the recent generation rotates
    assert arrivals.sweep() == []
    assert admit(arrivals, 1) is Verdict.DUPLICATE, "still within linger_ms"
    clock.now += 600  # the forward retires (its 25 uncollected copies go again), the deliveries age out
    again = arrivals.sweep()
    assert sorted(e for _, _, e, _, _ in again) == list(range(25, 50)), "copies that never came"
    assert sorted(arrivals._sets.ids(_WATCH, ("t", 7))) == list(range(25, 50)), "only those still in flight"
    assert admit(arrivals, 1) is Verdict.DELIVER, "beyond linger_ms: not known any more"
    arrivals.clear()
    assert not arrivals._sets.any(_WATCH) and arrivals.idle


def test_redeliveries_over_many_ledgers_keep_no_object_per_ledger() -> None:
    """One forwarded nack on each of 1,000 ledgers (1,000 topics, the sparse case), its copy handed out
    and acked: what the filter keeps for the late copies (recently delivered and acked, for linger_ms)
    holds no Python object per ledger (it was a bitmap per ledger and set: ~600 KB), and the emptied
    flights table is released at once (an emptied dict kept its table: 590 KB until the next sweep).
    Late copies are still caught."""
    arrivals, clock, _ = make()
    ledgers = range(1_000)
    for ledger in ledgers:
        arrivals.pending(ledger, 5, -1, f"t{ledger}")
    for ledger in ledgers:
        arrivals.forwarded(f"t{ledger}", ledger, [5], {}, clock.now, int(clock.now))
    clock.now += NATIVE_MIN_DELAY_MS
    gc.collect()
    histogram = arrivals.lateness.nbytes  # (its fixed-size counts are allocated at the first redelivery)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for ledger in ledgers:
            assert arrivals.admit(ledger, 5, -1, f"t{ledger}", 1) is Verdict.DELIVER
            arrivals.acked(ledger, 5, -1, f"t{ledger}")
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before - (arrivals.lateness.nbytes - histogram)
    finally:
        tracemalloc.stop()
    assert kept < 20 * len(ledgers), f"{kept} B of Python objects kept for 1,000 ledgers' redeliveries"
    assert sys.getsizeof(arrivals._flights) < 1_000, "the emptied flights table is released"
    assert arrivals.admit(3, 5, -1, "t3", 1) is Verdict.ACKED, "a late copy of an acked redelivery"


def test_acked_plain_records_acks_beside_pending_nacks() -> None:
    """PIP-393's case on the ack fast path: a batch with one message nacked; acks of its other messages
    take acked_plain (one lock round-trip), the nacked one does not; the last ack turns the entry into
    one bit, and copies of it are still classified."""
    index = TimeBucketIndex(8, "floor")
    clock = FakeClock()
    arrivals = ArrivalFilter(lambda *ids: None, clock=clock, linger_ms=1_000, index=index)
    for batch_index in range(3):
        assert admit(arrivals, 1, batch_index, size=3) is Verdict.DELIVER
    fresh = arrivals.pending(7, 1, 1, "t")
    assert fresh is not None
    index.add(int(clock.now) + 60_000, 7, 1, 1, "t", fresh=fresh)
    assert arrivals.acked_plain(("t", 7, 1), 0) is True
    assert arrivals.acked_plain(("t", 7, 1), 1) is False, "its nack is pending: acked() removes it"
    assert ("t", 7, 1) in arrivals._entries
    assert arrivals.acked_plain(("t", 7, 1), 2) is True
    assert not arrivals._entries and arrivals.counts().open_entries == 1, "one bit, not a record"
    verdicts = [admit(arrivals, 1, batch_index, size=3) for batch_index in range(3)]
    assert verdicts == [Verdict.ACKED, Verdict.HOLD, Verdict.ACKED]
