"""The package's public surface: ``__all__`` pinned (the SDK at the top level, the building blocks in
``pulsar_nack.lowlevel``), names resolved lazily, and what importing a module pulls in — the sweep, the
index and lowlevel never import the Pulsar client; memory never imports the index."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import pulsar_nack
import pulsar_nack.lowlevel

ROOT = Path(__file__).resolve().parent.parent

EXPORTED = [
    "Client",
    "NackConsumer",
    "NackOptions",
    "wrap",
    "NackStats",
    "NATIVE_DELAY_MS",
    "MultiplierRedeliveryBackoff",
    "RedeliveryBackoff",
    "DelayLimitedProducer",
    "DelayLimitExceeded",
]
LOWLEVEL = [
    "DueIds",
    "MemoryUsage",
    "NackIndex",
    "NackTracker",
    "NativeTiming",
    "TimeBucketIndex",
    "TimerWheel",
]


def test_all_is_pinned() -> None:
    assert pulsar_nack.__all__ == EXPORTED
    assert pulsar_nack.lowlevel.__all__ == LOWLEVEL
    assert not set(EXPORTED) & set(LOWLEVEL)


def test_type_checkers_see_the_exported_names() -> None:
    """The ``TYPE_CHECKING`` imports of ``__init__.py`` re-export exactly ``__all__``, each from the module
    the lazy import takes it from."""
    tree = ast.parse((ROOT / "pulsar_nack" / "__init__.py").read_text())
    guarded = next(node for node in tree.body if isinstance(node, ast.If))
    seen = {
        alias.asname: node.module
        for node in guarded.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.asname == alias.name
    }
    assert seen == pulsar_nack._EXPORTS


def test_every_exported_name_resolves_and_is_listed() -> None:
    assert all(hasattr(pulsar_nack, name) for name in EXPORTED)
    assert set(EXPORTED) <= set(dir(pulsar_nack))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = pulsar_nack.nothing  # type: ignore[attr-defined]  # mypy rejects it too


def _imported_after(statement: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``statement`` (from the repository root)."""
    code = f"import sys\n{statement}\nprint('\\n'.join(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


@pytest.mark.parametrize(
    "statement",
    [
        "import pulsar_nack.sweep.grid, pulsar_nack.sweep.measure, pulsar_nack.sweep.spark, "
        "pulsar_nack.sweep.report, pulsar_nack.sweep.plots",
        "import pulsar_nack.index, pulsar_nack.timer",
        "import pulsar_nack.lowlevel",
        "import pulsar_nack.native, pulsar_nack.index",
    ],
)
def test_the_pulsar_client_is_not_imported(statement: str) -> None:
    modules = _imported_after(statement)
    assert {"pulsar_nack.index", "pulsar_nack.sweep.grid"} & modules
    assert not {"_pulsar", "pulsar"} & modules


def test_the_client_is_imported_on_first_use() -> None:
    modules = _imported_after("import pulsar_nack\nassert pulsar_nack.Client")
    assert {"_pulsar", "pulsar", "pulsar_nack.consumer"} <= modules


def test_memory_does_not_import_the_index() -> None:
    assert "pulsar_nack.index" not in _imported_after("import pulsar_nack.memory")


#: The nack options of subscribe/wrap, under their names (Java's ConsumerBuilder / PIP-393 in snake case).
NACK_OPTIONS = {
    "negative_ack_redelivery_delay_ms",
    "negative_ack_precision_bit_cnt",
    "negative_ack_rounding",
    "negative_ack_redelivery_backoff",
    "max_redelivery_delay_ms",
    "on_delay_limit",
    "on_close",
    "on_redelivery",
    "max_held_chunked_bytes",
    "snapshot_dir",
    "snapshot_storage",
    "fast_receive",
}


def _keyword_only(function: Any) -> set[str]:
    parameters = inspect.signature(function).parameters.values()
    return {p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}


