"""Honest memory accounting for nack trackers.

Two views that must agree (the benchmark checks they do, within a few per cent):

* **From inside** — ``TimeBucketIndex.memory_usage()`` walks the index with these primitives:
  :func:`python_bytes` counts Python objects at the size CPython's allocator really hands out (pymalloc
  blocks are multiples of 16 bytes; objects over 512 bytes go to ``malloc``), :func:`bitmap_heap_bytes`
  CRoaring's C heap read from each bitmap's ``roaring_bitmap_t`` with glibc's ``malloc_usable_size``.
  ``sys.getsizeof`` and ``pympler.asizeof`` report a bitmap's *serialized* size instead, which is neither
  an upper nor a lower bound.
* **From outside** — :func:`heap_in_use` is what the process holds right now: pymalloc's allocated
  blocks plus glibc's in-use chunks (``mallinfo2``). The two are disjoint (pymalloc arenas are mmap-ed,
  not malloc-ed), so a delta of ``heap_in_use()`` around building a structure in a fresh process is its
  retained size — if that process runs with :data:`MEASURING_ENV`, which turns glibc's per-thread cache
  off: chunks freed into it still count as in use (10–20 KB after building anything). RSS would hide
  memory that glibc keeps after ``run_optimize`` frees it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import sys
import tempfile
from array import array
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

from pyroaring import AbstractBitMap, AbstractBitMap64, BitMap

__all__ = [
    "MEASURING_ENV",
    "MemoryUsage",
    "bitmap64_heap_bytes",
    "bitmap_heap_bytes",
    "heap_in_use",
    "python_bytes",
    "release_free_heap",
    "shared_bitmap64_heap_bytes",
]

#: Environment for a process that measures with :func:`heap_in_use`: no glibc tcache, whose freed
#: chunks mallinfo2 would count as in use.
MEASURING_ENV = {"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}


@dataclass(frozen=True)
class MemoryUsage:
    """Bytes held by a tracker: Python objects and CRoaring's C heap."""

    python_bytes: int
    roaring_bytes: int
    ids: int
    breakdown: dict[str, int] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return self.python_bytes + self.roaring_bytes

    @property
    def bytes_per_entry(self) -> float:
        return self.total_bytes / self.ids if self.ids else 0.0


# -- glibc ------------------------------------------------------------------------------------------


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _load_libc() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_usable_size.restype = ctypes.c_size_t
        libc.malloc_usable_size.argtypes = [ctypes.c_void_p]
        libc.mallinfo2.restype = _MallInfo2
        libc.malloc_trim.restype = ctypes.c_int
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        return libc
    except (OSError, AttributeError):  # not glibc (musl, macOS): fall back to estimates
        return None


_LIBC = _load_libc()
_CHUNK_HEADER = 8  # glibc keeps the chunk size in front of each allocation


def _chunk(address: int) -> int:
    """Bytes glibc holds for the allocation at ``address`` (usable size + header)."""
    return int(_LIBC.malloc_usable_size(address)) + _CHUNK_HEADER if address else 0


# -- CRoaring ----------------------------------------------------------------------------------------


class _RoaringArray(ctypes.Structure):
    """``roaring_array_t``, the only member of ``roaring_bitmap_t`` (CRoaring 1.x–4.x, roaring.h)."""

    _fields_ = [
        ("size", ctypes.c_int32),
        ("allocation_size", ctypes.c_int32),
        ("containers", ctypes.c_void_p),
        ("keys", ctypes.c_void_p),
        ("typecodes", ctypes.c_void_p),
        ("flags", ctypes.c_uint8),
    ]


class _Container(ctypes.Structure):
    """The common layout of CRoaring's containers: the payload pointer sits at offset 8 in all three."""

    _fields_ = [("count", ctypes.c_int32), ("capacity", ctypes.c_int32), ("payload", ctypes.c_void_p)]


_BITSET, _ARRAY, _RUN = 1, 2, 3
_BITSET_BYTES = 8192


def bitmap_heap_bytes(bitmap: BitMap) -> int:
    """CRoaring heap bytes of one bitmap, as glibc accounts them. O(containers).

    Reads the ``roaring_bitmap_t`` behind ``bitmap.raw_pointer`` and asks glibc for each allocation's
    real size. If the layout does not look like the one described above (another CRoaring, another
    libc), falls back to an estimate from ``get_statistics()``.
    """
    if _LIBC is not None:
        measured = _walk_bitmap(bitmap.raw_pointer)
        if measured is not None:
            return measured
    return _estimate_bitmap(bitmap)


