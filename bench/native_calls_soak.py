"""Benchmark: which native call on the official consumer grows the process heap with run time?

A bisection of the soak's finding (bench/nack_soak.py: pulsar-nack's consumer process heap grows with run
time in native memory while its own structures are flat). Each *call pattern* below runs a bare official
``pulsar.Client`` consumer — no pulsar-nack — on one pulsar-lite, each in a fresh process
(``PYTHONMALLOC=malloc``, glibc tcache off), all at once with the same traffic: a producer in the process
sends ``--rate`` messages a second in batches of 10 for ``--round-s``; the consumer settles ``--share`` of
first deliveries the pattern's way and acks everything else by the received message, redeliveries
included. Then the round drains: the producer stops and flushes, every redelivery comes and is acked,
nothing arrives for 1.5 s, the grouped acks go out; only then the process reads its heap from outside
(:func:`pulsar_nack.memory.heap_in_use`) into a table allocated before the run, so no message in flight
is counted (sampled while traffic flows, the heap moves by ~±100 KB with the messages in flight, and a
loaded machine's backlog looks like growth). Past the warm-up the least-squares slope (bytes a minute),
its standard error, and the slope per 1,000 messages received tell a trend.

Patterns (what the wrapper does, taken apart):

* ``ack`` — every message acked by its received message: the control.
* ``nack-received`` — the official nack of the received message (batched id), every 50 ms in a group,
  native delay 100 ms; redeliveries acked by their received message.
* ``nack-rebuilt`` — as pulsar-nack forwards a due entry: one native nack per entry of a *rebuilt*
  whole-entry id ``_pulsar.MessageId(partition, ledger, entry, -1)`` with its topic set.
* ``nack-rebuilt-thread`` — ``nack-rebuilt``, the nacks called from a second thread every 50 ms while the
  main thread receives (pulsar-nack forwards from its timer thread).
* ``nack-rebuilt-ack-entry`` — ``nack-rebuilt``, and once every message of a redelivered batch is acked by
  its received message, an ack of the rebuilt whole-entry id too (pulsar-nack's ack of a completed entry).
* ``ack-entry`` — no nack; every message acked by its received message and then the rebuilt whole-entry id
  acked too, once per entry (the whole-entry ack alone).
* ``wrapper`` — pulsar-nack itself (nack delay 1 s, its forwards and whole-entry acks), the soak's kind.
* ``wrapper-ack`` — pulsar-nack acking every message: its per-message path without a nack.

    python bench/native_calls_soak.py [--minutes 8] [--rate 1000] [--round-s 20] [--share 0.5]
        [--patterns ack,...]

``--trace N`` runs each probe under ``tracemalloc`` (N frames) and saves, with each run, the 15 call sites
whose Python allocations grew most between the second drained sample and the last.

Writes ``bench/results/native_calls_soak.json`` (``native_calls_soak_trace.json`` with ``--trace``: its
rounds are slower, so its slopes are not comparable) and the ``native-calls-soak`` (``-trace``) section of
docs/performance.md; ``--from-results`` re-renders from the saved samples.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import report
from nack_soak import steady, warm_numpy_cache

SCRIPT = Path(__file__).resolve()
COLUMNS = ("t_s", "heap", "rss", "received", "nacked", "entry_acks", "sent")
PATTERNS = {
    "ack": "ack of the received message only (control)",
    "nack-received": "native nack of the received message",
    "nack-rebuilt": "native nack of a rebuilt whole-entry id",
    "nack-rebuilt-thread": "native nack of a rebuilt whole-entry id, from another thread",
    "nack-rebuilt-ack-entry": "native nack and ack of rebuilt whole-entry ids",
    "ack-entry": "ack of a rebuilt whole-entry id (no nacks)",
    "wrapper": "pulsar-nack (its forwards and whole-entry acks)",
    "wrapper-ack": "pulsar-nack, acking everything (no nacks)",
}
WARMUP_S = 90.0
FORWARD_S = 0.05  # nack in groups no more often than this (the native timer restarts at every nack)
QUIET_S = 1.5  # drained: nothing received for this long (native nack delay 100 ms, forwards every 50 ms)
WRAPPER_DELAY_MS = 1_000  # the wrapper's nack delay (its pending nacks must be settled before a sample)


def probe(payload: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: run one call pattern and sample the heap."""
    import gc
    import random
    import threading

    import _pulsar
    import pulsar

    import pulsar_nack
    from pulsar_nack.memory import heap_in_use, rss_bytes
    from pulsar_nack.native.client import batch_size

    url, minutes, rate, share = payload["url"], payload["minutes"], payload["rate"], payload["share"]
    pattern, round_s, topic = payload["pattern"], payload["round_s"], payload["topic"]
    wrapped = pattern.startswith("wrapper")
    nacking = pattern.startswith("nack") or pattern == "wrapper"
    rebuilt = pattern.startswith("nack-rebuilt")
    threaded = pattern == "nack-rebuilt-thread"
    lock = threading.Lock()
    ack_entry = pattern in ("nack-rebuilt-ack-entry", "ack-entry")
    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    client = pulsar_nack.Client(url, logger=logger) if wrapped else pulsar.Client(url, logger=logger)
    consumer = client.subscribe(
        topic,
        "calls",
        consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_redelivery_delay_ms=WRAPPER_DELAY_MS if wrapped else 100,
    )
    native = consumer if wrapped else consumer._consumer  # the _pulsar.Consumer
    producer = client.create_producer(
        topic, batching_enabled=True, batching_max_messages=10, batching_max_publish_delay_ms=5
    )
    stop, producing, idle = threading.Event(), threading.Event(), threading.Event()
    sent = [0]

    def produce() -> None:
        while not stop.is_set():
            if not producing.wait(0.1):
                continue
            idle.clear()
            started, base = time.monotonic(), sent[0]
            while producing.is_set() and not stop.is_set():
                due = base + int((time.monotonic() - started) * rate)
                while sent[0] < due:
                    producer.send_async(sent[0].to_bytes(8, "big"), None)
                    sent[0] += 1
                time.sleep(0.01)
            producer.flush()
            idle.set()

    def entry_id(message: Any) -> Any:
        mid = message.message_id()
        rebuilt_id = _pulsar.MessageId(mid.partition(), mid.ledger_id(), mid.entry_id(), -1)
        rebuilt_id.topic_name(topic)
        return rebuilt_id

    def forwarder() -> None:  # the threaded pattern's: nack what the main thread collected
        while not stop.wait(FORWARD_S):
            with lock:
                targets = list(to_nack.values())
                to_nack.clear()
            for target in targets:
                native.negative_acknowledge(target)

    thread = threading.Thread(target=produce, daemon=True)
    forwarding = threading.Thread(target=forwarder, daemon=True)
    trace = payload.get("trace", 0)
    snapshots: list[Any] = []
    if trace:
        import tracemalloc

        tracemalloc.start(trace)
    rng = random.Random(7)
    numpy_cache = warm_numpy_cache()  # (see there: numpy's cache of small buffers, filled before the run)
    table = np.zeros((int(minutes * 60 / round_s) + 2, len(COLUMNS)))
    taken = received = nacked = entry_acks = 0
    to_nack: dict[tuple[int, ...], Any] = {}  # (ledger, entry[, batch index]) → what to nack, per group
    acked_in_entry: dict[tuple[int, int], int] = {}  # entry → its messages acked (ack-entry patterns)
    started = time.monotonic()
    end = started + minutes * 60
    next_forward = started + FORWARD_S
    round_end = started + round_s
    last_arrival = started
    producing.set()
    thread.start()
    if threaded:
        forwarding.start()
    try:
        while True:
            now = time.monotonic()
            if producing.is_set() and now >= round_end:
                producing.clear()  # the round's traffic is sent: drain it, then sample a quiet process
            drained = not producing.is_set() and not to_nack and now - last_arrival >= QUIET_S
            if drained and idle.is_set() and (not wrapped or consumer.nack_stats().pending == 0):
                time.sleep(0.3)  # the acks grouped in the last 100 ms go out
                gc.collect()
                table[taken] = (
                    now - started,
                    heap_in_use(),
                    rss_bytes(),
                    received,
                    nacked,
                    entry_acks,
                    sent[0],
                )
                taken += 1
                if trace and (taken == 2 or now >= end):  # Python allocations, warm and at the end
                    snapshots.append(tracemalloc.take_snapshot())
                if now >= end or taken == len(table):
                    break
                round_end = time.monotonic() + round_s
                producing.set()
            if to_nack and now >= next_forward and not threaded:
                for target in to_nack.values():
                    native.negative_acknowledge(target)
                to_nack.clear()
                next_forward = now + FORWARD_S
            try:
                message = consumer.receive(20)
            except pulsar.Timeout:
                continue
            last_arrival = time.monotonic()
            received += 1
            first = message.redelivery_count() == 0
            if nacking and first and rng.random() < share:
                nacked += 1
                if wrapped:
                    consumer.negative_acknowledge(message)
                    continue
                mid = message.message_id()
                if rebuilt:
                    key = (mid.ledger_id(), mid.entry_id())
                    if key not in to_nack:
                        with lock:
                            to_nack[key] = entry_id(message)
                else:
                    to_nack[(mid.ledger_id(), mid.entry_id(), mid.batch_index())] = message._message
                continue
            consumer.acknowledge(message)
            if ack_entry and (not first or pattern == "ack-entry"):
                mid = message.message_id()
                key = (mid.ledger_id(), mid.entry_id())
                count = acked_in_entry.get(key, 0) + 1
                if count >= max(batch_size(mid), 1):  # the batch's size, from its id
                    acked_in_entry.pop(key, None)
                    native.acknowledge(entry_id(message))
                    entry_acks += 1
                else:
                    acked_in_entry[key] = count
    finally:
        stop.set()
        thread.join(5)
        if threaded:
            forwarding.join(5)
        closed = True
        try:
            consumer.close()
            client.close()
        except pulsar.PulsarException:
            closed = False
    samples = [
        {name: float(v) if name == "t_s" else int(v) for name, v in zip(COLUMNS, row, strict=True)}
        for row in table[:taken]
    ]
    grown = []
    if len(snapshots) == 2:
        for stat in snapshots[1].compare_to(snapshots[0], "traceback")[:15]:
            grown.append(
                {"bytes": stat.size_diff, "count": stat.count_diff, "where": stat.traceback.format()}
            )
    return {
        "traced": grown,
        "samples": samples,
        "received": received,
        "nacked": nacked,
        "entry_acks": entry_acks,
        "sent": sent[0],
        "closed": closed,
        "numpy_cache": numpy_cache,
    }