def test_the_nack_options_are_one_definition_every_entry_point_shows() -> None:
    """``NackOptions`` defines them; ``wrap`` and both ``subscribe`` accept and show the same ones (current
    names only; the deprecated aliases are accepted, not shown), after every official argument."""
    import pulsar
    import pulsar.asyncio

    from pulsar_nack import aio
    from pulsar_nack.options import NACK_ARGUMENTS

    official = "negative_ack_redelivery_delay_ms"  # the official subscribe's own argument
    assert _keyword_only(pulsar_nack.wrap) == NACK_OPTIONS | {"native_delay_ms"}
    assert _keyword_only(pulsar_nack.Client.subscribe) == NACK_OPTIONS - {official}
    assert _keyword_only(aio.Client.subscribe) == (NACK_OPTIONS - {official}) | {"message_listener"}
    for ours, theirs in (
        (pulsar_nack.Client.subscribe, pulsar.Client.subscribe),
        (aio.Client.subscribe, pulsar.asyncio.Client.subscribe),
    ):
        official_names = list(inspect.signature(theirs).parameters)
        assert list(inspect.signature(ours).parameters)[: len(official_names)] == official_names
    deprecated = {"negative_ack_precision_bits", "negative_ack_backoff"}
    assert set(NACK_ARGUMENTS) == NACK_OPTIONS | deprecated


def _runtime_imports(path: Path) -> set[str]:
    """The modules ``path`` imports when it runs (imports under ``if TYPE_CHECKING:`` left out)."""
    tree = ast.parse(path.read_text())
    checking = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
    ]
    skipped = {id(inner) for node in checking for inner in ast.walk(node)}
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names.add(node.module)
    return names


def test_only_the_native_module_imports_the_clients_native_binding() -> None:
    """``_pulsar`` (pulsar-client's C++ binding) is imported by ``pulsar_nack.native.client`` alone: every
    other module reaches native objects through it (type annotations aside)."""
    package = ROOT / "pulsar_nack"
    importers = {
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if any(name == "_pulsar" or name.startswith("_pulsar.") for name in _runtime_imports(path))
    }
    assert importers == {"native/client.py"}


def _unit_imports() -> dict[str, set[str]]:
    """Each top-level module or subpackage of the package → the others it imports when it runs."""
    package = ROOT / "pulsar_nack"
    edges: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        unit = path.relative_to(package).parts[0].removesuffix(".py")
        for name in _runtime_imports(path):
            parts = name.split(".")
            if parts[0] == "pulsar_nack" and len(parts) > 1 and parts[1] != unit and unit != "__init__":
                edges.setdefault(unit, set()).add(parts[1])
    return edges


def test_no_module_or_subpackage_imports_one_that_imports_it_back() -> None:
    """The package's modules and subpackages form no import cycle (data flows one way: the tracker does
    not import ``snapshot/``, whose keeper and wiring import the tracker)."""
    edges = _unit_imports()
    for start in edges:
        seen: set[str] = set()
        frontier = [start]
        while frontier:
            for following in edges.get(frontier.pop(), ()):
                assert following != start, f"{start} imports itself back through {sorted(seen)}"
                if following not in seen:
                    seen.add(following)
                    frontier.append(following)


#: The official client's private attributes the wrapper reads on its objects.
CLIENT_PRIVATES = {"_message", "_schema", "_consumer", "_client", "_consumers"}


def test_only_the_native_module_and_the_per_message_paths_read_the_clients_private_attributes() -> None:
    """``X._message`` (and the other privates of pulsar-client's objects) on anything but ``self`` appears
    in ``native/client.py`` and the per-message paths only (bridge, the two consumers: a call costs a
    frame a message there): see native/client's docstring."""
    package = ROOT / "pulsar_nack"
    readers = {
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute)
        and node.attr in CLIENT_PRIVATES
        and not (isinstance(node.value, ast.Name) and node.value.id == "self")
    }
    assert readers == {"native/client.py", "bridge.py", "consumer.py", "aio.py"}
