"""Benchmark: a soak at constant pending — does anything the wrapper keeps grow with run time?

A consumer on a real broker (pulsar-lite, embedded) for ``--minutes`` (10 by default): a producer sends
``--rate`` messages a second in batches of 10, the consumer nacks ``--share`` of first deliveries with
the default delay (``--delay-s``) and acks everything else, redeliveries included, so pending nacks stay
near rate × share × delay once the first delay has passed. Every ``--sample-s`` (5 s) the consumer
process — a fresh one, ``PYTHONMALLOC=malloc`` with glibc's tcache off — reads its heap from outside
(:func:`pulsar_nack.memory.heap_in_use`: the client library's state included, and the producer's, which
runs in the same process) and ``nack_stats(with_memory=True)``, into a table allocated before the run
(a list of samples would itself grow with run time). Past the warm-up (twice the delay plus a minute)
memory must be flat: the least-squares slope of each, in bytes per minute, with its standard error (the
heap moves by ~±100 KB from sample to sample with the messages in flight, so a slope of a few KB/min is
only told from zero over many samples), and the growth from the first steady sample to the last.

Kinds: ``wrapper`` (pulsar-nack), ``native`` (the official consumer with the same nacks: its tracker
starves under a steady nack stream — each nack restarts its timer — so its pending grows until the
broker stops dispatching; not a constant-pending run) and ``native-ack`` (the official consumer with the
same traffic, acking what the others nack: the client library's own drift, the control).

    python bench/nack_soak.py [--minutes 10] [--rate 2000] [--share 0.5] [--delay-s 10] [--sample-s 5]

Writes ``bench/results/nack_soak.json`` and the ``nack-soak`` section of docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import report

SCRIPT = Path(__file__).resolve()
SAMPLE_S = 5.0
COLUMNS = ("t_s", "heap", "reported", "pending", "received", "sent")


#: numpy keeps up to 7 freed data buffers of each size below 1,024 bytes (and of each array rank's shape
#: below 16) for reuse (``_npy_alloc_cache``, numpy/_core/src/multiarray/alloc.c): malloc-ed, so counted
#: as in use by mallinfo2, and untracked by tracemalloc. pulsar-nack's flush makes small arrays of every
#: size its forwards have (entry ids, masks, numpy temporaries), so that cache fills up over minutes —
#: ~1 MB after a run's first minutes, at most ~3.6 MB, whatever the pending nacks — and reads as heap
#: growth with run time in a soak (the tracker's own structures stay flat). Each probe fills it first.
NUMPY_CACHE_BYTES = 1_024
NUMPY_CACHE_DEPTH = 7
NUMPY_CACHE_DIMS = 16


def warm_numpy_cache() -> int:
    """Fill numpy's cache of small freed buffers (every data size below 1 KiB, every rank below 16) in
    this process, so that its filling is not read as growth; returns the heap bytes it then holds
    (:func:`pulsar_nack.memory.heap_in_use` before and after). O(1,024 × 8) allocations, ~10 ms."""
    import gc

    from pulsar_nack.memory import heap_in_use

    gc.collect()
    before = heap_in_use()
    for size in range(1, NUMPY_CACHE_BYTES):
        held = [np.empty(size, np.uint8) for _ in range(NUMPY_CACHE_DEPTH + 1)]
        del held
    for rank in range(1, NUMPY_CACHE_DIMS):
        held = [np.empty((1,) * rank, np.uint8) for _ in range(NUMPY_CACHE_DEPTH + 1)]
        del held
    gc.collect()
    return heap_in_use() - before


def probe(payload: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: run the soak and sample memory."""
    import gc
    import random
    import threading
    import uuid

    import pulsar

    import pulsar_nack
    from pulsar_nack.memory import heap_in_use

    url, minutes, rate = payload["url"], payload["minutes"], payload["rate"]
    share, delay_ms = payload["share"], int(payload["delay_s"] * 1000)
    wrapped = payload["kind"] == "wrapper"
    nacking = payload["kind"] != "native-ack"
    sample_s = payload["sample_s"]
    topic = f"persistent://public/default/soak-{uuid.uuid4().hex[:12]}"
    client = pulsar_nack.Client(url) if wrapped else pulsar.Client(url)
    consumer = client.subscribe(
        topic, "soak", consumer_type=pulsar.ConsumerType.Shared, negative_ack_redelivery_delay_ms=delay_ms
    )
    producer = client.create_producer(
        topic, batching_enabled=True, batching_max_messages=10, batching_max_publish_delay_ms=5
    )
    stop = threading.Event()
    sent = [0]

    def produce() -> None:
        started = time.monotonic()
        while not stop.is_set():
            due = int((time.monotonic() - started) * rate)
            while sent[0] < due:
                producer.send_async(sent[0].to_bytes(8, "big"), None)
                sent[0] += 1
            time.sleep(0.01)
        producer.flush()

    thread = threading.Thread(target=produce, daemon=True)
    rng = random.Random(7)
    numpy_cache = warm_numpy_cache()
    # one row per sample, allocated now: appending to a list would grow the heap being measured
    table = np.zeros((int(minutes * 60 / sample_s) + 2, len(COLUMNS)))
    taken = 0
    received = nacked = 0
    started = time.monotonic()
    end = started + minutes * 60
    next_sample = started
    thread.start()
    try:
        while True:
            now = time.monotonic()
            if now >= next_sample:
                gc.collect()
                heap = heap_in_use()
                stats = consumer.nack_stats(with_memory=True) if wrapped else None
                reported = stats.memory_bytes or 0 if stats is not None else 0
                pending = stats.pending if stats is not None else 0
                table[taken] = (now - started, heap, reported, pending, received, sent[0])
                taken += 1
                next_sample = now + sample_s
                if now >= end or taken == len(table):
                    break
            try:
                message = consumer.receive(100)
            except pulsar.Timeout:
                continue
            received += 1
            if message.redelivery_count() == 0 and rng.random() < share and nacking:
                consumer.negative_acknowledge(message)
                nacked += 1
            else:
                consumer.acknowledge(message)
    finally:
        stop.set()
        thread.join(5)
        closed = True
        try:  # a close that times out (the official consumer's, once, on a loaded machine) loses no sample
            consumer.close()
            client.close()
        except pulsar.PulsarException:
            closed = False
    samples = [
        {name: float(v) if name == "t_s" else int(v) for name, v in zip(COLUMNS, row, strict=True)}
        for row in table[:taken]
    ]
    return {
        "samples": samples,
        "received": received,
        "nacked": nacked,
        "sent": sent[0],
        "closed": closed,
        "numpy_cache": numpy_cache,
    }


