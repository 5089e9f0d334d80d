"""``pulsar-nack`` end to end (a subprocess, as a user runs it): ``profile`` and ``estimate``, their
outputs, and bad input — exit status 2 and a message naming the option."""

from __future__ import annotations

import configparser
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pulsar_nack.cli import main

REPO = Path(__file__).resolve().parent.parent


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pulsar_nack.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def test_profile_end_to_end(tmp_path: Path) -> None:
    out_file = tmp_path / "profile.json"
    out = _cli(
        "profile", "--rate", "2000", "--duration", "5s", "--delay", "1h", "--topics", "2",
        "--batch-size", "10", "--nack-share", "0.2", "--no-java", "--json", str(out_file),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "messages 10,000" in out.stdout and "B per pending nack" in out.stdout
    for label in ("mallinfo2", "tracemalloc", "RSS", "nack_stats", "pympler", "native client"):
        assert label in out.stdout, label
    assert "msg" in out.stderr, "the progress bar"
    data = json.loads(out_file.read_text())
    assert data["messages"] == 10_000 and data["workload"]["batch_size"] == 10
    assert data["pending"] > 0 and data["memory"]["malloc"] > 0
    assert data["breakdown_total"] == sum(data["breakdown"].values())


@pytest.mark.parametrize(
    ("argv", "hidden", "named"),
    [
        (["profile", "--duration", "1s", "--no-progress"], "pympler", "profile needs pympler"),
        (["profile", "--duration", "1s"], "tqdm", "profile needs tqdm"),
        (["sweep", "--grid", "small", "--out", "out"], "pyspark", "the sweep needs pyspark"),
        (["sweep", "--master", "local[2]", "--out", "out"], "pyspark", "the sweep needs pyspark"),
        (["sweep", "--grid", "small", "--out", "out"], "pyarrow", "the sweep needs pyarrow"),
        (["sweep", "--grid", "small", "--out", "out"], "matplotlib", "the sweep needs matplotlib"),
        # a submodule the check before Spark does not list: the import of the job itself names it
        (["sweep", "--grid", "small", "--out", "out"], "matplotlib.figure", "the sweep needs matplotlib"),
    ],
)
def test_a_tool_without_its_extra_names_the_extra(
    argv: list[str], hidden: str, named: str, tmp_path: Path
) -> None:
    """The SDK does not install the tools' libraries: a tool without them exits 1 with one line naming
    the extra to install (``sys.modules[name] = None`` is Python's 'not installed')."""
    extra = "spark" if argv[0] == "sweep" else "profile"
    code = f"import sys; sys.modules[{hidden!r}] = None; from pulsar_nack.cli import main; sys.exit(main())"
    out = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert out.returncode == 1, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert out.stderr.strip() == f"pulsar-nack {argv[0]}: {named}: pip install 'pulsar-nack[{extra}]'"
    if argv[0] == "sweep":
        assert not (tmp_path / "out" / "sweep.parquet").exists()


def test_a_spark_submit_driver_without_a_module_names_its_python_and_the_module(tmp_path: Path) -> None:
    """Under spark-submit (which sets PYSPARK_GATEWAY_PORT for the driver's Python) a driver lacking
    pyarrow — spark.pyspark.python taken for the driver too, spark/README.md — is one line naming that
    Python, the module and the setting, exit 1, before the job runs."""
    code = "import sys; sys.modules['pyarrow'] = None; from pulsar_nack.cli import main; sys.exit(main())"
    out = subprocess.run(
        [sys.executable, "-c", code, "sweep", "--grid", "small", "--out", "out"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "PYSPARK_GATEWAY_PORT": "1"},
    )  # fmt: skip
    assert out.returncode == 1, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    line = out.stderr.strip()
    assert line.startswith(f"pulsar-nack sweep: the sweep's driver Python ({sys.executable}) needs pyarrow:")
    assert "pip install pyarrow" in line and "spark.pyspark.driver.python" in line


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--rate", "0"], "--rate"),
        (["--batch-size", "0"], "--batch-size"),
        (["--nack-share", "1.5"], "--nack-share"),
        (["--precision-bits", "40"], "--precision-bits"),
        (["--rounding", "up"], "--rounding"),
        (["--entries-per-ledger", "0"], "--entries-per-ledger"),
        (["--chunked-share", "1.5"], "--chunked-share"),
        (["--chunked-share", "0.5", "--chunked-bytes", "100"], "--chunked-bytes"),
        (["--max-held-chunked-bytes", "-1"], "--max-held-chunked-bytes"),
        (["--topics", "0"], "--topics"),
        (["--partitions", "0"], "--partitions"),
        (["--delay", "soon"], "--delay"),
        (["--duration=-5s"], "--duration"),
        (["--rate", "1e7", "--duration", "1h"], "--rate × --duration"),
    ],
)
def test_profile_bad_input_names_the_option(
    args: list[str], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["profile", "--no-progress", "--no-java", *args])
    assert exit_info.value.code == 2
    assert f"pulsar-nack profile: error: {option}:" in capsys.readouterr().err


