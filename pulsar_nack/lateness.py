"""Redelivery lateness as the application sees it: arrival − the due time it asked for.

The index keeps buckets, not due times (that is where its memory goes down), so the exact due time of
every pending nack is not known at arrival. Two fixed-size structures measure lateness anyway:

* :class:`DueSample` keeps the exact due times of a bounded sample of pending ids (a table of 512
  slots, two-way: 11 bytes a slot) — taken when the id's nack is filed, read when it is forwarded (the
  forward carries it to the copy that is handed out) — with the weight of each: how many nacks filed
  it stands for (:data:`Sampled`);
* :class:`LatenessHistogram` counts the sampled redeliveries' lateness, each by its weight, in log
  buckets (an HDR-histogram shape: 64 sub-buckets per power of two, so ≤ 1.6 % of the value wide,
  interpolated within), early ones (negative lateness: floor rounding) in a coarser mirror, and halves
  every count once it holds twice ``window`` samples: the percentiles describe roughly the last
  ``window``–``2 * window`` sampled redeliveries.

Why weights: while many nacks are pending — the busy, later parts of a run — the sample is thinned and
more of the nacks offered find their slots taken; unweighted, a nack sampled 1 in 64 counts as much as
one sampled 1 in 1 and the percentiles follow the quiet parts (the demo's 20,000 messages,
``nack_stats()`` p50 136 ms where the application measured 231 ms on pulsar-lite).

Neither grows with pending nacks or run time: ~4.9 KiB + ~1.3 KiB for the histogram, 5.5 KiB for the
sample, each allocated at its first use. Not thread-safe: the arrival filter calls both under its lock.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence

from pulsar_nack.memory import python_bytes

__all__ = ["DueSample", "LatenessHistogram", "Sampled"]

#: A sampled nack's exact due time (ms) and its weight (1 in how many nacks like it were sampled: see
#: :class:`DueSample`), for :meth:`LatenessHistogram.add`.
Sampled = tuple[float, int]

_NAN = math.nan
#: Spreads keys over the slots: the keys of one batch's messages differ in their low bits only (the batch
#: index), which a mask alone would put in one block of slots (Fibonacci hashing: 2**64 / golden ratio).
_SPREAD = 0x9E3779B97F4A7C15
_LOW = 0xFFFF_FFFF  # due times and keys are kept modulo 2**32
_HALF = 1 << 31
_FREE = _LOW  # the due time of a free slot (a due time that is this modulo 2**32 is not sampled)
_MIX = 0x9E3779B1  # odd: multiplying by it spreads every bit of a due time into the bits offered() tests


def offered(due_ms: int, every: int) -> bool:
    """Whether a nack due at ``due_ms`` (an int) is offered to a :class:`DueSample` thinned to ``every``.

    Tests bits 16+ of the due time times an odd constant (Fibonacci hashing), not the due time's own low
    bits: with ceil rounding a due time's offset in its 2^k-ms bucket is how late its message will be, and
    ``due_ms & every == 0`` offered, once ``every`` reached 2^k - 1, only due times on a bucket's edge —
    the least late (``nack_stats()`` p50 142 ms where the application measured 234 ms, the demo's
    20,000 messages with delays up to 10 s on pulsar-lite). The nack path tests ``every`` first, so that
    this call is made only while the sample is thinned. O(1)."""
    return not (due_ms & _LOW) * _MIX >> 16 & every


#: The sparsest sample of nacks a busy consumer offers to :class:`DueSample`: 1 in 256.
MAX_EVERY = 255


class DueSample:
    """Exact due times (ms) of up to ``capacity`` pending ids, by a key of the id (a hash): 11 bytes a
    slot — 32 bits of the key, the due time modulo 2**32 ms (49 days), read back near a time given, and
    its weight (returned by :meth:`take`): ``m << shift``, the nacks it stands for (two bytes) in units
    of the thinning it passed (log2 of ``every + 1``, a byte).

    The nack path offers a nack only when :func:`offered` says so: every nack while the table has room,
    and fewer (``every`` doubles up to :data:`MAX_EVERY`, a 1/256 sample) when an offered nack finds both
    of its slots taken while the table is three quarters full — so a busy consumer pays one bit test per
    nack, not a table probe; then the ids the new ``every`` would not have offered are dropped, so the
    sample is always the pending ids whose due time passes ``every``: spread evenly over a burst larger
    than the table, not its first nacks (whose lateness differs: with ceil rounding a bucket's earliest
    due times are the latest). ``every`` halves again each time an id is taken while the table is three
    quarters free. An id whose two slots are taken while the table has room (or is thinned its most) is
    not sampled: chosen by its hash, not by its lateness.

    The weights sum to the nacks filed (in expectation), whatever the thinning and the crowding of the
    table were when each was: the sample is thinned, and more offered ids find their slots taken, while
    many nacks are pending — the busy, late parts of a run — and unweighted the percentiles follow the
    quiet parts. An id noted at ``every`` stands for ``every + 1`` nacks; one that survives a thinning
    passed that offer test too (nested: ``every`` only gains low bits), so its shift is raised to the
    thinning's (its ``m`` kept); and an offered id that finds no room is counted in one of the two that
    took its slots (``m`` grows by one each ``1 << shift`` such nacks; the remainder waits in
    :attr:`missed`): pending at the same time, so late alike. Without that, the weights of a burst of
    3,000 nacks into 64 slots summed to 79 % of it, of 20,000 into 512 slots to 54 %.

    ``note`` keeps a due time if one of the key's two slots is free or holds this key (the earlier due time
    is kept: a re-nack does not move a nack later), or replaces an id due more than ``horizon_ms`` before
    it (one whose forward was never seen: acked, cleared). ``take`` returns the key's due time and weight
    and frees its slot. O(1) each, O(capacity) when ``every`` grows (at most 8 times while the table is
    full)."""

    __slots__ = ("_dues", "_keys", "_mask", "_ms", "_shifts", "every", "horizon_ms", "missed", "used")

    def __init__(self, capacity: int = 512, horizon_ms: int = 60_000) -> None:
        if capacity < 4 or capacity & (capacity - 1):
            raise ValueError(f"capacity must be a power of two >= 4, got {capacity}")
        self._mask = capacity - 1
        self.horizon_ms = int(horizon_ms)
        self._keys: array[int] | None = None  # allocated at the first note
        self._dues: array[int] | None = None  # due ms & _LOW; _FREE: a free slot
        self._shifts: array[int] | None = None  # the thinning passed: weight = m << shift
        self._ms: array[int] | None = None  # m: 1, plus offered nacks that found no room, in 1 << shift
        self.every = 0  # offer a nack when offered(due_ms, every) (0: every nack)
        self.used = 0  # slots taken
        self.missed = 0  # offered nacks that found no room, not yet counted in an m (< 1 << shift)

    def note(self, key: int, due_ms: int) -> None:
        """Sample ``due_ms`` (an int) for ``key`` if there is room (see the class docstring). O(1)."""
        dues = self._dues
        keys = self._keys
        if dues is None or keys is None:
            keys = self._keys = array("I", bytes(4 * (self._mask + 1)))
            dues = self._dues = array("I", [_FREE]) * (self._mask + 1)
            self._shifts = array("B", bytes(self._mask + 1))
            self._ms = array("H", bytes(2 * (self._mask + 1)))
        code = key & _LOW
        due = due_ms & _LOW
        slot = key * _SPREAD >> 40 & self._mask
        old = dues[slot]
        if old != _FREE and keys[slot] != code:  # taken by another id: its twin slot
            slot ^= 1
            old = dues[slot]
            if old != _FREE and keys[slot] != code:
                self._contend(key, due_ms, slot)
                return
        if old == _FREE:
            self.used += 1
            self._new(slot)
        elif (due - old) & _LOW < _HALF:  # this id's own, earlier due time (modulo 2**32)
            return
        keys[slot] = code
        dues[slot] = due

    def _new(self, slot: int) -> None:
        """A new id in ``slot``: it stands for ``every + 1`` nacks."""
        assert self._shifts is not None and self._ms is not None
        self._shifts[slot] = self.every.bit_length()
        self._ms[slot] = 1

    def _contend(self, key: int, due_ms: int, slot: int) -> None:
        """Both slots taken by other ids: one long overdue gives way, or the sample is thinned, or one of
        them counts this nack too."""
        dues, keys, shifts, ms = self._dues, self._keys, self._shifts, self._ms
        assert dues is not None and keys is not None and shifts is not None and ms is not None
        due = due_ms & _LOW
        for probe in (slot ^ 1, slot):
            if self.horizon_ms < (due - dues[probe]) & _LOW < _HALF:  # overdue by more than the horizon
                keys[probe] = key & _LOW
                dues[probe] = due
                self._new(probe)
                return
        if self.every >= MAX_EVERY or self.used < self._mask - (self._mask >> 2):
            # not sampled (chosen by its hash, not by its lateness); counted in the id in its slot
            more, self.missed = divmod(self.missed + self.every + 1, 1 << shifts[slot])
            ms[slot] = min(ms[slot] + more, 0xFFFF)
            return
        every = self.every = self.every << 1 | 1
        shift = every.bit_length()
        for probe, old in enumerate(dues):
            if old == _FREE:
                continue
            if offered(old, every):  # (old: the due time modulo 2**32, as offered reads)
                shifts[probe] = max(shifts[probe], shift)  # it passed this thinning too: 1 in 2**shift
            else:
                dues[probe] = _FREE
                self.used -= 1
        if offered(due_ms, every):
            self.note(key, due_ms)

    def take(self, key: int, near_ms: float) -> Sampled | None:
        """The due time sampled for ``key`` (None if it was not), read as the one within 24 days of
        ``near_ms``, and its weight; its slot is freed. O(1)."""
        dues = self._dues
        keys = self._keys
        shifts = self._shifts
        ms = self._ms
        if not self.used or dues is None or keys is None or shifts is None or ms is None:
            return None
        code = key & _LOW
        slot = key * _SPREAD >> 40 & self._mask
        if keys[slot] != code:
            slot ^= 1
            if keys[slot] != code:
                return None
        due = dues[slot]
        if due == _FREE:
            return None
        dues[slot] = _FREE
        self.used -= 1
        if self.every and self.used <= self._mask >> 2:
            self.every >>= 1  # room again: offer more nacks
        near = int(near_ms)
        return float(near + ((due - near + _HALF) & _LOW) - _HALF), ms[slot] << shifts[slot]

    def clear(self) -> None:
        self._keys = self._dues = self._shifts = self._ms = None
        self.every = self.used = self.missed = 0

    @property
    def nbytes(self) -> int:
        """Bytes held: the four arrays and this object. O(1)."""
        held = (self._keys, self._dues, self._shifts, self._ms)
        return python_bytes(self) + sum(python_bytes(a) for a in held if a is not None)


class _Buckets:
    """Counts of non-negative values (ms) in log buckets: ``2 * sub`` 1-ms buckets, then ``sub`` buckets
    per power of two up to 2**``bits`` ms (larger values count in the last). ``sub`` a power of two."""

    __slots__ = ("_shift", "_sub", "_top", "counts")

    def __init__(self, sub: int, bits: int) -> None:
        self._sub = sub
        self._shift = sub.bit_length()  # bit length of the 2*sub - 1 largest linear value
        self._top = (1 << bits) - 1
        exponents = bits - self._shift
        self.counts: array[int] = array("I", bytes(4 * (exponents * sub + 2 * sub)))

    def index(self, value: float) -> int:
        """O(1)."""
        units = min(int(value), self._top)
        exponent = units.bit_length() - self._shift
        if exponent <= 0:
            return units
        return exponent * self._sub + (units >> exponent)

    def bounds(self, index: int) -> tuple[float, float]:
        """[low, high) of a bucket (ms). O(1)."""
        sub = self._sub
        if index < 2 * sub:
            return float(index), float(index + 1)
        exponent = index // sub - 1
        low = (index % sub + sub) << exponent
        return float(low), float(low + (1 << exponent))


class LatenessHistogram:
    """Lateness (ms; negative: early) of redeliveries: see the module docstring. ``add`` O(1), percentiles
    O(buckets) (~1,700). ``len()`` is the samples counted (halved with the counts); the percentiles and
    the early share weigh each by its weight."""

    __slots__ = ("_early", "_late", "_samples", "_total", "window")

    def __init__(self, window: int = 4096) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self._late: _Buckets | None = None  # allocated at the first sample
        self._early: _Buckets | None = None
        self._total = 0  # the counts' sum: samples by their weights
        self._samples = 0

    def add(self, lateness_ms: float, weight: int = 1) -> None:
        """Count a redelivery ``lateness_ms`` late for ``weight`` (an int >= 1: 1 in how many were
        sampled, :data:`Sampled`). O(1), O(buckets) when the counts halve."""
        if self._late is None or self._early is None:
            self._late, self._early = _Buckets(64, 24), _Buckets(16, 24)
        if lateness_ms >= 0:
            buckets = self._late
        else:
            buckets, lateness_ms = self._early, -lateness_ms
        buckets.counts[buckets.index(lateness_ms)] += weight
        self._total += weight
        self._samples += 1
        # (and before a count could pass its 32 bits: a window of millions of samples weighing 256 each)
        if self._samples >= 2 * self.window or self._total >= _HALF:
            self._halve()

    def _halve(self) -> None:
        total = 0
        for buckets in (self._late, self._early):
            if buckets is not None:
                counts = buckets.counts
                for index, count in enumerate(counts):  # in place: the array keeps its size
                    if count:
                        counts[index] = count >> 1
                total += sum(counts)
        self._total = total
        self._samples = min(self._samples >> 1, total)

    def __len__(self) -> int:
        return self._samples

    @property
    def early_share(self) -> float | None:
        """The share of the counted redeliveries handed out early (None before any). O(buckets)."""
        if not self._total or self._early is None:
            return None
        return sum(self._early.counts) / self._total

    def percentiles(self, quantiles: Sequence[float]) -> list[float] | None:
        """The lateness at each quantile (0..1; numpy's linear ranks, interpolated within a bucket),
        None before any redelivery. O(buckets + quantiles)."""
        late, early = self._late, self._early
        total = self._total
        if not total or late is None or early is None:
            return None
        # ascending: early buckets from the most early, then late ones
        order: list[tuple[float, float, int]] = []  # (value at the bucket's start, width, count)
        for index in range(len(early.counts) - 1, -1, -1):
            count = early.counts[index]
            if count:
                low, high = early.bounds(index)
                order.append((-high, high - low, count))
        for index, count in enumerate(late.counts):
            if count:
                low, high = late.bounds(index)
                order.append((low, high - low, count))

        def at_rank(rank: int) -> float:
            # the rank-th smallest value: its bucket, and its place among the bucket's counts
            seen = 0
            for start, width, count in order:
                if rank < seen + count:
                    return start + width * (rank - seen + 0.5) / count
                seen += count
            start, width, _ = order[-1]
            return start + width

        results: list[float] = []
        for quantile in quantiles:
            rank = quantile * (total - 1)
            below = math.floor(rank)
            value = at_rank(below)
            if rank > below:  # between two ranks, as numpy interpolates
                value += (rank - below) * (at_rank(below + 1) - value)
            results.append(value)
        return results

    def clear(self) -> None:
        self._late = self._early = None
        self._total = self._samples = 0

    @property
    def nbytes(self) -> int:
        """Bytes held: the count arrays and these objects. O(1)."""
        total = python_bytes(self)
        for buckets in (self._late, self._early):
            if buckets is not None:
                total += python_bytes(buckets) + python_bytes(buckets.counts)
        return total