def _walk_bitmap(address: int) -> int | None:
    array = _RoaringArray.from_address(address)
    size, capacity = array.size, array.allocation_size
    # keys and typecodes live in the same allocation as the container pointers, right after them.
    if not (0 <= size <= capacity <= 65536):
        return None
    if capacity and (
        array.keys != array.containers + 8 * capacity or array.typecodes != array.keys + 2 * capacity
    ):
        return None
    total = _chunk(address) + (_chunk(array.containers) if capacity else 0)
    if not size:
        return total
    # Copies into temporary bytes: a ``(c_void_p * size)`` array type would stay in ctypes' type cache,
    # one per distinct size (~75 KB after a few hundred sizes), for as long as the process lives.
    pointers = memoryview(ctypes.string_at(array.containers, 8 * size)).cast("Q")
    typecodes = ctypes.string_at(array.typecodes, size)
    for pointer, typecode in zip(pointers, typecodes, strict=True):
        if typecode not in (_BITSET, _ARRAY, _RUN) or not pointer:
            return None
        # array/run: {int32 n; int32 capacity; payload*}; bitset: {int32 cardinality; words*} (same offset)
        payload = _Container.from_address(pointer).payload
        total += _chunk(pointer) + _chunk(payload or 0)
    return total


def bitmap64_heap_bytes(bitmap: Any) -> int:
    """CRoaring's heap for a 64-bit bitmap (an adaptive radix tree of containers), estimated from its
    statistics — the 64-bit bitmap has no layout we can walk. O(1).

    A model fitted to glibc's in-use bytes around building 2,000 bitmaps of each shape the index makes
    (members ``entry << 10 | batch index`` of consecutive entries: 1–16 containers), within 10 % there
    (``tests/test_memory.py`` checks it): the bitmap and its tree root, ~60 bytes per container for the
    first 16 (container struct and tree leaf), ~100 beyond (inner tree nodes), and array payloads with
    their growth headroom (~1.8 bytes per payload byte).
    """
    stats = bitmap.get_statistics()
    containers = stats["n_containers"]
    if not containers:
        return _BITMAP64_EMPTY
    payload = (
        stats["n_bytes_array_containers"]
        + stats["n_bytes_run_containers"]
        + stats["n_bytes_bitset_containers"]
    )
    tree = 60 * min(containers, 16) + 100 * max(containers - 16, 0)
    return int(_BITMAP64_BASE + tree + 1.8 * payload)


_BITMAP64_BASE = 321  # the roaring64 struct and the tree's root, with glibc's chunk headers
_BITMAP64_EMPTY = 208  # measured like the rest


