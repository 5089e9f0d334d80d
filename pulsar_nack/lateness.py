"""Redelivery lateness as the application sees it: arrival − the due time it asked for.

The index keeps buckets, not due times (that is where its memory goes down), so the exact due time of
every pending nack is not known at arrival. Lateness splits in two: the time from the nack's bucket time
to its arrival, known exactly for every redelivery (a forward labels each id with its bucket time), and
the due time's offset in its bucket (bucket − due: where in its 2^k ms the due time fell), known when the
nack is filed. Three fixed-size structures:

* :class:`DueSample` keeps the exact due times of a bounded sample of pending ids (128 slots, two-way,
  8 bytes a slot, 1 KiB; 256 were 2 KiB, no more accurate in tests/test_lateness.py), read when the
  id's forward is recorded: those redeliveries count their exact lateness (in tests with few nacks, all
  of them);
* :class:`_BucketOffsets` counts, per bucket (up to 40 at once), where its nacks' due times lie in it, in
  the order their copies will come (4 segments of consecutive nacks × 8 bins: 32 ms at k = 8, a count per
  bin, and per segment its first entry id, the lowest and highest offset it holds and whether its offsets
  fell or rose as they were filed; 6.0 KiB at 40 buckets, 1.6 KiB for up to 4: rows are made as buckets
  come): a forward's copies come in entry order, and a nack of an entry
  before its segment's first (an older message nacked again) is counted in an earlier segment, or a new
  first one. A redelivery not sampled counts its time since its bucket plus the next offset of its own
  bucket's nacks in that order — in a segment filed in order (one fixed delay: a due time is the filing time
  plus the delay) the one filed first of those left, else one drawn evenly over the segment — and a sampled
  one takes its own offset out, so that each nack's offset is counted once; per bucket, because nack times
  follow the forwards (an application nacks in bursts just after each forward), so where due times lie in a
  bucket differs from bucket to bucket, and with it how long the redeliveries wait;
* :class:`LatenessHistogram` counts those lateness values in log buckets (an HDR-histogram shape,
  each power of two's buckets as wide as the lateness there needs: 1 ms below 128 ms, 4 ms at 1–2 s and
  8 ms at 2–4 s, where a demo's p99 lies, 32 a power of two from 4 s to 70 min; 16-bit counts, 3.5 KiB;
  16 ms wide a p99 of 1.1 s read 13.6 ms high from the width alone), interpolated within, early ones (negative
  lateness: floor rounding) in a coarser mirror made at the first early one (0.6 KiB of the 3.5), and
  halves every count once it holds twice ``window`` redeliveries: the percentiles describe roughly the
  last ``window``–``2 * window``. Every redelivery counts once.

A weighted sample of due times alone (each sampled redelivery counted for the nacks it stood for, the
sample thinned while many were pending) missed the application's p50 by up to 20 ms in the demo's
20,000 messages (pulsar-lite, p50 242 vs 228 ms): its few heavy samples made it noisy; every nack's
offsets paired with every redelivery missed by 7–12 ms (the bursts above); a segment's offsets drawn
evenly over it at one fixed delay (the order within a segment lost) read p99 up to 29 ms high: the copies
that wait longest since their bucket are those whose due times lie latest in it. A copy labelled with
a flush's limit (a time past its bucket's) counts the time since that label: the label's lead over its
bucket is added to the offset drawn (without it, a demo's tail bucket read 5 ms low).

None grows with pending nacks or run time: at most :data:`MAX_BYTES` (11 KiB) in all, whatever was
counted (10.8 KiB measured: histogram 3.5, offsets 6.0, sample 1.3), each part allocated at its first
use; the offsets and the sample go again once no nack is pending or on its way (the arrival filter's
sweep, a clear): a consumer with nothing pending keeps the histogram alone. A cell's nacks lie in its
bin, within its segment's lowest and highest: a lowest and highest per cell (4 segments × 8 bins) was
20 KiB in all; 4 segments × 4 bins with them, 16 KiB, read the demo's per-message p99 5.4 and 10.5 ms
low (pulsar-lite, 2 runs); 32 buckets kept, not 40, read p50 30 ms low where delays spread over 40
(tests/test_lateness.py). Not thread-safe: the arrival filter calls them under its lock.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence

from pulsar_nack.memory import python_bytes

__all__ = ["MAX_BYTES", "SAMPLE_SLOTS", "DueSample", "LatenessHistogram"]

#: The most the estimator holds (``nbytes`` of a :class:`LatenessHistogram` with its buckets' offsets,
#: plus a :class:`DueSample` of the default capacity), whatever it counted: it is part of the fixed memory
#: the wrapper keeps for a consumer, which is to stay within 16 KiB.
MAX_BYTES = 11 * 1024

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
#: Slots of a :class:`DueSample` by default (8 bytes each).
SAMPLE_SLOTS = 128


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

    def __init__(self, capacity: int = SAMPLE_SLOTS, horizon_ms: int = 60_000) -> None:
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
    """Counts of non-negative values (ms): 1-ms buckets below ``2**linear``, then per power of two
    ``2**e`` ms buckets ``2**widths[e - linear]`` ms wide, up to ``2**(linear + len(widths))`` ms (larger
    values count in the last). 16-bit counts (the histogram halves them all before one would overflow)."""

    __slots__ = ("_bases", "_linear", "_top", "_widths", "counts")

    def __init__(self, linear: int, widths: Sequence[int]) -> None:
        self._linear = linear
        self._widths = tuple(widths)
        self._top = (1 << (linear + len(widths))) - 1
        bases = []  # per power of two: the index of a value is its base + (value >> its width's log)
        size = 1 << linear
        for exponent, width in enumerate(widths, start=linear):
            bases.append(size - ((1 << exponent) >> width))
            size += (1 << exponent) >> width
        self._bases = tuple(bases)
        self.counts: array[int] = array("H", bytes(2 * size))

    def index(self, value: float) -> int:
        """O(1)."""
        units = min(int(value), self._top)
        exponent = units.bit_length() - 1 - self._linear
        if exponent < 0:
            return units
        return self._bases[exponent] + (units >> self._widths[exponent])

    def spans(self) -> list[tuple[float, float]]:
        """[low, high) of every bucket (ms), in index order. O(buckets)."""
        spans = [(float(units), float(units + 1)) for units in range(1 << self._linear)]
        for exponent, width in enumerate(self._widths, start=self._linear):
            step = 1 << width
            spans += [(float(low), float(low + step)) for low in range(1 << exponent, 2 << exponent, step)]
        return spans


#: Offset bins a bucket keeps per segment (:class:`_BucketOffsets`), the segments of its nacks in filing
#: order, and the most buckets kept at once (a 10 s spread of delays is 40 buckets of 256 ms).
OFFSET_BINS = 8
OFFSET_SEGMENTS = 4
MAX_OFFSET_BUCKETS = 40
#: Rows made at first; twice as many each time a bucket finds none free, up to MAX_OFFSET_BUCKETS: a
#: consumer with a nack or two pending holds 0.9 KiB of offsets, not the 6.0 KiB of 40 rows.
_FIRST_ROWS = 4
_CELLS = OFFSET_BINS * OFFSET_SEGMENTS
#: Offsets are kept as places: 16-bit fractions of the bins' span (``OFFSET_BINS << shift`` ms); a place's
#: bin is its top bits.
_BIN_SHIFT = 16 - (OFFSET_BINS.bit_length() - 1)
# per bucket: [filed in its last segment, segments used, log2 of a segment's capacity, draws]
_META = 4
_GOLDEN = 0.6180339887498949  # spreads the draws of one bin over it (a low-discrepancy sequence)
_NO_BUCKET = -(1 << 63)
_NOTHING_REFUSED = (1 << 63) - 1  # (see _BucketOffsets._refused)
#: A segment holds at most 2**this nacks (its count is 16 bits): past 8 × 2**15 nacks in one bucket (a
#: busy consumer at k = 15: 8 nacks a ms) its last segment takes the rest.
_MAX_SEGMENT_LOG = 15
#: A segment's offsets count as filed in order when all but 1 in this many of its moves (an offset filed
#: below or above the one before it) go one way.
_ORDERED = 8
#: The order is read from every 4th nack of a segment (each compared with the 4th before it): a cost on
#: the nack path for 1 in 4 (a segment's order is a statistic: its 4th nacks tell it as well).
_ORDER_EVERY = 3
#: The row of a bucket is looked up first at ``hints[bucket % _HINTS]`` (a prime: any 61 consecutive
#: buckets, whatever their width, have hints of their own), then by a scan of the keys (``array.index``
#: makes an int of every key it passes: ~500 ns over 20 of them).
_HINTS = 61
#: A bucket this many bucket widths before the latest one redelivered is past: its row may give way.
_PAST_BUCKETS = 8


class _BucketOffsets:
    """Where the due times of the nacks filed in each bucket lie in it (``|bucket − due|``, in
    :data:`OFFSET_BINS` bins of ``1 << shift`` ms, widened as larger offsets come: 32 ms for k = 8), in
    the order their copies will come: a bucket's nacks are counted in up to :data:`OFFSET_SEGMENTS`
    segments of consecutive filings (a segment holds ``2**c`` nacks; when all are used, neighbours merge
    and ``c`` grows), for at most :data:`MAX_OFFSET_BUCKETS` buckets. Offsets are ≥ 0 with ceil rounding,
    ≤ 0 with floor (``sign``). Flat tables: per cell a 16-bit count, per segment the lowest and highest
    offset filed (16-bit places: fractions of the bins' span, 1/256 ms at k = 8; a cell's nacks are taken
    to lie in its bin within them, :meth:`_span`), the place filed last and how often one was filed below
    / above the one before it (8-bit counts, halved together), and the low 16 bits of its first entry id:
    120 bytes a bucket with its key and state (6.0 KiB with the arrays' headers and the rows' hints; a
    lowest and highest per cell was 10.6 KiB, float32 offsets and 8 segments 30.7); they do not grow with
    the nacks.

    The segments follow the order the copies will come in: a forward's copies come in entry order, so a
    nack of an entry before the first of the segment being filed (an older message nacked again, often
    with a shorter delay) is counted in the latest earlier segment whose first entry is not after it,
    else in a new first segment (the others move one on) while the row has one free, else in the first.
    Measured on the demo (pulsar-lite), copies come in entry order (rank correlation 1.00 within a
    forward) where filing order had 0.81–0.93; in filing order the per-message p99 read 9.3 ms low.

    A redelivery not sampled draws an offset of its bucket's nacks in that order — one of the first
    segment with nacks left: if all but 1 in :data:`_ORDERED` of its offsets fell (or rose) as they were
    filed, as at one fixed delay, the one filed first of those left (its cell's highest, or lowest; the
    rest taken as evenly spread in the cell's span), else one drawn evenly over it — and that nack leaves the
    counts; a copy the consumer keeps draws one of the whole bucket's when it is taken out of the index,
    before its bucket falls due (no order ties a kept copy's hand-out to the filing; drawn then, every
    offset of its bucket is still counted); a sampled one
    (:meth:`taken`) takes its own offset out, so that the offsets drawn are those of the nacks not
    sampled. Measured on the demo's 20,000 messages (per-message delays and a
    backoff, both brokers), per redelivery against the application's own due times: the
    earliest-due-first draw over all of a bucket's nacks read p50 6–16 ms high — the kept copies drew
    the largest offsets (+45–56 ms each on average), and the sampled redeliveries' offsets were never
    drawn, so the draws stopped short of a bucket's smallest offsets.

    A redelivery whose label is not a bucket kept (ids a flush popped up to its limit, a forward repeated)
    draws from the latest bucket kept at or before it. When every row is taken, a past bucket (one before
    a bucket already drawn from) gives way first, else the latest bucket if the new one is earlier, else
    the new bucket is not kept (its redeliveries draw from the bucket before it). Past: more than
    :data:`_PAST_BUCKETS` bucket widths before the latest bucket drawn from."""

    __slots__ = (
        "_at",
        "_base",
        "_bucket",
        "_filled",
        "_limit",
        "_refused",
        "_run",
        "_run_bucket",
        "_run_entry",
        "_run_offset",
        "_segment",
        "cells",
        "drawn_upto",
        "entries",
        "high",
        "hints",
        "keys",
        "last",
        "low",
        "meta",
        "moves",
        "shift",
        "sign",
        "span_log",
        "unit",
    )

    def __init__(self) -> None:
        rows = _FIRST_ROWS  # (more as buckets come: _grow)
        self.keys: array[int] = array("q", [_NO_BUCKET]) * rows  # a row's bucket time
        self.hints: array[int] = array("B", bytes(_HINTS))  # a row that may be a bucket's (see _HINTS)
        self.cells: array[int] = array("H", bytes(2 * _CELLS * rows))  # nacks left
        # the lowest and highest place of each segment's nacks (a cell's span within them: _span)
        self.low: array[int] = array("H", bytes(2 * OFFSET_SEGMENTS * rows))
        self.high: array[int] = array("H", bytes(2 * OFFSET_SEGMENTS * rows))
        self.meta: array[int] = array("H", bytes(2 * _META * rows))
        # per segment: the place compared last, and how often one compared was below / above the one
        # before it (every 4th nack's: the segment's order, see draw)
        self.last: array[int] = array("H", bytes(2 * OFFSET_SEGMENTS * rows))
        self.moves: array[int] = array("B", bytes(2 * OFFSET_SEGMENTS * rows))
        # per segment: the lowest entry position (its low 16 bits) filed in it; not above the next
        # segment's (see _add)
        self.entries: array[int] = array("H", bytes(2 * OFFSET_SEGMENTS * rows))
        self.shift = 0  # a bin is 2**shift ms wide
        self.span_log = self.shift + 16 - _BIN_SHIFT  # the bins span 2**this ms
        self.unit = 2.0 ** (self.span_log - 16)  # ms a place
        # the bucket filed last (a burst of nacks shares one), its meta index, its segment with room, the
        # segment's first cell, the nacks filed in it and how many it takes
        self._bucket = _NO_BUCKET
        self._at = self._segment = self._base = self._filled = self._limit = 0
        self.sign = 1
        self.drawn_upto = _NO_BUCKET  # the latest bucket drawn from: much earlier ones are past
        # The earliest bucket refused a row (every row taken by earlier buckets) since the rows last
        # changed: it and every later bucket are refused until a row is freed, given away or the draws
        # move on. Asking again cost each of their nacks a scan of the rows and a raised ValueError
        # (~5 µs; nacks due after 40 pending buckets, each in a bucket of its own: bench/nack_path.py).
        self._refused = _NOTHING_REFUSED
        # The nacks filed since the last one counted, all in this bucket at this offset (a burst: the
        # messages of a batch nacked in one ms share both): counted together by _flush, before anything
        # reads the counts. Counting each nack as it came cost ~0.4 µs of the nack path.
        self._run_bucket = _NO_BUCKET
        self._run_offset = self._run = self._run_entry = 0

    def add(self, bucket: int, offset_ms: int, entry: int = 0) -> None:
        """A nack filed in ``bucket``, ``offset_ms`` before it. O(1): a count for a nack of the bucket and
        offset filed last (a burst of nacks shares them; :meth:`_flush` files them together), a few int
        operations for one of the segment filed last, a C scan of the keys for another bucket; O(table)
        when the bins widen, O(row) when a bucket's segments merge (each doubling of its nacks)."""
        if bucket == self._run_bucket and offset_ms == self._run_offset:
            self._run += 1
            return
        if self._run:
            self._flush()
        self._run_bucket, self._run_offset, self._run_entry = bucket, offset_ms, entry
        self._add(bucket, offset_ms, 1, entry)

    def _flush(self) -> None:
        """File the nacks :meth:`add` only counted (every reader of the counts calls this first). O(1)
        plus :meth:`_add`'s."""
        run, self._run = self._run, 0
        bucket, self._run_bucket = self._run_bucket, _NO_BUCKET  # (the next nack is filed at once)
        if run:
            self._add(bucket, self._run_offset, run, self._run_entry)

    def _add(self, bucket: int, offset_ms: int, nacks: int, entry: int = 0) -> None:
        """File ``nacks`` nacks in ``bucket``, each ``offset_ms`` before it, of the message at ``entry``
        (its entry id: a burst counts at its first one's): the state ``nacks`` calls of the one-nack
        filing left. A nack of an entry before the first of the segment filed last (an older message
        nacked again, a shorter delay) is counted in an earlier segment (:meth:`_earlier`): a forward's
        copies come in entry order, so the segments follow the order the copies will come in. O(1) a
        segment they fill (see :meth:`add`), O(segments) a nack out of entry order."""
        entry &= 0xFFFF
        if offset_ms < 0:
            self.sign, offset_ms = -1, -offset_ms
        place = offset_ms << 16 >> self.span_log
        while place > 0xFFFF:
            self._widen()
            place = offset_ms << 16 >> self.span_log
        while nacks > 0:
            if (bucket != self._bucket or self._filled >= self._limit) and (
                bucket >= self._refused or not self._open(bucket, place, entry)
            ):
                return  # (not kept)
            filled = self._filled
            taken = min(nacks, self._limit - filled)  # the nacks this segment takes
            nacks -= taken
            self._filled = filled + taken
            segment = self._segment
            base = self._base
            if (entry - self.entries[segment]) & 0xFFFF >= 0x8000:  # before the segment's first entry
                segment = self._earlier(segment, entry, place)
                base = segment * OFFSET_BINS
            # the segment's order: every 4th nack's place is compared with the one compared before (the
            # first such of these: the rest compare equal places)
            elif (filled + _ORDER_EVERY) & ~_ORDER_EVERY < filled + taken:
                last = self.last
                before = last[segment]
                last[segment] = place
                if place != before:
                    moves, move = self.moves, 2 * segment + (place > before)
                    if moves[move] == 0xFF:  # (8-bit counts: both halve, their ratio stays)
                        moves[move & ~1] >>= 1
                        moves[move | 1] >>= 1
                    moves[move] += 1
            if place > self.high[segment]:  # (filed in order, a new offset is past one end: tested first)
                self.high[segment] = place
            elif place < self.low[segment]:
                self.low[segment] = place
            cell = base + (place >> _BIN_SHIFT)
            cells = self.cells
            count = cells[cell]
            if count < 0xFFFF:
                cells[cell] = min(count + taken, 0xFFFF)

    def _earlier(self, segment: int, entry: int, place: int) -> int:
        """The segment a nack of ``entry`` (16 bits) before ``segment``'s first entry is counted in: the
        latest of its row before it whose first entry is not after ``entry``, else a new first segment
        (:meth:`_prepend`) while the row has one free, else its first, which then starts at ``entry``.
        O(segments), O(row) for a new one."""
        entries = self.entries
        first = segment - segment % OFFSET_SEGMENTS
        earlier = segment - 1
        while earlier >= first and (entry - entries[earlier]) & 0xFFFF >= 0x8000:
            earlier -= 1
        if earlier < first:
            if self.meta[first // OFFSET_SEGMENTS * _META + 1] < OFFSET_SEGMENTS:
                return self._prepend(first // OFFSET_SEGMENTS, entry, place)
            earlier = first
            entries[first] = entry  # (not merged to make room: each such nack doubled the segments)
        if not any(self.cells[earlier * OFFSET_BINS : (earlier + 1) * OFFSET_BINS]):
            self.low[earlier] = self.high[earlier] = place  # (its bounds were of nacks all drawn)
        return earlier

    def _prepend(self, row: int, entry: int, place: int) -> int:
        """A new first segment of ``row`` (one of its segments is free) for nacks of entries before all of
        its segments' (older messages nacked again: their copies come first in a forward), the others
        moved one on; the row filed last is opened again at its next nack. O(row)."""
        meta, at = self.meta, row * _META
        if self._bucket != _NO_BUCKET:
            meta[self._at] = self._filled if self._filled < 0xFFFF else 0xFFFF
            self._bucket = _NO_BUCKET
        used = meta[at + 1]
        first = row * OFFSET_SEGMENTS
        cells, start = self.cells, row * _CELLS
        moved = cells[start : start + used * OFFSET_BINS]
        cells[start + OFFSET_BINS : start + (used + 1) * OFFSET_BINS] = moved
        cells[start : start + OFFSET_BINS] = array("H", bytes(2 * OFFSET_BINS))
        for part in (self.low, self.high, self.last, self.entries):
            part[first + 1 : first + used + 1] = part[first : first + used]
        self.moves[2 * first + 2 : 2 * (first + used + 1)] = self.moves[2 * first : 2 * (first + used)]
        self.moves[2 * first] = self.moves[2 * first + 1] = 0
        self.low[first] = self.high[first] = self.last[first] = place
        self.entries[first] = entry
        meta[at + 1] = used + 1
        return first

    def _open(self, bucket: int, place: int, entry: int = 0) -> bool:
        """Make ``bucket``'s row and its segment with room the ones :meth:`add` files into (a new segment,
        its first place ``place``, once the last is full; segments merge when all are used); False if the
        bucket is not kept. The row filed last keeps its fill count in ``meta`` again. O(rows + row)."""
        meta, filled = self.meta, self._filled
        if self._bucket != _NO_BUCKET:
            meta[self._at] = filled if filled < 0xFFFF else 0xFFFF
            self._bucket = _NO_BUCKET
        keys, hints, hint = self.keys, self.hints, bucket % _HINTS
        row = hints[hint]
        if keys[row] != bucket:
            try:
                row = keys.index(bucket)
            except ValueError:
                found = self._new_row(bucket)
                if found is None:
                    self._refused = bucket  # (after every kept one: a later one is refused too)
                    return False
                row = found
            hints[hint] = row
        at = row * _META
        filled, used, log = meta[at], meta[at + 1], meta[at + 2]
        if not used or (filled >= 1 << log and (used < OFFSET_SEGMENTS or log < _MAX_SEGMENT_LOG)):
            if used == OFFSET_SEGMENTS:
                self._merge(row)
                used, log = meta[at + 1], meta[at + 2]
            used += 1
            filled = 0
            meta[at + 1] = used
            segment = row * OFFSET_SEGMENTS + used - 1
            self.moves[2 * segment] = self.moves[2 * segment + 1] = 0
            self.last[segment] = self.low[segment] = self.high[segment] = place
            before = self.entries[segment - 1] if used > 1 else entry
            # (not before the segment before it: the segments' first entries never fall)
            self.entries[segment] = before if (entry - before) & 0xFFFF >= 0x8000 else entry
        else:
            segment = row * OFFSET_SEGMENTS + used - 1
        self._bucket, self._at, self._filled, self._segment = bucket, at, filled, segment
        self._base = segment * OFFSET_BINS
        # (past 2**15 nacks a segment, the last takes the rest)
        self._limit = 1 << 62 if used == OFFSET_SEGMENTS and log >= _MAX_SEGMENT_LOG else 1 << log
        return True

    def _new_row(self, bucket: int) -> int | None:
        """A row for a bucket not kept: free, else one given way (see the class docstring), else None."""
        keys = self.keys
        if _NO_BUCKET in keys:
            row = keys.index(_NO_BUCKET)
        elif len(keys) < MAX_OFFSET_BUCKETS:
            row = len(keys)
            self._grow()
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
        self._refused = _NOTHING_REFUSED  # (the rows changed: another bucket may be kept now)
        self._clear(row)
        return row

    def _grow(self) -> None:
        """Twice the rows (at most :data:`MAX_OFFSET_BUCKETS`): the new ones free, the others where they
        were (every table is row after row). O(rows)."""
        rows = len(self.keys)
        more = min(rows, MAX_OFFSET_BUCKETS - rows)
        self.keys.extend(array("q", [_NO_BUCKET]) * more)
        self.cells.extend(array("H", bytes(2 * _CELLS * more)))
        self.meta.extend(array("H", bytes(2 * _META * more)))
        for segments in (self.low, self.high, self.last, self.entries):
            segments.extend(array("H", bytes(2 * OFFSET_SEGMENTS * more)))
        self.moves.extend(array("B", bytes(2 * OFFSET_SEGMENTS * more)))

    def _clear(self, row: int) -> None:
        start = row * _CELLS
        self.cells[start : start + _CELLS] = array("H", bytes(2 * _CELLS))
        self.meta[row * _META : (row + 1) * _META] = array("H", bytes(2 * _META))

    def _pour(self, into: int, cell: int) -> None:
        """Cell ``cell``'s nacks join cell ``into``'s; ``cell`` is emptied. O(1)."""
        cells = self.cells
        count = cells[cell]
        if not count or into == cell:
            return
        cells[cell] = 0
        cells[into] = min(cells[into] + count, 0xFFFF)

    def _merge(self, row: int) -> None:
        """Neighbouring segments of a full row merge in pairs; a segment holds twice the nacks (their
        order counts add up). O(row)."""
        start = row * _CELLS
        moves, first_segment = self.moves, row * OFFSET_SEGMENTS
        cells, low, high = self.cells, self.low, self.high
        for segment in range(OFFSET_SEGMENTS // 2):
            into = start + segment * OFFSET_BINS
            first, second = start + 2 * segment * OFFSET_BINS, start + (2 * segment + 1) * OFFSET_BINS
            # the pair's lowest and highest: of those of its two segments that have nacks left
            bounds = [
                (low[first_segment + 2 * segment + half], high[first_segment + 2 * segment + half])
                for half, base in ((0, first), (1, second))
                if any(cells[base : base + OFFSET_BINS])
            ] or [(0, 0)]
            low[first_segment + segment] = min(lower for lower, _ in bounds)
            high[first_segment + segment] = max(upper for _, upper in bounds)
            for index in range(OFFSET_BINS):
                self._pour(into + index, first + index)
                self._pour(into + index, second + index)
            pair = 2 * (first_segment + 2 * segment)
            down, up = moves[pair] + moves[pair + 2], moves[pair + 1] + moves[pair + 3]
            while down > 0xFF or up > 0xFF:
                down, up = down >> 1, up >> 1
            moves[2 * (first_segment + segment)], moves[2 * (first_segment + segment) + 1] = down, up
            self.last[first_segment + segment] = self.last[first_segment + 2 * segment + 1]
            self.entries[first_segment + segment] = self.entries[first_segment + 2 * segment]
        at = row * _META
        self.meta[at + 1] = OFFSET_SEGMENTS // 2
        self.meta[at + 2] += 1
        self.meta[at] = 1 << self.meta[at + 2]  # the last merged segment is full

    def _widen(self) -> None:
        """Bins twice as wide: places halve, neighbouring bins merge. O(table)."""
        self.shift += 1
        self.span_log += 1
        self.unit *= 2
        self.low = array("H", (place >> 1 for place in self.low))
        self.high = array("H", (place >> 1 for place in self.high))
        self.last = array("H", (place >> 1 for place in self.last))
        for start in range(0, len(self.cells), OFFSET_BINS):
            for index in range(OFFSET_BINS):
                self._pour(start + (index >> 1), start + index)

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

    def _order(self, segment: int) -> int:
        """-1 if a segment's offsets fell as its nacks were filed (a fixed delay with ceil rounding: due
        times in filing order, each further from the bucket end), 1 if they rose (floor), 0 if neither
        holds for at least :data:`_ORDERED` of its moves (delays of their own). O(1)."""
        down, up = self.moves[2 * segment], self.moves[2 * segment + 1]
        if down * _ORDERED > (down + up) * (_ORDERED - 1):
            return -1
        if up * _ORDERED > (down + up) * (_ORDERED - 1):
            return 1
        return 0

    def draw(self, bucket: int, kept: bool = False) -> float | None:
        """The offset (ms, signed) of a nack of ``bucket`` (see the class docstring), which leaves the
        counts: one of the first segment with nacks left — or, for a ``kept`` copy, of the whole bucket.
        If that segment's offsets were filed in order (:meth:`_order`), the one filed first of those left:
        the highest (falling) or lowest (rising) of its outermost cell, the cell's remaining ones taken
        as evenly spread between its lowest and highest; else one chosen evenly over them (a
        low-discrepancy sequence: the n-th draw takes the nack at rank ``frac(n · φ)`` of them, placed
        within its cell's lowest and highest). None if no bucket at or before it has nacks left.
        O(rows + cells)."""
        self._flush()
        self._refused = _NOTHING_REFUSED  # (a row may be freed, and the draws move on: ask again)
        if bucket == _NO_BUCKET:
            return None
        row = self._row_at_or_before(bucket)
        if row is None:
            return None
        if bucket > self.drawn_upto and not kept:  # (a kept copy's bucket is not due yet)
            self.drawn_upto = bucket
        # a label past its own bucket's time (a flush's limit) but within one bucket of it: its copies are
        # that much later than their bucket time, the offset that much larger
        past = bucket - self.keys[row]
        if past >= OFFSET_BINS << self.shift:
            past = 0  # (a bucket not kept: one before it stands in, as its offsets alone)
        cells, start = self.cells, row * _CELLS
        first, last = start, start + _CELLS
        if not kept:  # the first segment with nacks left: the copies come in entry order (see _add)
            while not any(cells[first : first + OFFSET_BINS]):
                first += OFFSET_BINS
            last = first + OFFSET_BINS
            order = self._order(row * OFFSET_SEGMENTS + (first - start) // OFFSET_BINS)
            if order:
                return past + self.sign * self._draw_ordered(row, first, last, order)
        at = row * _META + 3
        draws = self.meta[at]
        self.meta[at] = (draws + 1) & 0xFFFF
        target = (draws * _GOLDEN) % 1.0 * sum(cells[first:last])
        seen = 0
        for cell in range(first, last):
            count = cells[cell]
            if count and target < seen + count:
                low, high = self._span(cell)
                self._take(row, cell)
                return past + self.sign * self.unit * (low + (target - seen) / count * (high - low))
            seen += count
        return None  # (not reached: the cells counted have nacks left)

    def _draw_ordered(self, row: int, first: int, last: int, order: int) -> float:
        """:meth:`draw` from an ordered segment (cells ``first`` to ``last``, some with nacks left): the
        nack filed first of those left, its offset (ms) unsigned. O(cells)."""
        cells = self.cells
        span = range(last - 1, first - 1, -1) if order < 0 else range(first, last)
        cell = next(cell for cell in span if cells[cell])
        count = cells[cell]
        lowest, highest = self._span(cell)
        segment = cell // OFFSET_BINS
        if order < 0:  # falling: the highest left; the next below it by the even spacing of the rest
            offset = highest
            if count > 1:
                self.high[segment] = int(offset - (offset - lowest) / (count - 1) + 0.5)
        else:
            offset = lowest
            if count > 1:
                self.low[segment] = int(offset + (highest - offset) / (count - 1) + 0.5)
        self._take(row, cell)
        return offset * self.unit

    def _span(self, cell: int) -> tuple[int, int]:
        """The lowest and highest place ``cell``'s nacks may hold: its bin, within its segment's lowest and
        highest. O(1)."""
        segment, bin_low = cell // OFFSET_BINS, (cell % OFFSET_BINS) << _BIN_SHIFT
        low = max(bin_low, self.low[segment])
        high = min(bin_low + (1 << _BIN_SHIFT) - 1, self.high[segment])
        return (low, high) if low <= high else (bin_low, bin_low + (1 << _BIN_SHIFT) - 1)

    def _take(self, row: int, cell: int) -> None:
        """One nack leaves ``cell``; the row is freed once none is left. O(row) then."""
        cells = self.cells
        cells[cell] -= 1
        if not cells[cell] and not any(cells[row * _CELLS : (row + 1) * _CELLS]):
            self.keys[row] = _NO_BUCKET  # every nack of it drawn or taken: the row is free
            if row * _META == self._at:
                self._bucket = _NO_BUCKET

    def taken(self, due_ms: float) -> None:
        """A nack due at ``due_ms`` whose redelivery counts its exact lateness (it was sampled): its offset
        leaves its bucket's (the bucket within 2**k ms of it: after it with ceil, before with floor), from
        the first segment whose offsets left in its bin span it, else the first that counts one there (at
        one fixed delay a segment straddles two bins: taken from the segment before, that one ran out
        early and every later draw of the bucket came one nack ahead). O(rows + segments)."""
        self._flush()
        self._refused = _NOTHING_REFUSED  # (a row may be freed: ask again)
        span = OFFSET_BINS << self.shift
        keys = self.keys
        for row, key in enumerate(keys):
            if key == _NO_BUCKET:
                continue
            offset = (key - due_ms) * self.sign
            if 0 <= offset < span:  # (not a sign of the bucket redelivered: a kept copy's is taken early)
                place = offset / self.unit
                index = min(int(place) >> _BIN_SHIFT, OFFSET_BINS - 1)
                start = row * _CELLS
                cells = self.cells
                found = None  # its segment's cell: the first whose offsets left span it, else the first
                for cell in range(start + index, start + _CELLS, OFFSET_BINS):
                    if cells[cell]:
                        low, high = self._span(cell)
                        if low <= place <= high:
                            found = cell
                            break
                        if found is None:
                            found = cell
                if found is not None:
                    self._take(row, found)
                return

    @property
    def nbytes(self) -> int:
        """Bytes held: the arrays and this object. O(1)."""
        held = (
            *(self.keys, self.hints, self.cells, self.low, self.high),
            *(self.meta, self.last, self.moves, self.entries),
        )
        return python_bytes(self) + sum(python_bytes(part) for part in held)


#: The late histogram's bucket widths (log2 ms) per power of two from 128 ms (1 ms below): 2 ms to 512
#: ms, 4 ms to 2 s, 8 ms to 4 s (where a demo's p99 lies: a tail at 1.1 s reads within 2 ms 4 ms wide,
#: 13.6 ms high 16 ms wide: tests/test_lateness.py), then 32 buckets a power of two (≤ 3.1 % of the
#: value wide) up to 2**22 ms (70 min; later ones count in the last): 1,280 counts. The early mirror: 16
#: a power of two from 32 ms (1 ms below) to 2**16 ms (more early: only at k ≥ 16, counted in the last),
#: 208 counts.
_LATE_WIDTHS = (1, 1, 2, 2, 3, *(exponent - 5 for exponent in range(12, 22)))
_EARLY_WIDTHS = tuple(exponent - 4 for exponent in range(5, 16))


class LatenessHistogram:
    """Lateness (ms; negative: early) of redeliveries: see the module docstring. ``add`` O(1), percentiles
    O(buckets) (2,128). ``len()`` is the samples counted (halved with the counts)."""

    __slots__ = ("_early", "_late", "_offsets", "_samples", "_total", "window")

    def __init__(self, window: int = 4096) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self._late: _Buckets | None = None  # allocated at the first sample
        self._early: _Buckets | None = None
        self._total = 0  # the counts' sum
        self._samples = 0
        self._offsets: _BucketOffsets | None = None  # where the recent buckets' nacks' due times lie

    def add(self, lateness_ms: float) -> None:
        """Count a redelivery ``lateness_ms`` late. O(1), O(buckets) when the counts halve."""
        if lateness_ms >= 0:
            buckets = self._late
            if buckets is None:
                buckets = self._late = _Buckets(7, _LATE_WIDTHS)
        else:
            buckets, lateness_ms = self._early, -lateness_ms
            if buckets is None:  # (floor rounding only: 0.6 KiB a ceil consumer does not hold)
                buckets = self._early = _Buckets(5, _EARLY_WIDTHS)
        counts, index = buckets.counts, buckets.index(lateness_ms)
        if counts[index] == 0xFFFF:  # (a window past 65,535 in one bucket: halved before it overflows)
            self._halve()
        counts[index] += 1
        self._total += 1
        self._samples += 1
        if self._samples >= 2 * self.window:
            self._halve()

    def offset(self, bucket: int, offset_ms: int, entry: int = 0) -> None:
        """A nack filed in ``bucket``, ``offset_ms`` before it (bucket − due time: negative with floor
        rounding), of a message at ``entry`` (its entry id: where its copy comes in a forward). O(1) (see
        :class:`_BucketOffsets`)."""
        offsets = self._offsets
        if offsets is None:
            offsets = self._offsets = _BucketOffsets()
        if bucket == offsets._run_bucket and offset_ms == offsets._run_offset:
            offsets._run += 1  # (_BucketOffsets.add's burst case, inlined: the nack path)
        else:
            offsets.add(bucket, offset_ms, entry)

    def taken(self, due_ms: float) -> None:
        """A nack due at ``due_ms`` was sampled (:meth:`DueSample.take`): its redelivery counts its exact
        lateness, so its offset leaves its bucket's, not to be drawn for another redelivery
        (:meth:`_BucketOffsets.taken`). O(buckets kept)."""
        if self._offsets is not None:
            self._offsets.taken(due_ms)

    def add_after_bucket(self, bucket: int, since_bucket_ms: float) -> None:
        """Count a forwarded redelivery whose exact due time was not sampled, ``since_bucket_ms`` after its
        bucket time ``bucket``: its lateness is that plus the offset of one of its bucket's nacks, taken in
        the order they were filed (:meth:`_BucketOffsets.draw`); 0 if no bucket's are kept (a restored
        snapshot's nack). O(buckets kept + cells)."""
        self.add(since_bucket_ms + self._draw(bucket))

    def kept_due(self, bucket: int) -> float:
        """A due time for a nack of ``bucket`` whose copy the consumer keeps until its bucket time (taken
        out of the index before it fell due, its exact due time not sampled): the bucket time less the
        offset of any one of its bucket's nacks (:meth:`_BucketOffsets.draw` with ``kept``), drawn now.
        Its hand-out then counts ``add(now − this)``. Drawn when the copy is taken, while every offset of
        its bucket is still counted: drawn at the hand-out, a copy handed out after its bucket's forwarded
        ones (an application working through a backlog) took the offsets they left — on the demo's 20,000
        messages (Apache), copies handed out 800 ms after their bucket drew 0–2 ms where theirs spread
        over 0–256 ms, and ``nack_stats()`` p99 read 106–122 ms from the application's, either way. The
        time a kept copy waits past its bucket (the application's backlog) does not depend on where its
        due time lies in the bucket, so any of the bucket's offsets stands for its own. O(buckets kept +
        cells)."""
        return bucket - self._draw(bucket, kept=True)

    def _draw(self, bucket: int, kept: bool = False) -> float:
        """:meth:`_BucketOffsets.draw`; 0 if no bucket's offsets are kept. O(buckets kept + cells)."""
        drawn = self._offsets.draw(bucket, kept) if self._offsets is not None else None
        return drawn if drawn is not None else 0.0

    def forget_pending(self) -> None:
        """No nack whose offset is counted is pending or on its way any more (a seek; the arrival filter's
        sweep saw none): the buckets' offsets go (up to 6 KiB, the most of the estimator), to be made again at
        the next nack; the lateness counted so far stays. Not at each draw: the counts do not drain
        exactly (an acked nack's offset stays), and a consumer with one nack pending at a time would make
        the table again at each nack (~10 µs). O(1)."""
        self._offsets = None

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
        if not self._total:
            return None
        return sum(self._early.counts) / self._total if self._early is not None else 0.0

    def percentiles(self, quantiles: Sequence[float]) -> list[float] | None:
        """The lateness at each quantile (0..1; numpy's linear ranks, interpolated within a bucket),
        None before any redelivery. O(buckets + quantiles)."""
        late, early = self._late, self._early
        total = self._total
        if not total:
            return None
        # ascending: early buckets from the most early, then late ones
        order: list[tuple[float, float, int]] = []  # (value at the bucket's start, width, count)
        if early is not None:
            spans = early.spans()
            for index in range(len(early.counts) - 1, -1, -1):
                count = early.counts[index]
                if count:
                    low, high = spans[index]
                    order.append((-high, high - low, count))
        if late is not None:
            for (low, high), count in zip(late.spans(), late.counts, strict=True):
                if count:
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