def steady(samples: list[dict[str, float]], warmup_s: float, key: str) -> dict[str, float]:
    """Slope (bytes a minute) with its standard error, over the samples after the warm-up and over their
    second half (a rise that levels off is told from one that goes on), and the growth of ``key``."""
    after = [s for s in samples if s["t_s"] >= warmup_s]
    if len(after) < 6:
        raise SystemExit(f"too few samples after the {warmup_s:.0f} s warm-up: run longer (--minutes)")
    t = np.array([s["t_s"] for s in after]) / 60
    values = np.array([s[key] for s in after], dtype=np.float64)
    fit, covariance = np.polyfit(t, values, 1, cov=True)
    half = len(t) // 2
    late, late_covariance = np.polyfit(t[half:], values[half:], 1, cov=True)
    return {
        "slope_per_min": float(fit[0]),
        "slope_se_per_min": float(np.sqrt(covariance[0, 0])),
        "late_slope_per_min": float(late[0]),
        "late_slope_se_per_min": float(np.sqrt(late_covariance[0, 0])),
        "late_from_s": float(t[half] * 60),
        "samples": len(after),
        "growth": float(values[-1] - values[0]),
        "first": float(values[0]),
        "last": float(values[-1]),
        "minutes": float(t[-1] - t[0]),
    }


KINDS = {
    "wrapper": "pulsar-nack: process heap (from outside)",
    "native": "official consumer, same nacks: process heap",
    "native-ack": "official consumer, acking instead (control): process heap",
}


def verdict(label: str, figure: dict[str, float]) -> str:
    """One sentence: is the slope told from zero (two standard errors), over the whole steady window and
    over its second half?"""
    parts = []
    for prefix, span in (("", "after the warm-up"), ("late_", f"from {figure['late_from_s']:.0f} s on")):
        slope, error = figure[prefix + "slope_per_min"], figure[prefix + "slope_se_per_min"]
        trend = "no trend told from zero" if abs(slope) <= 2 * error else ("grows" if slope > 0 else "falls")
        parts.append(f"{span} {trend} ({slope:+,.0f} ± {2 * error:,.0f} B/min)")
    return f"{label}: " + "; ".join(parts) + " (± two standard errors)"


Results = tuple[dict[str, Any], dict[str, Any], dict[str, dict[str, Any]]]


