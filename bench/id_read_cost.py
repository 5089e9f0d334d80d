"""Benchmark: what reading a received message's ids costs, by route (issue 28, direction (a)).

The wrapper classifies each received message by its (ledger id, entry id, batch index) and, once per
batched entry, its batch size. This measures, per message, each way to read them from the official
client's objects, on real messages received from an embedded pulsar-lite broker:

* ``getters`` — what the wrapper does today: ``m._message.message_id()`` then ``ledger_id()``,
  ``entry_id()``, ``batch_index()`` (four pybind11 calls);
* ``getters + size`` — the same plus the batch size from ``serialize()``
  (pulsar_nack.native.client.batch_size), as if it were read for every message (the wrapper reads it once
  per entry);
* ``str`` — ``str(message_id)`` (``(ledger,entry,partition,batch index)``) parsed in Python (no size);
* ``serialize`` — the ``MessageIdData`` protobuf of ``serialize()`` parsed in Python (all four fields);
* ``native ids`` / ``native ids_all`` — the prototype extension in native_ids/ (if it was built:
  ``cd native_ids && python setup.py build_ext --inplace``): one plain C call per message, one per list;
  ``native ids, pybind11 call`` — the same through a pybind11-dispatched function; ``native ids, pybind11
  lookup`` — that, and pybind11's type lookup for every message instead of the exact-type fast path.

Messages come from producer batches of B messages (B = 1: batching off), for B = 1, 10, 100 and 1,000;
``native ids_all`` reads them in calls of B messages (a ``batch_receive`` of one entry), the other routes one
message at a time in one Python loop (the wrapper's per-message path). Every route's result is checked
against the getters' (and the batch size against ``serialize()``'s) before it is timed. Time: the reading
thread's CPU time (the machine may be shared; wall time would count the waits for a core) with the garbage
collector off, the median of ``--reps`` passes over all messages. For scale, the same run measures the
official consumer's own CPU per message (process CPU, all threads, of the ``receive`` + ``acknowledge``
loop that fetched the messages).

    python bench/id_read_cost.py                  # 20,000 messages per batch size, 7 passes, ≈ 30 s

Writes ``bench/results/id_read_cost.json`` and the figures section of docs/receive_cost.md.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import re
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import _pulsar
import pulsar
import report

from pulsar_nack.native.client import batch_size
from pulsar_nack.testing import PulsarLite

ROOT = Path(__file__).resolve().parent.parent
NATIVE_DIR = ROOT / "native_ids"
DOC = ROOT / "docs" / "receive_cost.md"
SECTION = "id-read-cost"
BATCH_SIZES = (1, 10, 100, 1000)
Ids = tuple[int, int, int, int]
Route = Callable[[Sequence[Any]], list[Any]]


def load_native() -> tuple[Any, str]:
    """The prototype extension (or None) and why not."""
    sys.path.insert(0, str(NATIVE_DIR))
    try:
        return importlib.import_module("_pulsar_nack_ids"), ""
    except ImportError as error:
        return None, str(error)
    finally:
        sys.path.remove(str(NATIVE_DIR))


def getters(chunk: Sequence[Any]) -> list[Any]:
    out = []
    for m in chunk:
        mid = m._message.message_id()
        out.append((mid.ledger_id(), mid.entry_id(), mid.batch_index()))
    return out


def getters_size(chunk: Sequence[Any]) -> list[Any]:
    out = []
    for m in chunk:
        mid = m._message.message_id()
        out.append((mid.ledger_id(), mid.entry_id(), mid.batch_index(), batch_size(mid)))
    return out


def by_str(chunk: Sequence[Any]) -> list[Any]:
    out = []
    for m in chunk:
        ledger, entry, _, index = str(m._message.message_id())[1:-1].split(",")
        out.append((int(ledger), int(entry), int(index)))
    return out


def by_serialize(chunk: Sequence[Any]) -> list[Any]:
    """All four fields from the MessageIdData bytes (fields 1, 2, 4, 6; all varints; absent = default)."""
    out = []
    for m in chunk:
        data = m._message.message_id().serialize()
        fields = {4: -1, 6: 0}
        position, end = 0, len(data)
        while position < end:
            tag = data[position]  # (every tag of fields 1-7 fits in one byte)
            position += 1
            value = shift = 0
            while True:
                byte = data[position]
                position += 1
                value |= (byte & 0x7F) << shift
                shift += 7
                if byte < 0x80:
                    break
            if tag & 7 != 0:  # a length-delimited field (7, a chunked message's first id): skip it
                position += value
                continue
            fields[tag >> 3] = value
        index = fields[4]
        out.append((fields[1], fields[2], index - (1 << 64) if index >= 1 << 63 else index, fields[6]))
    return out


def native_routes(native: Any) -> dict[str, Route]:
    ids, ids_all, via_pybind, generic = native.ids, native.ids_all, native.pybind_ids, native.generic_ids
    return {
        "native ids": lambda chunk: [ids(m) for m in chunk],
        "native ids_all": lambda chunk: ids_all(chunk),
        "native ids, pybind11 call": lambda chunk: [via_pybind(m) for m in chunk],
        "native ids, pybind11 lookup": lambda chunk: [generic(m) for m in chunk],
    }


def receive_all(client: Any, size: int, count: int) -> tuple[list[Any], float]:
    """``count`` messages produced in batches of ``size`` (1: batching off), received back; and the
    consumer's CPU µs per message for its receive + acknowledge loop."""
    topic = f"persistent://public/default/ids-{size}-{uuid.uuid4().hex[:8]}"
    consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    producer = client.create_producer(
        topic,
        batching_enabled=size > 1,
        batching_max_messages=max(size, 2),  # (the client refuses 1; unused with batching off)
        batching_max_allowed_size_in_bytes=16 * 1024 * 1024,
        batching_max_publish_delay_ms=1000,
        block_if_queue_full=True,
        max_pending_messages=count,
    )
    for i in range(count):
        producer.send_async(i.to_bytes(4, "big"), None)
    producer.flush()
    producer.close()
    messages = []
    start = time.process_time()
    for _ in range(count):
        message = consumer.receive(timeout_millis=30_000)
        consumer.acknowledge(message)
        messages.append(message)
    cpu = time.process_time() - start
    consumer.close()
    return messages, cpu / count * 1e6


