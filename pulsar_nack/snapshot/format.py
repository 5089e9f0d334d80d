"""The immutable segment file: a sealed time range of pending nacks, as PIP-195's snapshot segments.

A segment holds *groups*: one per (bucket time, ledger), each a run-optimized Roaring bitmap of entry ids
(``pyroaring`` portable serialization, the format Java's and CRoaring's ``serialize`` share) plus, for
entries of which only some messages of the batch are pending, those batch indexes — exactly what
:class:`~pulsar_nack.index.TimeBucketIndex` stores per slot, so a restored id keeps its due bucket and its
batch members. Everything is little-endian ``struct`` packing; no pickle, no code runs on read.

Layout, format version 1 (offsets in bytes; u = unsigned, i = signed; all little-endian)::

    -- header, 80 bytes ------------------------------------------------------------------------------
    off  size  type   field
      0     8  bytes  magic  b"PNKSEG\\r\\n"  (\\r\\n catches text-mode mangling, as PNG's does)
      8     2  u16    format version (1); any other version is rejected
     10     2  u16    flags: bit 0 = some group has batch members, bit 1 = some group has wide batch
                      indexes (>= 1024); every other bit must be 0
     12     4  u32    header length (80) -- room to grow in later versions
     16     8  u64    segment sequence number (unique per storage, increasing)
     24     8  i64    min due time: the smallest group bucket time (ms)
     32     8  i64    max due time: the largest group bucket time (ms)
     40     8  u64    id count: sum of the groups' entry-bitmap cardinalities
     48     8  u64    payload length P (the file is exactly 80 + P bytes)
     56    16  bytes  blake2b-128 digest of the payload
     72     4  u32    reserved, 0
     76     4  u32    zlib.crc32 of header bytes 0..75
    -- payload, P bytes: four sections, in this order, each  u32 tag | u64 length L | L bytes ------------
    tag 1  TOPICS      u32 n; n x (u16 length, UTF-8 bytes)
    tag 2  LEDGERS     u32 n; n x (u32 topic index, u64 ledger id)
    tag 3  GROUPS      u32 n; n x group, strictly increasing by (bucket time, ledger index):
                         i64 bucket time | u32 ledger index
                         u32 length E | E bytes: BitMap of entry ids (non-empty, run-optimized)
                         u32 length M | M bytes: BitMap64 of (entry id << 10 | batch index) for entries
                                                pending only for some batch indexes < 1024 (M = 0: none)
                         u32 count W  | W x (u32 entry id, u32 batch index >= 1024)   (wide indexes)
    tag 4  SUPERSEDES  u32 n; n x u64 sequence numbers this segment replaces (a merge's inputs)

An entry listed in a group's bitmap is pending *as a whole* unless batch members name it, in which case
only those batch indexes are pending (the index's own rule). The header carries its own CRC so that its
metadata (time range, id count) can be trusted — and reported — even when the payload is damaged.

Reading is defensive: :func:`decode_segment` raises :class:`SnapshotCorrupt` (never another exception) for
any file it cannot vouch for, and bounds its allocations: every length and count is checked against the
bytes that remain *and* against :class:`ReadLimits` before anything is allocated for it, and every
decoded bitmap's cardinality is checked before it is expanded (a 1 MB Roaring bitmap can claim 2**32
ids). Decoding costs O(file size + ids) time and O(file size) extra memory.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from pyroaring import BitMap, BitMap64

from pulsar_nack.index import MAX_BATCH_INDEX, MAX_ENTRY_ID, MEMBER_BITS

__all__ = [
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "MAGIC",
    "Group",
    "ReadLimits",
    "Segment",
    "SegmentHeader",
    "SnapshotCorrupt",
    "decode_segment",
    "encode_segment",
    "read_header",
]

MAGIC = b"PNKSEG\r\n"
FORMAT_VERSION = 1
FLAG_MEMBERS = 1
FLAG_WIDE = 2
_KNOWN_FLAGS = FLAG_MEMBERS | FLAG_WIDE

_HEADER = struct.Struct("<8sHHIQqqQQ16sII")
HEADER_SIZE = _HEADER.size  # 80
_DIGEST_SIZE = 16
_SECTION = struct.Struct("<IQ")
_TAG_TOPICS, _TAG_LEDGERS, _TAG_GROUPS, _TAG_SUPERSEDES = 1, 2, 3, 4
_GROUP_FIXED = struct.Struct("<qI")
_U16, _U32, _U64 = struct.Struct("<H"), struct.Struct("<I"), struct.Struct("<Q")
_LEDGER = struct.Struct("<IQ")
_NARROW = 1 << MEMBER_BITS
_I64_MAX = 2**63 - 1
_U64_MAX = 2**64 - 1


class SnapshotCorrupt(ValueError):
    """A segment file that is truncated, damaged, hostile or of an unknown version."""


@dataclass(frozen=True)
class ReadLimits:
    """Upper bounds a reader enforces before allocating; a file beyond any of them is rejected.

    The defaults are far above what :class:`~pulsar_nack.snapshot.segments.SegmentStore` writes (segments of
    thousands of ids) and far below what would hurt: 16M ids expand to 64 MB of entry ids.
    """

    max_file_bytes: int = 256 * 2**20
    max_topics: int = 1 << 16
    max_topic_bytes: int = 8192
    max_ledgers: int = 1 << 20
    max_groups: int = 1 << 22
    max_ids: int = 1 << 24
    max_members: int = 1 << 26
    max_wide: int = 1 << 20
    max_supersedes: int = 1 << 16


DEFAULT_LIMITS = ReadLimits()


@dataclass(frozen=True)
class Group:
    """The ids of one ledger due at one bucket time.

    ``entries``: every pending entry id. ``members``: ``entry_id << 10 | batch_index`` of the messages of
    entries that are pending only in part (batch indexes < 1024); ``wide``: ``(entry_id, batch_index)``
    pairs for batch indexes >= 1024. An entry in ``entries`` named by neither is pending as a whole.
    """

    bucket_ms: int
    topic: str
    ledger_id: int
    entries: BitMap
    members: BitMap64 | None = None
    wide: tuple[tuple[int, int], ...] = ()

    def batch_masks(self) -> dict[int, int]:
        """entry id → bitmask of its pending batch indexes, for the partially pending entries.
        O(members)."""
        masks: dict[int, int] = {}
        if self.members:
            for value in self.members:
                entry = value >> MEMBER_BITS
                masks[entry] = masks.get(entry, 0) | 1 << (value & (_NARROW - 1))
        for entry, index in self.wide:
            masks[entry] = masks.get(entry, 0) | 1 << index
        return masks


@dataclass(frozen=True)
class Segment:
    """A decoded segment: groups sorted by (bucket time, topic, ledger), and the sequence numbers of the
    segments it replaces."""

    seq: int
    groups: tuple[Group, ...]
    supersedes: tuple[int, ...] = ()
    #: header fields as read (equal to the derived ones for a valid file); set by the decoder
    header: SegmentHeader | None = field(default=None, compare=False)

    @property
    def min_due_ms(self) -> int:
        return min(g.bucket_ms for g in self.groups) if self.groups else 0

    @property
    def max_due_ms(self) -> int:
        return max(g.bucket_ms for g in self.groups) if self.groups else 0

    @property
    def id_count(self) -> int:
        return sum(len(g.entries) for g in self.groups)


@dataclass(frozen=True)
class SegmentHeader:
    """The header's fields (checked by its CRC, not by the payload digest)."""

    version: int
    flags: int
    seq: int
    min_due_ms: int
    max_due_ms: int
    id_count: int
    payload_length: int
    digest: bytes


