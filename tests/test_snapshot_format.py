"""The segment file format: round trips, and a reader that rejects anything else with SnapshotCorrupt and
bounded allocation (hypothesis fuzzing of random bytes, truncations and bit flips; forged files whose
checksums are right but whose lengths lie)."""

from __future__ import annotations

import hashlib
import random
import struct
import tracemalloc
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyroaring import BitMap, BitMap64

from pulsar_nack.snapshot import format as fmt
from pulsar_nack.snapshot.format import (
    HEADER_SIZE,
    Group,
    ReadLimits,
    Segment,
    SnapshotCorrupt,
    decode_segment,
    encode_segment,
    groups_from_rows,
    read_header,
)


def _random_segment(seed: int, *, groups: int = 60, seq: int = 7) -> Segment:
    rng = random.Random(seed)
    topics = [f"persistent://public/default/t-{i}" for i in range(rng.randint(1, 6))] + [""]
    rows = []
    used = set()
    for _ in range(groups):
        bucket = rng.randrange(0, 2**40) & ~255
        topic = rng.choice(topics)
        ledger = rng.randrange(0, 2**63 - 1) if rng.random() < 0.1 else rng.randrange(0, 50)
        if (bucket, topic, ledger) in used:
            continue
        used.add((bucket, topic, ledger))
        if rng.random() < 0.3:
            start = rng.randrange(0, 2**32 - 5000)
            entries = BitMap(range(start, start + rng.randint(1, 4000)))
        else:
            entries = BitMap(rng.randrange(0, 2**32) for _ in range(rng.randint(1, 300)))
        masks = {}
        for entry in rng.sample(sorted(entries), k=min(len(entries), rng.randint(0, 5))):
            mask = 0
            for _ in range(rng.randint(1, 4)):
                mask |= 1 << (rng.randrange(0, 1024) if rng.random() < 0.9 else rng.randrange(1024, 3000))
            masks[entry] = mask
        rows.append((bucket, topic, ledger, entries, masks or None))
    return Segment(seq, tuple(groups_from_rows(rows)), tuple(sorted(rng.sample(range(1, 10**6), 3))))


def _as_rows(segment: Segment) -> list[tuple[int, str, int, list[int], dict[int, int]]]:
    return sorted(
        (g.bucket_ms, g.topic, g.ledger_id, list(g.entries), g.batch_masks()) for g in segment.groups
    )


@pytest.mark.parametrize("seed", range(12))
def test_round_trip_random_segments(seed: int) -> None:
    segment = _random_segment(seed)
    data = encode_segment(segment)
    back = decode_segment(data)
    assert _as_rows(back) == _as_rows(segment)
    assert back.seq == segment.seq and back.supersedes == segment.supersedes
    assert (back.min_due_ms, back.max_due_ms, back.id_count) == (
        segment.min_due_ms,
        segment.max_due_ms,
        segment.id_count,
    )
    header = read_header(data)
    assert header.id_count == segment.id_count and header.payload_length == len(data) - HEADER_SIZE


def test_round_trip_empty_segment_and_wide_batch_indexes() -> None:
    assert decode_segment(encode_segment(Segment(1, ()))).groups == ()
    rows = [(256, "t", 3, BitMap([10, 11]), {10: 1 << 5 | 1 << 1023 | 1 << 1024 | 1 << 70_000})]
    back = decode_segment(encode_segment(Segment(2, tuple(groups_from_rows(rows)))))
    assert back.groups[0].batch_masks() == {10: 1 << 5 | 1 << 1023 | 1 << 1024 | 1 << 70_000}
    assert back.groups[0].wide == ((10, 1024), (10, 70_000))


def test_encoder_does_not_run_optimize_the_callers_bitmap() -> None:
    live = BitMap()
    for entry in range(1000):  # one by one: an array container; run_optimize would make it a run
        live.add(entry)
    assert live.get_statistics()["n_run_containers"] == 0
    encode_segment(Segment(1, (Group(0, "", 1, live),)))
    assert live.get_statistics()["n_run_containers"] == 0


