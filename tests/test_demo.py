"""``pulsar-nack demo``: a real run against an embedded broker, and its input checks."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from pulsar_nack.cli import main


def test_demo_acks_every_message_and_reports_the_tracker() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pulsar_nack.cli", "demo", "--messages", "600", "--max-delay-ms", "800"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    summary = re.search(
        r"messages 600, acked (\d+), received (\d+), nacked (\d+), redelivered (\d+)", out.stdout
    )
    assert summary is not None, out.stdout
    acked, received, nacked, redelivered = (int(g) for g in summary.groups())
    assert acked == 600 and nacked > 0 and redelivered == nacked and received == 600 + nacked
    assert "lateness (arrival − due, ms)" in out.stdout and "tracker memory at the peak" in out.stdout
    assert "pending" in out.stderr, "the live progress line"


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["--messages", "0"], "--messages"),
        (["--nack-share", "1.5"], "--nack-share"),
        (["--bogus"], "--bogus"),
    ],
)
def test_demo_rejects_bad_arguments(argv: list[str], text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["demo", *argv])
    assert info.value.code == 2 and text in capsys.readouterr().err
