"""``pulsar-nack demo``: a real run against an embedded broker, its input checks, and the native client's
figure it prints — measured by bench/nack_lateness.py and shipped as package data, never typed in."""

from __future__ import annotations

import argparse
import json
import os
import pty
import re
import signal
import socket
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from pulsar_nack import demo, profile
from pulsar_nack.cli import main
from pulsar_nack.profile import ProfileError, native_cost

REPO = Path(__file__).resolve().parent.parent


def _packaged_cost() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        resources.files("pulsar_nack").joinpath("data", "native_nack_cost.json").read_text()
    )
    return data


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
    assert "pending" in out.stderr, "the progress line"
    assert "\r" not in out.stderr, "not a terminal: plain lines, not one line rewritten in place"
    assert all(line.startswith("received") for line in out.stderr.splitlines()), out.stderr
    cost = _packaged_cost()
    assert (
        f"the native client {cost['bytes_per_nack']:.0f} B (measured {cost['date']} on {cost['machine']} by "
        "bench/nack_lateness.py)"
    ) in out.stdout
    # one definition on both sides: the wrapper's marginal bytes per pending nack, then its parts
    marginal = re.search(r"over \d+ samples\): pulsar-nack (-?[\d.]+) B", out.stdout)
    assert marginal is not None or "too few samples" in out.stdout, out.stdout
    parts = r"in all \(index [\d,]+ B, arrivals [\d,]+ B, ledgers [\d,]+ B, timer [\d,]+ B"
    assert re.search(parts, out.stdout), out.stdout


def test_the_packaged_native_figure_is_the_benchmarks_measurement() -> None:
    """The package data is bench/results/nack_lateness.json's native bytes per pending nack, with its
    date, machine, versions and commit."""
    cost = _packaged_cost()
    results = json.loads((REPO / "bench" / "results" / "nack_lateness.json").read_text())
    measured = results["brokers"][cost["broker"]]["memory"]
    assert cost["bytes_per_nack"] == measured["native"]["bytes_per_nack"]
    assert cost["pending"] == measured["count"]
    machine = results["machine"]
    assert (cost["date"], cost["commit"], cost["source"]) == (
        machine["date"],
        machine["commit"],
        "bench/nack_lateness.py",
    )
    assert cost["machine"] == f"{machine['cpu']} ({machine['cores']} cores)"
    assert cost["versions"] == {"python": machine["python"], **machine["libraries"]}


def test_the_native_figure_comes_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "cost.json"
    cost = {"bytes_per_nack": 123.4, "date": "2030-01-02", "machine": "Test CPU", "source": "bench/x.py",
            "broker": "pulsar-lite", "commit": "abc1234"}  # fmt: skip
    path.write_text(json.dumps(cost))
    native = native_cost(path)
    assert native == cost
    # the tracker grows 10 B per pending nack over 2,000 B fixed: the marginal is 10, not total / pending
    samples = [(pending, 2_000 + 10 * pending) for pending in (0, 500, 1_000)]
    progress = demo._Progress(peak_pending=1_000, peak_bytes=12_000, memory=samples,
                              peak_parts=(("index", 9_000), ("arrivals", 3_000)))  # fmt: skip
    marginal, total = demo._memory_lines(progress, native)
    assert marginal.endswith(
        "over 3 samples): pulsar-nack 10.0 B, the native client 123 B (measured 2030-01-02 on Test CPU by "
        "bench/x.py); 12× less"
    )
    assert total == (
        "tracker memory at the peak of 1,000 pending nacks: 12,000 B in all (index 9,000 B, arrivals 3,000 B)"
    )


def test_the_marginal_needs_samples_spread_over_pending() -> None:
    assert demo.marginal_bytes([(0, 100), (1_000, 20_100)]) is None, "two samples"
    assert demo.marginal_bytes([(500, 100), (520, 300), (540, 500)]) is None, "pending barely moved"
    assert demo.marginal_bytes([(0, 100), (100, 1_100), (200, 2_100)]) == pytest.approx(10.0)


@pytest.mark.parametrize("content", [None, "{broken", '{"date": "2030-01-02"}'])
def test_without_the_file_the_native_figure_is_unavailable(
    content: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "native_nack_cost.json"
    if content is not None:
        path.write_text(content)
    monkeypatch.setattr(profile, "NATIVE_COST_FILE", path)
    with pytest.raises(ProfileError, match=r"native_nack_cost\.json: no usable measurement"):
        native_cost()
    assert demo._native_cost() is None
    samples = [(0, 0), (500, 5_000), (1_000, 10_000)]
    progress = demo._Progress(received=10, acked=10, peak_pending=1_000, peak_bytes=10_000, memory=samples)
    stats = type("Stats", (), {"redelivered": 0, "held_back": 0, "dropped": 0})()
    demo._summary(progress, stats, argparse.Namespace(messages=10, precision_bits=8))
    out = capsys.readouterr().out
    assert "the native client's figure is unavailable" in out
    assert "pulsar-nack 10.0 B" in out and "× less" not in out


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


# -- user errors and interruption, through the real command ----------------------------------------------


def _demo(*args: str, timeout: float = 120, prelude: str = "pass") -> subprocess.CompletedProcess[str]:
    """``pulsar-nack demo ARGS`` in a fresh interpreter; ``prelude`` runs first (to hide a package)."""
    code = f"import sys; {prelude}; from pulsar_nack.cli import main; sys.exit(main())"
    return subprocess.run(
        [sys.executable, "-c", code, "demo", *args], capture_output=True, text=True, timeout=timeout
    )


def _one_line_error(out: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in out.stderr + out.stdout, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--precision-bits", "-1"], "argument --precision-bits: must be in 0..30, got -1"),
        (["--precision-bits", "31"], "argument --precision-bits: must be in 0..30, got 31"),
        (["--messages", "many"], "argument --messages: expected an integer, got 'many'"),
        (["--nack-share", "half"], "argument --nack-share: expected a number, got 'half'"),
        (["--operation-timeout-s", "0"], "argument --operation-timeout-s: must be > 0, got 0"),
        (["--service-url", "localhost:6650"], "--service-url: expected a pulsar://"),
        (["--service-url", "pulsar://localhost:port"], "--service-url: expected HOST:PORT"),
    ],
)
def test_bad_arguments_fail_before_a_broker_starts(argv: list[str], named: str) -> None:
    out = _demo(*argv)
    assert out.returncode == 2, out.stderr[-2000:]
    assert named in _one_line_error(out)
    assert "started an embedded pulsar-lite broker" not in out.stdout


