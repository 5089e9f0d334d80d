"""Benchmark: what keeping snapshots (``snapshot_dir=``) costs the nack path, and the CPU of a tracker
taking 10,000 nacks/s — with and without snapshots, in one run (issue 12's goal: ≤ 5 % CPU over no
snapshots at 10,000 nacks/s).

* **nack call**: ``NackTracker.schedule`` (the tracker's part of ``negative_acknowledge``) for 100,000
  in-order ids of one topic due 2-20 s ahead, into a fresh tracker, µs per call, best of 5 rounds —
  without snapshots (a ``TimeBucketIndex``) and with them (a ``SegmentStore`` on a ``LocalDirectoryStorage``
  in a temp directory, fsync on; its timer-thread life cycle runs meanwhile).
* **CPU at 10,000 nacks/s**: a fresh process per mode (alternating, ``ROUNDS`` each) files 100 nacks every
  10 ms for ``SECONDS`` s (due 2-20 s ahead: ~180,000 pending at the end), while the timer thread forwards
  due ids (to a no-op: no broker) and, with snapshots, seals, loads, rewrites and deletes segments every
  second. CPU = the process's user + system time over the run (every thread), median of the rounds; the
  overhead is relative to the tracker alone — a consumer's own receive/ack work, which would dilute it, is
  left out, so this is an upper bound of the overhead a consumer sees.
* **Restore** of 10,000,000 pending ids (ledgers of 50,000 entries), due times in entry order or at random
  over 18 s, from a local directory, with the default memory bound (fresh process each): the segment
  store's restore alone, and the tracker's (the store's plus teaching the arrival filter every id, which a
  consumer does at subscribe); their peak memory (RSS high-water mark) against what they retain; bytes on
  disk per id. ``python bench/snapshot_cost.py --restore`` re-measures only this part.
* **A consumer at 10,000 nacks/s** (pulsar-lite, fresh process per run, modes alternating, median of 3):
  the same work in both modes — 150,000 messages pre-produced on a fresh topic, each first delivery
  nacked once (100 every 10 ms) with a 5 s delay, every redelivered copy acked; the run ends when a copy
  of every message has come back and been acked (a run not done within ``CONSUMER_DEADLINE_S`` is
  reported as failed and left out of the median). CPU of the consumer process (its C++ client threads
  included) over the whole run; per run the redeliveries acked (= the nacks) and the wall time.
* **The same at random delays** (the costly case: every sealed group sparse): message ``m{i}``'s delay
  uniform over 2-20 s from a fixed seed (:func:`message_delays`: the same delays in every run and mode),
  on Apache Pulsar standalone (``RANDOM_BROKER``) with no cap of unacked messages per consumer (~100,000
  are outstanding at once): pulsar-lite 0.2.0 stops dispatching to the subscription 4-5 s in, once
  ~40,000 redeliveries requested in random entry order are outstanding (tests/test_snapshot_restart.py).
  ``python bench/snapshot_cost.py --consumer-random`` measures only this row, into the saved result
  (``--consumer-one``: only the one-delay row).

    python bench/snapshot_cost.py            # measure (about 8 minutes)
    python bench/snapshot_cost.py --render   # rewrite the section from the saved result

Writes ``bench/results/snapshot_cost.json`` and the ``snapshot-cost`` section of docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from typing import Any

import report

CALLS = 100_000
ROUNDS = 5
RATE = 10_000  # nacks per second
SECONDS = 20.0
CONSUMER_SECONDS = 15.0  # of nacking: CONSUMER_MESSAGES at RATE
CONSUMER_MESSAGES = int(RATE * CONSUMER_SECONDS)
CONSUMER_ROUNDS = 3  # consumer runs per mode (--rounds)
# a consumer run not done by then (nacks 15 s, the last due <= 20 s later) fails
CONSUMER_DEADLINE_S = 120.0
RESTORE_IDS = 10_000_000
RESTORE_PER_LEDGER = 50_000
RESTORE_NOW = 1_790_000_000_000
CONSUMER_DELAY_MS = 5_000
RANDOM_DELAY_MS = (2_000, 20_000)
# pulsar-lite 0.2.0 stops dispatching to the subscription once ~40,000 redeliveries requested in random
# entry order are outstanding (measured: stalled 4.4 s in, 44,359 nacked, 3,289 back): Apache Pulsar,
# without its cap of unacked messages per consumer (50,000 by default; ~100,000 are outstanding at 15 s)
RANDOM_BROKER = "apache"
APACHE_SETTINGS = {"maxUnackedMessagesPerConsumer": 0, "maxUnackedMessagesPerSubscription": 0}
TOPIC = "persistent://public/default/bench"
BROKER_NAMES = {"lite": "pulsar-lite", "apache": "Apache Pulsar standalone"}


def _tracker(snapshots: bool, directory: str) -> Any:
    from pulsar_nack.snapshot import LocalDirectoryStorage, SegmentStore
    from pulsar_nack.tracker import NackTracker, epoch_clock

    if not snapshots:
        return NackTracker(lambda due: None)
    store = SegmentStore(LocalDirectoryStorage(directory))
    return NackTracker(lambda due: None, index=store, clock=epoch_clock())


def nack_call_us(snapshots: bool) -> float:
    """Best of ROUNDS: µs per ``schedule`` call."""
    rng = random.Random(1)
    delays = [rng.uniform(2_000, 20_000) for _ in range(CALLS)]
    best = float("inf")
    for _ in range(ROUNDS):
        with tempfile.TemporaryDirectory() as directory:
            tracker = _tracker(snapshots, directory)
            schedule, now = tracker.schedule, tracker.now()
            started = time.perf_counter()
            for entry, delay in enumerate(delays):
                schedule(now + delay, 1, entry, -1, TOPIC)
            best = min(best, (time.perf_counter() - started) / CALLS * 1e6)
            tracker.close()
    return best


def probe(snapshots: bool) -> dict[str, Any]:
    """One paced run at RATE nacks/s (fresh process): CPU seconds and what the store did."""
    rng = random.Random(2)
    with tempfile.TemporaryDirectory() as directory:
        tracker = _tracker(snapshots, directory)
        per_tick = RATE // 100
        ticks = int(SECONDS * 100)
        entry = 0
        cpu_started = time.process_time()
        wall_started = next_tick = time.monotonic()
        for _ in range(ticks):
            now = tracker.now()
            for _ in range(per_tick):
                tracker.schedule(
                    now + rng.uniform(2_000, 20_000), 1 + entry // 50_000, entry % 50_000, -1, TOPIC
                )
                entry += 1
            next_tick += 0.01
            pause = next_tick - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        cpu = time.process_time() - cpu_started
        wall = time.monotonic() - wall_started
        stats = tracker.stats()
        store_stats = tracker.index.stats() if snapshots else None
        tracker.close()
    result: dict[str, Any] = {"cpu_s": cpu, "wall_s": wall, "nacks": entry, "pending": stats.pending}
    if store_stats is not None:
        s = store_stats
        result |= {
            "segments": s.segments_total,
            "bytes": s.bytes_total,
            "creates": s.create.succeeded,
            "merges": s.merge.succeeded,
            "deletes": s.delete.succeeded,
            "create_ms": s.create.total_ms,
            "merge_ms": s.merge.total_ms,
        }
    return result


def _write_pending(directory: str, spread: str) -> dict[str, Any]:
    """RESTORE_IDS pending ids (ledgers of RESTORE_PER_LEDGER entries, due 2-20 s ahead, in entry order
    or at random) sealed into segment files the way a consumer seals them (checkpoints of 4 ledgers),
    filed in bulk (one add_many per bucket and ledger) so that writing 10M ids takes seconds."""
    import os

    import numpy as np

    from pulsar_nack.snapshot import LocalDirectoryStorage, SegmentConfig, SegmentStore

    store = SegmentStore(
        LocalDirectoryStorage(directory, fsync=False), SegmentConfig(max_loaded_ids=0, load_ahead_ms=0)
    )
    rng = np.random.default_rng(1)
    mask = ~((1 << 8) - 1)  # the default precision: 256-ms buckets
    for start in range(0, RESTORE_IDS, RESTORE_PER_LEDGER):
        ledger = 1 + start // RESTORE_PER_LEDGER
        count = min(RESTORE_PER_LEDGER, RESTORE_IDS - start)
        if spread == "ordered":
            due = RESTORE_NOW + 2_000 + np.arange(start, start + count) * 18_000 // RESTORE_IDS
        else:
            due = RESTORE_NOW + 2_000 + rng.integers(0, 18_000, count)
        buckets = due & mask
        order = np.argsort(buckets, kind="stable")
        ordered, entries = buckets[order], np.arange(count, dtype=np.uint32)[order]
        cuts = np.flatnonzero(np.diff(ordered)) + 1
        for bucket_ids, entry_ids in zip(np.split(ordered, cuts), np.split(entries, cuts), strict=True):
            store._mutable.add_many(int(bucket_ids[0]), ledger, np.sort(entry_ids), topic=TOPIC)
        if ledger % 4 == 0:
            store.checkpoint(RESTORE_NOW)
    store.checkpoint(RESTORE_NOW)
    names = os.listdir(directory)
    return {"files": len(names), "bytes": sum(os.path.getsize(os.path.join(directory, n)) for n in names)}


def restore_probe(directory: str, part: str) -> dict[str, Any]:
    """One restore of the snapshot in ``directory``, in this fresh process: ``store`` (the segment
    store's) or ``tracker`` (what subscribe does: the store's, then the arrival filter taught every id).
    Time; peak = the process's RSS high-water mark over the restore minus its RSS before (Python,
    numpy and CRoaring alike); retained = heap in use after minus before (memory.heap_in_use)."""
    import gc
    import resource

    from pulsar_nack.memory import heap_in_use, rss_bytes
    from pulsar_nack.snapshot import LocalDirectoryStorage, SegmentStore
    from pulsar_nack.snapshot.keeper import SnapshotKeeper
    from pulsar_nack.timer import TimerWheel
    from pulsar_nack.tracker import NackTracker

    def clock() -> float:
        return float(RESTORE_NOW)

    gc.collect()
    heap_before, rss_before = heap_in_use(), rss_bytes()
    high_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    store = SegmentStore(LocalDirectoryStorage(directory, fsync=False))  # the default memory bound
    started = time.perf_counter()
    if part == "store":
        restored = store.restore(RESTORE_NOW)
        keep: Any = store
    else:
        tracker = NackTracker(
            lambda due: None, clock=clock, wheel=TimerWheel(clock=clock, start=False), index=store
        )
        restored = SnapshotKeeper(tracker, store).restore()
        keep = tracker
    seconds = time.perf_counter() - started
    high = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    gc.collect()
    retained = heap_in_use() - heap_before
    del keep
    return {
        "seconds": seconds,
        "ids": restored.ids,
        "loaded_ids": restored.loaded_ids,
        "segments": restored.segments,
        "peak_bytes": high - rss_before if high > high_before else None,
        "retained_bytes": retained,
    }


def restore_runs() -> list[dict[str, Any]]:
    """For each spread: write the snapshot (a process of its own), then restore it in fresh processes
    (started with MEASURING_ENV, as memory.heap_in_use wants): the store's, then the tracker's."""

    rows = []
    for spread in ("ordered", "random"):
        with tempfile.TemporaryDirectory() as directory:
            written = report.run_probe(__file__, {"write": [directory, spread]}, measuring=False)
            row: dict[str, Any] = {"spread": spread, **written}
            for part in ("store", "tracker"):
                row[part] = report.run_probe(__file__, {"restore": [directory, part]})
            row["ids"] = row["store"]["ids"]
            row["bytes_per_id"] = row["bytes"] / row["ids"]
        rows.append(row)
        print("restore", rows[-1])
    return rows


def message_delays(count: int, spread: str) -> list[float]:
    """The delay (ms) of message ``m{i}``'s nack, for every i < count: CONSUMER_DELAY_MS (``one``) or
    uniform over RANDOM_DELAY_MS drawn from a fixed seed (``random``) — the same list in every run and
    mode, whatever order the broker delivers in. O(count)."""
    if spread == "one":
        return [float(CONSUMER_DELAY_MS)] * count
    if spread != "random":
        raise ValueError(f"spread must be 'one' or 'random', got {spread!r}")
    rng = random.Random(3)
    low, high = RANDOM_DELAY_MS
    return [rng.uniform(low, high) for _ in range(count)]


def consumer_probe(service_url: str, topic: str, snapshots: bool, spread: str = "one") -> dict[str, Any]:
    """A real consumer (fresh process) doing a fixed amount of work: CONSUMER_MESSAGES messages on
    ``topic`` (payload ``m{i}``), each first delivery nacked once — RATE nacks/s, 100 every 10 ms — with
    :func:`message_delays`' delay for that message, and every redelivered copy acked; the run ends when
    a redelivered copy of every message has been acked, or fails after CONSUMER_DEADLINE_S. CPU = the
    process's user + system time (every thread, the C++ client's included) from before the client is
    made to after it is closed. Returns the CPU, the wall time, what was nacked and acked, and
    ``finished`` (False with ``failure`` saying why)."""
    import pulsar

    import pulsar_nack

    count = CONSUMER_MESSAGES
    delays = message_delays(count, spread)
    nacked, acked = bytearray(count), bytearray(count)
    nacks = redelivered = extra = 0
    failure = ""
    cpu_started = time.process_time()
    wall_started = time.monotonic()
    deadline = wall_started + CONSUMER_DEADLINE_S
    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    client = pulsar_nack.Client(service_url, logger=logger)
    with tempfile.TemporaryDirectory() as directory:
        consumer = client.subscribe(
            topic,
            "bench",
            consumer_type=pulsar.ConsumerType.Shared,
            initial_position=pulsar.InitialPosition.Earliest,
            **({"snapshot_dir": directory} if snapshots else {}),
        )
        per_tick = RATE // 100
        next_tick = time.monotonic()
        tick_nacks = 0
        while redelivered < count:
            now = time.monotonic()
            if now > deadline:
                failure = f"deadline: {nacks} nacked, {redelivered} acked after {now - wall_started:.0f} s"
                break
            if nacks < count and tick_nacks >= per_tick:  # pace the nacks: 100 per 10 ms
                next_tick += 0.01
                tick_nacks = 0
                pause = next_tick - now
                if pause > 0:
                    time.sleep(pause)
            try:
                message = consumer.receive(1_000)
            except pulsar.Timeout:
                continue
            i = int(message.data()[1:])
            if not nacked[i]:
                nacked[i] = 1
                consumer.negative_acknowledge(message, delay_ms=delays[i])
                nacks += 1
                tick_nacks += 1
                continue
            consumer.acknowledge(message)
            if acked[i]:
                extra += 1  # a copy of a message acked already
            else:
                acked[i] = 1
                redelivered += 1
        wall = time.monotonic() - wall_started
        pending = consumer.nack_stats().pending
        consumer.close()
    client.close()
    cpu = time.process_time() - cpu_started
    if not failure and nacks != redelivered:
        failure = f"{nacks} nacked but {redelivered} redeliveries acked"
    return {
        "cpu_s": cpu,
        "wall_s": wall,
        "nacks": nacks,
        "redelivered": redelivered,
        "extra_copies": extra,
        "pending": pending,
        "finished": not failure,
        "failure": failure,
    }


def consumer_runs(rounds: int, spread: str = "one", kind: str = "lite") -> dict[str, list[dict[str, Any]]]:
    """Alternating fresh consumer processes on one broker (``kind``: ``lite`` or ``apache``), a fresh
    topic of CONSUMER_MESSAGES messages each (``spread``: see :func:`message_delays`). A run that does
    not finish is kept, marked ``finished: false``, and left out of the medians (:func:`consumer_cpu`)."""
    import uuid

    import pulsar

    from pulsar_nack.testing import Broker, PulsarLite

    runs: dict[str, list[dict[str, Any]]] = {"bare": [], "snapshots": []}
    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    started: Broker
    if kind == "apache":
        from harness.standalone import PulsarStandalone

        started = PulsarStandalone(settings=APACHE_SETTINGS)
    else:
        started = PulsarLite()
    with started as broker:
        for _ in range(rounds):
            for mode in ("bare", "snapshots"):
                topic = f"persistent://public/default/snapcost-{uuid.uuid4().hex[:8]}"
                client = pulsar.Client(broker.service_url, logger=logger)
                producer = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
                for i in range(CONSUMER_MESSAGES):
                    producer.send_async(f"m{i}".encode(), None)
                producer.flush()
                client.close()
                spec = {"consumer": [broker.service_url, topic, mode == "snapshots", spread]}
                row = report.run_probe(__file__, spec, timeout=CONSUMER_DEADLINE_S + 120, measuring=False)
                runs[mode].append(row)
                print(
                    f"consumer {spread} {mode}: CPU {row['cpu_s']:.2f} s, {row['nacks']:,} nacked, "
                    f"{row['redelivered']:,} redeliveries acked, wall {row['wall_s']:.1f} s"
                    + ("" if row["finished"] else f" - FAILED ({row['failure']})"),
                    flush=True,
                )
    return runs


def consumer_cpu(runs: dict[str, list[dict[str, Any]]]) -> dict[str, float | None]:
    """Median CPU per mode over the runs that finished (None if fewer than 3 did: no figure). Runs of
    the old 15-s window shape (no ``finished`` key) count as they are."""
    medians: dict[str, float | None] = {}
    for mode, rows in runs.items():
        done = [r["cpu_s"] for r in rows if r.get("finished", True)]
        medians[mode] = statistics.median(done) if len(done) >= 3 else None
    return medians


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    part = parser.add_mutually_exclusive_group()
    part.add_argument("--render", action="store_true", help="rewrite the section from the saved result")
    part.add_argument(
        "--restore", action="store_true", help="re-measure only the restore, into the saved result"
    )
    part.add_argument(
        "--consumer-random", action="store_true", help="re-measure only the random-delay consumer row"
    )
    part.add_argument(
        "--consumer-one", action="store_true", help="re-measure only the one-delay consumer row"
    )
    part.add_argument("--probe", metavar="SPEC", help=argparse.SUPPRESS)  # one measured child process
    parser.add_argument(
        "--rounds", type=int, default=CONSUMER_ROUNDS, help="consumer runs per mode (default %(default)s)"
    )
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error(f"--rounds: at least 3 runs per mode make a median, got {args.rounds}")
    return args


def main() -> None:
    args = _arguments()
    if args.render:
        render(json.loads((report.RESULTS / "snapshot_cost.json").read_text()))
        return
    if args.restore:
        saved = json.loads((report.RESULTS / "snapshot_cost.json").read_text())
        saved["restore"] = restore_runs()
        saved["restore_machine"] = report.machine()
        report.save_json("snapshot_cost", saved)
        render(saved)
        return
    if args.consumer_random:
        saved = json.loads((report.RESULTS / "snapshot_cost.json").read_text())
        load_before = os.getloadavg()[0]
        saved["consumer_random_runs"] = consumer_runs(args.rounds, "random", RANDOM_BROKER)
        saved["consumer_random_broker"] = RANDOM_BROKER
        saved["consumer_random_load"] = [load_before, os.getloadavg()[0]]  # 1-minute load, before / after
        saved["consumer_random_machine"] = report.machine()
        report.save_json("snapshot_cost", saved)
        render(saved)
        return
    if args.consumer_one:
        saved = json.loads((report.RESULTS / "snapshot_cost.json").read_text())
        saved["consumer_runs"] = consumer_runs(args.rounds)
        saved["consumer_cpu_s"] = consumer_cpu(saved["consumer_runs"])
        saved["consumer_machine"] = report.machine()
        report.save_json("snapshot_cost", saved)
        render(saved)
        return
    if args.probe:
        spec = json.loads(args.probe)
        if "consumer" in spec:
            print(json.dumps(consumer_probe(*spec["consumer"])))
        elif "write" in spec:
            print(json.dumps(_write_pending(*spec["write"])))
        elif "restore" in spec:
            print(json.dumps(restore_probe(*spec["restore"])))
        else:
            print(json.dumps(probe(spec["snapshots"])))
        return
    facts = report.machine()
    calls = {mode: nack_call_us(mode == "snapshots") for mode in ("bare", "snapshots")}
    print(f"nack call: {calls['bare']:.2f} us bare, {calls['snapshots']:.2f} us with snapshots")
    runs: dict[str, list[dict[str, Any]]] = {"bare": [], "snapshots": []}
    for _ in range(ROUNDS):
        for mode in ("bare", "snapshots"):
            spec = {"snapshots": mode == "snapshots"}
            row = report.run_probe(__file__, spec, timeout=SECONDS * 10, measuring=False)
            runs[mode].append(row)
            print(mode, row)
    cpu = {mode: statistics.median(r["cpu_s"] for r in rows) for mode, rows in runs.items()}
    overhead = cpu["snapshots"] / cpu["bare"] - 1
    consumers = consumer_runs(args.rounds)
    one_cpu = consumer_cpu(consumers)
    print(f"consumer CPU (one delay), s: {one_cpu}")
    random_consumers = consumer_runs(args.rounds, "random", RANDOM_BROKER)
    print(
        f"CPU at {RATE} nacks/s: {cpu['bare']:.2f} s bare, {cpu['snapshots']:.2f} s with snapshots "
        f"({overhead:+.1%}) over {SECONDS:.0f} s"
    )
    payload = {
        "machine": facts,
        "calls_us": calls,
        "runs": runs,
        "cpu_s": cpu,
        "consumer_runs": consumers,
        "consumer_cpu_s": one_cpu,
        "consumer_random_runs": random_consumers,
        "consumer_random_broker": RANDOM_BROKER,
        "restore": restore_runs(),
    }
    report.save_json("snapshot_cost", payload)
    render(payload)


def _consumer_row(kind: str, due: str, runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """A consumer row of the table: its medians (:func:`consumer_cpu`) and what the runs did. Runs of the
    count-bound shape (``finished`` in them) say how many finished; the old 15-s window shape is labelled
    as such."""
    medians = consumer_cpu(runs)
    counted = {m: [r for r in rows if r.get("finished", True)] for m, rows in runs.items()}
    if all("finished" in r for rows in runs.values() for r in rows):
        back = {m: sorted({r["redelivered"] for r in rows}) for m, rows in counted.items()}
        shape = (
            f"{CONSUMER_MESSAGES:,} messages, each first delivery nacked once at {RATE:,} nacks/s {due}, "
            f"until every redelivered copy is acked: CPU of the whole run (s, median of "
            f"{len(counted['bare'])} / {len(counted['snapshots'])} finished of "
            f"{len(runs['bare'])} / {len(runs['snapshots'])}; redeliveries acked per run "
            f"{', '.join(f'{b:,}' for b in back['bare'])} / {', '.join(f'{b:,}' for b in back['snapshots'])})"
        )
    else:
        back_median = {m: statistics.median(r["redelivered"] for r in rows) for m, rows in runs.items()}
        shape = (
            f"{CONSUMER_SECONDS:.0f} s at {RATE:,} nacks/s {due}, redeliveries acked: CPU (s, median of "
            f"{len(runs['bare'])}; redeliveries acked {back_median['bare']:,.0f} / "
            f"{back_median['snapshots']:,.0f})"
        )
    bare, snaps = medians["bare"], medians["snapshots"]
    return [
        f"consumer process on {BROKER_NAMES[kind]}, {shape}",
        "n/a" if bare is None else f"{bare:.2f}",
        "n/a" if snaps is None else f"{snaps:.2f}",
        "inconclusive: < 3 runs finished" if bare is None or snaps is None else f"{snaps / bare - 1:+.1%}",
    ]


def render(payload: dict[str, Any]) -> None:
    """Write the ``snapshot-cost`` section of docs/performance.md from a result (``--render``: from
    bench/results/snapshot_cost.json, the figures as measured)."""
    calls, cpu = payload["calls_us"], payload["cpu_s"]
    snap = payload["runs"]["snapshots"][-1]
    overhead = cpu["snapshots"] / cpu["bare"] - 1
    rows = [
        [
            "`NackTracker.schedule` call (µs, best of 5)",
            f"{calls['bare']:.2f}",
            f"{calls['snapshots']:.2f}",
            f"{calls['snapshots'] / calls['bare'] - 1:+.0%}",
        ],
        [
            f"tracker alone, {SECONDS:.0f} s at {RATE:,} nacks/s due 2-20 s at random: CPU (s, median of "
            f"{len(payload['runs']['bare'])})",
            f"{cpu['bare']:.2f}",
            f"{cpu['snapshots']:.2f}",
            f"{overhead:+.1%} ({(cpu['snapshots'] - cpu['bare']) / SECONDS:+.1%} of a core)",
        ],
        _consumer_row("lite", f"due in {CONSUMER_DELAY_MS / 1000:.0f} s", payload["consumer_runs"]),
    ]
    per_run: list[list[str]] = []
    random_runs = payload.get("consumer_random_runs")
    if random_runs:
        due = f"due {RANDOM_DELAY_MS[0] // 1000}-{RANDOM_DELAY_MS[1] // 1000} s at random"
        rows.append(_consumer_row(payload.get("consumer_random_broker", "lite"), due, random_runs))
        per_run = [
            [
                mode,
                str(n),
                f"{r['cpu_s']:.2f}",
                f"{r['nacks']:,}",
                f"{r['redelivered']:,}",
                f"{r['wall_s']:.1f}" if "wall_s" in r else "n/a",
                "yes" if r.get("finished", True) else f"**no**: {r['failure']}",
            ]
            for mode, mode_rows in random_runs.items()
            for n, r in enumerate(mode_rows, 1)
        ]
    restore = [r for r in payload.get("restore", []) if "store" in r]  # the 10M-id format

    def mb(value: int | None) -> str:
        return "n/a" if value is None else f"{value / 2**20:.1f}"

    restore_rows = [
        [
            f"{r['ids']:,} ids, due times {'in entry order' if r['spread'] == 'ordered' else 'at random'}",
            f"{r['store']['seconds']:.2f}",
            f"{r['tracker']['seconds']:.2f}",
            f"{mb(r['tracker']['peak_bytes'])} / {mb(r['tracker']['retained_bytes'])}",
            f"{r['store']['loaded_ids']:,}",
            f"{r['bytes_per_id']:.2f}",
        ]
        for r in restore
    ]
    restore_lines = (
        [
            "",
            "Restore from a local directory (fresh process each; the default memory bound: segments due "
            "within 60 s loaded up to 1M ids, the rest kept as per-ledger membership bitmaps), s. The "
            "tracker's includes teaching the arrival filter every id (one bitmap update per ledger, the "
            "ledgers numbered together). Peak = RSS "
            "high-water mark over the restore minus RSS before; retained = heap in use after minus before "
            "(memory.heap_in_use): what the restored consumer holds. Goals (issue 12): 10M ids in ≤ 1 s, "
            "peak ≤ 2× retained; ≤ 1 B per id on disk dense, ≤ 4 B sparse"
            + (
                f" — {report.machine_line(payload['restore_machine'])}"
                if "restore_machine" in payload
                else ""
            ),
            "",
            report.table(
                [
                    "",
                    "segment store, s",
                    "tracker (what subscribe does), s",
                    "tracker peak / retained, MB",
                    "ids loaded",
                    "bytes on disk per id",
                ],
                restore_rows,
            ),
        ]
        if restore_rows
        else []
    )
    markdown = "\n".join(
        [
            "## Snapshots: the nack path and CPU at 10,000 nacks/s (`python bench/snapshot_cost.py`)",
            "",
            report.machine_line(payload["machine"]),
            "",
            report.table(["", "no snapshots", "snapshots", "difference"], rows),
            *(
                [
                    "",
                    "The random-delay consumer row, run by run (modes alternating; a run that does not "
                    "finish is left out of the median):",
                    "",
                    report.table(
                        ["mode", "run", "CPU, s", "nacked", "redeliveries acked", "wall, s", "finished"],
                        per_run,
                    ),
                ]
                if per_run
                else []
            ),
            "",
            "Goal (issue 12): ≤ 5 % CPU over no snapshots at 10,000 nacks/s. The first consumer row is "
            "that case with one delay (sealed groups are runs of entries); the tracker row and the last "
            "consumer row are the costly case — due times spread at random, every sealed group sparse, "
            "read back into the loaded index id by id — the tracker row without a consumer's receive and "
            "ack work to dilute it"
            + (
                f" (one-delay consumer row: {report.machine_line(payload['consumer_machine'])})"
                if "consumer_machine" in payload
                else ""
            )
            + (
                f" (random-delay consumer row: {report.machine_line(payload['consumer_random_machine'])}"
                + (
                    " load {:.2f} before, {:.2f} after".format(*payload["consumer_random_load"])
                    if "consumer_random_load" in payload
                    else ""
                )
                + ")"
                if "consumer_random_machine" in payload
                else ""
            )
            + ". At the end of a tracker run with "
            f"snapshots: {snap['pending']:,} pending ids in {snap['segments']} segments, {snap['bytes']:,} "
            f"bytes on disk ({snap['bytes'] / max(snap['pending'], 1):.2f} B per pending id); "
            f"{snap['creates']} segments written ({snap['create_ms']:.0f} ms), {snap['merges']} rewritten "
            f"or merged, {snap['deletes']} deleted.",
            *restore_lines,
        ]
    )
    report.write_section("snapshot-cost", markdown)


if __name__ == "__main__":
    main()