# -- encoding ---------------------------------------------------------------------------------------------


def encode_segment(segment: Segment) -> bytes:
    """Serialize a segment. Raises ``ValueError`` for groups the format cannot hold (empty bitmaps,
    duplicate (bucket, ledger) groups, members of entries not in the group, out-of-range values).

    Bitmaps are copied before ``run_optimize``: a caller's bitmap is never changed (a live bitmap must not
    be run-optimized in place — the broker's #26117). O(ids + groups log groups)."""
    groups = sorted(segment.groups, key=lambda g: (g.bucket_ms, g.topic, g.ledger_id))
    topics: dict[str, int] = {}
    ledgers: dict[tuple[str, int], int] = {}
    for g in groups:
        topics.setdefault(g.topic, len(topics))
        ledgers.setdefault((g.topic, g.ledger_id), len(ledgers))
    flags = 0
    body = [_U32.pack(len(groups))]
    seen: set[tuple[int, int]] = set()
    ids = 0
    keyed = sorted(
        (((g.bucket_ms, ledgers[(g.topic, g.ledger_id)]), g) for g in groups), key=lambda kg: kg[0]
    )
    for key, g in keyed:
        _check_group(g)
        if key in seen:
            raise ValueError(f"two groups for bucket {g.bucket_ms}, ledger {g.topic!r}/{g.ledger_id}")
        seen.add(key)
        entries = BitMap(g.entries)
        entries.run_optimize()
        raw_entries = entries.serialize()
        raw_members = b""
        if g.members:
            flags |= FLAG_MEMBERS
            members = BitMap64(g.members)
            members.run_optimize()
            raw_members = members.serialize()
        if g.wide:
            flags |= FLAG_WIDE
        ids += len(entries)
        body.append(_GROUP_FIXED.pack(*key))
        body.append(_U32.pack(len(raw_entries)) + raw_entries)
        body.append(_U32.pack(len(raw_members)) + raw_members)
        body.append(_U32.pack(len(g.wide)))
        body.extend(struct.pack("<II", e, i) for e, i in sorted(g.wide))
    topic_part = [_U32.pack(len(topics))]
    for topic in topics:
        raw = topic.encode("utf-8")
        if len(raw) > DEFAULT_LIMITS.max_topic_bytes:
            raise ValueError(f"topic name longer than {DEFAULT_LIMITS.max_topic_bytes} bytes")
        topic_part.append(_U16.pack(len(raw)) + raw)
    ledger_part = [_U32.pack(len(ledgers))]
    for (topic, ledger_id), _ in sorted(ledgers.items(), key=lambda kv: kv[1]):
        if not 0 <= ledger_id <= _I64_MAX:
            raise ValueError(f"ledger id out of range: {ledger_id}")
        ledger_part.append(_LEDGER.pack(topics[topic], ledger_id))
    supersedes = [_U32.pack(len(segment.supersedes))]
    for seq in segment.supersedes:
        if not 0 <= seq <= _U64_MAX:
            raise ValueError(f"sequence number out of range: {seq}")
        supersedes.append(_U64.pack(seq))
    payload = b"".join(
        _section(tag, b"".join(parts))
        for tag, parts in (
            (_TAG_TOPICS, topic_part),
            (_TAG_LEDGERS, ledger_part),
            (_TAG_GROUPS, body),
            (_TAG_SUPERSEDES, supersedes),
        )
    )
    if not 0 <= segment.seq <= _U64_MAX:
        raise ValueError(f"sequence number out of range: {segment.seq}")
    lo = groups[0].bucket_ms if groups else 0
    hi = max((g.bucket_ms for g in groups), default=0)
    digest = hashlib.blake2b(payload, digest_size=_DIGEST_SIZE).digest()
    head = _HEADER.pack(
        MAGIC, FORMAT_VERSION, flags, HEADER_SIZE, segment.seq, lo, hi, ids, len(payload), digest, 0, 0
    )
    crc = zlib.crc32(head[:-4])
    return head[:-4] + _U32.pack(crc) + payload