def test_a_service_url_nobody_listens_on_fails_at_once_naming_it() -> None:
    from pulsar_nack.testing import free_ports

    url = f"pulsar://127.0.0.1:{free_ports()[0]}"
    out = _demo("--service-url", url)
    assert out.returncode == 1, out.stderr[-2000:]
    assert _one_line_error(out) == (
        f"pulsar-nack demo: --service-url: cannot connect to {url} (127.0.0.1:{url.rsplit(':', 1)[1]}: "
        "Connection refused)"
    )


def test_a_service_url_that_never_answers_fails_within_the_operation_timeout() -> None:
    """Something accepts the connection but never speaks Pulsar: the client gives up after its operation
    timeout (2 s here, and its connection timeout no longer than that) and the one line names the URL."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"pulsar://127.0.0.1:{silent.getsockname()[1]}"
        out = _demo("--service-url", url, "--operation-timeout-s", "2", timeout=60)
    assert out.returncode == 1, out.stderr[-2000:]
    line = _one_line_error(out)
    assert line.startswith(f"pulsar-nack demo: --service-url {url}: Pulsar error:"), line
    assert line.endswith("(operation timeout 2 s)"), line


def test_without_the_broker_extra_the_message_names_it() -> None:
    """pulsar-lite not importable (``sys.modules[name] = None`` is Python's 'not installed')."""
    env_free = "import os; os.environ.pop('PULSAR_LITE_BINARY', None); sys.modules['pulsar_lite'] = None"
    out = _demo("--messages", "10", prelude=env_free)
    assert out.returncode == 1, out.stderr[-2000:]
    assert "pip install 'pulsar-nack[broker]'" in _one_line_error(out)


@pytest.mark.parametrize("when", ["producing", "consuming"])
def test_ctrl_c_exits_130_quietly_and_stops_the_broker(when: str) -> None:
    """Ctrl-C while the demo produces (inside the client's blocking calls, which raise pulsar.Interrupted)
    or consumes: exit status 130, no traceback, the embedded broker stopped."""
    messages = "500000" if when == "producing" else "20000"
    process = subprocess.Popen(
        [sys.executable, "-m", "pulsar_nack.cli", "demo", "--messages", messages, "--timeout-s", "300"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None and process.stderr is not None
        started = process.stdout.readline()
        port = re.search(r"pulsar://127\.0\.0\.1:(\d+)", started)
        assert port is not None, started
        if when == "producing":
            time.sleep(0.5)  # 500,000 messages take seconds to send
        else:  # the first progress line (anything the client logs before it is skipped)
            seen = [process.stderr.readline() for _ in range(1)]
            while not seen[-1].startswith("received") and seen[-1] and len(seen) < 200:
                seen.append(process.stderr.readline())
            assert seen[-1].startswith("received"), f"consuming when interrupted: {seen[-5:]}"
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, err[-2000:]
    assert "Traceback" not in err + out and "KeyboardInterrupt" not in err, err[-2000:]
    from pulsar_nack.testing import port_accepts

    assert not port_accepts(int(port.group(1))), "the embedded broker is stopped"


def test_the_progress_is_a_live_line_on_a_terminal() -> None:
    """stderr on a pseudo-terminal: the progress line is rewritten in place (``\\r``) and ended with one
    newline; the piped case (test_demo_acks_every_message_and_reports_the_tracker) gets plain lines."""
    controller, terminal = pty.openpty()
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "pulsar_nack.cli", "demo", "--messages", "3000", "--max-delay-ms", "2000"],
            stdout=subprocess.PIPE, stderr=terminal, text=True,
        )  # fmt: skip
        os.close(terminal)
        shown = b""
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the process closed the terminal
                break
            if not chunk:
                break
            shown += chunk
        process.wait(timeout=120)
    finally:
        os.close(controller)
    assert process.returncode == 0, shown[-2000:]
    text = shown.decode()
    assert text.count("\rreceived") >= 2, text[-2000:]
    assert text.count("\n") <= 2, "one live line, ended once"


def test_ctrl_c_inside_a_blocking_client_call_exits_130() -> None:
    """Ctrl-C while subscribing to a broker that never answers: the client's blocking call raises
    ``pulsar.Interrupted`` (a PulsarException) — still a Ctrl-C, exit status 130, not a run error."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"pulsar://127.0.0.1:{silent.getsockname()[1]}"
        process = subprocess.Popen(
            [sys.executable, "-m", "pulsar_nack.cli", "demo", "--service-url", url],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        silent.settimeout(60)
        try:
            probe, _ = silent.accept()  # the demo's reachability check
            probe.close()
            client, _ = silent.accept()  # the client, now waiting for an answer that never comes
            time.sleep(0.5)
            process.send_signal(signal.SIGINT)
            _, err = process.communicate(timeout=60)
            client.close()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert process.returncode == 130, err[-2000:]
    assert err == "", err[-2000:]
