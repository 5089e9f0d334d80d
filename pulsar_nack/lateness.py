"""Redelivery lateness as the application sees it: arrival − the due time it asked for.

The index keeps buckets, not due times (that is where its memory goes down), so the exact due time of
every pending nack is not known at arrival. Lateness splits in two: the time from the nack's bucket time
to its arrival, known exactly for every redelivery (a forward labels each id with its bucket time), and
the due time's offset in its bucket (bucket − due: where in its 2^k ms the due time fell), known when the
nack is filed. Three fixed-size structures:

* :class:`DueSample` keeps the exact due times of a bounded sample of pending ids (512 slots, two-way,
  8 bytes a slot, 4 KiB), read when the id's forward is recorded: those redeliveries count their exact
  lateness (in tests with few nacks, all of them);
* :class:`_BucketOffsets` counts, per bucket (the 64 nacked most recently), where its nacks' due times
  lie in it (32 bins: 8 ms at k = 8; 4.8 KiB): a redelivery not sampled counts its time since its bucket
  plus an offset drawn from its own bucket's, earliest due first (a bucket's copies come in about the
  order its nacks were filed); per bucket, because nack times follow the forwards (an application nacks
  in bursts just after each forward), so where due times lie in a bucket differs from bucket to bucket,
  and with it how long the redeliveries wait;
* :class:`LatenessHistogram` counts those lateness values in log buckets (an HDR-histogram shape: 64
  sub-buckets per power of two, so ≤ 1.6 % of the value wide, interpolated within; ~6.2 KiB), early
  ones (negative lateness: floor rounding) in a coarser mirror, and halves every count once it holds
  twice ``window`` redeliveries: the percentiles describe roughly the last ``window``–``2 * window``.
  Every redelivery counts once.

A weighted sample of due times alone (each sampled redelivery counted for the nacks it stood for, the
sample thinned while many were pending) missed the application's p50 by up to 20 ms in the demo's
20,000 messages (pulsar-lite, p50 242 vs 228 ms): its few heavy samples made it noisy; every nack's
offsets paired with every redelivery missed by 7–12 ms (the bursts above).

None grows with pending nacks or run time (~15 KiB in all, each part allocated at its first use). Not
thread-safe: the arrival filter calls them under its lock.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence

from pulsar_nack.memory import python_bytes

__all__ = ["DueSample", "LatenessHistogram", "Sampled"]

#: What a copy kept for a pending nack carries to its hand-out, for its lateness: a time (ms) and whether
#: it is the nack's exact due time (sampled: :meth:`LatenessHistogram.add`) or its bucket time
#: (:meth:`LatenessHistogram.add_after_bucket`).
Sampled = tuple[float, bool]

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
    """Exact due times (ms) of up to ``capacity`` pending ids, by a key of the id (a hash): 8 bytes a slot
    — 32 bits of the key and the due time modulo 2**32 ms (49 days), read back near a time given.

    The nack path offers a nack only when :func:`offered` says so: every nack while the table has room,
    and fewer (``every`` doubles up to :data:`MAX_EVERY`, a 1/256 sample) when an offered nack finds both
    of its slots taken while the table is three quarters full — so a busy consumer pays one bit test per
    nack, not a table probe; then the ids the new ``every`` would not have offered are dropped. ``every``
    halves again each time an id is taken while the table is three quarters free. An id whose two slots
    are taken while the table has room (or is thinned its most) is not sampled: chosen by its hash, not by
    its lateness. The redeliveries of ids not sampled count in :class:`LatenessHistogram` by their
    bucket: their lateness is measured from their bucket time, and the offset of their due time in the
    bucket is taken from every nack's (:meth:`LatenessHistogram.offset`) — no weights, so the sampled
    ones add no sampling noise of their own.

    ``note`` keeps a due time if one of the key's two slots is free or holds this key (the earlier due time
    is kept: a re-nack does not move a nack later), or replaces an id due more than ``horizon_ms`` before
    it (one whose forward was never seen: acked, cleared). ``take`` returns the key's due time and frees
    its slot. O(1) each, O(capacity) when ``every`` grows (at most 8 times while the table is full)."""

    __slots__ = ("_dues", "_keys", "_mask", "every", "horizon_ms", "used")

    def __init__(self, capacity: int = 512, horizon_ms: int = 60_000) -> None:
        if capacity < 4 or capacity & (capacity - 1):
            raise ValueError(f"capacity must be a power of two >= 4, got {capacity}")
        self._mask = capacity - 1
        self.horizon_ms = int(horizon_ms)
        self._keys: array[int] | None = None  # allocated at the first note
        self._dues: array[int] | None = None  # due ms & _LOW; _FREE: a free slot
        self.every = 0  # offer a nack when offered(due_ms, every) (0: every nack)
        self.used = 0  # slots taken

    def note(self, key: int, due_ms: int) -> None:
        """Sample ``due_ms`` (an int) for ``key`` if there is room (see the class docstring). O(1)."""
        dues = self._dues
        keys = self._keys
        if dues is None or keys is None:
            keys = self._keys = array("I", bytes(4 * (self._mask + 1)))
            dues = self._dues = array("I", [_FREE]) * (self._mask + 1)
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
        elif (due - old) & _LOW < _HALF:  # this id's own, earlier due time (modulo 2**32)
            return
        keys[slot] = code
        dues[slot] = due

    def _contend(self, key: int, due_ms: int, slot: int) -> None:
        """Both slots taken by other ids: one long overdue gives way, or the sample is thinned."""
        dues, keys = self._dues, self._keys
        assert dues is not None and keys is not None
        due = due_ms & _LOW
        for probe in (slot ^ 1, slot):
            if self.horizon_ms < (due - dues[probe]) & _LOW < _HALF:  # overdue by more than the horizon
                keys[probe] = key & _LOW
                dues[probe] = due
                return
        if self.every >= MAX_EVERY or self.used < self._mask - (self._mask >> 2):
            return  # not sampled (chosen by its hash, not by its lateness)
        every = self.every = self.every << 1 | 1
        for probe, old in enumerate(dues):
            if old != _FREE and not offered(old, every):  # (old: the due time modulo 2**32)
                dues[probe] = _FREE
                self.used -= 1
        if offered(due_ms, every):
            self.note(key, due_ms)

    def take(self, key: int, near_ms: float) -> float | None:
        """The due time sampled for ``key`` (None if it was not), read as the one within 24 days of
        ``near_ms``; its slot is freed. O(1)."""
        dues = self._dues
        keys = self._keys
        if not self.used or dues is None or keys is None:
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
        return float(near + ((due - near + _HALF) & _LOW) - _HALF)

    def clear(self) -> None:
        self._keys = self._dues = None
        self.every = self.used = 0

    @property
    def nbytes(self) -> int:
        """Bytes held: the two arrays and this object. O(1)."""
        held = (self._keys, self._dues)
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


#: Offset bins a bucket keeps (:class:`_BucketOffsets`), and the most buckets kept at once (a 10 s
#: spread of delays is 40 buckets of 256 ms).
OFFSET_BINS = 32
MAX_OFFSET_BUCKETS = 64


class _BucketOffsets:
    """Where the due times of the nacks filed in each bucket lie in it — ``|bucket − due|`` in
    :data:`OFFSET_BINS` bins of ``1 << shift`` ms (widened as larger offsets come: 1 ms up to 32 ms
    buckets, 8 ms for k = 8) — for at most :data:`MAX_OFFSET_BUCKETS` buckets: a bucket leaves once it
    has had as many draws as nacks, or, the earliest, when a new one needs its row. Offsets are ≥ 0 with
    ceil rounding, ≤ 0 with floor (``sign``). One flat table: 68 bytes a bucket and 8 for its key (4.8 KiB).

    Why per bucket: nack times are not independent of the forwards — an application that nacks what it
    is handed nacks in bursts just after each forward, and with a fixed delay or a backoff those nacks'
    due times fall at one place in their bucket, while their redeliveries are the ones that wait for the
    busy receive queue. The offsets of all nacks taken together, paired with every redelivery, missed the
    application's p50 by 7–12 ms in the demo workload."""

    __slots__ = ("counts", "keys", "shift", "sign")

    def __init__(self) -> None:
        self.keys: array[int] = array("q", [_NO_BUCKET]) * MAX_OFFSET_BUCKETS  # a row's bucket time
        # per row: OFFSET_BINS counts, then the draws so far (two 16-bit halves)
        self.counts: array[int] = array("H", bytes(2 * _ROW * MAX_OFFSET_BUCKETS))
        self.shift = 0
        self.sign = 1

    def add(self, bucket: int, offset_ms: int) -> None:
        """A nack filed in ``bucket``, ``offset_ms`` before it. O(1) (a C scan of 64 keys); O(table) when
        the bins widen."""
        if offset_ms < 0:
            self.sign, offset_ms = -1, -offset_ms
        while offset_ms >> self.shift >= OFFSET_BINS:
            self._widen()
        keys = self.keys
        try:
            row = keys.index(bucket)
        except ValueError:  # a new bucket: a free row, else the earliest bucket's
            row = keys.index(_NO_BUCKET) if _NO_BUCKET in keys else keys.index(min(keys))
            keys[row] = bucket
            start = row * _ROW
            self.counts[start : start + _ROW] = array("H", bytes(2 * _ROW))
        at = row * _ROW + (offset_ms >> self.shift)
        if self.counts[at] < 0xFFFF:
            self.counts[at] += 1

    def _widen(self) -> None:
        self.shift += 1
        counts = self.counts
        for start in range(0, len(counts), _ROW):
            for index in range(OFFSET_BINS):
                count, counts[start + index] = counts[start + index], 0
                if count:
                    counts[start + (index >> 1)] = min(counts[start + (index >> 1)] + count, 0xFFFF)

    def draw(self, bucket: int) -> float | None:
        """The next offset (ms, signed) drawn from the nacks of ``bucket``, earliest due first, spread
        evenly within its bin; None if the bucket is not kept. In that order because a bucket's copies
        come in about the order its nacks were filed: the broker redelivers a forward's entries in entry
        order, and an application that nacks what it is handed nacked them in that order — paired at
        random (or stratified), the demo's p50 read 5–34 ms low and its p99 up to 134 ms high. O(bins)."""
        keys = self.keys
        if bucket == _NO_BUCKET or bucket not in keys:
            return None
        row = keys.index(bucket)
        start = row * _ROW
        counts = self.counts[start : start + _ROW]
        total = sum(counts[:OFFSET_BINS])
        draws = counts[OFFSET_BINS] | counts[OFFSET_BINS + 1] << 16
        rank = draws + 0.5
        target = total - rank if self.sign > 0 else rank  # (a larger offset: due earlier, with ceil)
        draws += 1
        if draws >= total:
            keys[row] = _NO_BUCKET  # as many redeliveries as nacks: done with (a later one draws anew)
        else:
            self.counts[start + OFFSET_BINS] = draws & 0xFFFF
            self.counts[start + OFFSET_BINS + 1] = draws >> 16
        seen = 0
        for index in range(OFFSET_BINS):
            count = counts[index]
            if target < seen + count:
                return self.sign * (index + (target - seen) / count) * (1 << self.shift)
            seen += count
        return None  # (no nack counted: a row taken by a bucket whose counts saturated at 0)

    @property
    def nbytes(self) -> int:
        """Bytes held: the two arrays and this object. O(1)."""
        return python_bytes(self) + python_bytes(self.keys) + python_bytes(self.counts)