def _section(tag: int, data: bytes) -> bytes:
    return _SECTION.pack(tag, len(data)) + data


def _check_group(g: Group) -> None:
    if not g.entries:
        raise ValueError("a group needs at least one entry id")
    if not -(2**63) <= g.bucket_ms <= _I64_MAX:
        raise ValueError(f"bucket time out of range: {g.bucket_ms}")
    if g.members:
        owners = BitMap(np.unique(np.asarray(g.members.to_array(), dtype=np.uint64) >> MEMBER_BITS))
        if not owners.issubset(g.entries):
            raise ValueError("batch members of entries that are not in the group")
    for entry, index in g.wide:
        if entry not in g.entries or not _NARROW <= index <= MAX_BATCH_INDEX:
            raise ValueError(f"bad wide batch member ({entry}, {index})")


# -- decoding ---------------------------------------------------------------------------------------------


class _Reader:
    """A bounds-checked cursor over a buffer: every read checks the remaining length first."""

    __slots__ = ("_data", "_end", "_pos", "_what")

    def __init__(self, data: memoryview, what: str) -> None:
        self._data = data
        self._pos = 0
        self._end = len(data)
        self._what = what

    @property
    def remaining(self) -> int:
        return self._end - self._pos

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or n > self.remaining:
            raise SnapshotCorrupt(f"{self._what}: {what} needs {n} bytes, {self.remaining} left (truncated?)")
        view = self._data[self._pos : self._pos + n]
        self._pos += n
        return view

    def unpack(self, fmt: struct.Struct, what: str) -> tuple[int, ...]:
        return fmt.unpack(self.take(fmt.size, what))

    def count(self, what: str, item_bytes: int, limit: int) -> int:
        """A u32 count of items of at least ``item_bytes`` each, checked against the bytes left and
        ``limit`` before the caller allocates anything for them."""
        (n,) = self.unpack(_U32, f"{what} count")
        if n > limit:
            raise SnapshotCorrupt(f"{self._what}: {n} {what} exceed the limit of {limit}")
        if n * item_bytes > self.remaining:
            raise SnapshotCorrupt(f"{self._what}: {n} {what} cannot fit in {self.remaining} bytes")
        return int(n)

    def done(self) -> None:
        if self.remaining:
            raise SnapshotCorrupt(f"{self._what}: {self.remaining} unexpected trailing bytes")