def test_profile_holds_chunked_payload_from_the_command_line(tmp_path: Path) -> None:
    """--chunked-share / --chunked-bytes / --max-held-chunked-bytes reach the workload: the held payload
    shows in the report and the JSON, bounded by the option."""
    out_file = tmp_path / "profile.json"
    out = _cli(
        "profile", "--rate", "200", "--duration", "5s", "--delay", "1h", "--chunked-share", "0.5",
        "--chunked-bytes", "100000", "--max-held-chunked-bytes", "1000000", "--no-java", "--no-progress",
        "--json", str(out_file),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "of which held chunked payload" in out.stdout
    data = json.loads(out_file.read_text())
    assert data["workload"]["chunked_share"] == 0.5 and data["workload"]["chunked_bytes"] == 100_000
    assert data["held_chunked"] == 10, "a 1 MB bound holds ten 100 kB messages"
    assert data["held_chunked_bytes"] == 1_000_000 and data["chunked_over_bound"] > 0


def test_profile_bad_input_exits_2_as_a_process() -> None:
    out = _cli("profile", "--batch-size", "-3")
    assert out.returncode == 2 and "--batch-size:" in out.stderr


def test_estimate_end_to_end(tmp_path: Path) -> None:
    out_file = tmp_path / "estimate.json"
    out = _cli(
        "estimate", "--rate", "10000", "--delay", "1h", "--precision-bits", "8",
        "--entries-per-ledger", "50000", "--batch-size", "1", "--nack-share", "1", "--topics", "1",
        "--json", str(out_file),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "pending nacked messages: 36,000,000" in out.stdout
    for label in ("pulsar-nack", "Java PIP-393 structure", "native client", "fitted range", "model:"):
        assert label in out.stdout, label
    data = json.loads(out_file.read_text())
    assert data["pending"] == 36_000_000
    assert data["native_bytes"] > 100 * data["pulsar_nack_bytes"] > 0
    # 10k/s for an hour is beyond what can be profiled here: the estimate says it extrapolates.
    assert "OUTSIDE the fitted range" in out.stdout and data["outside"]


def test_estimate_takes_a_uniform_delay_as_profile_does(tmp_path: Path) -> None:
    """Each nack's delay drawn between 10 s and 70 s: the mean delay's nacks pending, in more buckets (and
    more memory) than the same nacks at one delay."""
    spread, fixed = tmp_path / "spread.json", tmp_path / "fixed.json"
    common = ["--rate", "1000", "--topics", "100", "--batch-size", "10", "--nack-share", "0.1"]
    out = _cli("estimate", *common, "--delay", "uniform:10s:70s", "--json", str(spread))
    assert out.returncode == 0, out.stderr[-2000:]
    assert "delay 10 s to 70 s (uniform)" in out.stdout
    assert _cli("estimate", *common, "--delay", "40s", "--json", str(fixed)).returncode == 0
    spread_data, fixed_data = json.loads(spread.read_text()), json.loads(fixed.read_text())
    assert spread_data["pending"] == pytest.approx(fixed_data["pending"]) == 4_000
    assert spread_data["scenario"]["delay_spread_ms"] == 60_000
    assert spread_data["features"]["live_buckets"] + spread_data["features"]["packed_buckets"] > (
        fixed_data["features"]["live_buckets"] + fixed_data["features"]["packed_buckets"]
    )


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--rate", "-1", "--delay", "1h"], "--rate"),
        (["--rate", "100", "--delay", "soon"], "--delay"),
        (["--rate", "100", "--delay", "uniform:1h:1m"], "--delay"),
        (["--rate", "100", "--delay", "exp:1m"], "--delay"),
        (["--rate", "100", "--delay", "1h", "--precision-bits", "31"], "--precision-bits"),
        (["--rate", "100", "--delay", "1h", "--batch-size", "0"], "--batch-size"),
        (["--rate", "100", "--delay", "1h", "--nack-share", "0"], "--nack-share"),
        (["--rate", "100", "--delay", "1h", "--topics", "0"], "--topics"),
        (["--rate", "100", "--delay", "1h", "--entries-per-ledger", "0"], "--entries-per-ledger"),
        (["--rate", "100", "--delay", "1h", "--duration", "x"], "--duration"),
        (["--rate", "100", "--delay", "1h", "--fit", "/nonexistent/fit.json"], "--fit"),
    ],
)
def test_estimate_bad_input_names_the_option(
    args: list[str], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["estimate", *args])
    assert exit_info.value.code == 2
    assert f"pulsar-nack estimate: error: {option}:" in capsys.readouterr().err