@pytest.mark.parametrize(
    "group",
    [
        Group(0, "", 1, BitMap()),
        Group(0, "", 1, BitMap([1]), BitMap64([5 << 10 | 1])),
        Group(0, "", 1, BitMap([1]), None, ((1, 3),)),
        Group(0, "", 1, BitMap([1]), None, ((2, 2000),)),
    ],
)
def test_encoder_rejects_groups_the_format_cannot_hold(group: Group) -> None:
    with pytest.raises(ValueError):
        encode_segment(Segment(1, (group,)))


def test_module_does_not_use_pickle() -> None:
    source = Path(fmt.__file__).read_text()
    assert "import pickle" not in source and "marshal" not in source


# -- rejecting damaged files ------------------------------------------------------------------------------

_VALID = encode_segment(_random_segment(99, groups=25))


def _decode_or_corrupt(data: bytes) -> Segment | None:
    try:
        return decode_segment(data)
    except SnapshotCorrupt:
        return None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2048))
def test_fuzz_random_bytes_are_rejected(data: bytes) -> None:
    assert _decode_or_corrupt(data) is None
    assert _decode_or_corrupt(fmt.MAGIC + data) is None


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=len(_VALID) - 1))
def test_fuzz_truncations_are_rejected(length: int) -> None:
    with pytest.raises(SnapshotCorrupt):
        decode_segment(_VALID[:length])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(_VALID) - 1), st.integers(0, 7)), min_size=1, max_size=4))
def test_fuzz_bit_flips_are_rejected(flips: list[tuple[int, int]]) -> None:
    data = bytearray(_VALID)
    for offset, bit in flips:
        data[offset] ^= 1 << bit
    if bytes(data) == _VALID:  # flips that cancel out
        return
    with pytest.raises(SnapshotCorrupt):
        decode_segment(bytes(data))


def _forge(payload: bytes, *, ids: int = 1, lo: int = 0, hi: int = 0, flags: int = 0, seq: int = 1) -> bytes:
    """A file with *correct* checksums around an arbitrary payload: what a hostile writer can produce."""
    digest = hashlib.blake2b(payload, digest_size=16).digest()
    head = struct.pack(
        "<8sHHIQqqQQ16sI", fmt.MAGIC, 1, flags, HEADER_SIZE, seq, lo, hi, ids, len(payload), digest, 0
    )
    return head + struct.pack("<I", zlib.crc32(head)) + payload


def _section(tag: int, body: bytes, claimed: int | None = None) -> bytes:
    return struct.pack("<IQ", tag, len(body) if claimed is None else claimed) + body


def _payload(groups: bytes, *, topics: bytes | None = None, ledgers: bytes | None = None) -> bytes:
    topics = struct.pack("<IH", 1, 1) + b"t" if topics is None else topics
    ledgers = struct.pack("<IIQ", 1, 0, 5) if ledgers is None else ledgers
    return (
        _section(1, topics) + _section(2, ledgers) + _section(3, groups) + _section(4, struct.pack("<I", 0))
    )


def _group(entries: bytes, *, bucket: int = 0, members: bytes = b"", wide: bytes = b"\0\0\0\0") -> bytes:
    return (
        struct.pack("<qI", bucket, 0)
        + struct.pack("<I", len(entries))
        + entries
        + struct.pack("<I", len(members))
        + members
        + wide
    )


def test_forged_valid_file_decodes() -> None:
    """The forging helpers write real files: the hostile cases below differ in one field each."""
    data = _forge(_payload(struct.pack("<I", 1) + _group(BitMap([3, 4]).serialize())), ids=2)
    assert _as_rows(decode_segment(data)) == [(0, "t", 5, [3, 4], {})]


_FULL_RANGE = BitMap()
_FULL_RANGE.add_range(0, 2**32)
_FULL_RANGE.run_optimize()
_FULL_MEMBERS = BitMap64()
_FULL_MEMBERS.add_range(0, 2**32)
_FULL_MEMBERS.run_optimize()