def read_header(data: bytes | memoryview, limits: ReadLimits = DEFAULT_LIMITS) -> SegmentHeader:
    """Parse and verify the 80-byte header only (magic, version, flags, CRC, sizes against ``len(data)``
    when ``data`` holds the whole file or just the header). O(1)."""
    view = memoryview(data)
    if len(view) < HEADER_SIZE:
        raise SnapshotCorrupt(f"segment: {len(view)} bytes, shorter than the {HEADER_SIZE}-byte header")
    fields = _HEADER.unpack(view[:HEADER_SIZE])
    magic, version, flags, header_len, seq, lo, hi, ids, payload_len, digest, reserved, crc = fields
    if magic != MAGIC:
        raise SnapshotCorrupt("segment: bad magic, not a pulsar-nack segment file")
    if zlib.crc32(view[: HEADER_SIZE - 4]) != crc:
        raise SnapshotCorrupt("segment: header checksum mismatch")
    if version != FORMAT_VERSION:
        raise SnapshotCorrupt(f"segment: format version {version}, this reader knows {FORMAT_VERSION}")
    if flags & ~_KNOWN_FLAGS or reserved or header_len != HEADER_SIZE:
        raise SnapshotCorrupt(f"segment: unknown flags {flags:#x} or header layout")
    if lo > hi or ids > limits.max_ids or payload_len > limits.max_file_bytes:
        raise SnapshotCorrupt(f"segment: header out of bounds (due {lo}..{hi}, {ids} ids, {payload_len} B)")
    return SegmentHeader(version, flags, seq, lo, hi, ids, payload_len, bytes(digest))


def decode_segment(data: bytes | memoryview, limits: ReadLimits = DEFAULT_LIMITS) -> Segment:
    """Parse, verify and return a whole segment file; raise :class:`SnapshotCorrupt` for anything else.

    O(file size + ids); extra memory O(file size), capped by ``limits`` before any allocation."""
    try:
        return _decode(memoryview(data), limits)
    except SnapshotCorrupt:
        raise
    except (ValueError, IndexError, OverflowError, struct.error, UnicodeDecodeError, MemoryError) as exc:
        raise SnapshotCorrupt(f"segment: {type(exc).__name__}: {exc}") from exc