def _setup_cfg_metadata() -> dict[str, str]:
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    return dict(config["metadata"])


def test_version_is_the_packages_one_source() -> None:
    """``pulsar-nack --version`` prints ``pulsar_nack.__version__``, which setup.cfg reads (attr:), so the
    wheel's metadata, the module and the command cannot disagree."""
    import pulsar_nack

    out = _cli("--version", timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"pulsar-nack {pulsar_nack.__version__}\n" and out.stderr == ""
    assert _setup_cfg_metadata()["version"] == "attr: pulsar_nack.__version__"


def test_metadata_names_the_license_and_the_project_urls() -> None:
    metadata = _setup_cfg_metadata()
    assert metadata["license"] == "Apache-2.0" and metadata["license_files"] == "LICENSE"
    assert "Apache License\n                           Version 2.0" in (REPO / "LICENSE").read_text()
    urls = dict(line.split(" = ", 1) for line in metadata["project_urls"].strip().splitlines())
    assert {"Source", "Documentation", "Changelog", "Issues"} <= set(urls)
    assert all(url.startswith("https://") for url in urls.values())


# -- user errors: one line on stderr naming the argument or the cause, exit 2 (usage) or 1 (run) -------


def _one_line_error(out: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a failed run (no traceback, no usage block)."""
    assert "Traceback" not in out.stderr + out.stdout, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["profile", "--rate", "x"], "argument --rate"),
        (["profile", "--no-java", "--json", "/nonexistent/profile.json"], "--json: cannot write"),
        (["profile", "--no-java", "--json", "/proc/profile.json"], "--json: cannot write"),
        (["estimate", "--rate", "1", "--delay", "1", "--json", "/nonexistent/e"], "--json: cannot write"),
        (["estimate", "--rate", "1", "--delay", "1h", "--json", "/tmp"], "--json: /tmp is a folder"),
        (["profile", "--broker", "http://127.0.0.1:6650"], "--broker: expected a pulsar://"),
        (["profile", "--broker", "pulsar://127.0.0.1:x"], "--broker: expected HOST:PORT"),
        (["profile", "--broker", "pulsar://127.0.0.1:6650", "--broker-timeout", "soon"], "--broker-timeout:"),
        (["sweep", "--master", "nowhere"], "--master:"),
        (["sweep", "--grid", "small", "--out", "/proc/pulsar-nack-sweep"], "--out: cannot create"),
        (["sweep", "--grid", "/nonexistent/grid.json"], "--grid:"),
        (["nonsense"], "invalid choice: 'nonsense'"),
        ([], "required: COMMAND"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(args: list[str], named: str) -> None:
    out = _cli(*args, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    line = _one_line_error(out)
    assert line.startswith("pulsar-nack") and "error:" in line and named in line, line


def test_a_broker_out_of_reach_is_a_run_error_naming_the_url(tmp_path: Path) -> None:
    """``profile --broker`` at a port nobody listens on: exit 1 at once, the URL in the one line, and the
    --json file is not left behind."""
    from pulsar_nack.testing import free_ports

    url = f"pulsar://127.0.0.1:{free_ports()[0]}"
    json_path = tmp_path / "profile.json"
    out = _cli("profile", "--broker", url, "--no-java", "--no-progress", "--json", str(json_path))
    assert out.returncode == 1, out.stderr[-2000:]
    line = _one_line_error(out)
    assert line.startswith("pulsar-nack profile: --broker: cannot connect to") and url in line, line
    assert not json_path.exists()


def test_a_spark_master_out_of_reach_fails_before_spark_starts(tmp_path: Path) -> None:
    from pulsar_nack.testing import free_ports

    master = f"spark://127.0.0.1:{free_ports()[0]}"
    out = _cli("sweep", "--grid", "small", "--master", master, "--out", str(tmp_path / "out"))
    assert out.returncode == 1, out.stderr[-2000:]
    line = _one_line_error(out)
    assert line.startswith("pulsar-nack sweep: --master: cannot connect to") and master in line, line


def test_profile_progress_in_a_pipe_is_plain_lines() -> None:
    """Not a terminal: the bar's states are plain lines (at most one per 5 s, and the last one), never one
    line rewritten with carriage returns."""
    out = _cli("profile", "--rate", "2000", "--duration", "5s", "--delay", "1h", "--no-java")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "\r" not in out.stderr
    lines = out.stderr.splitlines()
    assert 2 <= len(lines) <= 10 and all("msg" in line for line in lines), out.stderr
    assert "100%" in lines[-1], "the last state is printed when the bar closes"


def _children(pid: int) -> set[int]:
    tasks = Path(f"/proc/{pid}/task")
    return {int(child) for task in tasks.iterdir() for child in (task / "children").read_text().split()}


def test_sigint_to_profile_exits_130_quietly_and_ends_its_probe() -> None:
    """SIGINT to the command alone (not its process group, as Ctrl-C would): exit 130, no traceback, and
    the measuring child process it started is gone too."""
    process = subprocess.Popen(
        [sys.executable, "-m", "pulsar_nack.cli", "profile", "--rate", "20000", "--duration", "120s",
         "--delay", "1h", "--no-java"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stderr is not None
        assert "msg" in process.stderr.readline(), "the bar is up"
        deadline = time.monotonic() + 60
        while not (children := _children(process.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert children, "a probe process"
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, err[-2000:]
    assert "Traceback" not in err + out and "KeyboardInterrupt" not in err
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{child}").exists() for child in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [child for child in children if Path(f"/proc/{child}").exists()], "the probe was killed"


def test_ctrl_c_to_the_sweep_exits_130_quietly_and_stops_spark(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) while the sweep's job runs: exit 130,
    no traceback or Spark error on the way out, and nothing of the group left (the JVM, its Python
    workers)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "pulsar_nack.cli", "sweep", "--grid", "small", "--out", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert process.stderr is not None
        seen: list[str] = []
        while not any(line.startswith("sweep:") for line in seen):  # the job's bar: Spark is up
            line = process.stderr.readline()
            assert line, "".join(seen)[-2000:]
            seen.append(line)
        os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    err = "".join(seen) + err
    assert process.returncode == 130, err[-3000:]
    assert "Traceback" not in err + out and "KeyboardInterrupt" not in err, err[-3000:]
    assert " ERROR " not in err and "ERROR:" not in err, err[-3000:]
    deadline = time.monotonic() + 30
    while _group(process.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _group(process.pid), "the JVM and its workers stopped"


def _group(pgid: int) -> list[int]:
    """The live processes of a process group."""
    found = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True).stdout
    return [int(pid) for pid in found.split()]


def test_a_spark_master_that_never_answers_is_one_run_error(tmp_path: Path) -> None:
    """Something accepts connections on the master's port but is no Spark master: Spark gives up on its
    own (about a minute: 3 registration attempts of 20 s, fixed in Spark) and the command ends with one
    line of its own naming the master — Spark's log lines say why — instead of a Java stack trace."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        master = f"spark://127.0.0.1:{silent.getsockname()[1]}"
        out = _cli("sweep", "--grid", "small", "--master", master, "--out", str(tmp_path), "--no-progress")
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "\tat " not in out.stderr, out.stderr[-3000:]
    ours = [line for line in out.stderr.splitlines() if line.startswith("pulsar-nack")]
    assert len(ours) == 1 and ours[0].startswith(f"pulsar-nack sweep: Spark failed (master {master}): "), ours
