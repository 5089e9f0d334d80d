"""``pulsar-nack profile --broker URL``: the profile's workload run through a real broker.

:func:`profile_broker` produces the workload's messages to fresh topics (one per ``topics``; batched when
``batch_size`` > 1), then consumes them in fresh interpreters, one per measure, each on its own durable
subscription created before the first message is sent (so the broker keeps every message for it):

* the wrapper (:class:`pulsar_nack.Client`), which nacks ``nack_share`` of the messages at the
  workload's delays and acks the rest, paced at ``rate`` (message ``i`` is handled no earlier than
  ``i / rate`` s after the first) — in three processes: ``default`` (RSS, times, the tracker's counts
  and the pympler breakdown of :func:`pulsar_nack.profile.type_breakdown`), ``malloc``
  (``PYTHONMALLOC=malloc`` + ``mallinfo2``) and ``tracemalloc``;
* the official client's consumer with its native nack tracker, side by side, the same way in two
  processes (``native`` for RSS, ``native-malloc``), its single ``negative_ack_redelivery_delay_ms``
  set to the workload's mean delay (the native client has no per-message delay).

Copies a nack brings back before the run ends are acked when they arrive. Memory is the consumer process's
growth from its baseline to the end of the run. Every probe subscribes, consumes a warm-up (a receiver
queue's worth of messages a topic, acked; the probes one at a time) and reads its baseline before the
workload's first message is sent, then waits for its turn; the run ends once a marker sent after the
workload's messages has come from every topic. So the receiver queues are empty at both reads (a queue
that held messages at either read moved the figure by megabytes at 100 topics: a consumer's queue refills
in halves, so it ends anywhere from half full to full), and the client library has reached its steady
state before the baseline (at 100 topics it frees ~3 MB a few seconds after its first messages and grows
~1 MB while its queues first fill: measured with nothing nacked, both clients alike). The client library's
own state (unacked-message and batch-ack tracking, the native nack tracker) is included, for both clients
alike, beside the tracker's own walk (``nack_stats(with_memory=True)``) and, in the ``malloc`` process,
what the heap gives back when the tracker then drops its pending nacks (``released``: the index and the
arrival filter, read at one moment, so without the client library's churn between the baseline and the end
— which moves the growth by a few hundred KB either way even at one topic), beside what the walk says the
drop frees (``dropped``: the walk before less the walk after, ``kept``: the tracker's fixed part, which
stays). So at small scales the growth is dominated by that churn: the native tracker's ~450 B per pending
nack shows from a few thousand nacks on; pulsar-nack's tracker shows in ``released`` and its own walk.
Time per nack is the ``negative_acknowledge`` call; time per forward is the final drain of the tracker, as
the offline profile does when nothing fell due.

Bounds: at most :data:`MAX_BROKER_MESSAGES` messages; every probe ends within ``timeout_s`` or fails
naming how many messages it received. Cost: O(messages) per probe, plus the broker's round trips.
"""

from __future__ import annotations

import gc
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Final

from pulsar_nack.native import NATIVE_MIN_DELAY_MS
from pulsar_nack.profile import (
    ProfileError,
    ProfileResult,
    Workload,
    _probe_env,
    finish_child,
    java_side,
    start_child,
    type_breakdown,
)

__all__ = ["BROKER_MODES", "MAX_BROKER_MESSAGES", "check_broker_run", "probe_broker", "profile_broker"]

#: The most messages a broker profile produces (≈ 25k messages/s on 2 cores: under a minute to produce).
MAX_BROKER_MESSAGES: Final = 1_000_000
#: The probes, in the order they run: the wrapper's three measures, then the native client's two.
BROKER_MODES: Final = ("default", "malloc", "tracemalloc", "native", "native-malloc")
_RECEIVE_MS: Final = 1_000  # one receive() call's wait: the deadline is checked between calls
_QUEUE: Final = 500  # the probes' receiver queue
#: Sent to every topic after the workload's messages: a probe that has received every topic's marker has
#: nothing left in its receiver queues.
_END: Final = b"end"
_WARM: Final = b"warm"  # the warm-up's messages (module docstring)
_WARMED: Final = b"warmed"  # the warm-up's last message to a topic
_WARM_SETTLE_S: Final = 6.0  # after the warm-up: the client frees ~3 MB ~5 s after its first messages
_SUBSCRIBED: Final = "subscribed"  # a probe's line once subscribed: the warm-up may be sent
_READY: Final = "ready"  # a probe's line once its baseline is read: it then waits for its go file
_GO_POLL_S: Final = 0.05
# The probes take turns at the warm-up too: pulsar-lite stops dispatching to some of the subscriptions
# read at once (100 topics, not batched, two or more subscriptions consumed together: each stalls at
# 20-48 k of 50 k messages; one at a time, each gets all)
_WARM_TURN: Final = ".warm"
_PROGRESS_EVERY: Final = 1_000


