"""The package's public surface: ``__all__`` pinned, names resolved lazily, and what importing a module
pulls in — the sweep and the index never import the Pulsar client; memory never imports the index."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import pulsar_nack

ROOT = Path(__file__).resolve().parent.parent

EXPORTED = [
    "NATIVE_DELAY_MS",
    "Client",
    "DelayLimitExceeded",
    "DelayLimitedProducer",
    "DueIds",
    "MemoryUsage",
    "MultiplierRedeliveryBackoff",
    "NackConsumer",
    "NackOptions",
    "NackStats",
    "NackTracker",
    "NativeTiming",
    "RedeliveryBackoff",
    "TimeBucketIndex",
    "TimerWheel",
    "wrap",
]


def test_all_is_pinned() -> None:
    assert pulsar_nack.__all__ == EXPORTED


def test_every_exported_name_resolves_and_is_listed() -> None:
    assert all(hasattr(pulsar_nack, name) for name in EXPORTED)
    assert set(EXPORTED) <= set(dir(pulsar_nack))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = pulsar_nack.nothing  # type: ignore[attr-defined]


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
    ],
)
def test_the_pulsar_client_is_not_imported(statement: str) -> None:
    modules = _imported_after(statement)
    assert "pulsar_nack.index" in modules or "pulsar_nack.sweep.grid" in modules
    assert not {"_pulsar", "pulsar"} & modules


def test_the_client_is_imported_on_first_use() -> None:
    modules = _imported_after("import pulsar_nack\nassert pulsar_nack.Client")
    assert {"_pulsar", "pulsar", "pulsar_nack.consumer"} <= modules


def test_memory_does_not_import_the_index() -> None:
    assert "pulsar_nack.index" not in _imported_after("import pulsar_nack.memory")
