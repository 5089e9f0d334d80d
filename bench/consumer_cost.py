"""Benchmark: per-message cost of the wrapper against the official consumer — throughput and CPU.

Through a real broker (pulsar-lite always, Apache Pulsar standalone when Java/Maven are available), for
each consumer *kind* — ``native`` (``pulsar.Client``) and ``wrapper`` (``pulsar_nack.Client``, a drop-in) —
side by side in one run:

* **Scenario A, nothing nacked**: N messages (default 100,000) are produced into a fresh topic; then a
  fresh consumer process drains and acks them all.
* **Scenario B, 10 % nacked**: the same, but every 10th message (by the index in its payload) is nacked
  once on first sight — the wrapper with ``negative_acknowledge(msg, delay_ms=0)``, the native client with
  a plain ``negative_acknowledge(msg)`` — and acked when it comes back. Both subscribe with the same
  arguments (``negative_ack_redelivery_delay_ms=100``, the native minimum). The run ends when every
  message has been acked once (distinct payloads; copies seen again are acked and counted as duplicates).

Each in three consumption **modes** — ``receive`` (a receive + ack loop), ``listener`` (a
``message_listener`` that acks; the main thread waits for the count), ``batch_receive`` (``batch_receive``
with a policy of up to 100 messages / 10 ms, then an ack per message) — at each producer **batch size**
(``--batch-sizes``, default 1, 10, 100 and 1,000: ``batching_max_messages``; 1 = batching off; issue 28:
pulsar-client's producers batch up to 1,000 messages by default). Consumers: Shared subscription, default
``receiver_queue_size``, ``initial_position=Earliest`` (the subscription is also created before
producing), logger at Error.

Only the consumer process is measured, from the first message handed to the application to the ack that
completes the count: wall time (rate = N / time, msg/s) and process CPU (user + sys from
``getrusage(RUSAGE_SELF)``: Python and the C++ client's threads) per message. Every run is a fresh
subprocess; native and wrapper alternate which goes first from one repetition to the next; medians over
the repetitions (default 3). A run that does not finish within ``--timeout`` seconds is recorded as failed.
The machine may be shared: each run first waits (up to ``--quiet-wait`` s) until other processes use less
than a quarter of a core, and records how many cores they used while it ran (from /proc/stat, minus this
benchmark and the broker) and the 1-minute load average when it started; runs disturbed by more are listed
under the tables.

The wrapper measured is ``pulsar_nack`` as of git ``HEAD`` when the run starts (``--wrapper-rev``;
``worktree`` for the files as they are), copied to a temporary folder that every process imports it from:
edits to the working tree during a run change nothing. Its commit and a digest of its sources are recorded.

Goals (wrapper / native, medians): rate ≥ 0.9× in every mode and CPU per message ≤ 1.3× with nothing
nacked; with 10 % nacked, drain time ≤ 1.0× and CPU per message ≤ 1.3×.

    python bench/consumer_cost.py                                  # both brokers, 100k messages, 3 reps
    python bench/consumer_cost.py --quick --brokers lite --reps 1  # a smoke run (20k messages)
    python bench/consumer_cost.py --modes receive --batch-sizes 100 --scenarios A

Writes ``bench/results/consumer_cost.json`` and the ``consumer-cost`` section of docs/performance.md;
with ``--fast-receive`` (the wrapper subscribed with ``fast_receive=True``), ``consumer_cost_fast.json``
and the ``consumer-cost-fast`` section; with ``--floor`` (no pulsar-nack: in the wrapper's place the
official consumer behind :class:`_Interposer`, the thinnest Python drop-in — a method of its own around
``receive``, ``batch_receive``, ``acknowledge`` and the listener, each only calling through — what any
wrapper written in Python adds at the least), ``consumer_cost_floor.json`` and ``consumer-cost-floor``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import report
from tqdm import tqdm

SCRIPT = Path(__file__).resolve()
MODES = ("receive", "listener", "batch_receive")
#: scenario -> nack every n-th message (0: none)
SCENARIOS = {"A": 0, "B": 10}
SCENARIO_TITLES = {"A": "nothing nacked", "B": "10 % nacked"}
SUBSCRIPTION = "bench"
NACK_DELAY_MS = 100  # the native minimum; the wrapper gets the same subscribe arguments
BATCH_SIZES = (1, 10, 100, 1_000)  # producer batching_max_messages (1: batching off)
BATCH_RECEIVE = {"max_num_message": 100, "max_num_bytes": 10 * 1024 * 1024, "timeout_ms": 10}
PAYLOAD_BYTES = 16
#: Other processes using more than this many cores during a run disturb it: it is flagged, and each run
#: first waits (up to --quiet-wait seconds) for the machine to be quieter than this.
QUIET_CORES = 0.25
#: Goals, wrapper / native of the medians.
GOALS = {"A": {"rate": 0.9, "cpu": 1.3}, "B": {"drain": 1.0, "cpu": 1.3}}


# -- the measured consumer (a fresh process per run) -------------------------------------------------


def _subscribe_args(mode: str) -> dict[str, Any]:
    import pulsar

    args: dict[str, Any] = {
        "consumer_type": pulsar.ConsumerType.Shared,
        "initial_position": pulsar.InitialPosition.Earliest,
        "negative_ack_redelivery_delay_ms": NACK_DELAY_MS,
    }
    if mode == "batch_receive":
        args["batch_receive_policy"] = pulsar.ConsumerBatchReceivePolicy(**BATCH_RECEIVE)
    return args


def _cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)  # the whole process: all threads
    return usage.ru_utime + usage.ru_stime


def _lost(consumer: Any, acked: bytearray, nacked_ids: dict[int, tuple[int, int, int]]) -> dict[str, Any]:
    """On a timeout: the nacked payloads that never came back, and where the wrapper has each — kept in
    memory (``held``), pending in its index, in flight (forwarded, no copy handed out yet), handed out
    (``out``: the filter takes a copy for the application's), or none of these — with its counters.
    Diagnostic only: reads the wrapper's internals."""
    lost = sorted(i for i in nacked_ids if not acked[i])
    found: dict[str, Any] = {"count": len(lost), "payloads": lost[:50]}
    nacks = getattr(consumer, "_nacks", None)
    if nacks is None or not lost:
        return found
    arrivals, topic = nacks.tracker.arrivals, nacks._fixed_topic

    def _in_flight(flights: Any, batch_index: int) -> bool:  # None, one flight, or index → flight
        if flights is None or isinstance(flights, dict):
            return batch_index in (flights or ())
        return bool(flights.index == batch_index)

    states = dict.fromkeys(("held", "pending", "in_flight", "out", "none"), 0)
    for i in lost:
        ledger_id, entry_id, batch_index = nacked_ids[i]
        entry = arrivals._entries.get((topic, ledger_id, entry_id))
        if (topic, ledger_id, entry_id, batch_index) in nacks.hold.held:
            state = "held"
        elif nacks.tracker.index.due_of(ledger_id, entry_id, batch_index, topic) is not None:
            state = "pending"
        elif entry is not None and _in_flight(entry.flights, batch_index):
            state = "in_flight"
        elif entry is not None and entry.out >> batch_index & 1:
            state = "out"
        else:
            state = "none"
        states[state] += 1
    stats = consumer.nack_stats()
    found["states"] = states
    found["nack_stats"] = {
        name: getattr(stats, name)
        for name in ("pending", "forwarded", "redelivered", "reforwarded", "abandoned", "chunked_held")
    }
    return found


def consume(spec: dict[str, Any]) -> dict[str, Any]:
    """Drain ``spec['messages']`` messages with one consumer kind in one mode; returns the figures.

    The per-message code is the same for both kinds; only the nack call differs (``delay_ms=0`` for the
    wrapper). A watchdog prints what was done so far and exits if the count is not reached in time.
    """
    kind, mode, count, nack_every = spec["kind"], spec["mode"], spec["messages"], spec["nack_every"]
    wrapper = kind == "wrapper"
    acked = bytearray(count)
    nacked = bytearray(count)
    nacked_ids: dict[int, tuple[int, int, int]] = {}  # payload -> (ledger, entry, batch index): see _lost
    left = count
    duplicates = nacks = handled = 0
    started = False
    t0 = t1 = c0 = c1 = 0.0
    first_batch_index = None
    done = threading.Event()

    def handle(consumer: Any, message: Any) -> None:
        nonlocal left, duplicates, nacks, handled, started, t0, t1, c0, c1, first_batch_index
        if not started:
            started = True
            t0, c0 = time.perf_counter(), _cpu_s()
            first_batch_index = message.message_id().batch_index()
        handled += 1
        i = int(message.data())
        if nack_every and not i % nack_every and not nacked[i]:
            nacked[i] = 1
            nacks += 1
            if spec.get("diagnose"):
                mid = message.message_id()
                nacked_ids[i] = (mid.ledger_id(), mid.entry_id(), mid.batch_index())
            if wrapper:
                consumer.negative_acknowledge(message, delay_ms=0)
            else:
                consumer.negative_acknowledge(message)
            return
        consumer.acknowledge(message)
        if acked[i]:
            duplicates += 1
            return
        acked[i] = 1
        left -= 1
        if not left:
            t1, c1 = time.perf_counter(), _cpu_s()
            done.set()

    def figures() -> dict[str, Any]:
        out: dict[str, Any] = {
            "ok": not left,
            "acked": count - left,
            "handled": handled,
            "nacks": nacks,
            "duplicates": duplicates,
            "batched": first_batch_index is not None and first_batch_index >= 0,
        }
        if not left:
            wall, cpu = t1 - t0, c1 - c0
            out.update(
                wall_s=wall,
                cpu_s=cpu,
                rate=count / wall,
                cpu_us_per_msg=cpu / count * 1e6,
                cpu_share=cpu / wall,
            )
        return out

    def watchdog() -> None:
        if not done.wait(spec["timeout_s"]):
            failed = {**figures(), "error": f"timeout after {spec['timeout_s']} s"}
            if spec.get("diagnose"):
                try:
                    failed["lost"] = _lost(consumer, acked, nacked_ids)
                except Exception as error:  # a diagnostic must not hide the timeout
                    failed["lost"] = repr(error)
            print(json.dumps(failed), flush=True)
            os._exit(3)

    threading.Thread(target=watchdog, daemon=True).start()
    import pulsar_nack

    floor = wrapper and spec.get("floor", False)

    if not pulsar_nack.__file__.startswith(spec["wrapper_path"]):
        raise RuntimeError(f"imported {pulsar_nack.__file__}, not the snapshot in {spec['wrapper_path']}")
    client = report.client("native" if floor else kind, spec["service_url"])
    consumer: Any = None
    args = _subscribe_args(mode)
    if wrapper and spec.get("fast_receive"):
        args["fast_receive"] = True
    if mode == "listener":
        args["message_listener"] = _interposed(handle) if floor else handle
    consumer = client.subscribe(spec["topic"], SUBSCRIPTION, **args)
    if floor:
        consumer.__class__ = _interposer()
    if mode == "receive":
        while left:
            handle(consumer, consumer.receive())
    elif mode == "batch_receive":
        while left:
            for message in consumer.batch_receive():
                handle(consumer, message)
    else:
        done.wait()
    print(json.dumps(figures()), flush=True)  # before closing: a close that hangs loses nothing
    consumer.close()
    client.close()
    return figures()


def _interposer() -> type:
    """``--floor``'s consumer class: the official one with a method of its own around each per-message
    call, each only calling through — the least a drop-in written in Python adds to every message."""
    import pulsar

    class _Interposer(pulsar.Consumer):  # type: ignore[misc]
        def receive(self, timeout_millis: int | None = None) -> Any:
            return super().receive(timeout_millis)

        def batch_receive(self) -> Any:
            return super().batch_receive()

        def acknowledge(self, message: Any) -> None:
            super().acknowledge(message)

    return _Interposer


def _interposed(listener: Any) -> Any:
    """``--floor``'s listener: a function of its own around the application's (what a wrapper's is)."""

    def interposed(consumer: Any, message: Any) -> None:
        listener(consumer, message)

    return interposed


# -- the parent: topics, producers, consumer processes ---------------------------------------------


def prepare_topic(client: Any, count: int, batch: int) -> tuple[str, float]:
    """A fresh topic with its subscription and ``count`` messages produced in batches of up to ``batch``
    (1: not batched); returns (topic, seconds to produce)."""
    import pulsar

    topic = f"persistent://public/default/cost-{uuid.uuid4().hex[:12]}"
    shared, earliest = pulsar.ConsumerType.Shared, pulsar.InitialPosition.Earliest
    client.subscribe(topic, SUBSCRIPTION, consumer_type=shared, initial_position=earliest).close()
    producer = client.create_producer(
        topic,
        batching_enabled=batch > 1,
        batching_max_messages=max(batch, 2),  # (the client wants > 1 even with batching off)
        batching_max_publish_delay_ms=10,
        block_if_queue_full=True,
    )
    started = time.perf_counter()
    for i in range(count):
        producer.send_async(f"{i:0{PAYLOAD_BYTES}d}".encode(), None)
    producer.flush()
    elapsed = time.perf_counter() - started
    producer.close()
    return topic, elapsed


def _busy_s() -> float:
    """CPU seconds all cores spent not idle since boot (/proc/stat)."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _process_cpu_s(pid: int) -> float:
    """CPU seconds of process ``pid`` (all its threads), 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class OtherLoad:
    """Cores that *other* processes kept busy since creation: the machine's busy time minus this process,
    its finished children (the consumer processes) and the broker."""

    def __init__(self, broker_pid: int) -> None:
        self.broker_pid = broker_pid
        self.start = self._sample()

    def _sample(self) -> tuple[float, float, float]:
        own = resource.getrusage(resource.RUSAGE_SELF)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        ours = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
        return time.monotonic(), _busy_s(), ours + _process_cpu_s(self.broker_pid)

    def cores(self) -> float:
        (t0, busy0, ours0), (t1, busy1, ours1) = self.start, self._sample()
        return max(0.0, (busy1 - busy0 - (ours1 - ours0)) / max(t1 - t0, 1e-9))


def wait_until_quiet(broker_pid: int, limit_s: float) -> tuple[float, float]:
    """Wait (≤ ``limit_s``) until other processes use < QUIET_CORES; returns (seconds waited, their cores)."""
    started = time.monotonic()
    while True:
        load = OtherLoad(broker_pid)
        time.sleep(0.5)
        cores = load.cores()
        waited = time.monotonic() - started
        if cores < QUIET_CORES or waited >= limit_s:
            return waited, cores


def run_consumer(spec: dict[str, Any], broker_pid: int) -> dict[str, Any]:
    """``consume(spec)`` in a fresh interpreter; a crash or a hang is a failed run, not an exception.
    Also records how many cores other processes on the machine used meanwhile (``others_cores``)."""
    command = [sys.executable, str(SCRIPT), "--consume", json.dumps(spec)]
    started = time.monotonic()
    others = OtherLoad(broker_pid)
    try:
        out = subprocess.run(
            command, capture_output=True, text=True, timeout=spec["timeout_s"] + 30, cwd=report.ROOT
        )
        stdout, stderr, code = out.stdout, out.stderr, out.returncode
    except subprocess.TimeoutExpired as exc:  # the watchdog did not fire, or close() hung
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
        code = None
    result: dict[str, Any] = {"ok": False}
    for line in reversed(stdout.strip().splitlines()):
        with contextlib.suppress(ValueError):
            result = json.loads(line)
            break
    if code != 0:
        lines = stderr.strip().splitlines()
        result.setdefault("error", f"exit code {code}: {lines[-1] if lines else 'no output'}")
        result["stderr"] = stderr[-3000:]
    result["process_s"] = time.monotonic() - started
    result["others_cores"] = others.cores()
    return result


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [run[key] for run in runs if run.get("ok")]
    return statistics.median(values) if values else None


def _ratio(top: float | None, bottom: float | None) -> float | None:
    return None if top is None or bottom is None or bottom == 0 else top / bottom


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per kind and the wrapper / native ratios."""
    out: dict[str, Any] = {}
    for kind in report.KINDS:
        mine = [run for run in runs if run["kind"] == kind]
        out[kind] = {
            "rate": _median(mine, "rate"),
            "wall_s": _median(mine, "wall_s"),
            "cpu_us_per_msg": _median(mine, "cpu_us_per_msg"),
            "duplicates": _median(mine, "duplicates"),
            "others_cores_max": max((run.get("others_cores", 0.0) for run in mine), default=0.0),
            "ok": sum(1 for run in mine if run.get("ok")),
            "runs": len(mine),
        }
    native, wrapper = out["native"], out["wrapper"]
    out["ratio"] = {
        "rate": _ratio(wrapper["rate"], native["rate"]),
        "drain": _ratio(wrapper["wall_s"], native["wall_s"]),
        "cpu": _ratio(wrapper["cpu_us_per_msg"], native["cpu_us_per_msg"]),
    }
    return out


def cells(args: argparse.Namespace) -> list[dict[str, Any]]:
    return [
        {"scenario": scenario, "mode": mode, "batch": batch, "batching": batch > 1}
        for scenario in args.scenarios
        for batch in args.batch_sizes
        for mode in args.modes
    ]


def run_broker(label: str, broker: Any, args: argparse.Namespace) -> dict[str, Any]:
    import pulsar

    service_url, broker_pid = broker.service_url, broker.pid
    client = pulsar.Client(
        service_url, operation_timeout_seconds=30, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )
    base = {
        "service_url": service_url,
        "timeout_s": args.timeout,
        "wrapper_path": args.wrapper_path,
        "fast_receive": args.fast_receive,
        "floor": args.floor,
        "diagnose": args.diagnose,
    }
    try:
        # warm-up, not recorded: the broker's caches, JIT (Apache Pulsar) and the page cache
        for batch in (1, 100):
            for kind in report.KINDS:
                topic, _ = prepare_topic(client, min(args.messages, 20_000), batch)
                spec = {**base, "kind": kind, "mode": "receive", "nack_every": 0, "topic": topic}
                run_consumer({**spec, "messages": min(args.messages, 20_000)}, broker_pid)
        out: list[dict[str, Any]] = []
        todo = cells(args)
        with tqdm(total=len(todo) * args.reps * len(report.KINDS), unit="run", file=sys.stderr) as bar:
            for number, cell in enumerate(todo):
                runs = []
                for rep in range(args.reps):
                    order = report.KINDS if (rep + number) % 2 == 0 else tuple(reversed(report.KINDS))
                    for kind in order:
                        bar.set_description(
                            f"{label} {cell['scenario']} {cell['mode']} {_batching(cell)} {kind}"
                        )
                        topic, produce_s = prepare_topic(client, args.messages, cell["batch"])
                        spec = {
                            **base,
                            "kind": kind,
                            "mode": cell["mode"],
                            "messages": args.messages,
                            "nack_every": SCENARIOS[cell["scenario"]],
                            "topic": topic,
                        }
                        waited_s, before = wait_until_quiet(broker_pid, args.quiet_wait)
                        load = os.getloadavg()[0]
                        result = run_consumer(spec, broker_pid)
                        runs.append(
                            {
                                "kind": kind,
                                "rep": rep,
                                "produce_s": produce_s,
                                "quiet_wait_s": waited_s,
                                "others_cores_before": before,
                                "loadavg": load,
                                **result,
                            }
                        )
                        if not result.get("ok"):
                            _say(f"  FAILED {label} {cell} {kind} rep {rep}: {result.get('error')}")
                        bar.update()
                row = {**cell, "runs": runs, **summarize(runs)}
                out.append(row)
                _say(_console_row(label, row))
    finally:
        client.close()
    return {"cells": out}


# -- output -----------------------------------------------------------------------------------------


def _say(line: str) -> None:
    """A line of the table, on stdout as it is measured (around the progress bar on stderr)."""
    tqdm.write(line, file=sys.stdout)
    sys.stdout.flush()


def _batching(cell: dict[str, Any]) -> str:
    batch = cell.get("batch", 100 if cell["batching"] else 1)  # (files before batch sizes: 100 or off)
    return f"batches of {batch:,}" if batch > 1 else "not batched"


def _num(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


def _goal_checks(row: dict[str, Any]) -> tuple[tuple[str, bool], tuple[str, bool]]:
    """(cell, met) for the speed goal — rate in A, drain time in B — and for the CPU goal."""
    goals, ratio = GOALS[row["scenario"]], row["ratio"]
    if row["scenario"] == "A":
        speed, goal, at_least = ratio["rate"], goals["rate"], True
    else:
        speed, goal, at_least = ratio["drain"], goals["drain"], False
    speed_ok = speed is not None and (speed >= goal if at_least else speed <= goal)
    cpu_ok = ratio["cpu"] is not None and ratio["cpu"] <= goals["cpu"]
    return (
        (f"{_x(speed)} ({'≥' if at_least else '≤'} {goal}) {_mark(speed_ok)}", speed_ok),
        (f"{_x(ratio['cpu'])} (≤ {goals['cpu']}) {_mark(cpu_ok)}", cpu_ok),
    )


def _mark(ok: bool) -> str:
    return "✓" if ok else "✗"


def _failures(row: dict[str, Any]) -> str:
    bad = [
        f"{kind} {row[kind]['runs'] - row[kind]['ok']}"
        for kind in report.KINDS
        if row[kind]["ok"] < row[kind]["runs"]
    ]
    return ", ".join(bad) if bad else ""


_HEADERS = [
    "scenario",
    "mode",
    "batch size",
    "native msg/s",
    "wrapper msg/s",
    "rate (A) / drain time (B), wrapper ÷ native",
    "native CPU µs/msg",
    "wrapper CPU µs/msg",
    "CPU/msg, wrapper ÷ native",
    "duplicates native / wrapper",
    "failed runs",
    "load avg (1 min), other cores",
]


def _row(row: dict[str, Any]) -> list[str]:
    native, wrapper = row["native"], row["wrapper"]
    speed, cpu = _goal_checks(row)
    return [
        f"{row['scenario']} {SCENARIO_TITLES[row['scenario']]}",
        row["mode"],
        _batching(row),
        _num(native["rate"]),
        _num(wrapper["rate"]),
        speed[0],
        _num(native["cpu_us_per_msg"], 1),
        _num(wrapper["cpu_us_per_msg"], 1),
        cpu[0],
        f"{_num(native['duplicates'])} / {_num(wrapper['duplicates'])}",
        _failures(row) or "0",
        _load(row),
    ]


def _load(row: dict[str, Any]) -> str:
    """The highest 1-minute load average at the start of a run of the row, and the most cores other
    processes used during one (files before load averages: the latter only)."""
    loads = [run["loadavg"] for run in row["runs"] if "loadavg" in run]
    others = max((run.get("others_cores", 0.0) for run in row["runs"]), default=0.0)
    return (f"≤ {max(loads):.1f}, " if loads else "") + f"≤ {others:.2f}"


def _console_row(label: str, row: dict[str, Any]) -> str:
    cells_ = _row(row)
    others = max(row[kind]["others_cores_max"] for kind in report.KINDS)
    return (
        f"{label:13} {cells_[0]:17} {cells_[1]:13} {cells_[2]:9} | msg/s native {cells_[3]:>9} wrapper "
        f"{cells_[4]:>9} -> {cells_[5]:22} | CPU µs/msg native {cells_[6]:>6} wrapper {cells_[7]:>6} -> "
        f"{cells_[8]:16} | dup {cells_[9]} | failed {cells_[10]} | others ≤ {others:.2f} cores"
    )


def render(results: dict[str, Any]) -> str:
    params = results["parameters"]
    runs = f"{params['reps']} run{'s' if params['reps'] != 1 else ''}"
    fast = params.get("fast_receive", False)
    floor = params.get("floor", False)
    parts = [
        "## Per-message cost: pulsar-nack vs the native consumer"
        + (" (the wrapper with `fast_receive=True`)" if fast else "")
        + (": the floor of any Python wrapper" if floor else ""),
        "",
        *(
            [
                "No pulsar-nack in this run: in the wrapper's place (the *wrapper* columns) the official "
                "consumer behind the thinnest Python drop-in, a method of its own around `receive`, "
                "`batch_receive`, `acknowledge` and the listener, each only calling through "
                "(`bench/consumer_cost.py`'s `_Interposer`). What it costs is what any wrapper written "
                "in Python adds to every message at the least, before it does any work "
                "(docs/receive_cost.md).",
                "",
            ]
            if floor
            else []
        ),
        *(
            [
                "Fast mode (docs/receive_cost.md): while nothing is nacked the wrapper hands messages out "
                "without reading their ids; copies a broker sends on its own meanwhile are handed out as "
                "the official consumer hands them out. The default (`fast_receive=False`): the "
                "consumer-cost section.",
                "",
            ]
            if fast
            else []
        ),
        f"`python bench/consumer_cost.py{params['command_options']}` — {params['messages']:,} messages "
        f"of {PAYLOAD_BYTES} bytes pre-produced into a fresh topic, drained by a fresh consumer process "
        f"(Shared, default receiver queue); median of {runs} per kind, native and wrapper "
        "alternating which goes first. Rate = messages / (first message received → the ack completing the "
        "count); CPU = the consumer process's user + sys (C++ client threads included) over the same span. "
        f"A: every message acked. B: every {SCENARIOS['B']}th message nacked once on first sight (wrapper "
        f"`delay_ms=0`, native plain nack; both subscribed with `negative_ack_redelivery_delay_ms="
        f"{NACK_DELAY_MS}`), acked when it comes back; the run ends when each message was acked once "
        "(duplicates: copies acked again, median). Batch size = the producer's `batching_max_messages` "
        "(not batched: batching off); `batch_receive` with up to "
        f"{BATCH_RECEIVE['max_num_message']} messages / "
        f"{BATCH_RECEIVE['timeout_ms']} ms. Goals (wrapper ÷ native): A — rate ≥ {GOALS['A']['rate']}×, "
        f"CPU/msg ≤ {GOALS['A']['cpu']}×; B — drain time ≤ {GOALS['B']['drain']}×, CPU/msg ≤ "
        f"{GOALS['B']['cpu']}×.",
        "",
        report.machine_line(results["machine"]),
        "",
        f"Wrapper measured: `pulsar_nack` at {results['wrapper']['commit']} (sources sha256 "
        f"{results['wrapper']['sources_sha256']}), one snapshot for the whole run; "
        f"{results['elapsed_s'] / 60:.1f} min in all. The machine is shared (2 cores): the last column "
        "gives the highest 1-minute load average when a run of the row started and the most cores other "
        "processes used during one.",
    ]
    for label, figures in results["brokers"].items():
        rows = figures["cells"]
        met = sum(ok for row in rows for _, ok in _goal_checks(row))
        cpu_ratios = [row["ratio"]["cpu"] for row in rows if row["ratio"]["cpu"] is not None]
        parts += ["", f"### {label}", "", report.table(_HEADERS, [_row(row) for row in rows]), ""]
        if cpu_ratios:
            parts.append(
                f"- CPU per message, wrapper ÷ native: {min(cpu_ratios):.2f}× to {max(cpu_ratios):.2f}× "
                f"(median {statistics.median(cpu_ratios):.2f}×); {met} of {2 * len(rows)} goals met."
            )
        failed = [
            f"{row['scenario']} {row['mode']} {_batching(row)} {run['kind']} rep {run['rep']}: "
            f"{run.get('error')}"
            for row in rows
            for run in row["runs"]
            if not run.get("ok")
        ]
        disturbed = [
            f"{row['scenario']} {row['mode']} {_batching(row)} {run['kind']} rep {run['rep']}: "
            f"{run['others_cores']:.2f}"
            for row in rows
            for run in row["runs"]
            if run.get("others_cores", 0.0) >= QUIET_CORES
        ]
        busiest = max((run.get("others_cores", 0.0) for row in rows for run in row["runs"]), default=0.0)
        parts.append(
            f"- Other processes on the machine used at most {busiest:.2f} cores during a consumer run "
            f"(busy CPU time from /proc/stat minus this benchmark and the broker); "
            + (
                f"runs at ≥ {QUIET_CORES} cores ({len(disturbed)}): " + "; ".join(disturbed)
                if disturbed
                else f"no run reached {QUIET_CORES}."
            )
        )
        if failed:
            parts.append(f"- Failed runs ({len(failed)}): " + "; ".join(f"`{f[:160]}`" for f in failed[:8]))
        ids_floor = _id_call_floor(rows, results["parameters"].get("fast_receive", False))
        if ids_floor and not floor:
            parts.append(ids_floor)
    return "\n".join(parts)


def _id_call_floor(rows: list[dict[str, Any]], fast: bool) -> str | None:
    """The CPU ratio no per-message classification can beat: the native consumer's CPU per message plus
    the client calls that read a message's id (measured by bench/nack_path.py), for scenario A, batched;
    ``fast``: the wrapper ran in fast mode (``fast_receive=True``), which reads no id in scenario A."""
    path = report.RESULTS / "nack_path.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    calls = [row["native_id_calls_us"] for row in data["rows"] if "native_id_calls_us" in row]
    cells = [
        row
        for row in rows
        if row["scenario"] == "A" and row["batching"] and row["native"].get("cpu_us_per_msg")
    ]
    if not calls or not cells:
        return None
    id_us = min(calls)
    bounds = ", ".join(
        f"{row['mode']} {_batching(row)} ≥ "
        f"{(row['native']['cpu_us_per_msg'] + id_us) / row['native']['cpu_us_per_msg']:.2f}×"
        for row in cells
    )
    facts = data["machine"]
    reading = (
        f"Reading a message's id (`message_id()`, its batch index, ledger and entry id) costs {id_us:.2f} µs "
        f"a message (`bench/nack_path.py`, {facts['date']}, commit {facts['commit']})"
    )
    if fast:
        return (
            "- Scenario A runs in fast mode (`fast_receive=True`, docs/receive_cost.md, direction (b)): "
            f"no message's id is read while nothing is nacked. {reading}: added to the native CPU per "
            "message of scenario A, batched, that is the floor of a wrapper classifying every message "
            f"(the default, and scenario B): {bounds}, before any bookkeeping."
        )
    return (
        "- The wrapper classifies every message (the default, `fast_receive=False`). "
        f"{reading}: added to the native CPU per message of scenario A, batched, that is the floor of "
        f"any per-message classification: {bounds}, before any bookkeeping."
    )


# -- the wrapper under test -------------------------------------------------------------------------


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=report.ROOT, capture_output=True, text=True, check=True).stdout


def snapshot_wrapper(rev: str, into: Path) -> dict[str, Any]:
    """Copy ``pulsar_nack`` as of git ``rev`` (``worktree``: the files as they are now) into ``into``."""
    if rev == "worktree":
        ignore = shutil.ignore_patterns("__pycache__")
        shutil.copytree(report.ROOT / "pulsar_nack", into / "pulsar_nack", ignore=ignore)
        changed = _git("status", "--porcelain", "--", "pulsar_nack").strip()
        commit = _git("rev-parse", "--short", "HEAD").strip() + (" + uncommitted changes" if changed else "")
    else:
        commit = _git("rev-parse", "--short", f"{rev}^{{commit}}").strip()
        archive = subprocess.run(
            ["git", "archive", commit, "pulsar_nack"], cwd=report.ROOT, capture_output=True, check=True
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(into, filter="data")
    digest = hashlib.sha256()
    for path in sorted((into / "pulsar_nack").rglob("*.py")):
        digest.update(path.relative_to(into).as_posix().encode() + b"\0" + path.read_bytes())
    return {"rev": rev, "commit": commit, "sources_sha256": digest.hexdigest()[:16]}


# -- the run ----------------------------------------------------------------------------------------


def _choices(value: str, allowed: tuple[str, ...], name: str) -> list[str]:
    chosen = [v for v in value.split(",") if v]
    unknown = [v for v in chosen if v not in allowed]
    if not chosen or unknown:
        raise SystemExit(f"--{name}: {value!r}; choose from {', '.join(allowed)}")
    return chosen


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--brokers", default="lite,apache", help="lite, apache (default both)")
    parser.add_argument("--messages", type=int, help="per run (default 100,000)")
    parser.add_argument("--quick", action="store_true", help="20,000 messages per run")
    parser.add_argument("--reps", type=int, default=3, help="runs per kind and cell (default 3)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per consumer run (default 180)")
    parser.add_argument("--scenarios", default="A,B", help="A (nothing nacked), B (10 %% nacked)")
    parser.add_argument("--modes", default=",".join(MODES), help=", ".join(MODES))
    parser.add_argument(
        "--batch-sizes",
        default=",".join(map(str, BATCH_SIZES)),
        help="producer batch sizes (batching_max_messages; 1 = not batched), default 1,10,100,1000",
    )
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=60.0,
        help=f"seconds each run may wait for other processes to use < {QUIET_CORES} cores (default 60)",
    )
    parser.add_argument(
        "--wrapper-rev",
        default="HEAD",
        help="git revision of pulsar_nack to measure, or 'worktree' (default HEAD)",
    )
    parser.add_argument(
        "--diagnose",
        action="store_true",
        help="a run that times out records which nacked messages never came back and where the wrapper "
        "has them (held, pending, in flight, handed out; 'lost' in the JSON); reads each nacked id",
    )
    parser.add_argument(
        "--fast-receive",
        action="store_true",
        help="subscribe the wrapper with fast_receive=True (fast mode); results go to "
        "bench/results/consumer_cost_fast.json and the consumer-cost-fast section",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="measure the thinnest Python drop-in (the official consumer behind pass-through methods) in "
        "the wrapper's place; results go to bench/results/consumer_cost_floor.json and the "
        "consumer-cost-floor section",
    )
    parser.add_argument("--consume", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.consume:
        consume(json.loads(args.consume))
        return 0
    args.messages = args.messages or (20_000 if args.quick else 100_000)
    if args.messages < 100 or args.reps < 1:
        parser.error("--messages must be ≥ 100 and --reps ≥ 1")
    args.scenarios = _choices(args.scenarios, tuple(SCENARIOS), "scenarios")
    args.modes = _choices(args.modes, MODES, "modes")
    if args.floor and (args.fast_receive or "B" in args.scenarios):
        parser.error("--floor: scenario A only (--scenarios A; nothing nacked), without --fast-receive")
    try:
        args.batch_sizes = [int(v) for v in args.batch_sizes.split(",") if v]
    except ValueError:
        parser.error(f"--batch-sizes: {args.batch_sizes!r}; integers >= 1, e.g. 1,10,100,1000")
    if not args.batch_sizes or min(args.batch_sizes) < 1:
        parser.error(f"--batch-sizes: {args.batch_sizes!r}; integers >= 1, e.g. 1,10,100,1000")
    with tempfile.TemporaryDirectory(prefix="consumer-cost-") as snapshot:
        wrapper = snapshot_wrapper(args.wrapper_rev, Path(snapshot))
        # the brokers come from this working tree (imported before the snapshot goes on the path, so they
        # work whichever revision is measured); every consumer process imports the snapshot
        import harness.standalone  # noqa: F401
        import pulsar_nack.testing  # noqa: F401

        args.wrapper_path = snapshot
        sys.path.insert(0, snapshot)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (snapshot, os.environ.get("PYTHONPATH")) if p)
        results = run(args, argv, wrapper)
    suffix = "_floor" if args.floor else "_fast" if args.fast_receive else ""
    report.save_json(f"consumer_cost{suffix}", results)
    markdown = render(results)
    report.write_section(f"consumer-cost{suffix.replace('_', '-')}", markdown)
    print(markdown)
    print(f"\n{results['elapsed_s'] / 60:.1f} min", file=sys.stderr)
    return 0


def run(args: argparse.Namespace, argv: list[str], wrapper: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    results: dict[str, Any] = {
        "machine": report.machine(),
        "wrapper": wrapper,
        "parameters": {
            "messages": args.messages,
            "reps": args.reps,
            "timeout_s": args.timeout,
            "scenarios": {s: SCENARIOS[s] for s in args.scenarios},
            "modes": args.modes,
            "batch_sizes": args.batch_sizes,
            "batch_receive_policy": BATCH_RECEIVE,
            "nack_redelivery_delay_ms": NACK_DELAY_MS,
            "payload_bytes": PAYLOAD_BYTES,
            "goals": GOALS,
            "fast_receive": args.fast_receive,
            "floor": args.floor,
            "quiet_cores": QUIET_CORES,
            "quiet_wait_s": args.quiet_wait,
            "diagnose": args.diagnose,
            "command_options": "".join(f" {a}" for a in argv),
        },
        "brokers": {},
    }
    from harness.standalone import PulsarStandalone

    for label, broker_type in report.brokers(args.brokers.split(",")):
        print(f"starting {label} ...", file=sys.stderr)
        # the JIT's full tiers for a throughput benchmark (PulsarStandalone's default is C1 only)
        options = {"c1_only": False} if broker_type is PulsarStandalone else {}
        with broker_type(**options) as broker:
            results["brokers"][label] = run_broker(label, broker, args)
    results["elapsed_s"] = time.monotonic() - started
    return results


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