_HOSTILE = {
    "section claims 4 GB": _forge(_section(1, b"\0" * 16, claimed=2**32)),
    "section claims 2**63 bytes": _forge(_section(1, b"\0" * 16, claimed=2**63)),
    "topic count 4G": _forge(_payload(struct.pack("<I", 0), topics=struct.pack("<I", 2**32 - 1))),
    "ledger count 4G": _forge(_payload(struct.pack("<I", 0), ledgers=struct.pack("<I", 2**32 - 1))),
    "group count 4G": _forge(_payload(struct.pack("<I", 2**32 - 1)), ids=0),
    "bitmap length 4G": _forge(_payload(struct.pack("<I", 1) + struct.pack("<qII", 0, 0, 2**32 - 1)), ids=1),
    "bitmap of 2**32 ids": _forge(
        _payload(struct.pack("<I", 1) + _group(_FULL_RANGE.serialize())), ids=2**32
    ),
    "bitmap of 2**32 ids, header says 1": _forge(
        _payload(struct.pack("<I", 1) + _group(_FULL_RANGE.serialize()))
    ),
    "wide count 4G": _forge(
        _payload(struct.pack("<I", 1) + _group(BitMap([1]).serialize(), wide=struct.pack("<I", 2**32 - 1))),
        flags=2,
    ),
    "members of 2**32 ids": _forge(
        _payload(struct.pack("<I", 1) + _group(BitMap([1]).serialize(), members=_FULL_MEMBERS.serialize())),
        flags=1,
    ),
    "payload length 4G": _forge(b"")[:48] + struct.pack("<Q", 2**32) + _forge(b"")[56:],
    "ledger with unknown topic": _forge(
        _payload(struct.pack("<I", 0), ledgers=struct.pack("<IIQ", 1, 9, 5)), ids=0
    ),
    "group with unknown ledger": _forge(
        _payload(struct.pack("<I", 1) + struct.pack("<qI", 0, 3) + b"\0" * 12), ids=1
    ),
    "garbage bitmap": _forge(_payload(struct.pack("<I", 1) + _group(b"\x3b\x30\xff\xff" + b"\x00" * 8))),
    "empty bitmap bytes": _forge(_payload(struct.pack("<I", 1) + _group(b""))),
    "member of an entry not in the group": _forge(
        _payload(
            struct.pack("<I", 1) + _group(BitMap([1]).serialize(), members=BitMap64([2 << 10]).serialize())
        ),
        flags=1,
    ),
    "bucket outside the header range": _forge(
        _payload(struct.pack("<I", 1) + _group(BitMap([1]).serialize(), bucket=500)), lo=0, hi=100
    ),
    "future version": _forge(b"")[:8] + struct.pack("<H", 2) + _forge(b"")[10:],
}


@pytest.mark.parametrize("case", sorted(_HOSTILE))
def test_hostile_files_are_rejected_with_bounded_allocation(case: str) -> None:
    data = _HOSTILE[case]
    tracemalloc.start()
    try:
        with pytest.raises(SnapshotCorrupt):
            decode_segment(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000 + 4 * len(data), f"{case}: peak {peak} B"


def test_limits_are_enforced_before_expanding() -> None:
    segment = Segment(1, (Group(0, "", 1, BitMap(range(1000))),))
    data = encode_segment(segment)
    assert decode_segment(data, ReadLimits(max_ids=1000)).id_count == 1000
    with pytest.raises(SnapshotCorrupt, match="ids"):
        decode_segment(data, ReadLimits(max_ids=999))
    with pytest.raises(SnapshotCorrupt, match="limit"):
        decode_segment(data, ReadLimits(max_file_bytes=len(data) - 1))


def test_header_survives_payload_damage_for_loss_reporting() -> None:
    data = bytearray(_VALID)
    data[-1] ^= 0xFF
    with pytest.raises(SnapshotCorrupt, match="payload checksum"):
        decode_segment(bytes(data))
    assert read_header(bytes(data)).id_count == decode_segment(_VALID).id_count
