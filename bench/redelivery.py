"""Benchmark: redelivery as the application sees it, and what it costs the broker (issue 24).

One workload per run, on each broker: ``--messages`` messages in batches of 10 through one Shared
consumer; each delivery is nacked with probability 0.3 (at most twice per message), else acked — the same
seeded decisions in every run. Three runs per broker:

* **wrapper, per-message delays** — ``pulsar_nack`` with its defaults (ceil rounding, k = 8), each nack
  with its own delay, uniform over 0.5–3 s;
* **wrapper, fixed delay** and **official, fixed delay** — every nack at the default delay (1.75 s, the
  mean of the above), the official ``pulsar.Client`` with ``negative_ack_redelivery_delay_ms``.

Reported per run: redeliveries the application received early (arrival before nack time + delay, on its
own clock) and their lateness p50/p99 beside what ``nack_stats()`` reports; forwards to the native client
per second beside the buckets that fell due per second; messages and bytes the broker dispatched to the
subscription (pulsar-lite ``/metrics`` ``pulsar_out_messages_total``/``pulsar_out_bytes_total``, Apache
topic stats ``msgOutCounter``/``bytesOutCounter``) and what the application was handed.

    python bench/redelivery.py                     # both brokers
    python bench/redelivery.py --brokers lite --messages 1000

Writes ``bench/results/redelivery.json`` and the ``redelivery`` section of docs/performance.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import sys
import time
import urllib.request
import uuid
from typing import Any

import numpy as np
import report

from pulsar_nack.bridge import KEPT_COPY_BYTES
from pulsar_nack.lateness import SAMPLE_SLOTS

BATCH = 10
NACK_SHARE = 0.3
MAX_NACKS = 2
DELAYS_MS = (500.0, 3_000.0)
FIXED_DELAY_MS = 1_750
SEED = 24
K = 8


#: ``pulsar-nack demo``'s decisions (pulsar_nack/demo.py, its defaults): each delivery nacked with
#: probability 0.3, at most twice a message; a nack gives a per-call delay (uniform integer 100–10,000 ms)
#: or, as often, none, leaving the delay to the consumer's backoff (200 ms · 2^redelivery count, ≤ 10 s).
DEMO_MAX_DELAY_MS = 10_000
DEMO_BACKOFF_MS = 200
#: A nack's delay in a plan: milliseconds, or BACKOFF (no per-call delay: the consumer's backoff decides).
BACKOFF = -1.0


def _decisions(messages: int, workload: str = "mixed") -> list[list[float | None]]:
    """Per message, per delivery round: the nack delay (ms; :data:`BACKOFF` for the backoff's) or None
    (ack). Seeded: the same in every run, whatever order the broker delivers in. O(messages)."""
    rng = random.Random(SEED)
    plan: list[list[float | None]] = []
    for _ in range(messages):
        rounds: list[float | None] = []
        for _ in range(MAX_NACKS):
            if rng.random() >= NACK_SHARE:
                break
            if workload == "demo":
                per_call = rng.random() < 0.5
                rounds.append(float(rng.randint(100, DEMO_MAX_DELAY_MS)) if per_call else BACKOFF)
            else:
                rounds.append(rng.uniform(*DELAYS_MS))
        rounds.append(None)
        plan.append(rounds)
    return plan


def _fixed_delay_ms(workload: str) -> int:
    """The one delay of the fixed-delay runs: the mean of the per-message delays of the workload (the
    demo's: half uniform over 100–10,000 ms, half its backoff's 200 or 400 ms by round). O(1)."""
    if workload == "demo":
        return round((100 + DEMO_MAX_DELAY_MS) / 4 + (DEMO_BACKOFF_MS + 2 * DEMO_BACKOFF_MS) / 4)
    return FIXED_DELAY_MS


def _dispatched(broker: Any, topic: str, subscription: str) -> tuple[int, int]:
    """Messages and bytes the broker dispatched to the subscription's consumers, from the broker."""
    metrics_url = getattr(broker, "metrics_url", None)
    if metrics_url:
        text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
        counts = {"messages": 0, "bytes": 0}
        short = topic.rsplit("/", 1)[1]
        for line in text.splitlines():
            if f'topic="{short}"' not in line or f'subscription="{subscription}"' not in line:
                continue
            for kind in counts:
                if line.startswith(f"pulsar_out_{kind}_total"):
                    counts[kind] += int(float(line.rsplit(" ", 1)[1]))
        return counts["messages"], counts["bytes"]
    name = topic.removeprefix("persistent://")
    stats = broker.admin("GET", f"/admin/v2/persistent/{name}/stats")
    sub = stats["subscriptions"][subscription]
    return int(sub["msgOutCounter"]), int(sub["bytesOutCounter"])


def run(broker: Any, mode: str, messages: int, timeout_s: float, workload: str = "mixed") -> dict[str, Any]:
    """One run: ``mode`` is ``wrapper-per-message``, ``wrapper-fixed`` or ``official-fixed``; ``workload``
    ``mixed`` (delays 0.5–3 s) or ``demo`` (``pulsar-nack demo``'s per-call delays and backoff)."""
    import pulsar

    import pulsar_nack

    topic = f"persistent://public/default/redeliver-{uuid.uuid4().hex[:8]}"
    subscription = "bench"
    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    official = mode.startswith("official")
    client_type = pulsar.Client if official else pulsar_nack.Client
    client = client_type(broker.service_url, operation_timeout_seconds=30, logger=logger)
    forwards: list[tuple[float, int]] = []  # (time, entries) of each forward to the native client
    forward_log: ForwardLog = []
    nack_log: NackLog = {}

    def on_redelivery(due: Any) -> None:
        now = time.monotonic()
        forwards.append((now, sum(len(d.entry_ids) for d in due)))
        taken = [
            (ids.ledger_id, entry_id, tuple(ids.batch_indexes.get(entry_id, ())))
            for ids in due
            for entry_id in ids.entry_ids.tolist()
        ]
        forward_log.append((now * 1000.0, taken))

    fixed_ms = _fixed_delay_ms(workload)
    options: dict[str, Any] = {"negative_ack_redelivery_delay_ms": fixed_ms}
    if mode == "wrapper-per-message" and workload == "demo":
        options["negative_ack_redelivery_backoff"] = pulsar_nack.MultiplierRedeliveryBackoff(
            DEMO_BACKOFF_MS, DEMO_MAX_DELAY_MS
        )
    if not official:
        options["on_redelivery"] = on_redelivery
    consumer = client.subscribe(topic, subscription, consumer_type=pulsar.ConsumerType.Shared, **options)
    producer = client.create_producer(
        topic,
        batching_enabled=True,
        batching_max_messages=BATCH,
        batching_max_publish_delay_ms=60_000,
        block_if_queue_full=True,
    )
    for i in range(messages):
        producer.send_async(i.to_bytes(4, "big"), None)
        if i % BATCH == BATCH - 1:
            producer.flush()
    producer.flush()
    plan = _decisions(messages, workload)
    load_before = os.getloadavg()[0]  # the machine's 1-minute load average (2 cores, shared)
    expected = sum(len(rounds) for rounds in plan)  # hand-outs the application needs
    nacks = [0] * messages
    acked = bytearray(messages)
    due: dict[int, float] = {}
    lateness: list[float] = []
    buckets: set[int] = set()
    handed = duplicates = 0
    started = time.monotonic()
    deadline = started + timeout_s
    needed = expected
    quiet_until: float | None = None
    peak = (0, 0, 0)  # kept copies in the hold at their most: (copies, payload bytes, measured bytes)
    next_look = started
    while time.monotonic() < deadline:
        if not official and time.monotonic() >= next_look:  # what the hold keeps (issue 24's held copies)
            next_look = time.monotonic() + 0.25
            look = consumer.nack_stats(with_memory=True)
            if look.chunked_held > peak[0]:
                parts = dict(look.memory_parts or ())
                peak = (look.chunked_held, look.chunked_held_bytes, parts.get("held chunked", 0))
        try:
            message = consumer.receive(200)
        except pulsar.Timeout:
            if needed <= 0:
                if quiet_until is None:
                    quiet_until = time.monotonic() + 1.5  # late duplicates would show up meanwhile
                elif time.monotonic() >= quiet_until:
                    break
            continue
        now_ms = time.monotonic() * 1000.0
        handed += 1
        index = int.from_bytes(message.data(), "big")
        if acked[index]:
            duplicates += 1  # a copy of a message the application acked (a batch sibling)
            consumer.acknowledge(message)
            continue
        if index in due:
            lateness.append(now_ms - due.pop(index))
        needed -= 1
        delay = plan[index][nacks[index]]
        if delay is None:
            acked[index] = 1
            consumer.acknowledge(message)
            continue
        nacks[index] += 1
        message_id = message.message_id()
        message_key = (message_id.ledger_id(), message_id.entry_id(), message_id.batch_index())
        per_call = delay != BACKOFF
        if mode != "wrapper-per-message":
            delay, per_call = float(fixed_ms), False
        elif not per_call:  # what the consumer's backoff gives this message (as the demo computes it)
            delay = consumer.nack_options.delay_for(None, message.redelivery_count())
        nacked_ms = time.monotonic() * 1000.0
        due_ms = nacked_ms + delay
        due[index] = due_ms
        nack_log.setdefault(message_key, []).append((nacked_ms, due_ms))
        buckets.add(-(-int(due_ms) >> K))
        if per_call:
            consumer.negative_acknowledge(message, delay_ms=delay)
        else:
            consumer.negative_acknowledge(message)
    elapsed = time.monotonic() - started
    stats = None if official else consumer.nack_stats()
    # the lateness estimator's bytes (its histogram, the buckets' offsets and the sample of due times):
    # fixed, whatever the pending nacks
    estimator = None
    if not official:
        arrivals = consumer._nacks.tracker.arrivals  # (no public getter: a bench's look inside)
        estimator = arrivals.lateness.nbytes + arrivals.dues.nbytes
    # Messages the application still waited for: (index, hand-outs so far, ms past their due time or None
    # when never nacked) — what a lost message looked like, for the report.
    end_ms = time.monotonic() * 1000.0
    missing_ids = [
        [i, nacks[i], round(end_ms - due[i], 1) if i in due else None]
        for i in range(messages)
        if not acked[i]
    ][:20]
    time.sleep(1.0)  # the broker's counters settle
    out_messages, out_bytes = _dispatched(broker, topic, subscription)
    consumer.close()
    producer.close()
    client.close()
    early = [v for v in lateness if v < 0]
    span_s = (forwards[-1][0] - forwards[0][0]) if len(forwards) > 1 else 0.0
    result: dict[str, Any] = {
        "mode": mode,
        "workload": workload,
        "fixed_delay_ms": fixed_ms,
        "messages": messages,
        "completed": needed <= 0,
        "missing": max(needed, 0),
        "missing_ids": missing_ids,
        "timeout_s": timeout_s,
        "elapsed_s": round(elapsed, 2),
        "handed_out": handed,
        "duplicates_handed_out": duplicates,
        "redeliveries": len(lateness),
        "early": len(early),
        "early_max_ms": round(-min(early), 1) if early else 0.0,
        "lateness_p50_ms": round(float(np.percentile(lateness, 50)), 1) if lateness else None,
        "lateness_p99_ms": round(float(np.percentile(lateness, 99)), 1) if lateness else None,
        "broker_messages": out_messages,
        "broker_bytes": out_bytes,
        "nack_buckets": len(buckets),
        "load_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],  # at the start and the end
    }
    if stats is not None:
        result.update(
            reported_p50_ms=None if stats.lateness_p50_ms is None else round(stats.lateness_p50_ms, 1),
            reported_p99_ms=None if stats.lateness_p99_ms is None else round(stats.lateness_p99_ms, 1),
            reported_early_share=stats.lateness_early_share,
            # where the reported p50 and p99 fall among the application's lateness values (the share at
            # or below them): a percentile in a sparse stretch of the distribution moves many ms for a
            # fraction of a percent of the redeliveries
            reported_p50_app_rank=_rank(lateness, stats.lateness_p50_ms),
            reported_p99_app_rank=_rank(lateness, stats.lateness_p99_ms),
            reported_samples=stats.lateness_samples,
            lateness_estimator_bytes=estimator,
            held_redelivered=stats.chunked_redelivered,
            pending_at_end=stats.pending,
            reforwarded=stats.reforwarded,
            abandoned=stats.abandoned,
            held_at_end=stats.chunked_held,
            held_peak=peak[0],
            held_peak_payload_bytes=peak[1],
            held_peak_memory_bytes=peak[2],
            forwards=len(forwards),
            forwarded_entries=sum(n for _, n in forwards),
            forward_span_s=round(span_s, 2),
            min_forward_gap_ms=round(min((b[0] - a[0]) * 1000 for a, b in itertools.pairwise(forwards)), 1)
            if len(forwards) > 1
            else None,
            # forwards that came less than 2^k ms after the previous one (a late timer's, then the next
            # on its time), and the closest two forwards of one entry
            forwards_closer_than_bucket=sum(
                1 for a, b in itertools.pairwise(forwards) if (b[0] - a[0]) * 1000 < 1 << K
            ),
            **_forward_gaps(forward_log, nack_log),
        )
    return result


def _rank(values: list[float], value: float | None) -> float | None:
    """The share of ``values`` at or below ``value``, to 4 places (None without either). O(values)."""
    if value is None or not values:
        return None
    return round(sum(1 for v in values if v <= value) / len(values), 4)


def _bucket(due_ms: float) -> int:
    """The bucket (ceil rounding, k = :data:`K`) of a due time on the application's clock. O(1)."""
    return -(-math.ceil(due_ms) >> K) << K


#: What each forward took: (time ms, [(ledger, entry, the batch indexes due, or () for the whole entry)]).
ForwardLog = list[tuple[float, list[tuple[int, int, tuple[int, ...]]]]]
#: The application's nacks by message id: (ledger, entry, batch index) -> [(nack time ms, due ms)].
NackLog = dict[tuple[int, int, int], list[tuple[float, float]]]


def _forward_gaps(forward_log: ForwardLog, nack_log: NackLog) -> dict[str, Any]:
    """Forwards closer than 2^k ms, told apart by the application's own due times (issue 24's "one
    forward per due bucket per entry"). A forward's bucket: the latest due bucket (the latest nack before
    the forward) among the messages it took (a whole entry: its messages nacked before it) — a forward
    goes one native latency before its bucket, ``typical`` (the run's median of time − bucket; buckets more
    than 2^k ms after the forward are not its: a whole entry's messages not due yet) — and its
    timer lateness: time − bucket − typical. A forward less than 2^k ms after another either came before
    the regular time of the bucket after the other's (10 ms of jitter allowed): an extra forward, the
    defect (a nack filed for a bucket already forwarded re-arming the timer); or else the other ran late
    by the shortfall at least (less 10 ms): the gap is the timer's. Counted between consecutive forwards,
    and per entry between consecutive forwards of one entry. O(forwarded ids · nacks per message)."""
    width = 1 << K
    by_entry: dict[tuple[int, int], list[int]] = {}  # the batch indexes nacked, per entry
    for ledger_id, entry_id, batch_index in nack_log:
        by_entry.setdefault((ledger_id, entry_id), []).append(batch_index)
    timeline: list[tuple[float, int]] = []  # (time, bucket) of each forward
    whole: dict[float, int] = {}  # entries each forward took whole (no batch indexes)
    per_entry: dict[tuple[int, int], list[tuple[float, int]]] = {}  # the forwards of each entry
    for at, taken in forward_log:
        found = []
        whole[at] = sum(1 for _, _, indexes in taken if not indexes)
        for ledger_id, entry_id, indexes in taken:
            chosen = indexes or tuple(by_entry.get((ledger_id, entry_id), ()))
            for index in chosen:
                nacks = nack_log.get((ledger_id, entry_id, index), ())
                before = [due for nacked, due in nacks if nacked <= at]
                # (a forward takes buckets up to one native latency ahead: a later one is a message of an
                # entry due as a whole that was not due yet)
                if before and _bucket(before[-1]) <= at + width:
                    found.append(((ledger_id, entry_id), _bucket(before[-1])))
        if found:
            bucket = max(bucket for _, bucket in found)
            timeline.append((at, bucket))
            for entry in {entry for entry, _ in found}:
                per_entry.setdefault(entry, []).append((at, bucket))
    if not timeline:
        return {}
    typical = float(np.median([at - bucket for at, bucket in timeline]))

    def classify(pairs: list[tuple[tuple[float, int], tuple[float, int]]]) -> dict[str, Any]:
        extra: list[float] = []  # gaps of extra forwards
        examples: list[list[float]] = []  # the first few: what to look at
        jitter = 0
        late: list[float] = []  # how late the first ran, for gaps the timer's lateness explains
        for (t1, b1), (t2, b2) in pairs:
            gap = t2 - t1
            if gap >= width:
                continue
            if t2 < b1 + width + typical - 10:
                extra.append(gap)
                if len(examples) < 5:  # gap, how early, its bucket after the other's, entries taken whole
                    early = b1 + width + typical - t2
                    examples.append([round(gap, 1), round(early, 1), b2 - b1, whole.get(t2, 0)])
            elif gap > width - 10:
                jitter += 1
            else:
                late.append(t1 - b1 - typical)
        return {"extra": extra, "jitter": jitter, "late": late, "examples": examples}

    closer = classify(list(itertools.pairwise(timeline)))
    entry_pairs = [pair for forwards in per_entry.values() for pair in itertools.pairwise(forwards)]
    entries = classify(entry_pairs)
    entry_gaps = [b[0] - a[0] for a, b in entry_pairs if b[0] - a[0] < width]
    lateness = [at - bucket - typical for at, bucket in timeline]
    return {
        "forward_timer_late_p50_ms": round(float(np.median(lateness)), 1),
        "forward_timer_late_max_ms": round(max(lateness), 1),
        "forwards_closer_counted": len(closer["extra"]) + closer["jitter"] + len(closer["late"]),
        "forwards_closer_extra": len(closer["extra"]),
        # [gap, ms before the regular time, its bucket - the other's, entries taken whole] of the first 5
        "forwards_closer_extra_examples": closer["examples"],
        "forwards_closer_by_under_10ms": closer["jitter"],
        "forwards_closer_after_a_late_one": len(closer["late"]),
        "entry_gaps_below_bucket": len(entry_gaps),
        "min_entry_forward_gap_ms": round(min(entry_gaps), 1) if entry_gaps else None,
        "entry_gaps_extra": len(entries["extra"]),
        "entry_gaps_extra_min_ms": round(min(entries["extra"]), 1) if entries["extra"] else None,
        "entry_gaps_by_under_10ms": entries["jitter"],
        "entry_gaps_after_a_late_one": len(entries["late"]),
        "entry_gaps_first_late_min_ms": round(min(entries["late"]), 1) if entries["late"] else None,
    }


MODES = ("wrapper-per-message", "wrapper-fixed", "official-fixed")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--brokers", default="lite,apache")
    parser.add_argument("--workload", choices=WORKLOADS, default="mixed")
    parser.add_argument("--messages", type=int, help="default: 2,000 (mixed), 20,000 (demo)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per run")
    parser.add_argument("--render", action="store_true", help="only rewrite the section from the results")
    args = parser.parse_args(argv)
    saved = _load()
    if not args.render:
        messages = args.messages or (20_000 if args.workload == "demo" else 2_000)
        facts = report.machine()
        results: dict[str, Any] = {}
        for label, broker_type in report.brokers(args.brokers.split(",")):
            with broker_type() as broker:
                results[label] = {}
                for mode in MODES:
                    print(f"{label}: {args.workload} {mode}, {messages:,} messages ...", file=sys.stderr)
                    result = run(broker, mode, messages, args.timeout, args.workload)
                    results[label][mode] = result
                    print(json.dumps(result), file=sys.stderr)
        saved[args.workload] = {"machine": facts, "results": results}
        report.save_json("redelivery", {"workloads": saved})
    text = render(saved)
    report.write_section("redelivery", text)
    print(text)
    return 0


WORKLOADS = ("mixed", "demo")


def _load() -> dict[str, Any]:
    """The saved runs by workload (a file from before workloads holds the mixed one). O(file)."""
    path = report.RESULTS / "redelivery.json"
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    return dict(data["workloads"]) if "workloads" in data else {"mixed": data}


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def render(saved: dict[str, Any]) -> str:
    """The section: what every workload's runs have in common, then each workload's tables."""
    parts = [
        "## Redelivery as the application sees it, and what it costs the broker",
        "`python bench/redelivery.py [--workload mixed|demo]` — batches of 10, one Shared consumer; each "
        f"delivery nacked with probability {NACK_SHARE} (at most {MAX_NACKS} times a message), else acked, "
        "the same seeded decisions in every run and every mode (decided per message and round, not in "
        "arrival order). Three runs a broker: the wrapper with per-message delays, the wrapper and the "
        "official client at one fixed delay (the mean of the per-message delays). The wrapper with its "
        f"defaults (ceil rounding, k = {K}). Early and "
        "lateness (arrival − (nack time + delay)) are measured by the application on its own clock; "
        "reported = `nack_stats()`. Forwards per second: calls forwarding due entries to the native "
        "client, "
        "against the distinct 2^k-ms buckets the nacks fell due in, per second of the run; a forward "
        "less than 2^k ms after the previous one follows one the timer thread ran late (a loaded "
        "machine): the next comes at its own bucket's time rather than adding that lateness to every "
        "later bucket (tests/test_redelivery_flush.py). Broker "
        "messages/bytes: dispatched to the subscription, counted by the broker (pulsar-lite `/metrics` "
        "`pulsar_out_messages_total`/`pulsar_out_bytes_total`, Apache topic stats "
        "`msgOutCounter`/`bytesOutCounter`). Kept copies: batch "
        "siblings that came with a forward of their entry, kept in memory until due (issue 24) "
        "instead of being fetched again; peak = most kept at once (sampled every 250 ms), with "
        "the bytes counted against `max_held_chunked_bytes` (what each pins in the native client: batch "
        f"size × payload + {KEPT_COPY_BYTES:,} B) and the hold's measured bytes "
        "(`nack_stats(with_memory=True)`, part 'held chunked'; included in `memory_bytes`).",
    ]
    goals = _goal_rows(saved)
    if goals:
        parts.append(
            "Issue 24's goals, wrapper with per-message delays (ceil rounding, the default) against the "
            "official client at one fixed delay, same run, from the tables below:"
        )
        parts.append(report.table(["goal", "workload", "pulsar-lite", "Apache Pulsar"], goals))
        parts.append(
            "Kept copies and memory: a kept copy is a message the consumer holds, not a pending nack — its "
            "nack has left the index — so it is outside issue 23's budget of 16 B per pending nack (that "
            "figure is the index's, `bench/nack_memory.py`). It does count in `nack_stats(with_memory=True)"
            ".memory_bytes` (part 'held chunked': what it pins, batch size × payload + "
            f"{KEPT_COPY_BYTES:,} B, plus the hold's records) and in `chunked_held_bytes`, bounded by "
            "`max_held_chunked_bytes` (64 MiB by default; past it a sibling is fetched by its own forward, "
            "as before) and kept only when due within 30 s. The official consumer keeps no such copy: the "
            "broker sends the entry again instead."
        )
        parts.append(
            "`nack_stats()` lateness (`pulsar_nack.lateness`) counts every redelivery once: its exact "
            f"lateness if its due time is in the sample of due times (`DueSample`, {SAMPLE_SLOTS} slots), "
            "else the time from its bucket time to its arrival (each forward labels its ids with their "
            "bucket time) plus the offset of one of its own bucket's nacks, taken in the order they were "
            "filed (a bucket's forwarded copies come in about that order; a copy the consumer keeps draws "
            "any of the bucket's when it is taken out of the index, before its bucket falls due): in a "
            "segment of a bucket's nacks whose offsets fell as they were filed (one fixed delay) the one "
            "filed first of those left, else one drawn evenly over the segment; each nack's offset once "
            "(a sampled one's leaves the bucket's). No weights. Its size (estimator, "
            "`nbytes` of the histogram, the buckets' offsets and the sample) is fixed, whatever the "
            "pending nacks. "
            "Forwards per due bucket: one forward per due bucket *per entry* is the goal. A forward's "
            "bucket is the latest due bucket among the messages it took (the application's own due "
            "times), its timer lateness its time minus that bucket, less the run's median of that (a "
            f"forward goes one native latency early). A forward less than {1 << K} ms after another is "
            "*extra* if it came before the regular time of the bucket after the other's — a nack filed "
            "for a bucket already forwarded re-arming the timer, the defect (the issue saw forwards every "
            "60–150 ms) — or else follows a forward the timer thread ran late (by the shortfall at "
            "least; less than 10 ms: jitter). Counted between consecutive forwards, and between "
            "consecutive forwards of one entry."
        )
    for workload in WORKLOADS:
        if workload in saved:
            parts.append(_render_workload(workload, saved[workload]["machine"], saved[workload]["results"]))
    return "\n\n".join(parts)


def _early(w: dict[str, Any], _: dict[str, Any]) -> str:
    return f"{w['early']} of {w['redeliveries']:,}"


def _lateness(w: dict[str, Any], _: dict[str, Any]) -> str:
    ranks = ""
    if w.get("reported_p50_app_rank") is not None and w.get("reported_p99_app_rank") is not None:
        ranks = (
            f" (the app's {100 * w['reported_p50_app_rank']:.1f}th / "
            f"{100 * w['reported_p99_app_rank']:.1f}th percentile)"
        )
    size = w.get("lateness_estimator_bytes")
    return (
        f"app {_ms(w['lateness_p50_ms'])} / {_ms(w['lateness_p99_ms'])}, "
        f"nack_stats {_ms(w.get('reported_p50_ms'))} / {_ms(w.get('reported_p99_ms'))}{ranks}; "
        f"early share {w.get('reported_early_share')}" + ("" if size is None else f"; estimator {size:,} B")
    )


def _forwards(w: dict[str, Any], _: dict[str, Any]) -> str:
    span = w.get("forward_span_s")
    if not span:
        return "–"
    text = (
        f"{w['forwards'] / span:.2f} forwards/s for {w['nack_buckets'] / span:.2f} buckets due/s; "
        f"closest two {_ms(w['min_forward_gap_ms'])} ms apart"
    )
    if "forwards_closer_than_bucket" in w:
        text += f" ({w['forwards_closer_than_bucket']} of {w['forwards']:,} closer than {1 << K} ms"
        if "forwards_closer_extra" in w:
            text += (
                f": {w['forwards_closer_extra']} extra (before their bucket's time), "
                f"{w['forwards_closer_by_under_10ms']} by less than 10 ms, "
                f"{w['forwards_closer_after_a_late_one']} after a forward the timer ran late; "
                f"timer lateness p50 {_ms(w['forward_timer_late_p50_ms'])}, "
                f"max {_ms(w['forward_timer_late_max_ms'])} ms"
            )
        text += ")"
    if "entry_gaps_extra" in w:
        text += (
            f"; per entry, {w['entry_gaps_below_bucket']} two forwards closer than {1 << K} ms: "
            f"{w['entry_gaps_extra']} extra, {w['entry_gaps_by_under_10ms']} by less than 10 ms, "
            f"{w['entry_gaps_after_a_late_one']} after a forward the timer ran late"
            + (
                f"; closest {_ms(w.get('min_entry_forward_gap_ms'))} ms"
                if w.get("min_entry_forward_gap_ms") is not None
                else ""
            )
        )
    elif "min_entry_forward_gap_ms" in w:
        text += f"; closest two of one entry {_ms(w.get('min_entry_forward_gap_ms'))} ms apart"
    return text


def _traffic(w: dict[str, Any], o: dict[str, Any]) -> str:
    if not o.get("broker_messages"):
        return "–"
    return (
        f"{w['broker_messages']:,} vs {o['broker_messages']:,} messages "
        f"({w['broker_messages'] / o['broker_messages']:.3f}×), {w['broker_bytes']:,} vs "
        f"{o['broker_bytes']:,} B ({w['broker_bytes'] / o['broker_bytes']:.3f}×)"
    )


def _kept(w: dict[str, Any], _: dict[str, Any]) -> str:
    return (
        f"peak {w.get('held_peak', 0):,} kept: {w.get('held_peak_payload_bytes', 0):,} B counted, "
        f"{w.get('held_peak_memory_bytes', 0):,} B in memory_bytes"
    )


GOALS = (
    ("never early by default: redeliveries early (app clock)", _early),
    ("lateness p50 / p99 ms as the app sees it", _lateness),
    ("one forward per due bucket", _forwards),
    ("broker dispatch ≤ official's: wrapper vs official", _traffic),
    ("kept copies, counted in memory", _kept),
)


def _goal_rows(saved: dict[str, Any]) -> list[list[str]]:
    """One row per goal of issue 24 and workload, a column per broker (wrapper-per-message against
    official-fixed)."""
    rows: list[list[str]] = []
    brokers = ("pulsar-lite", "Apache Pulsar")
    for workload in WORKLOADS:
        if workload not in saved:
            continue
        results = saved[workload]["results"]
        for goal, text in GOALS:
            cells = []
            for broker in brokers:
                runs = results.get(broker, {})
                wrapper = runs.get("wrapper-per-message")
                cells.append("–" if wrapper is None else text(wrapper, runs.get("official-fixed", {})))
            rows.append([goal, workload, *cells])
    return rows


def _reported(r: dict[str, Any]) -> str:
    """nack_stats p50 / p99, and where they fall among the application's values when recorded."""
    text = f"{_ms(r.get('reported_p50_ms'))} / {_ms(r.get('reported_p99_ms'))}"
    if r.get("reported_p50_app_rank") is not None and r.get("reported_p99_app_rank") is not None:
        text += f" (app's {100 * r['reported_p50_app_rank']:.1f} / {100 * r['reported_p99_app_rank']:.1f} %)"
    return text


def _render_workload(workload: str, facts: dict[str, Any], results: dict[str, Any]) -> str:
    timing_rows = []
    traffic_rows = []
    for label, runs in sorted(results.items(), key=lambda item: item[0] != "pulsar-lite"):
        official = runs.get("official-fixed", {})
        for mode, r in sorted(runs.items(), key=lambda item: MODES.index(item[0])):  # (saved sorted by name)
            wrapper = not mode.startswith("official")
            timing_rows.append(
                [
                    label,
                    mode,
                    f"{r['redeliveries']:,}",
                    f"{r['early']:,}" + (f" (by ≤ {r['early_max_ms']:.0f} ms)" if r["early"] else ""),
                    f"{_ms(r['lateness_p50_ms'])} / {_ms(r['lateness_p99_ms'])}",
                    "–" if "load_1min" not in r else f"{r['load_1min'][0]:.1f}–{r['load_1min'][1]:.1f}",
                    _reported(r) if wrapper else "–",
                    (
                        f"{r['forwards'] / r['forward_span_s']:.2f} / "
                        f"{r['nack_buckets'] / r['forward_span_s']:.2f} "
                        f"(min gap {_ms(r['min_forward_gap_ms'])} ms)"
                    )
                    if wrapper and r.get("forward_span_s")
                    else "–",
                ]
            )
            ratio = (
                f"{r['broker_messages'] / official['broker_messages']:.2f}×"
                if official.get("broker_messages")
                else "–"
            )
            traffic_rows.append(
                [
                    label,
                    mode,
                    f"{r['broker_messages']:,}",
                    f"{r['broker_bytes']:,}",
                    ratio,
                    f"{r['handed_out']:,}",
                    f"{r['duplicates_handed_out']:,}",
                    "yes" if r["completed"] else f"NO ({r['missing']} missing)",
                    (
                        f"{r['held_redelivered']:,}; peak {r['held_peak']:,} "
                        f"({r['held_peak_payload_bytes']:,} B counted, {r['held_peak_memory_bytes']:,} B)"
                    )
                    if r.get("held_peak") is not None
                    else "–",
                ]
            )
    messages = next(iter(next(iter(results.values())).values()))["messages"]
    if workload == "demo":
        title = (
            f"### `pulsar-nack demo`'s workload: {messages:,} messages, per-call delays and backoff\n\n"
            "The demo's decisions (pulsar_nack/demo.py): half the nacks with a per-call delay uniform over "
            f"100–{DEMO_MAX_DELAY_MS:,} ms, half with none, left to the consumer's backoff "
            f"(`MultiplierRedeliveryBackoff({DEMO_BACKOFF_MS}, {DEMO_MAX_DELAY_MS})`: 200 ms, then 400 ms); "
            f"fixed: {_fixed_delay_ms(workload):,} ms."
        )
    else:
        title = (
            f"### Mixed delays: {messages:,} messages\n\nPer-message delays uniform over "
            f"{DELAYS_MS[0]:.0f}–{DELAYS_MS[1]:.0f} ms; fixed: {FIXED_DELAY_MS:,} ms."
        )
    return "\n\n".join(
        [
            title,
            report.machine_line(facts),
            report.table(
                [
                    "broker",
                    "run",
                    "redeliveries",
                    "early",
                    "app lateness p50 / p99 ms",
                    "load (1 min, start–end)",
                    "nack_stats p50 / p99 ms",
                    "forwards/s / buckets due/s",
                ],
                timing_rows,
            ),
            report.table(
                [
                    "broker",
                    "run",
                    "broker messages",
                    "broker bytes",
                    "vs official",
                    "handed to the app",
                    "acked messages handed again",
                    "complete",
                    "handed out from kept copies; peak kept",
                ],
                traffic_rows,
            ),
        ]
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