def shared_bitmap64_heap_bytes(bitmap: Any, shrunk: bool) -> int:
    """CRoaring's heap for one of the index's shared bitmaps (the small slots of one bucket, codes with
    the low bits of the ledger's ordinal below the entry id, see ``pulsar_nack.index._Layout``: a
    container holds the ids of up to 2**b ledgers, from one to a few thousand values), estimated from its
    statistics. O(1).

    A linear model fitted (least relative squares) to glibc's in-use bytes around building bitmaps of 1
    to 300 ledgers × 1 to 100 ids each, entry ids spread over 500 to 60,000, value by value in random
    order: a fixed part per bitmap, a part per container (container struct, tree leaf, inner nodes, slot
    in the container array) and each container's payload in glibc chunks. ``shrunk`` (after
    ``shrink_to_fit``, what compact() does): payloads are exact, within 5 % on those shapes. As built, an
    array container's capacity is the first step of CRoaring's growth sequence (:data:`_ARRAY_CAPACITIES`,
    measured) at or above its cardinality — taken at the bitmap's average cardinality, so within 15 %
    (``tests/test_memory.py`` checks both).
    """
    stats = bitmap.get_statistics()
    containers = stats["n_containers"]
    if not containers:
        return _BITMAP64_EMPTY
    payload = 0
    arrays = stats["n_array_containers"]
    if arrays:
        average = stats["n_values_array_containers"] / arrays
        values = round(average) if shrunk else _array_capacity(average)
        payload += arrays * _malloc_chunk(2 * values)
    runs = stats["n_run_containers"]
    if runs:
        payload += runs * _malloc_chunk(stats["n_bytes_run_containers"] // runs)
    payload += stats["n_bitset_containers"] * (_BITSET_BYTES + 64)  # aligned allocation
    fixed, per_container, per_payload_byte = _SHARED_SHRUNK if shrunk else _SHARED_GROWN
    return int(fixed + per_container * containers + per_payload_byte * payload)


_SHARED_SHRUNK = (262.4, 88.4, 1.0)  # bytes: per bitmap, per container, per payload chunk byte
_SHARED_GROWN = (221.7, 126.6, 0.97)

#: The capacities (values) an array container grows through as values are added one by one (CRoaring:
#: x2 below 64, x1.5 below 1024, x1.25 beyond, at most 4096), read off glibc's in-use bytes.
_ARRAY_CAPACITIES = (4, 8, 16, 32, 64, 96, 144, 216, 324, 486, 729, 1093, 1366, 1707, 2133, 2666, 3332, 4096)


def _array_capacity(values: float) -> int:
    """The capacity of an array container grown to hold ``values`` values. O(1)."""
    return _ARRAY_CAPACITIES[min(bisect_left(_ARRAY_CAPACITIES, values), len(_ARRAY_CAPACITIES) - 1)]


def _malloc_chunk(size: int) -> int:
    """glibc's chunk for a ``malloc(size)``: size + 8-byte header, 16-byte aligned, at least 32."""
    return max(32, (size + _CHUNK_HEADER + 15) & ~15)


def _estimate_bitmap(bitmap: BitMap) -> int:
    stats = bitmap.get_statistics()
    containers = stats["n_containers"]
    payload = (
        stats["n_bytes_array_containers"]
        + stats["n_bytes_run_containers"]
        + stats["n_bytes_bitset_containers"]
    )
    return 48 + (32 if containers else 0) + containers * (11 + 32 + 16) + payload


# -- Python objects ---------------------------------------------------------------------------------

_SMALL_REQUEST = 512  # pymalloc serves requests up to this size from its pools
#: Whether pymalloc serves small objects: unless ``PYTHONMALLOC`` names another allocator (read at
#: startup). A process measuring with ``PYTHONMALLOC=malloc`` has every object in a glibc chunk (an int:
#: 48 bytes there, 32 from pymalloc), and what it reports must be what it holds.
_PYMALLOC = os.environ.get("PYTHONMALLOC", "") in ("", "default", "debug", "pymalloc", "pymalloc_debug")


#: Containers whose items live in an allocation of their own (a list's item array, a dict's or set's
#: table, an array's buffer): ``sys.getsizeof`` of an empty one, the object without it. An allocation has
#: its own rounding and header: a one-item ``array('q')`` takes chunks of 96 + 32 bytes under
#: ``PYTHONMALLOC=malloc``, not the 96 of its 88 bytes as one (a bucket time's chunk at k = 0: -8.6 %
#: reported at 1 topic, batches of 100, every message nacked, 1 h).
_SEPARATE_ITEMS: dict[type, int] = {
    list: sys.getsizeof([]),
    dict: sys.getsizeof({}),
    set: sys.getsizeof(set()),
    array: sys.getsizeof(array("b")),
}


def python_bytes(obj: object) -> int:
    """Bytes the allocator hands out for ``obj`` itself (a dict's or list's table included), not what it
    refers to. O(1)."""
    size = sys.getsizeof(obj)
    if isinstance(obj, AbstractBitMap | AbstractBitMap64):
        size = type(obj).__basicsize__  # getsizeof reports the serialized size here
    empty = _SEPARATE_ITEMS.get(type(obj))
    if empty is not None and size > empty:
        return _allocated(empty) + _allocated(size - empty)
    return _allocated(size)


def _allocated(size: int) -> int:
    if size <= _SMALL_REQUEST and _PYMALLOC:
        return (size + 15) & ~15
    return _malloc_chunk(size)


def release_free_heap() -> bool:
    """Give the free memory in glibc's heap back to the system (``malloc_trim(0)``: whole free pages
    anywhere in the heap, not only at its top); True if some was released. Without it, memory freed after
    a peak stays resident (glibc raises its trim threshold after freeing large blocks, e.g. numpy's
    temporaries). No-op (False) without glibc. O(heap's free chunks): ~0.2 ms on a 50 MB heap with
    nothing to give back, 2-3 ms releasing 20 MB; it holds glibc's arena lock meanwhile."""
    if _LIBC is None:
        return False
    return bool(_LIBC.malloc_trim(0))


# -- from outside -----------------------------------------------------------------------------------

_ALLOCATED_BLOCKS = re.compile(rb"# bytes in allocated blocks\s*=\s*([\d,]+)")


def rss_bytes() -> int:
    """This process's resident set size (``/proc/self/statm``, pages x page size), bytes. O(1). Linux only."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def heap_in_use() -> int:
    """Bytes this process holds in pymalloc blocks plus glibc in-use chunks. O(heap metadata).

    Use deltas around building something in a fresh process started with :data:`MEASURING_ENV`
    (``gc.collect()`` first). Needs glibc.
    """
    if _LIBC is None:
        raise RuntimeError("heap_in_use needs glibc (mallinfo2)")
    info = _LIBC.mallinfo2()
    return _pymalloc_allocated() + int(info.uordblks) + int(info.hblkhd)


def _pymalloc_allocated() -> int:
    """pymalloc's "bytes in allocated blocks", read from ``sys._debugmallocstats()`` (it prints to fd 2)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as out:
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        match = _ALLOCATED_BLOCKS.search(out.read())
    if match is None:  # PYTHONMALLOC=malloc: everything is in mallinfo2 already
        return 0
    return int(match.group(1).replace(b",", b""))