def trend(figure: dict[str, float], prefix: str = "") -> str:
    value, error = figure[prefix + "slope_per_min"], figure[prefix + "slope_se_per_min"]
    told = "flat" if abs(value) <= 2 * error else ("grows" if value > 0 else "falls")
    return f"{value:+,.0f} ± {2 * error:,.0f} ({told})"


def measure(args: argparse.Namespace, patterns: list[str]) -> dict[str, Any]:
    """All patterns at once on one pulsar-lite, one topic each, one fresh process each."""
    import concurrent.futures
    import uuid

    from pulsar_nack.testing import PulsarLite

    path = os.pathsep.join(p for p in (str(report.ROOT), os.environ.get("PYTHONPATH")) if p)
    env: dict[str, str | None] = {"PYTHONMALLOC": "malloc", "PYTHONPATH": path}
    settings = {
        "minutes": args.minutes,
        "rate": args.rate,
        "share": args.share,
        "round_s": args.round_s,
        "patterns": patterns,
        "trace": args.trace,
    }
    facts = report.machine()
    with PulsarLite() as broker, concurrent.futures.ThreadPoolExecutor(len(patterns)) as pool:
        futures = {
            pattern: pool.submit(
                report.run_probe,
                SCRIPT,
                {
                    "url": broker.service_url,
                    "pattern": pattern,
                    "topic": f"calls-{uuid.uuid4().hex[:10]}",
                    **settings,
                },
                args.minutes * 60 + 300,
                env,
            )
            for pattern in patterns
        }
        runs: dict[str, Any] = {}
        for pattern, future in futures.items():
            try:
                runs[pattern] = future.result()
            except RuntimeError as error:  # one failed pattern loses no other's samples
                print(f"{pattern}: {error}", file=sys.stderr)
    saved = {"machine": facts, "settings": settings, "runs": runs}
    report.save_json(result_name(args.trace), saved)
    return saved