_ROW = OFFSET_BINS + 2
_NO_BUCKET = -(1 << 63)


class LatenessHistogram:
    """Lateness (ms; negative: early) of redeliveries: see the module docstring. ``add`` O(1), percentiles
    O(buckets) (~1,700). ``len()`` is the samples counted (halved with the counts); the percentiles and
    the early share weigh each by its weight."""

    __slots__ = ("_early", "_late", "_offsets", "_samples", "_total", "window")

    def __init__(self, window: int = 4096) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self._late: _Buckets | None = None  # allocated at the first sample
        self._early: _Buckets | None = None
        self._total = 0  # the counts' sum: samples by their weights
        self._samples = 0
        self._offsets: _BucketOffsets | None = None  # where the recent buckets' nacks' due times lie

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

    def offset(self, bucket: int, offset_ms: int) -> None:
        """A nack filed in ``bucket``, ``offset_ms`` before it (bucket − due time: negative with floor
        rounding). O(1) (see :class:`_BucketOffsets`)."""
        offsets = self._offsets
        if offsets is None:
            offsets = self._offsets = _BucketOffsets()
        offsets.add(bucket, offset_ms)

    def add_after_bucket(self, bucket: int, since_bucket_ms: float) -> None:
        """Count a redelivery whose exact due time was not sampled, ``since_bucket_ms`` after its bucket
        time ``bucket``: its lateness is that plus an offset drawn from its bucket's nacks', in their
        order (:meth:`_BucketOffsets.draw`; 0 if the bucket's are not kept: a restored snapshot's nack).
        O(bins)."""
        drawn = self._offsets.draw(bucket) if self._offsets is not None else None
        self.add(since_bucket_ms + (drawn if drawn is not None else 0.0))

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
        self._offsets = None

    @property
    def nbytes(self) -> int:
        """Bytes held: the count arrays, the buckets' offsets and these objects. O(buckets kept)."""
        total = python_bytes(self) + (self._offsets.nbytes if self._offsets is not None else 0)
        for buckets in (self._late, self._early):
            if buckets is not None:
                total += python_bytes(buckets) + python_bytes(buckets.counts)
        return total