def _decode(view: memoryview, limits: ReadLimits) -> Segment:
    if len(view) > limits.max_file_bytes:
        raise SnapshotCorrupt(f"segment: {len(view)} bytes exceed the limit of {limits.max_file_bytes}")
    header = read_header(view, limits)
    if header.payload_length != len(view) - HEADER_SIZE:
        raise SnapshotCorrupt(
            f"segment: header says {header.payload_length} payload bytes, file has {len(view) - HEADER_SIZE}"
            " (truncated or extended)"
        )
    payload = view[HEADER_SIZE:]
    if hashlib.blake2b(payload, digest_size=_DIGEST_SIZE).digest() != header.digest:
        raise SnapshotCorrupt("segment: payload checksum mismatch")
    outer = _Reader(payload, "segment")
    sections = []
    for tag in (_TAG_TOPICS, _TAG_LEDGERS, _TAG_GROUPS, _TAG_SUPERSEDES):
        got, length = outer.unpack(_SECTION, "section header")
        if got != tag:
            raise SnapshotCorrupt(f"segment: section tag {got} where {tag} belongs")
        sections.append(_Reader(outer.take(length, f"section {tag}"), f"section {tag}"))
    outer.done()
    topics = _read_topics(sections[0], limits)
    ledgers = _read_ledgers(sections[1], limits, len(topics))
    groups = _read_groups(sections[2], limits, header, topics, ledgers)
    sup = sections[3]
    n = sup.count("superseded segments", _U64.size, limits.max_supersedes)
    supersedes = tuple(int(x) for x in np.frombuffer(sup.take(n * 8, "supersedes"), dtype="<u8").tolist())
    sup.done()
    return Segment(header.seq, groups, supersedes, header)


def _read_topics(r: _Reader, limits: ReadLimits) -> list[str]:
    n = r.count("topics", _U16.size, limits.max_topics)
    topics = []
    for _ in range(n):
        (length,) = r.unpack(_U16, "topic length")
        if length > limits.max_topic_bytes:
            raise SnapshotCorrupt(f"section 1: topic of {length} bytes exceeds {limits.max_topic_bytes}")
        topics.append(str(r.take(length, "topic"), "utf-8"))
    r.done()
    if len(set(topics)) != len(topics):
        raise SnapshotCorrupt("section 1: duplicate topics")
    return topics


def _read_ledgers(r: _Reader, limits: ReadLimits, topic_count: int) -> list[tuple[int, int]]:
    n = r.count("ledgers", _LEDGER.size, limits.max_ledgers)
    raw = np.frombuffer(r.take(n * _LEDGER.size, "ledgers"), dtype=np.dtype([("t", "<u4"), ("l", "<u8")]))
    r.done()
    topic_idx, ledger_ids = raw["t"], raw["l"]
    if n and (int(topic_idx.max()) >= topic_count or int(ledger_ids.max()) > _I64_MAX):
        raise SnapshotCorrupt("section 2: ledger with an unknown topic or an out-of-range id")
    pairs = list(zip(topic_idx.tolist(), ledger_ids.tolist(), strict=True))
    if len(set(pairs)) != len(pairs):
        raise SnapshotCorrupt("section 2: duplicate ledgers")
    return pairs  # (topic index, ledger id)