#: The routes that take a list in one call: timed in calls of B messages. The others read one message at a
#: time, as the wrapper's per-message path does, so they are timed in one loop over all messages (a loop per
#: B-message list would add the same Python scaffolding to each of them and nothing to ids_all).
PER_LIST = {"native ids_all"}


def time_route(name: str, route: Route, messages: list[Any], size: int, reps: int) -> float:
    """Median over ``reps`` passes of this thread's CPU µs per message to read all ``messages`` (in calls of
    ``size`` for a :data:`PER_LIST` route). Thread CPU, not wall time: the machine is shared, and the reads
    run in this thread only."""
    chunks = (
        [messages[i : i + size] for i in range(0, len(messages), size)] if name in PER_LIST else [messages]
    )
    samples = []
    gc.disable()
    try:
        for _ in range(reps):
            start = time.thread_time()
            for chunk in chunks:
                route(chunk)
            samples.append((time.thread_time() - start) / len(messages) * 1e6)
    finally:
        gc.enable()
    return statistics.median(samples)


def check(name: str, route: Route, messages: list[Any], expected: list[Ids]) -> None:
    """Raises if ``route`` reads other ids than the getters (+ serialize's batch size)."""
    got = route(messages)
    width = len(got[0])
    if [tuple(g) for g in got] != [e[:width] for e in expected]:
        bad = next(i for i, (g, e) in enumerate(zip(got, expected, strict=True)) if tuple(g) != e[:width])
        raise AssertionError(f"{name}: message {bad}: {got[bad]} != {expected[bad][:width]}")