def numpy_cache_note(runs: dict[str, Any]) -> str:
    """A sentence on numpy's cache of small freed buffers, filled in each probe before its run (see
    ``nack_soak.warm_numpy_cache``), with the bytes it held in the wrapper's; empty for results saved
    before the probes filled it."""
    held = [run["numpy_cache"] for run in runs.values() if "numpy_cache" in run]
    if not held:
        return ""
    wrapper = runs.get("wrapper", {}).get("numpy_cache")
    return (
        " Each probe first fills numpy's cache of small freed buffers (up to 7 per data size below "
        "1 KiB, malloc-ed: in use to mallinfo2, unseen by tracemalloc; pulsar-nack's flush fills it over "
        "minutes with arrays of every size, which read as heap growth before)"
        + (f": {wrapper:,} B in the wrapper's process" if wrapper is not None else "")
        + f" ({min(held):,}–{max(held):,} B over the probes)."
    )


def site_text(where: list[str]) -> str:
    """``path:line `code``` of a tracemalloc traceback's innermost frame (its formatted lines), the path
    from the repository (or the library) down."""
    match = re.search(r'File ".*?/((?:pulsar_nack|bench|site-packages)/[^"]+)", line (\d+)', where[-2])
    place = f"{match.group(1)}:{match.group(2)}" if match else where[-2].strip()
    return f"{place} `{where[-1].strip()}`"


