"""The sweep's grids: grid points and their checks, the JSON format, the built-in grids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pulsar_nack.sweep.grid import GRIDS, GridError, GridPoint, load_grid, parse_grid

# -- grid points -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "error", "field"),
    [
        ({"x": 0}, ValueError, "x"),
        ({"x": 1.5}, TypeError, "x"),
        ({"k": 31}, ValueError, "k"),
        ({"k": True}, TypeError, "k"),
        ({"n": 0}, ValueError, "n"),
        ({"entries_per_ledger": 0}, ValueError, "entries_per_ledger"),
        ({"nack_share": 0.0}, ValueError, "nack_share"),
        ({"nack_share": 1.5}, ValueError, "nack_share"),
        ({"nack_share": "0.1"}, TypeError, "nack_share"),
        ({"batch": 0}, ValueError, "batch"),
        ({"batch": 100_000}, ValueError, "entries_per_ledger × batch"),
        ({"rounding": "round"}, ValueError, "rounding"),
        ({"compact": "yes"}, TypeError, "compact"),
        ({"contender": "treemap"}, ValueError, "contender"),
    ],
)
def test_grid_point_rejects_bad_values_naming_the_field(
    values: dict[str, Any], error: type, field: str
) -> None:
    with pytest.raises(error, match=f"^{field}"):
        GridPoint(**values)


def test_grid_point_normalizes_share_and_labels_itself() -> None:
    point = GridPoint(x=8, k=10, nack_share=1)
    assert isinstance(point.nack_share, float) and point == GridPoint(x=8, k=10)
    assert point.ids_per_bucket == 8192
    assert point.label() == "index x=8 k=10"
    variant = GridPoint(x=8, k=10, nack_share=0.1, batch=4, rounding="ceil", compact=False)
    assert variant.label() == "index x=8 k=10 sparse 0.1 batch 4 ceil no-compact"


# -- grids ---------------------------------------------------------------------------------------------


def test_parse_grid_expands_products_in_order_with_defaults() -> None:
    points = parse_grid(
        {
            "defaults": {"n": 1000, "x": 2},
            "grids": [{"x": [1, 4], "k": [3, 5]}, {"contender": ["hashmap", "heap"], "k": 1}],
        }
    )
    assert [(p.contender, p.x, p.k, p.n) for p in points] == [
        ("index", 1, 3, 1000),
        ("index", 1, 5, 1000),
        ("index", 4, 3, 1000),
        ("index", 4, 5, 1000),
        ("hashmap", 2, 1, 1000),
        ("heap", 2, 1, 1000),
    ]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ([], "must be a JSON object"),
        ({"grids": [{"x": 1}], "extra": 1}, r"unknown key\(s\) \['extra'\]"),
        ({"grids": []}, "'grids' must be a non-empty list"),
        ({"grids": [{"x": 1}], "defaults": [1]}, "'defaults' must be an object"),
        ({"grids": [{"x": 1}], "defaults": {"speed": 1}}, r"defaults: unknown field\(s\) \['speed'\]"),
        ({"grids": [{"x": 1}, {"y": [1]}]}, r"grids\[1\]: unknown field\(s\) \['y'\]"),
        ({"grids": [{"x": []}]}, r"grids\[0\]: 'x' is an empty list"),
        ({"grids": [{"x": [1, -1]}]}, r"grids\[0\]: x must be >= 1"),
        ({"grids": [{"x": [1, 2]}, {"x": 2}]}, r"grids\[1\] repeats the point index x=2 k=8 of .*grids\[0\]"),
        ({"grids": ["x"]}, r"grids\[0\] must be a non-empty object"),
    ],
)
def test_parse_grid_errors_name_the_source_and_the_bad_part(spec: Any, message: str) -> None:
    with pytest.raises(GridError, match=f"^my.json: .*{message}"):
        parse_grid(spec, "my.json")


def test_default_grid_is_the_issues_48_points_and_the_baselines() -> None:
    points = load_grid("default")
    index = [p for p in points if p.contender == "index"]
    assert [(p.x, p.k) for p in index] == [
        (x, k) for x in (1, 2, 4, 8, 16, 32) for k in (0, 4, 8, 10, 12, 15, 16, 18)
    ]
    assert all(p.n == 200_000 and p.nack_share == 1.0 and p.batch == 1 and p.compact for p in points)
    assert [p.contender for p in points[48:]] == ["hashmap", "heap"]


def test_small_grid_touches_every_axis() -> None:
    points = load_grid("small")
    assert len(points) <= 16 and all(p.n <= 20_000 for p in points)
    assert {p.contender for p in points} == {"index", "hashmap", "heap"}
    assert any(p.nack_share < 1 for p in points) and any(p.batch > 1 for p in points)
    assert {p.rounding for p in points} == {"floor", "ceil"} and {p.compact for p in points} == {True, False}


def test_load_grid_reads_a_json_file(tmp_path: Path) -> None:
    path = tmp_path / "grid.json"
    path.write_text(json.dumps({"grids": [{"x": 3, "k": [1, 2], "n": 500}]}))
    assert load_grid(str(path)) == [GridPoint(x=3, k=1, n=500), GridPoint(x=3, k=2, n=500)]


def test_load_grid_errors(tmp_path: Path) -> None:
    with pytest.raises(GridError, match="'nope' is neither a built-in grid \\(default, small\\) nor a file"):
        load_grid("nope")
    broken = tmp_path / "broken.json"
    broken.write_text("{'grids': ")
    with pytest.raises(GridError, match=f"grid file {broken} is not valid JSON"):
        load_grid(str(broken))
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"grids": [{"k": 99}]}))
    with pytest.raises(GridError, match=rf"grid file {wrong}: grids\[0\]: k must be in 0..30"):
        load_grid(str(wrong))


def test_builtin_grids_parse() -> None:
    for name, spec in GRIDS.items():
        assert parse_grid(spec) == load_grid(name)