def measure(count: int, reps: int) -> dict[str, Any]:
    native, why_not = load_native()
    routes: dict[str, Route] = {
        "getters": getters,
        "getters + size": getters_size,
        "str": by_str,
        "serialize": by_serialize,
    }
    if native is not None:
        routes.update(native_routes(native))
    rows = []
    load_before = os.getloadavg()[0]
    with PulsarLite() as broker:
        client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        try:
            for size in BATCH_SIZES:
                total = -(-count // size) * size
                messages, official_cpu_us = receive_all(client, size, total)
                expected = getters_size(messages)
                sizes = {e[3] for e in expected}
                for name, route in routes.items():
                    check(name, route, messages, expected)
                row: dict[str, Any] = {
                    "batch_size": size,
                    "messages": total,
                    "batch_sizes_seen": sorted(sizes),
                    "official_receive_ack_cpu_us": official_cpu_us,
                    "us_per_message": {
                        name: time_route(name, r, messages, size, reps) for name, r in routes.items()
                    },
                }
                rows.append(row)
                print(row, file=sys.stderr)
        finally:
            client.close()
    return {
        "machine": report.machine(),
        "reps": reps,
        "native": None
        if native is None
        else {
            "built": True,
            "internals_id": native.INTERNALS_ID,
            "pybind11": ".".join(map(str, native.PYBIND11_VERSION)),
            "pulsar_client": pulsar.__version__,
            "libpulsar": sorted(
                p.name for p in (Path(_pulsar.__file__).parent / "pulsar_client.libs").iterdir()
            ),
        },
        "native_not_built": why_not,
        "load_average_1min": [load_before, os.getloadavg()[0]],
        "rows": rows,
    }


def render(results: dict[str, Any]) -> str:
    rows = results["rows"]
    names = list(rows[0]["us_per_message"])
    table = report.table(
        ["route", *(f"B = {r['batch_size']:,}" for r in rows)],
        [[name, *(f"{r['us_per_message'][name]:.3f}" for r in rows)] for name in names]
        + [
            [
                "official consumer, receive + ack (CPU)",
                *(f"{r['official_receive_ack_cpu_us']:.2f}" for r in rows),
            ]
        ],
    )
    native = results["native"]
    lines = [
        f"`python bench/id_read_cost.py` — CPU µs per message to read a received message's ids, by route; "
        f"{rows[0]['messages']:,}+ messages from producer batches of B (B = 1: batching off), read one at a "
        f"time in one loop, except `native ids_all`: one call per B messages; median of {results['reps']} "
        "passes. The last row is the official consumer's CPU per message "
        "for the `receive` + `acknowledge` loop that fetched them (process CPU, all threads), for scale.",
        report.machine_line(results["machine"])
        + " 1-minute load average before / after: {:.1f} / {:.1f} (other work on the machine inflates the "
        "figures).".format(*results["load_average_1min"]),
        table,
    ]
    sizes = [r["batch_size"] for r in rows]

    def times(name: str) -> str:
        return ", ".join(f"{r['us_per_message'][name] / r['us_per_message']['getters']:.2f}×" for r in rows)

    lines.append(
        f"Pure Python, for B = {', '.join(f'{b:,}' for b in sizes)}: `str` costs {times('str')} the getters' "
        f"(and has no batch size), `serialize` (all four fields) {times('serialize')}, and the getters with "
        f"the batch size read from `serialize()` {times('getters + size')}."
    )
    if native is not None:

        def per_b(values: dict[int, float], fmt: str) -> str:
            return ", ".join(fmt.format(values[b]) for b in sizes)

        def ratio(name: str) -> dict[int, float]:
            return {r["batch_size"]: r["us_per_message"][name] / r["us_per_message"]["getters"] for r in rows}

        def saved(name: str) -> dict[int, float]:
            return {r["batch_size"]: r["us_per_message"]["getters"] - r["us_per_message"][name] for r in rows}

        def share(name: str) -> dict[int, float]:
            return {
                r["batch_size"]: (r["us_per_message"]["getters"] - r["us_per_message"][name])
                / r["official_receive_ack_cpu_us"]
                for r in rows
            }

        lines.append(
            f"Extension built with pybind11 {native['pybind11']} (`{native['internals_id']}`) against "
            f"pulsar-client {native['pulsar_client']} ({', '.join(native['libpulsar'])}). For B = "
            f"{', '.join(f'{b:,}' for b in sizes)}: `native ids_all` (one call per list, all four ids) costs "
            f"{per_b(ratio('native ids_all'), '{:.2f}×')} the getters' (three ids, no batch size), saving "
            f"{per_b(saved('native ids_all'), '{:.2f}')} µs a message — "
            f"{per_b(share('native ids_all'), '{:.0%}')} of the official consumer's CPU per message in the "
            f"same run; `native ids` (one call per message, the `receive` and listener path) costs "
            f"{per_b(ratio('native ids'), '{:.2f}×')} the getters', saving "
            f"{per_b(saved('native ids'), '{:.2f}')} µs ({per_b(share('native ids'), '{:.0%}')})."
        )
    else:
        lines.append(f"The extension was not built: {results['native_not_built']}")
    return "\n\n".join(lines)


def write_section(markdown: str) -> None:
    """Replace the generated section of docs/receive_cost.md (the rest of the page is written by hand)."""
    text = DOC.read_text()
    pattern = re.compile(rf"<!-- BEGIN {SECTION} -->.*?<!-- END {SECTION} -->", re.DOTALL)
    block = f"<!-- BEGIN {SECTION} -->\n{markdown.rstrip()}\n<!-- END {SECTION} -->"
    if not pattern.search(text):
        raise SystemExit(f"{DOC}: no {SECTION} section markers")
    DOC.write_text(pattern.sub(lambda _: block, text))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000, help="messages per batch size")
    parser.add_argument("--reps", type=int, default=7, help="timed passes per route (median)")
    args = parser.parse_args(argv)
    results = measure(args.messages, args.reps)
    report.save_json("id_read_cost", results)
    text = render(results)
    write_section(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
