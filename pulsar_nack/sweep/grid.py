"""The sweep's grids: :class:`GridPoint` (one experiment) and grids of them from a small JSON format.

A :class:`GridPoint` names one experiment of the TimeBucket blog's memory analysis (§3.2): a tracker
(``contender``) is fed ``n`` nacked ids of the blog's workload (``x`` ids per ms, ``entries_per_ledger``
entries per ledger, a ``nack_share`` of the message stream nacked, ``batch`` messages per entry);
:func:`pulsar_nack.sweep.measure.measure` measures it. Grids are lists of points, built from a small
JSON format (:func:`parse_grid`, :func:`load_grid`); ``default`` is 48 (x, k) points (x = 1, 2, 4, 8, 16,
32 ids per ms; k = 0, 4, 8, 10, 12, 15, 16, 18) plus one point per baseline, ``small`` a dozen quick points
that touch every axis.

:func:`parse_points` parses the same format into points of another class (``bench/`` uses it).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Final, Literal, Protocol, TypeVar, get_args

from pulsar_nack.index import MAX_ENTRY_ID, MAX_PRECISION_BITS, Rounding

__all__ = [
    "CONTENDERS",
    "GRIDS",
    "Contender",
    "GridError",
    "GridPoint",
    "load_grid",
    "parse_grid",
    "parse_points",
]

Contender = Literal["index", "hashmap", "heap"]
CONTENDERS: Final[tuple[str, ...]] = get_args(Contender)


@dataclass(frozen=True)
class GridPoint:
    """One experiment of the sweep.

    ``x`` ids per ms and ``k`` precision bits make the nominal bucket size ``M = x·2^k`` ids.
    ``nack_share`` is the share of the consecutive message stream that is nacked (1.0 = dense; below 1
    the messages are chosen by SplitMix64, as in :class:`~pulsar_nack.sweep.workloads.Workload`). ``batch``
    messages make one entry: with ``batch > 1`` every id carries a batch index (``0..batch-1``), and the
    index tracks those per entry; ``batch == 1`` means plain, non-batched entries. ``compact`` calls
    :meth:`TimeBucketIndex.compact` after building (baselines have nothing to compact). ``rounding`` is
    the index's bucket rounding. Every value is checked on construction; errors name the field.
    """

    contender: Contender = "index"
    x: int = 8
    k: int = 8
    n: int = 200_000
    entries_per_ledger: int = 50_000
    nack_share: float = 1.0
    batch: int = 1
    rounding: Rounding = "floor"
    compact: bool = True

    def __post_init__(self) -> None:
        for name in ("x", "k", "n", "entries_per_ledger", "batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r}")
        if isinstance(self.nack_share, bool) or not isinstance(self.nack_share, int | float):
            raise TypeError(f"nack_share must be a number, got {self.nack_share!r}")
        object.__setattr__(self, "nack_share", float(self.nack_share))
        if not isinstance(self.compact, bool):
            raise TypeError(f"compact must be true or false, got {self.compact!r}")
        if self.contender not in CONTENDERS:
            raise ValueError(f"contender must be one of {', '.join(CONTENDERS)}, got {self.contender!r}")
        if self.rounding not in get_args(Rounding):
            raise ValueError(f"rounding must be 'floor' or 'ceil', got {self.rounding!r}")
        if self.x < 1:
            raise ValueError(f"x must be >= 1 id per ms, got {self.x}")
        if not 0 <= self.k <= MAX_PRECISION_BITS:
            raise ValueError(f"k must be in 0..{MAX_PRECISION_BITS}, got {self.k}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if not 0.0 < self.nack_share <= 1.0:
            raise ValueError(f"nack_share must be in (0, 1], got {self.nack_share}")
        if self.entries_per_ledger < 1:
            raise ValueError(f"entries_per_ledger must be >= 1, got {self.entries_per_ledger}")
        if self.batch < 1:
            raise ValueError(f"batch must be >= 1 message per entry, got {self.batch}")
        if self.entries_per_ledger * self.batch > MAX_ENTRY_ID:
            raise ValueError(
                f"entries_per_ledger × batch must be <= {MAX_ENTRY_ID}, got "
                f"{self.entries_per_ledger} × {self.batch}"
            )

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> GridPoint:
        """The point a row of :func:`~pulsar_nack.sweep.measure.measure` (or any mapping holding every
        field) was measured at."""
        return cls(**{name: row[name] for name in _FIELDS})

    @property
    def ids_per_bucket(self) -> int:
        """The nominal bucket size M = x·2^k (a bucket holds at most n ids)."""
        return self.x << self.k

    def label(self) -> str:
        """A short human label, e.g. ``index x=8 k=10 sparse 0.1 batch 4 ceil no-compact``."""
        parts = [self.contender, f"x={self.x}", f"k={self.k}"]
        if self.nack_share < 1.0:
            parts.append(f"sparse {self.nack_share:g}")
        if self.batch > 1:
            parts.append(f"batch {self.batch}")
        if self.rounding != "floor":
            parts.append(self.rounding)
        if not self.compact:
            parts.append("no-compact")
        return " ".join(parts)


# -- grids -------------------------------------------------------------------------------------------


class GridError(ValueError):
    """A grid name, file or specification that cannot be turned into grid points."""


#: Built-in grids, in the JSON format of :func:`parse_grid`.
GRIDS: Final[dict[str, dict[str, Any]]] = {
    # 48 (x, k) points of the index, plus each baseline once (their memory depends on
    # neither x nor k), 200,000 ids each.
    "default": {
        "defaults": {"n": 200_000},
        "grids": [
            {"contender": "index", "x": [1, 2, 4, 8, 16, 32], "k": [0, 4, 8, 10, 12, 15, 16, 18]},
            {"contender": ["hashmap", "heap"], "x": 8, "k": 10},
        ],
    },
    # A dozen points that touch every axis, 20,000 ids each: for tests and the notebook.
    "small": {
        "defaults": {"n": 20_000},
        "grids": [
            {"contender": "index", "x": [1, 8], "k": [4, 8, 12]},
            {"contender": "index", "x": 8, "k": 10, "nack_share": 0.1},
            {"contender": "index", "x": 8, "k": 10, "batch": 4},
            {"contender": "index", "x": 8, "k": 10, "rounding": "ceil"},
            {"contender": "index", "x": 8, "k": 10, "compact": False},
            {"contender": ["hashmap", "heap"], "x": 8, "k": 10},
        ],
    },
}

_FIELDS: Final = tuple(f.name for f in fields(GridPoint))


def parse_grid(spec: Any, source: str = "grid") -> list[GridPoint]:
    """Expand a grid specification into points, in order. O(points).

    The format (JSON)::

        {"defaults": {"n": 200000},                     # optional: values for every point
         "grids": [{"x": [1, 2, 4], "k": [8, 10]},      # a product: x outer, k inner
                   {"contender": ["hashmap", "heap"]}]} # scalars and lists mix freely

    Each entry of ``grids`` is the Cartesian product of its values (a scalar is a one-value list),
    first key outermost; fields left out come from ``defaults``, then from :class:`GridPoint`. Fields
    are those of :class:`GridPoint`. Raises :class:`GridError` naming ``source`` and the bad part.
    """
    return parse_points(spec, source, GridPoint, _FIELDS)


def load_grid(grid: str) -> list[GridPoint]:
    """The points of a built-in grid (``default``, ``small``) or of a JSON grid file. O(points).

    Raises :class:`GridError` when ``grid`` is neither a built-in name nor a readable file, or the file
    is not valid JSON in :func:`parse_grid`'s format.
    """
    if grid in GRIDS:
        return parse_grid(GRIDS[grid], f"grid {grid!r}")
    path = Path(grid)
    if not path.is_file():
        raise GridError(f"{grid!r} is neither a built-in grid ({', '.join(GRIDS)}) nor a file")
    try:
        spec = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as error:
        raise GridError(f"cannot read grid file {grid}: {error}") from None
    except json.JSONDecodeError as error:
        raise GridError(f"grid file {grid} is not valid JSON: {error}") from None
    return parse_grid(spec, f"grid file {grid}")


def _check_fields(values: Mapping[str, Any], where: str, names: Sequence[str] = _FIELDS) -> None:
    unknown = [name for name in values if name not in names]
    if unknown:
        raise GridError(f"{where}: unknown field(s) {unknown}; fields are {', '.join(names)}")


class _Point(Protocol, Hashable):
    def label(self) -> str: ...


P = TypeVar("P", bound=_Point)


def parse_points(spec: Any, source: str, cls: type[P], names: Sequence[str]) -> list[P]:
    """:func:`parse_grid`'s format for points of another frozen dataclass ``cls`` with the fields ``names``
    (a point must be hashable and have a ``label()``: repeated points are an error). O(points)."""
    if not isinstance(spec, Mapping):
        raise GridError(f"{source}: must be a JSON object with 'grids' (and optional 'defaults')")
    unknown = set(spec) - {"defaults", "grids"}
    if unknown:
        raise GridError(
            f"{source}: unknown key(s) {sorted(unknown)}; expected 'grids' and optional 'defaults'"
        )
    defaults = spec.get("defaults", {})
    if not isinstance(defaults, Mapping):
        raise GridError(f"{source}: 'defaults' must be an object of field values")
    _check_fields(defaults, f"{source}: defaults", names)
    grids = spec.get("grids")
    if not isinstance(grids, list) or not grids:
        raise GridError(f"{source}: 'grids' must be a non-empty list of objects")
    points: list[P] = []
    seen: dict[P, str] = {}
    for i, grid in enumerate(grids):
        where = f"{source}: grids[{i}]"
        if not isinstance(grid, Mapping) or not grid:
            raise GridError(f"{where} must be a non-empty object of field values")
        _check_fields(grid, where, names)
        for values in _product(grid, where):
            try:
                point = cls(**{**defaults, **values})
            except (TypeError, ValueError) as error:
                raise GridError(f"{where}: {error}") from None
            if point in seen:
                raise GridError(f"{where} repeats the point {point.label()} of {seen[point]}")
            seen[point] = where
            points.append(point)
    return points


def _product(grid: Mapping[str, Any], where: str) -> Iterator[dict[str, Any]]:
    axes: list[Sequence[Any]] = []
    for name, value in grid.items():
        if isinstance(value, list):
            if not value:
                raise GridError(f"{where}: '{name}' is an empty list")
            axes.append(value)
        else:
            axes.append([value])
    for combination in itertools.product(*axes):
        yield dict(zip(grid, combination, strict=True))