def check_broker_run(workload: Workload, service_url: str, timeout_s: float) -> None:
    """Raise :class:`ProfileError` naming the parameter a broker run cannot take (nothing is sent). O(1)."""
    if not isinstance(service_url, str) or not service_url.startswith(("pulsar://", "pulsar+ssl://")):
        raise ProfileError(f"broker: expected a pulsar:// or pulsar+ssl:// URL, got {service_url!r}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not 0 < timeout_s < math.inf:
        raise ProfileError(f"timeout_s: must be a finite number of seconds > 0, got {timeout_s!r}")
    if workload.partitions != 1:
        raise ProfileError(
            f"partitions: a broker run uses non-partitioned topics (one per topic), got {workload.partitions}"
        )
    if workload.messages > MAX_BROKER_MESSAGES:
        raise ProfileError(
            f"rate × duration_s: {workload.messages:,} messages is more than {MAX_BROKER_MESSAGES:,} for a "
            "broker run; lower the rate or the duration"
        )


def _subscription(mode: str) -> str:
    return f"pulsar-nack-profile-{mode}"


def _produce(
    workload: Workload,
    service_url: str,
    topics: Sequence[str],
    progress: Callable[[int], None],
    warm_up: bool = False,
) -> None:
    """Send the workload's messages round-robin over ``topics`` (batches of ``batch_size`` when > 1),
    then :data:`_END` to each; with ``warm_up``, :data:`_QUEUE` :data:`_WARM` messages to each, then
    :data:`_WARMED`. Every probe's durable subscription exists already. O(messages)."""
    import pulsar

    client = pulsar.Client(
        service_url, operation_timeout_seconds=30, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )
    try:
        batched = workload.batch_size > 1
        producers = [
            client.create_producer(
                topic,
                batching_enabled=batched,
                batching_max_messages=max(workload.batch_size, 2),
                batching_max_publish_delay_ms=10_000 if batched else 10,
                block_if_queue_full=True,
            )
            for topic in topics
        ]
        errors: list[str] = []

        def sent(result: Any, _: Any) -> None:
            if result != pulsar.Result.Ok:
                errors.append(str(result))

        count = _QUEUE * len(topics) if warm_up else workload.messages
        for i in range(count):
            # whole batches per topic: a batch of one topic is batch_size consecutive messages
            t = (i // workload.batch_size) % len(topics)
            producers[t].send_async(_WARM if warm_up else f"{i}".encode(), sent)
            if not warm_up and (i + 1) % _PROGRESS_EVERY == 0:
                progress(i + 1)
        for producer in producers:
            producer.send_async(_WARMED if warm_up else _END, sent)
        for producer in producers:
            producer.flush()
            producer.close()
        if errors:
            raise RuntimeError(f"broker: {len(errors)} sends failed ({errors[0]})")
        if not warm_up:
            progress(workload.messages)
    finally:
        client.close()


# -- the probe (a fresh interpreter) ------------------------------------------------------------------


def probe_broker(
    mode: str, service_url: str, topics: Sequence[str], workload: Workload, timeout_s: float, go: str
) -> dict[str, Any]:
    """Subscribe on ``mode``'s subscription in this (fresh) interpreter, once the file ``go`` +
    :data:`_WARM_TURN` exists consume the warm-up, read the baseline, print :data:`_READY`, and once
    the file ``go`` exists consume the workload's messages and measure (see the
    module docstring); prints ``progress N`` lines. Raises RuntimeError when ``go`` does not appear or
    the messages do not all arrive within ``timeout_s``."""
    import tracemalloc

    import pulsar

    import pulsar_nack
    from pulsar_nack.memory import heap_in_use, rss_bytes

    native = mode.startswith("native")
    measure = _measure(mode)
    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    options: dict[str, Any] = {
        "consumer_type": pulsar.ConsumerType.Shared,
        "initial_position": pulsar.InitialPosition.Earliest,
    }
    if native:
        client: Any = pulsar.Client(service_url, operation_timeout_seconds=30, logger=logger)
        delay_ms = max(NATIVE_MIN_DELAY_MS, round(workload.delay.mean_ms))
        options["negative_ack_redelivery_delay_ms"] = delay_ms
    else:
        client = pulsar_nack.Client(service_url, operation_timeout_seconds=30, logger=logger)
        options["negative_ack_precision_bit_cnt"] = workload.precision_bits
        options["negative_ack_rounding"] = workload.rounding
    try:
        consumer = client.subscribe(list(topics), _subscription(mode), receiver_queue_size=_QUEUE, **options)
        print(_SUBSCRIBED, flush=True)
        _wait_for_turn(go + _WARM_TURN, timeout_s * (len(BROKER_MODES) + 1))
        warmed, warm_until = 0, time.monotonic() + timeout_s
        while warmed < len(topics):  # the warm-up (module docstring), acked
            if time.monotonic() > warm_until:
                raise RuntimeError(
                    f"broker: the warm-up came from {warmed} of {len(topics)} topics within {timeout_s:g} s"
                )
            try:
                message = consumer.receive(_RECEIVE_MS)
            except pulsar.Timeout:
                continue
            warmed += message.data() == _WARMED
            consumer.acknowledge(message)
            del message
        time.sleep(_WARM_SETTLE_S)
        rng = random.Random(workload.seed)
        draw, share = workload.delay.sampler(rng), workload.nack_share
        # which messages arrived once already (the payload is the message's number): allocated before
        # the baseline, and independent of the broker's redelivery counts
        seen = bytearray(workload.messages)
        gc.collect()
        if measure == "tracemalloc":
            tracemalloc.start()
            baseline = tracemalloc.get_traced_memory()[0]
        else:
            baseline = heap_in_use() if measure == "malloc" else rss_bytes()
        print(_READY, flush=True)
        _wait_for_turn(go, timeout_s * (len(BROKER_MODES) + 1))
        originals = nacked = copies = ended = 0
        nack_s = 0.0
        perf = time.perf_counter
        started = time.monotonic()
        deadline = started + timeout_s
        per_message_s = 1.0 / workload.rate
        while originals < workload.messages or ended < len(topics):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"broker: received {originals:,} of {workload.messages:,} messages and {ended} of "
                    f"{len(topics)} topics' ends within {timeout_s:g} s (timeout_s)"
                )
            try:
                message = consumer.receive(_RECEIVE_MS)
            except pulsar.Timeout:
                continue
            data = message.data()
            if data == _END:  # the topic's last message: its queue is empty once it is taken
                ended += 1
                consumer.acknowledge(message)
                continue
            number = int(data)
            if seen[number]:  # a copy a nack brought back: the application acks it
                copies += 1
                consumer.acknowledge(message)
                continue
            seen[number] = 1
            ahead = started + originals * per_message_s - time.monotonic()
            if ahead > 0.002:  # paced at the workload's rate
                time.sleep(ahead)
            originals += 1
            if rng.random() < share:
                delay = draw()
                t0 = perf()
                if native:
                    consumer.negative_acknowledge(message)
                else:
                    consumer.negative_acknowledge(message, delay)
                nack_s += perf() - t0
                nacked += 1
            else:
                consumer.acknowledge(message)
            del message
            if originals % _PROGRESS_EVERY == 0:
                print(f"progress {originals}", flush=True)
        gc.collect()
        if measure == "tracemalloc":
            grown = tracemalloc.get_traced_memory()[0] - baseline
            tracemalloc.stop()
        else:
            grown = (heap_in_use() if measure == "malloc" else rss_bytes()) - baseline
        released = dropped = kept = None
        if measure == "malloc" and not native:  # what dropping the pending nacks gives back (docstring)
            tracker = consumer._nacks.tracker
            walked = tracker.stats(with_memory=True).memory_bytes
            gc.collect()
            held = heap_in_use()
            tracker.clear()
            gc.collect()
            released = held - heap_in_use()
            # what the walk says the drop freed: the tracker's fixed part (``kept``: the timer's levels,
            # the lateness estimator) stays, so this, not the whole walk, is what ``released`` is read against
            kept = tracker.stats(with_memory=True).memory_bytes or 0
            dropped = (walked or 0) - kept
        out: dict[str, Any] = {
            "mode": mode,
            "bytes": grown,
            "nacked": nacked,
            "copies": copies,
            "pending": nacked - copies,
            "elapsed_s": time.monotonic() - started,
            "nack_us": nack_s / nacked * 1e6 if nacked else 0.0,
            "released": released,
            "dropped": dropped,
            "kept": kept,
        }
        if native:
            out["native_delay_ms"] = delay_ms
        elif mode == "default":
            out |= _tracker_figures(consumer)
        consumer.close()
        return out
    finally:
        client.close()


def _tracker_figures(consumer: Any) -> dict[str, Any]:
    """The wrapper's tracker after the run: counts, its own walk, the pympler breakdown, and the time to
    forward everything pending (the final drain)."""
    tracker = consumer._nacks.tracker
    stats = tracker.stats(with_memory=True)
    index = tracker.index
    out = {
        "pending_ids": stats.pending,
        "buckets": stats.buckets,
        "slots": index.structure()["slots"],
        "ledgers": len({(topic, ledger) for _, topic, ledger, _ in index}),
        "reported": stats.memory_bytes,
        "forwards_during_run": stats.forwarded,
        "breakdown": type_breakdown([index, tracker.arrivals], stop=[tracker]),
    }
    started = time.perf_counter()
    drained = tracker.flush(everything=True)
    out["forward_us"] = (time.perf_counter() - started) / drained * 1e6 if drained else 0.0
    out["drained_entries"] = drained
    return out


def _wait_for_turn(path: str, timeout_s: float) -> None:
    """Sleep until the file ``path`` exists; RuntimeError after ``timeout_s``."""
    until = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > until:
            raise RuntimeError(f"broker: no turn came (file {path}) within {timeout_s:g} s")
        time.sleep(_GO_POLL_S)


# -- the parent ---------------------------------------------------------------------------------------


def _start(
    mode: str, service_url: str, topics: Sequence[str], workload: Workload, timeout_s: float, go: str
) -> subprocess.Popen[str]:
    """Start ``mode``'s probe; it has subscribed once :func:`_await` read its :data:`_SUBSCRIBED`, and
    read its baseline once it read its :data:`_READY`."""
    command = [
        sys.executable,
        "-m",
        "pulsar_nack.profile_broker",
        mode,
        service_url,
        json.dumps(list(topics)),
        json.dumps(workload.to_json()),
        repr(float(timeout_s)),
        go,
    ]
    return start_child(command, _probe_env("malloc" if _measure(mode) == "malloc" else "default"))


def _measure(mode: str) -> str:
    """What a probe reads: ``malloc`` (heap in use, PYTHONMALLOC=malloc), ``tracemalloc``, or ``rss``."""
    return "tracemalloc" if mode == "tracemalloc" else "malloc" if mode.endswith("malloc") else "rss"


def _await(child: subprocess.Popen[str], mode: str, line: str) -> None:
    """Read the probe's output to ``line``; RuntimeError with its stderr if it ends first. Bounded by the
    probe's own deadlines (the client's operation timeout, the warm-up's ``timeout_s``)."""
    assert child.stdout is not None and child.stderr is not None
    for out in child.stdout:
        if out.strip() == line:
            return
    child.wait()
    raise RuntimeError(f"broker profile probe {mode!r} ended before {line}:\n{child.stderr.read()[-3000:]}")


def profile_broker(
    workload: Workload,
    service_url: str,
    *,
    java: bool = True,
    timeout_s: float = 300.0,
    progress: Callable[[str, int, int], None] | None = None,
) -> ProfileResult:
    """Run ``workload`` through the broker at ``service_url`` (module docstring): produce to fresh topics,
    consume with the wrapper in three fresh processes and with the native client in two, and, with
    ``java``, the Java structure on the same pending entries. ``progress(stage, done, total)`` follows
    the messages. Raises :class:`ProfileError` naming a parameter a broker run cannot take."""
    if not isinstance(workload, Workload):
        raise ProfileError(f"workload: expected a Workload, got {type(workload).__name__}")
    check_broker_run(workload, service_url, timeout_s)
    started = time.perf_counter()
    run = uuid.uuid4().hex[:12]
    topics = [f"persistent://public/default/pulsar-nack-profile-{run}-{t}" for t in range(workload.topics)]

    def stage(name: str) -> Callable[[int], None]:
        return lambda done: progress(name, done, workload.messages) if progress is not None else None

    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="pulsar-nack-profile-") as turns:
        go = {mode: os.path.join(turns, mode) for mode in BROKER_MODES}
        children: dict[str, subprocess.Popen[str]] = {}
        try:  # every probe warms up and reads its baseline before the workload is sent
            for mode in BROKER_MODES:
                children[mode] = _start(mode, service_url, topics, workload, timeout_s, go[mode])
                _await(children[mode], mode, _SUBSCRIBED)
            _produce(workload, service_url, topics, stage("produce"), warm_up=True)
            for mode, child in children.items():  # one at a time (_WARM_TURN)
                open(go[mode] + _WARM_TURN, "w").close()
                _await(child, mode, _READY)
            _produce(workload, service_url, topics, stage("produce"))
            for mode in BROKER_MODES:  # one at a time: the others wait, subscribed
                open(go[mode], "w").close()
                results[mode] = finish_child(
                    children.pop(mode), f"broker profile probe {mode!r}", timeout_s + 60, stage(mode)
                )
        finally:
            for child in children.values():
                child.kill()
                child.wait()
    main = results["default"]
    memory = {"malloc": results["malloc"]["bytes"], "tracemalloc": results["tracemalloc"]["bytes"]}
    memory["released"] = results["malloc"]["released"]
    memory["dropped"] = results["malloc"]["dropped"]
    memory["kept"] = results["malloc"]["kept"]
    memory |= {"rss": main["bytes"], "reported": main["reported"]}
    java_result, java_note = None, "Java: not asked for"
    if java:
        if progress is not None:
            progress("java", 0, 1)
        java_result, java_note = java_side(workload, int(main["pending_ids"]))
        if progress is not None:
            progress("java", 1, 1)
    native, native_malloc = results["native"], results["native-malloc"]
    pending_native = max(int(native_malloc["pending"]), 0)
    native_figures = {
        "bytes": native_malloc["bytes"],
        "bytes_rss": native["bytes"],
        "bytes_per_nack": native_malloc["bytes"] / pending_native if pending_native else 0.0,
        "pending": pending_native,
        "nack_us": native["nack_us"],
        "delay_ms": native["native_delay_ms"],
        "source": (
            f"measured in this run: the official consumer on subscription {_subscription('native-malloc')}, "
            f"process growth with PYTHONMALLOC=malloc (RSS {native['bytes'] / 1e6:.3f} MB), "
            f"negative_ack_redelivery_delay_ms = {native['native_delay_ms']}"
        ),
    }
    return ProfileResult(
        workload=workload,
        messages=workload.messages,
        nacked=int(main["nacked"]),
        pending=int(main["pending"]),
        pending_ids=int(main["pending_ids"]),
        buckets=int(main["buckets"]),
        ledgers=int(main["ledgers"]),
        slots=int(main["slots"]),
        forwards=int(main["forwards_during_run"]),
        forwarded_entries=int(main["drained_entries"]),
        nack_us=float(main["nack_us"]),
        forward_us=float(main["forward_us"]),
        forward_source="drain",
        memory={key: int(value) for key, value in memory.items()},
        breakdown={str(k): int(v) for k, v in main["breakdown"].items()},
        java=java_result,
        java_note=java_note,
        native=native_figures,
        elapsed_s=time.perf_counter() - started,
        broker=f"{service_url}: {len(topics)} fresh topic(s) pulsar-nack-profile-{run}-*, consumed in "
        f"{main['elapsed_s']:.1f} s (paced at the rate)",
    )


def _main(argv: Sequence[str]) -> int:
    """Probe entry point: ``python -m pulsar_nack.profile_broker MODE URL TOPICS_JSON WORKLOAD_JSON
    TIMEOUT_S GO_FILE``."""
    mode, url, topics, payload, timeout, go = argv
    if mode not in BROKER_MODES:
        raise SystemExit(f"unknown probe mode {mode!r}")
    result = probe_broker(
        mode, url, json.loads(topics), Workload.from_json(json.loads(payload)), float(timeout), go
    )
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