def _read_groups(
    r: _Reader,
    limits: ReadLimits,
    header: SegmentHeader,
    topics: Sequence[str],
    ledgers: Sequence[tuple[int, int]],
) -> tuple[Group, ...]:
    n = r.count("groups", _GROUP_FIXED.size + 12, limits.max_groups)
    groups = []
    ids = members_total = wide_total = 0
    previous: tuple[int, int] | None = None
    flags = 0
    for _ in range(n):
        bucket, ledger_index = r.unpack(_GROUP_FIXED, "group")
        if ledger_index >= len(ledgers):
            raise SnapshotCorrupt(f"section 3: group names ledger {ledger_index} of {len(ledgers)}")
        if previous is not None and (bucket, ledger_index) <= previous:
            raise SnapshotCorrupt("section 3: groups out of order or repeated")
        previous = (bucket, ledger_index)
        if not header.min_due_ms <= bucket <= header.max_due_ms:
            raise SnapshotCorrupt(f"section 3: bucket {bucket} outside the header's due range")
        (length,) = r.unpack(_U32, "entry bitmap length")
        entries = _bitmap(r.take(length, "entry bitmap"))
        cardinality = len(entries)
        if cardinality == 0:
            raise SnapshotCorrupt("section 3: empty group")
        ids += cardinality
        if ids > header.id_count or ids > limits.max_ids:
            raise SnapshotCorrupt(f"section 3: more ids than the header's {header.id_count}")
        (length,) = r.unpack(_U32, "member bitmap length")
        members = None
        if length:
            members = _bitmap64(r.take(length, "member bitmap"))
            members_total += len(members)
            if members_total > limits.max_members:
                raise SnapshotCorrupt(f"section 3: more than {limits.max_members} batch members")
            if members:
                flags |= FLAG_MEMBERS
                owners = np.unique(np.asarray(members.to_array(), dtype=np.uint64) >> MEMBER_BITS)
                if int(owners[-1]) > MAX_ENTRY_ID or not BitMap(owners).issubset(entries):
                    raise SnapshotCorrupt("section 3: batch members of entries not in their group")
            else:
                members = None
        wide_count = r.count("wide batch members", 8, limits.max_wide - wide_total)
        wide_total += wide_count
        wide: tuple[tuple[int, int], ...] = ()
        if wide_count:
            flags |= FLAG_WIDE
            pairs = np.frombuffer(r.take(wide_count * 8, "wide members"), dtype="<u4").reshape(-1, 2)
            wide = tuple((int(e), int(i)) for e, i in pairs.tolist())
            for e, i in wide:
                if e not in entries or not _NARROW <= i <= MAX_BATCH_INDEX:
                    raise SnapshotCorrupt(f"section 3: bad wide batch member ({e}, {i})")
            if len(set(wide)) != len(wide):
                raise SnapshotCorrupt("section 3: repeated wide batch members")
        topic_index, ledger_id = ledgers[ledger_index]
        groups.append(Group(int(bucket), topics[topic_index], int(ledger_id), entries, members, wide))
    r.done()
    if ids != header.id_count:
        raise SnapshotCorrupt(f"section 3: {ids} ids, the header says {header.id_count}")
    if groups and (groups[0].bucket_ms, groups[-1].bucket_ms) != (header.min_due_ms, header.max_due_ms):
        raise SnapshotCorrupt("section 3: the header's due range does not match the groups")
    if flags != header.flags:
        raise SnapshotCorrupt(f"segment: flags {header.flags:#x} do not match the content ({flags:#x})")
    return tuple(groups)


def _bitmap(raw: memoryview) -> BitMap:
    """Deserialize one 32-bit Roaring bitmap (CRoaring's bounds-checked reader plus its structure
    validation, as pyroaring does); an empty buffer is corrupt too."""
    if not len(raw):
        raise SnapshotCorrupt("section 3: empty bitmap encoding")
    try:
        return BitMap.deserialize(raw)  # type: ignore[arg-type]  # any buffer works
    except (ValueError, IndexError, MemoryError) as exc:
        raise SnapshotCorrupt(f"section 3: bad Roaring bitmap: {exc}") from exc


def _bitmap64(raw: memoryview) -> BitMap64:
    """As :func:`_bitmap`, for the 64-bit member bitmaps."""
    if not len(raw):
        raise SnapshotCorrupt("section 3: empty bitmap encoding")
    try:
        return BitMap64.deserialize(raw)  # type: ignore[arg-type]
    except (ValueError, IndexError, MemoryError) as exc:
        raise SnapshotCorrupt(f"section 3: bad Roaring bitmap: {exc}") from exc


def groups_from_rows(rows: Iterable[tuple[int, str, int, BitMap, dict[int, int] | None]]) -> list[Group]:
    """Build groups from ``(bucket, topic, ledger, entries, batch masks or None)`` rows (masks: entry id →
    bitmask of pending batch indexes, for partially pending entries). O(ids + members)."""
    out = []
    for bucket, topic, ledger_id, entries, masks in rows:
        members: BitMap64 | None = None
        wide: list[tuple[int, int]] = []
        if masks:
            members = BitMap64()
            for entry, mask in masks.items():
                base = entry << MEMBER_BITS
                narrow, index = mask & ((1 << _NARROW) - 1), 0
                while narrow:
                    if narrow & 1:
                        members.add(base | index)
                    narrow >>= 1
                    index += 1
                high = mask >> _NARROW
                index = _NARROW
                while high:
                    if high & 1:
                        wide.append((entry, index))
                    high >>= 1
                    index += 1
            if not members:
                members = None
        out.append(Group(bucket, topic, ledger_id, entries, members, tuple(wide)))
    return out