def measure(args: argparse.Namespace, kinds: list[str], warmup_s: float) -> Results:
    """Run each kind in turn on one pulsar-lite and save the results: machine facts, settings, runs."""
    from pulsar_nack.testing import PulsarLite

    facts = report.machine()
    path = os.pathsep.join(p for p in (str(report.ROOT), os.environ.get("PYTHONPATH")) if p)
    env: dict[str, str | None] = {"PYTHONMALLOC": "malloc", "PYTHONPATH": path}
    settings = {
        "minutes": args.minutes,
        "rate": args.rate,
        "share": args.share,
        "delay_s": args.delay_s,
        "sample_s": args.sample_s,
        "kinds": kinds,
    }
    runs: dict[str, dict[str, Any]] = {}
    with PulsarLite() as broker:
        # the official consumer on the same broker with the same traffic, in turn (one fresh process each)
        for kind in kinds:
            payload = {"url": broker.service_url, "kind": kind, **settings}
            runs[kind] = report.run_probe(SCRIPT, payload, timeout=args.minutes * 60 + 300, env=env)
            runs[kind]["heap"] = steady(runs[kind]["samples"], warmup_s, "heap")
            if kind == "wrapper":
                runs[kind]["reported"] = steady(runs[kind]["samples"], warmup_s, "reported")
    report.save_json("nack_soak", {"machine": facts, "settings": settings, "runs": runs})
    return facts, settings, runs


def cache_note(runs: dict[str, dict[str, Any]]) -> str:
    """A sentence on numpy's cache, if the probes filled it first (:func:`warm_numpy_cache`); else one
    saying they did not (results saved before)."""
    held = {kind: run["numpy_cache"] for kind, run in runs.items() if "numpy_cache" in run}
    if not held:
        return " The probes did not fill numpy's cache of small freed buffers first (see below)."
    return (
        " Each probe first fills numpy's cache of small freed buffers (up to 7 per size below 1 KiB, "
        "malloc-ed; filled by pulsar-nack's flushes over minutes otherwise): "
        + ", ".join(f"{held[kind]:,} B ({kind})" for kind in held)
        + "."
    )


def bisection() -> str:
    """A paragraph on where the growth is, from bench/native_calls_soak.py's saved results (empty if it
    has not run): its second-half slopes, the bare official consumer's calls beside pulsar-nack's."""
    path = report.RESULTS / "native_calls_soak.json"
    if not path.exists():
        return ""
    runs = json.loads(path.read_text())["runs"]
    if "wrapper" not in runs or not all("heap" in run for run in runs.values()):
        return ""
    bare = {
        kind: run["heap"]["late_slope_per_min"]
        for kind, run in runs.items()
        if not kind.startswith("wrapper")
    }
    wrapper = runs["wrapper"]["heap"]
    return (
        "\n\nWhere the heap grows is bisected by `bench/native_calls_soak.py` (its section below; heap read "
        "only after each round has drained): the bare official consumer doing each of pulsar-nack's native "
        "calls — nacks of received ids, nacks and acks of rebuilt whole-entry ids — grows at most "
        f"{max(bare.values()):+,.0f} B/min over the second half ({min(bare.values()):+,.0f} at least), "
        f"pulsar-nack {wrapper['late_slope_per_min']:+,.0f} ± {2 * wrapper['late_slope_se_per_min']:,.0f} "
        "B/min in the same run: the native calls made from the main thread do not grow the heap."
        + (warmed(runs["wrapper"]) if "numpy_cache" in runs["wrapper"] else traced())
    )


def warmed(wrapper: dict[str, Any]) -> str:
    """A sentence for a bisection whose probes filled numpy's cache first (see :func:`warm_numpy_cache`):
    what pulsar-nack's growth was."""
    return (
        " There every probe first filled numpy's cache of small freed buffers "
        f"({wrapper['numpy_cache']:,} B in pulsar-nack's process): pulsar-nack's growth in the runs before "
        "was that cache filling with the flush's arrays of every size (bounded: at most 7 buffers per size "
        "below 1 KiB), not a structure of pulsar-nack's."
    )


