"""The runnable examples: each runs as a subprocess with small parameters, within 30 s, exits 0 and prints
what it promises. Against each broker (``--service-url``), and once with its own embedded pulsar-lite."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pulsar_nack.testing import Broker

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
LIMIT_S = 30


def run_example(name: str, *args: str) -> str:
    """Run ``examples/<name>`` and return its stdout; fails on a non-zero exit or after LIMIT_S."""
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, str(EXAMPLES / name), *args],
            capture_output=True,
            text=True,
            timeout=LIMIT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        so_far = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout
        pytest.fail(f"{name} ran longer than {LIMIT_S} s; output so far:\n{so_far}")
    assert done.returncode == 0, f"{name} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    assert time.monotonic() - started < LIMIT_S
    return done.stdout


def check_order_timeout(out: str) -> None:
    """6 orders, every 2nd paid: 0, 2, 4 paid; 1, 3, 5 closed at their deadline, not before."""
    assert "placed 6 orders" in out
    assert {f"order-{i}" for i in (0, 2, 4)} == set(re.findall(r"(order-\d+): paid -> nothing to do", out))
    closed = dict(re.findall(r"closed (order-\d+): unpaid (\d+) ms after its deadline", out))
    assert set(closed) == {"order-1", "order-3", "order-5"}
    assert all(0 <= int(late) < 1000 for late in closed.values()), closed
    assert "summary: 3 closed, 3 paid" in out


def check_retry_with_backoff(out: str) -> None:
    """Job i fails i times; at most 3 attempts: jobs 0-2 succeed, job 3 is given up; delays grow."""
    assert "job-0 attempt 1: ok -> ack" in out
    assert re.search(r"job-2 attempt 3 after \d+ ms: ok -> ack", out)
    assert re.search(r"job-3 attempt 3 after \d+ ms: .*giving up -> ack", out)
    assert "redelivery_count=0 -> retry in 150 ms" in out and "redelivery_count=1 -> retry in 300 ms" in out
    waits = [int(ms) for ms in re.findall(r"job-3 attempt \d after (\d+) ms", out)]
    assert len(waits) == 2 and 150 <= waits[0] < 300 <= waits[1], waits  # never early, then growing
    assert "summary: 3 succeeded, 1 gave up (job-3)" in out


def check_wrap_existing_consumer(out: str) -> None:
    assert "still a pulsar.Consumer: True" in out
    back = re.findall(r"back: (m\d) after (\d+) ms \(asked (\d+) ms\)", out)
    assert [name for name, _, _ in back] == ["m2", "m1", "m0"]
    assert all(int(asked) <= int(after) < int(asked) + 1000 for _, after, asked in back), back
    assert "summary: all 3 messages came back in due order" in out


CASES = {
    "order_timeout.py": (["--orders", "6", "--timeout-ms", "1500", "--pay-every", "2"], check_order_timeout),
    "retry_with_backoff.py": (
        ["--jobs", "4", "--max-attempts", "3", "--min-delay-ms", "150", "--max-delay-ms", "600"],
        check_retry_with_backoff,
    ),
    "wrap_existing_consumer.py": (["--messages", "3", "--step-ms", "200"], check_wrap_existing_consumer),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_example_against_the_broker(broker: Broker, name: str) -> None:
    args, check = CASES[name]
    check(run_example(name, "--service-url", broker.service_url, "--max-seconds", "25", *args))


@pytest.mark.parametrize("name", sorted(CASES))
def test_example_with_its_embedded_broker(name: str) -> None:
    args, check = CASES[name]
    out = run_example(name, *args)
    assert "started an embedded pulsar-lite broker at pulsar://127.0.0.1:" in out
    check(out)


def test_bad_arguments_are_reported_by_name() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "order_timeout.py"), "--timeout-ms", "-5"],
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
        check=False,
    )
    assert done.returncode == 2 and "--timeout-ms" in done.stderr and "must be > 0" in done.stderr