def result_name(trace: int) -> str:
    """The results file's (and the section's) name: traced runs are kept apart."""
    return "native_calls_soak_trace" if trace else "native_calls_soak"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    parser.add_argument("--minutes", type=float, default=8.0)
    parser.add_argument("--rate", type=int, default=1_000, help="messages a second per pattern (1,000)")
    parser.add_argument("--share", type=float, default=0.5, help="share of first deliveries nacked (0.5)")
    parser.add_argument("--round-s", type=float, default=20.0, help="seconds of traffic per round (20)")
    parser.add_argument("--patterns", default=",".join(PATTERNS), help="from: " + ", ".join(PATTERNS))
    parser.add_argument(
        "--trace",
        type=int,
        default=0,
        help="tracemalloc with this many frames in each probe; the 15 sites that grew most from the 2nd "
        "sample to the last are saved with the run (slows the consumer: rounds take longer)",
    )
    parser.add_argument("--from-results", action="store_true", help="no run: re-render the saved results")
    args = parser.parse_args(argv)
    if args.probe:
        print(json.dumps(probe(json.loads(args.probe))), flush=True)
        return 0
    patterns = args.patterns.split(",")
    if set(patterns) - set(PATTERNS):
        parser.error(f"--patterns: from {', '.join(PATTERNS)}, got {args.patterns!r}")
    if args.minutes * 60 < WARMUP_S + 6 * args.round_s:
        parser.error(f"--minutes: at least {(WARMUP_S + 6 * args.round_s) / 60:.1f}")
    if args.from_results:
        saved = json.loads((report.RESULTS / f"{result_name(args.trace)}.json").read_text())
    else:
        saved = measure(args, patterns)
    settings, runs = saved["settings"], saved["runs"]
    rows = []
    for pattern in [p for p in settings["patterns"] if p in runs]:
        run = runs[pattern]
        heap = steady(run["samples"], WARMUP_S, "heap")
        run["heap"] = heap
        after = [s for s in run["samples"] if s["t_s"] >= WARMUP_S]
        per_min = (after[-1]["received"] - after[0]["received"]) / heap["minutes"]
        rows.append(
            [
                f"`{pattern}`: {PATTERNS[pattern]}",
                f"{run['received']:,}",
                f"{run['nacked']:,}",
                f"{run['entry_acks']:,}",
                str(heap["samples"]),
                trend(heap),
                trend(heap, "late_"),
                f"{heap['growth']:+,.0f}",
                f"{heap['slope_per_min'] / per_min * 1000:+,.1f}",
            ]
        )
    text = "\n\n".join(
        [
            "## Which native call grows the heap? (soak bisection"
            + (", under tracemalloc)" if settings.get("trace") else ")"),
            "`python bench/native_calls_soak.py` — a bare official consumer (no pulsar-nack, except the "
            "`wrapper` row) per call pattern, all patterns at once on one pulsar-lite, each in a fresh "
            f"process (`PYTHONMALLOC=malloc`, tcache off) for {settings['minutes']:g} min: "
            f"rounds of {settings['round_s']:g} s at {settings['rate']:,} messages/s in batches of 10, "
            f"{settings['share']:.0%} of first deliveries settled the pattern's way (native nacks in groups "
            "every 50 ms, native delay 100 ms; the wrapper's delay 1 s), everything else acked; after each "
            "round the traffic drains (every redelivery acked, 1.5 s quiet, grouped acks sent) and the heap "
            "(pymalloc off: every allocation) is read. Slopes after a "
            f"{WARMUP_S:.0f} s warm-up, ± two standard errors." + numpy_cache_note(runs),
            report.machine_line(saved["machine"]),
            report.table(
                [
                    "pattern",
                    "received",
                    "nacked",
                    "whole-entry acks",
                    "samples",
                    "heap slope, B/min",
                    "second half",
                    "growth, B",
                    "B per 1,000 received",
                ],
                rows,
            ),
        ]
    )
    bare = [p for p in settings["patterns"] if p in runs and not p.startswith("wrapper")]
    if bare:
        worst = max(bare, key=lambda p: runs[p]["heap"]["late_slope_per_min"])
        lines = [
            f"Over the second half, the bare official consumer's largest slope is `{worst}`'s "
            f"{trend(runs[worst]['heap'], 'late_')} B/min"
        ]
        if "wrapper" in runs:
            lines.append(f"pulsar-nack's is {trend(runs['wrapper']['heap'], 'late_')} B/min")
        text += "\n\n" + "; ".join(lines) + "."
    traced = [p for p in settings["patterns"] if runs.get(p, {}).get("traced")]
    for pattern in traced:
        sites = runs[pattern]["traced"][:3]
        where = "; ".join(
            f"{site['bytes']:+,} B in {site['count']:+,} blocks at {site_text(site['where'])}"
            for site in sites
        )
        text += f"\n\n`{pattern}`, the Python allocations that grew most (tracemalloc): {where}."
    report.save_json(result_name(settings.get("trace", 0)), saved)
    report.write_section(result_name(settings.get("trace", 0)).replace("_", "-"), text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