def traced() -> str:
    """A sentence from bench/native_calls_soak.py's ``--trace`` run (empty if there is none): where the
    Python allocations that grew most were made, pulsar-nack's and the bare consumer's nacking from a
    second thread."""
    path = report.RESULTS / "native_calls_soak_trace.json"
    if not path.exists():
        return ""
    runs = json.loads(path.read_text())["runs"]
    if not {"wrapper", "nack-rebuilt-thread"} <= set(runs):
        return ""
    top = {kind: runs[kind]["traced"][0] for kind in ("wrapper", "nack-rebuilt-thread")}
    return (
        " Under tracemalloc (`--trace`, one slower run at "
        f"{json.loads(path.read_text())['settings']['rate']:,} messages/s) the Python allocations that grew "
        f"most are at the native nack call both in pulsar-nack's forward from its timer thread "
        f"(+{top['wrapper']['bytes']:,} B in {top['wrapper']['count']:,} blocks) and in the bare consumer "
        f"nacking rebuilt ids from a second thread (+{top['nack-rebuilt-thread']['bytes']:,} B in "
        f"{top['nack-rebuilt-thread']['count']:,} blocks), whose heap grows "
        f"{runs['nack-rebuilt-thread']['heap']['late_slope_per_min']:+,.0f} B/min over the second half "
        f"against pulsar-nack's {runs['wrapper']['heap']['late_slope_per_min']:+,.0f}: the call site is "
        "shared, most of pulsar-nack's growth is not there; not explained yet."
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=2_000, help="messages a second (default 2,000)")
    parser.add_argument("--share", type=float, default=0.5, help="share of first deliveries nacked")
    parser.add_argument("--delay-s", type=float, default=10.0, help="the nack delay (default 10 s)")
    parser.add_argument("--sample-s", type=float, default=SAMPLE_S, help="seconds between samples (5)")
    parser.add_argument(
        "--from-results",
        action="store_true",
        help="no run: analyse bench/results/nack_soak.json again and rewrite the section from it",
    )
    parser.add_argument(
        "--kinds",
        default="wrapper,native-ack",
        help="consumers, in this order, from: " + ", ".join(KINDS) + " (default wrapper,native-ack)",
    )
    args = parser.parse_args(argv)
    if args.probe:
        print(json.dumps(probe(json.loads(args.probe))), flush=True)
        return 0
    warmup_s = 2 * args.delay_s + 60
    if not args.sample_s >= 1:
        parser.error(f"--sample-s: at least 1, got {args.sample_s}")
    if args.minutes * 60 < warmup_s + 3 * args.sample_s:
        parser.error(
            f"--minutes: at least {(warmup_s + 3 * args.sample_s) / 60:.1f} with --delay-s {args.delay_s:g}"
        )
    kinds = args.kinds.split(",")
    if not args.kinds or set(kinds) - set(KINDS):
        parser.error(f"--kinds: from {', '.join(KINDS)}, got {args.kinds!r}")
    if not 0 < args.share <= 1:
        parser.error(f"--share: in (0, 1], got {args.share}")
    if args.from_results:
        saved = json.loads((report.RESULTS / "nack_soak.json").read_text())
        facts, settings, runs = saved["machine"], saved["settings"], saved["runs"]
        args.minutes, args.rate, args.share = settings["minutes"], settings["rate"], settings["share"]
        args.delay_s, args.sample_s = settings["delay_s"], settings["sample_s"]
        # in the order they ran (the JSON's keys are sorted)
        kinds = settings.get("kinds") or sorted(runs, key=list(KINDS).index)
        runs = {kind: runs[kind] for kind in kinds}
        warmup_s = 2 * args.delay_s + 60
        for kind, run in runs.items():
            run["heap"] = steady(run["samples"], warmup_s, "heap")
            if kind == "wrapper":
                run["reported"] = steady(run["samples"], warmup_s, "reported")
        report.save_json("nack_soak", saved)
    else:
        facts, settings, runs = measure(args, kinds, warmup_s)
    figures = [(KINDS[kind], run["heap"]) for kind, run in runs.items()]
    if "wrapper" in runs:
        figures.append(("pulsar-nack: nack_stats().memory_bytes", runs["wrapper"]["reported"]))
    rows = [
        [
            label,
            f"{f['first']:,.0f}",
            f"{f['last']:,.0f}",
            f"{f['growth']:+,.0f}",
            f"{f['slope_per_min']:+,.0f}",
            f"{f['slope_se_per_min']:,.0f}",
        ]
        for label, f in figures
    ]
    result = runs.get("wrapper") or next(iter(runs.values()))
    heap = result["heap"]
    pending = [s["pending"] for s in result["samples"] if s["t_s"] >= warmup_s]
    lines = [f"- {verdict(label, f)}." for label, f in figures]
    text = "\n\n".join(
        [
            "## Soak at constant pending: memory over run time",
            "`python bench/nack_soak.py` — one consumer on pulsar-lite ("
            + ", then ".join(KINDS[kind].split(":")[0] for kind in kinds)
            + "; the same traffic, each in a fresh process) for "
            f"{args.minutes:g} min: {args.rate:,} messages/s in batches of 10 (the producer in the same "
            f"process), {args.share:.0%} of first deliveries nacked with a {args.delay_s:g} s delay, "
            "everything else acked; the consumer process (fresh, `PYTHONMALLOC=malloc`, tcache off) samples "
            f"its heap from outside and `nack_stats(with_memory=True)` every {args.sample_s:g} s. After the "
            f"{warmup_s:.0f} s warm-up: {heap['minutes']:.1f} min ({heap['samples']} samples), pending "
            f"{min(pending):,}–{max(pending):,}; {result['received']:,} messages received, "
            f"{result['nacked']:,} nacked." + cache_note(runs),
            report.machine_line(facts),
            report.table(
                ["memory", "first steady sample, B", "last, B", "growth, B", "slope, B/min", "std. error"],
                rows,
            ),
            "\n".join(lines),
        ]
    )
    text += bisection()
    report.write_section("nack-soak", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
