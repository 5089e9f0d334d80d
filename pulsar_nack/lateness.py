"""Redelivery lateness as the application sees it: arrival − the due time it asked for.

The index keeps buckets, not due times (that is where its memory goes down), so the exact due time of
every pending nack is not known at arrival. Lateness splits in two: the time from the nack's bucket time
to its arrival, known exactly for every redelivery (a forward labels each id with its bucket time), and
the due time's offset in its bucket (bucket − due: where in its 2^k ms the due time fell), known when the
nack is filed. Three fixed-size structures:

* :class:`DueSample` keeps the exact due times of a bounded sample of pending ids (512 slots, two-way,
  8 bytes a slot, 4 KiB), read when the id's forward is recorded: those redeliveries count their exact
  lateness (in tests with few nacks, all of them);
* :class:`_BucketOffsets` counts, per bucket (up to 40 at once), where its nacks' due times lie in it,
  in the order they were filed (8 segments of consecutive nacks × 8 bins: 32 ms at k = 8; 5.8 KiB): a
  redelivery not sampled counts its time since its bucket plus the next offset of its own bucket's nacks
  in filing order (a bucket's copies come in about the order its nacks were filed), and a sampled one
  takes its own offset out, so that each nack's offset is counted once; per bucket, because nack times
  follow the forwards (an application nacks in bursts just after each forward), so where due times lie
  in a bucket differs from bucket to bucket, and with it how long the redeliveries wait;
* :class:`LatenessHistogram` counts those lateness values in log buckets (an HDR-histogram shape: 64
  sub-buckets per power of two, so ≤ 1.6 % of the value wide, interpolated within; ~6.2 KiB), early
  ones (negative lateness: floor rounding) in a coarser mirror, and halves every count once it holds
  twice ``window`` redeliveries: the percentiles describe roughly the last ``window``–``2 * window``.
  Every redelivery counts once.

A weighted sample of due times alone (each sampled redelivery counted for the nacks it stood for, the
sample thinned while many were pending) missed the application's p50 by up to 20 ms in the demo's
20,000 messages (pulsar-lite, p50 242 vs 228 ms): its few heavy samples made it noisy; every nack's
offsets paired with every redelivery missed by 7–12 ms (the bursts above).

None grows with pending nacks or run time (~18 KiB in all, each part allocated at its first use). Not
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


#: Offset bins a bucket keeps per segment (:class:`_BucketOffsets`), the segments of its nacks in filing
#: order, and the most buckets kept at once (a 10 s spread of delays is 40 buckets of 256 ms).
OFFSET_BINS = 8
OFFSET_SEGMENTS = 8
MAX_OFFSET_BUCKETS = 40
_CELLS = OFFSET_BINS * OFFSET_SEGMENTS
# per bucket: [filed in its last segment, segments used, log2 of a segment's capacity, draws]
_META = 4
_GOLDEN = 0.6180339887498949  # spreads the draws of one bin over it (a low-discrepancy sequence)
_NO_BUCKET = -(1 << 63)
#: A bucket this many bucket widths before the latest one redelivered is past: its row may give way.
_PAST_BUCKETS = 8


class _BucketOffsets:
    """Where the due times of the nacks filed in each bucket lie in it (``|bucket − due|``, in
    :data:`OFFSET_BINS` bins of ``1 << shift`` ms, widened as larger offsets come: 32 ms for k = 8), in
    the order the nacks were filed: a bucket's nacks are counted in up to :data:`OFFSET_SEGMENTS`
    segments of consecutive filings (a segment holds ``2**c`` nacks; when all are used, neighbours merge
    and ``c`` grows), for at most :data:`MAX_OFFSET_BUCKETS` buckets. Offsets are ≥ 0 with ceil rounding,
    ≤ 0 with floor (``sign``). One flat table of 16-bit counts: 128 bytes a bucket, 16 for its key and
    state (5.8 KiB); it does not grow with the nacks.

    A redelivery not sampled draws an offset of its bucket's nacks in filing order — one of the first
    segment with nacks left (evenly over it: the order within a segment is lost) — and that nack leaves the
    counts; a copy the consumer kept draws one of the whole bucket's (kept copies are handed out at the
    bucket time, before the forwarded ones arrive: no order ties them to the filing); a sampled one
    (:meth:`taken`) takes its own offset out, so that the offsets drawn are those of the nacks not
    sampled. Why filing order: a forward's entries come back in entry order, and an application nacks
    what it is handed in that order, so a bucket's forwarded copies come in about the order its nacks
    were filed, whatever their delays. Measured on the demo's 20,000 messages (per-message delays and a
    backoff, both brokers), per redelivery against the application's own due times: the
    earliest-due-first draw over all of a bucket's nacks read p50 6–16 ms high — the kept copies drew
    the largest offsets (+45–56 ms each on average), and the sampled redeliveries' offsets were never
    drawn, so the draws stopped short of a bucket's smallest offsets.

    A redelivery whose label is not a bucket kept (ids a flush popped up to its limit, a forward repeated)
    draws from the latest bucket kept at or before it. When every row is taken, a past bucket (one before
    a bucket already drawn from) gives way first, else the latest bucket if the new one is earlier, else
    the new bucket is not kept (its redeliveries draw from the bucket before it). Past: more than
    :data:`_PAST_BUCKETS` bucket widths before the latest bucket drawn from."""

    __slots__ = ("cells", "drawn_upto", "keys", "meta", "shift", "sign")

    def __init__(self) -> None:
        self.keys: array[int] = array("q", [_NO_BUCKET]) * MAX_OFFSET_BUCKETS  # a row's bucket time
        self.cells: array[int] = array("H", bytes(2 * _CELLS * MAX_OFFSET_BUCKETS))  # nacks left
        self.meta: array[int] = array("H", bytes(2 * _META * MAX_OFFSET_BUCKETS))
        self.shift = 0
        self.sign = 1
        self.drawn_upto = _NO_BUCKET  # the latest bucket drawn from: much earlier ones are past

    def add(self, bucket: int, offset_ms: int) -> None:
        """A nack filed in ``bucket``, ``offset_ms`` before it. O(1) (a C scan of the keys); O(table) when
        the bins widen, O(row) when a bucket's segments merge (each doubling of its nacks)."""
        if offset_ms < 0:
            self.sign, offset_ms = -1, -offset_ms
        while offset_ms >> self.shift >= OFFSET_BINS:
            self._widen()
        keys = self.keys
        try:
            row = keys.index(bucket)
        except ValueError:
            found = self._new_row(bucket)
            if found is None:
                return
            row = found
        meta, at = self.meta, row * _META
        filled, used, log = meta[at], meta[at + 1], meta[at + 2]
        if filled >= 1 << log or not used:
            if used == OFFSET_SEGMENTS:
                self._merge(row)
                used, log = meta[at + 1], meta[at + 2]
            used += 1
            filled = 0
            meta[at + 1] = used
        meta[at] = filled + 1
        cell = row * _CELLS + (used - 1) * OFFSET_BINS + (offset_ms >> self.shift)
        if self.cells[cell] < 0xFFFF:
            self.cells[cell] += 1

    def _new_row(self, bucket: int) -> int | None:
        """A row for a bucket not kept: free, else one given way (see the class docstring), else None."""
        keys = self.keys
        if _NO_BUCKET in keys:
            row = keys.index(_NO_BUCKET)
        else:
            earliest = min(keys)
            latest = max(keys)
            if earliest < self.drawn_upto - (_PAST_BUCKETS * OFFSET_BINS << self.shift):
                row = keys.index(earliest)
            elif bucket < latest:
                row = keys.index(latest)
            else:
                return None
        keys[row] = bucket
        self._clear(row)
        return row

    def _clear(self, row: int) -> None:
        start = row * _CELLS
        self.cells[start : start + _CELLS] = array("H", bytes(2 * _CELLS))
        self.meta[row * _META : (row + 1) * _META] = array("H", bytes(2 * _META))

    def _merge(self, row: int) -> None:
        """Neighbouring segments of a full row merge in pairs; a segment holds twice the nacks. O(row)."""
        cells, start = self.cells, row * _CELLS
        for segment in range(OFFSET_SEGMENTS // 2):
            into = start + segment * OFFSET_BINS
            first, second = start + 2 * segment * OFFSET_BINS, start + (2 * segment + 1) * OFFSET_BINS
            for index in range(OFFSET_BINS):
                cells[into + index] = min(cells[first + index] + cells[second + index], 0xFFFF)
        cells[start + _CELLS // 2 : start + _CELLS] = array("H", bytes(_CELLS))
        at = row * _META
        self.meta[at + 1] = OFFSET_SEGMENTS // 2
        self.meta[at + 2] += 1
        self.meta[at] = 1 << self.meta[at + 2]  # the last merged segment is full

    def _widen(self) -> None:
        self.shift += 1
        cells = self.cells
        for start in range(0, len(cells), OFFSET_BINS):
            for index in range(OFFSET_BINS):
                count, cells[start + index] = cells[start + index], 0
                if count:
                    cells[start + (index >> 1)] = min(cells[start + (index >> 1)] + count, 0xFFFF)

    def _row_at_or_before(self, bucket: int) -> int | None:
        """The row of ``bucket`` if it has nacks left, else the latest earlier bucket that has. O(rows)."""
        keys, cells = self.keys, self.cells
        best: int | None = None
        for row, key in enumerate(keys):
            if key == _NO_BUCKET or key > bucket or (best is not None and key <= keys[best]):
                continue
            if any(cells[row * _CELLS : (row + 1) * _CELLS]):
                best = row
                if key == bucket:
                    break
        return best

    def draw(self, bucket: int, kept: bool = False) -> float | None:
        """The offset (ms, signed) of a nack of ``bucket`` (see the class docstring), which leaves the
        counts: one of the first segment with nacks left — or, for a ``kept`` copy, of the whole bucket —
        chosen evenly over them (a low-discrepancy sequence: the n-th draw takes the nack at rank
        ``frac(n · φ)`` of them, spread within its bin). None if no bucket at or before it has nacks left.
        O(rows + cells)."""
        if bucket == _NO_BUCKET:
            return None
        row = self._row_at_or_before(bucket)
        if row is None:
            return None
        if bucket > self.drawn_upto:
            self.drawn_upto = bucket
        cells, start = self.cells, row * _CELLS
        first, last = start, start + _CELLS
        if not kept:  # the first segment with nacks left: the copies come in the order nacks were filed
            while not any(cells[first : first + OFFSET_BINS]):
                first += OFFSET_BINS
            last = first + OFFSET_BINS
        at = row * _META + 3
        draws = self.meta[at]
        self.meta[at] = (draws + 1) & 0xFFFF
        target = (draws * _GOLDEN) % 1.0 * sum(cells[first:last])
        seen = 0
        for cell in range(first, last):
            count = cells[cell]
            if count and target < seen + count:
                self._take(row, cell)
                index = (cell - start) % OFFSET_BINS
                return self.sign * (index + (target - seen) / count) * (1 << self.shift)
            seen += count
        return None  # (not reached: the cells counted have nacks left)

    def _take(self, row: int, cell: int) -> None:
        """One nack leaves ``cell``; the row is freed once none is left. O(row) then."""
        cells = self.cells
        cells[cell] -= 1
        if not cells[cell] and not any(cells[row * _CELLS : (row + 1) * _CELLS]):
            self.keys[row] = _NO_BUCKET  # every nack of it drawn or taken: the row is free

    def taken(self, due_ms: float) -> None:
        """A nack due at ``due_ms`` whose redelivery counts its exact lateness (it was sampled): its offset
        leaves its bucket's (the bucket within 2**k ms of it: after it with ceil, before with floor), from
        the first segment that counts one there. O(rows + segments)."""
        span = OFFSET_BINS << self.shift
        keys = self.keys
        for row, key in enumerate(keys):
            if key == _NO_BUCKET:
                continue
            offset = (key - due_ms) * self.sign
            if 0 <= offset < span:  # (not a sign of the bucket redelivered: a kept copy's is taken early)
                index = min(int(offset) >> self.shift, OFFSET_BINS - 1)
                start = row * _CELLS
                for cell in range(start + index, start + _CELLS, OFFSET_BINS):
                    if self.cells[cell]:
                        self._take(row, cell)
                        return
                return

    @property
    def nbytes(self) -> int:
        """Bytes held: the three arrays and this object. O(1)."""
        held = (self.keys, self.cells, self.meta)
        return python_bytes(self) + sum(python_bytes(part) for part in held)


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

    def taken(self, due_ms: float) -> None:
        """A nack due at ``due_ms`` was sampled (:meth:`DueSample.take`): its redelivery counts its exact
        lateness, so its offset leaves its bucket's, not to be drawn for another redelivery
        (:meth:`_BucketOffsets.taken`). O(buckets kept)."""
        if self._offsets is not None:
            self._offsets.taken(due_ms)

    def add_after_bucket(self, bucket: int, since_bucket_ms: float, kept: bool = False) -> None:
        """Count a redelivery whose exact due time was not sampled, ``since_bucket_ms`` after its bucket
        time ``bucket``: its lateness is that plus the offset of one of its bucket's nacks, taken in the
        order they were filed — or any of them for a copy the consumer ``kept`` (handed out at the bucket
        time, before the forwarded copies arrive) — :meth:`_BucketOffsets.draw`; 0 if no bucket's are kept
        (a restored snapshot's nack). O(buckets kept + cells)."""
        drawn = self._offsets.draw(bucket, kept) if self._offsets is not None else None
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
