"""The ``apache`` marker (tests/conftest.py): ``-m 'not apache'`` runs no test that needs Apache Pulsar.

Tests pick their broker three ways: the ``broker`` fixture's parameter, the ``apache_pulsar`` or
``require_apache`` fixture, or a parameter of their own (``kind``) and ``request.getfixturevalue``. The
last used to escape the marker (8 tests started Apache Pulsar under ``-m 'not apache'``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def _pytest(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS), *sys.path])}
    env.pop("PULSAR_NACK_REQUIRE_APACHE", None)  # (a skip, not a failure, in the control run below)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _looks_apache(nodeid: str) -> bool:
    """A node id with a parameter id ``apache`` (``test_x[apache]``, ``test_x[apache-batched]``)."""
    params = nodeid.partition("[")[2].rstrip("]")
    return "apache" in params.split("-")


def test_not_apache_deselects_every_test_with_an_apache_parameter() -> None:
    """Collect the whole suite with ``-m 'not apache'``: no test with an ``apache`` parameter is left, and
    the deselected ones include the tests that choose their broker with their own ``kind`` parameter."""
    result = _pytest("--collect-only", "-q", "-m", "not apache", str(TESTS))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    collected = [line for line in result.stdout.splitlines() if "::" in line]
    assert len(collected) > 500, result.stdout[-2000:]  # the suite was collected, not one file
    escaped = [nodeid for nodeid in collected if _looks_apache(nodeid)]
    assert not escaped, f"{len(escaped)} Apache tests escape -m 'not apache': {escaped}"
    # the tests that escaped before are there, and deselected: the other half of their parameters stays
    lite_halves = [
        "tests/test_broker_faults.py::test_broker_killed_with_nacks_pending_and_in_flight[lite-single-classified]",
        "tests/test_snapshot_restart.py::test_nacks_come_back_at_their_due_times_after_sigkill[lite]",
        "tests/test_snapshot_running_takeover.py::"
        "test_a_running_member_holds_a_killed_members_copies_back_at_once[lite-directory]",
    ]
    assert set(lite_halves) <= set(collected), [n for n in lite_halves if n not in collected]


def test_a_test_that_reaches_apache_unmarked_fails_under_not_apache(tmp_path: Path) -> None:
    """A test that fetches Apache Pulsar in a way collection cannot see fails under ``-m 'not apache'``,
    naming the cause; without ``-m`` the same test runs (it only asks whether Apache can run here)."""
    (tmp_path / "test_escape.py").write_text(
        "import pytest\n\n\n"
        "def test_hidden(request: pytest.FixtureRequest) -> None:\n"
        "    request.getfixturevalue('require' + '_apache')\n"
    )
    # tests/conftest.py as a plugin: its fixtures and hooks for a test file outside tests/
    args = ("-p", "conftest", "-q", "--rootdir", str(tmp_path), str(tmp_path / "test_escape.py"))
    deselecting = _pytest("-m", "not apache", *args, cwd=tmp_path)
    assert deselecting.returncode == 1, deselecting.stdout[-2000:]
    assert "was not marked `apache`" in deselecting.stdout, deselecting.stdout[-2000:]
    plain = _pytest(*args, cwd=tmp_path)
    assert plain.returncode == 0, plain.stdout[-2000:]
    assert "was not marked" not in plain.stdout
