"""``pulsar-nack demo``: the wrapper at work against a real broker, with a live progress line.

Starts the embedded broker (pulsar-lite on loopback) unless ``--service-url`` is given, produces messages
(batched), and consumes them with a wrapped consumer that nacks a share of them: some with per-call
delays, the rest with a backoff by redelivery count, each message failing at most ``--max-failures``
times. The progress line shows received, nacked, pending, buckets, tracker bytes and redelivery lateness;
the summary compares the tracker's memory per pending nack with the native client's, as
``bench/nack_lateness.py`` measured it (the package's ``data/native_nack_cost.json``, with the date and
machine of that measurement; without the file the demo says the native figure is unavailable).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import signal
import sys
import threading
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class _Progress:
    received: int = 0
    acked: int = 0
    nacked: int = 0
    lateness_ms: list[float] = field(default_factory=list)
    peak_pending: int = 0
    peak_bytes: int = 0
    peak_parts: tuple[tuple[str, int], ...] = ()
    interrupted: bool = False  # Ctrl-C while consuming
    memory: list[tuple[int, int]] = field(default_factory=list)  # (pending, tracker bytes), twice a second


def register(subcommands: Any) -> None:
    """Add the ``demo`` subcommand to the ``pulsar-nack`` parser."""
    parser = subcommands.add_parser(
        "demo", help="nack messages through an embedded broker and watch the tracker"
    )
    parser.add_argument(
        "--service-url",
        help="use this broker (pulsar://HOST:PORT) instead of starting pulsar-lite (which needs the "
        "broker extra: pip install 'pulsar-nack[broker]')",
    )
    parser.add_argument(
        "--messages", type=_positive, default=20_000, help="messages to produce (default 20000)"
    )
    parser.add_argument(
        "--nack-share", type=_share, default=0.3, help="share of deliveries nacked (default 0.3)"
    )
    parser.add_argument(
        "--max-delay-ms", type=_positive, default=10_000, help="largest nack delay (ms, default 10000)"
    )
    parser.add_argument("--max-failures", type=_positive, default=2, help="nacks per message at most")
    parser.add_argument(
        "--precision-bits", type=_precision, default=8, help="k: buckets of 2^k ms, 0..30 (default 8)"
    )
    parser.add_argument("--timeout-s", type=_positive, default=120, help="give up after this long")
    parser.add_argument(
        "--operation-timeout-s",
        type=_positive,
        default=30,
        help="the client's operation timeout: how long a broker may take to answer (default 30)",
    )
    parser.add_argument("--seed", type=_integer, default=1)
    parser.set_defaults(run=run)


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _positive(text: str) -> int:
    value = _integer(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _precision(text: str) -> int:
    from pulsar_nack.index import MAX_PRECISION_BITS

    value = _integer(text)
    if not 0 <= value <= MAX_PRECISION_BITS:
        raise argparse.ArgumentTypeError(f"must be in 0..{MAX_PRECISION_BITS}, got {value}")
    return value


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {value}")
    return value


def _check_broker(args: argparse.Namespace) -> None:
    """Before anything starts: the ``--service-url`` (its form, then that it accepts connections), or,
    without one, that the embedded broker is installed. UsageError / RunError naming the cause."""
    from pulsar_nack.cli import RunError, check_reachable, check_service_url

    if args.service_url is not None:
        check_service_url("--service-url", args.service_url)
        check_reachable(
            "--service-url",
            args.service_url,
            args.operation_timeout_s,
            ("pulsar", "pulsar+ssl", "http", "https"),
        )
    elif not os.environ.get("PULSAR_LITE_BINARY") and importlib.util.find_spec("pulsar_lite") is None:
        raise RunError(
            "the embedded broker is not installed: pip install 'pulsar-nack[broker]' (or pass --service-url)"
        )


def run(args: argparse.Namespace) -> int:
    import pulsar

    from pulsar_nack.cli import RunError
    from pulsar_nack.testing import BrokerError

    _check_broker(args)
    try:
        return _run(args)
    except pulsar.Interrupted:  # Ctrl-C inside a blocking client call (flush, send, close): a Ctrl-C
        raise KeyboardInterrupt from None
    except pulsar.PulsarException as error:
        where = "the embedded broker" if args.service_url is None else f"--service-url {args.service_url}"
        raise RunError(f"{where}: {error} (operation timeout {args.operation_timeout_s} s)") from None
    except BrokerError as error:
        raise RunError(f"the embedded broker: {error}") from None


def _run(args: argparse.Namespace) -> int:
    import pulsar

    import pulsar_nack
    from pulsar_nack.testing import broker_url

    rng = random.Random(args.seed)
    with ExitStack() as stack:
        service_url = stack.enter_context(broker_url(args.service_url))
        client = pulsar_nack.Client(
            service_url,
            operation_timeout_seconds=args.operation_timeout_s,
            # The connection attempt inside an operation (10 s by default) must not outlast the operation.
            connection_timeout_ms=min(10_000, args.operation_timeout_s * 1_000),
            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error),
        )
        stack.callback(client.close)
        topic = f"persistent://public/default/demo-{uuid.uuid4().hex[:8]}"
        consumer = client.subscribe(
            topic,
            "demo",
            consumer_type=pulsar.ConsumerType.Shared,
            negative_ack_precision_bit_cnt=args.precision_bits,
            negative_ack_redelivery_backoff=pulsar_nack.MultiplierRedeliveryBackoff(200, args.max_delay_ms),
        )
        # Small batches: a nack brings its whole entry back, and every sibling passes the tracker again.
        producer = client.create_producer(
            topic, batching_enabled=True, batching_max_messages=10, block_if_queue_full=True
        )
        for i in range(args.messages):
            producer.send_async(f"order-{i}".encode(), None)
        producer.flush()
        progress = _consume(consumer, args, rng)
        if progress.interrupted:
            raise KeyboardInterrupt  # after the loop: the consumer's state is whole; close as usual
        stats = consumer.nack_stats()
        consumer.close()
    _summary(progress, stats, args)
    return 0 if progress.acked == args.messages else 1


def _consume(consumer: Any, args: argparse.Namespace, rng: random.Random) -> _Progress:
    import pulsar

    from pulsar_nack.progress import ProgressStream

    progress = _Progress()
    due_at: dict[bytes, float] = {}  # message → when its nack asked for it back
    stop = threading.Event()
    line = ProgressStream(sys.stderr)
    printer = threading.Thread(target=_print_progress, args=(consumer, progress, stop, line), daemon=True)
    printer.start()
    deadline = time.monotonic() + args.timeout_s
    # While consuming, the main thread is mostly inside the tracker (admission, nacks, acks): a Ctrl-C sets a
    # flag the loop reads at the next message or receive timeout instead of raising KeyboardInterrupt there,
    # where it could leave state half-updated and a lock held, so that closing the consumer waits for ever
    # (seen once on a loaded machine: no exit 60 s after the signal).
    interrupted = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda _signum, _frame: interrupted.set())
    try:
        while progress.acked < args.messages and time.monotonic() < deadline and not interrupted.is_set():
            try:
                message = consumer.receive(200)
            except pulsar.Timeout:
                continue
            now = time.monotonic()
            progress.received += 1
            key = message.data()
            if key in due_at:
                progress.lateness_ms.append((now - due_at.pop(key)) * 1000)
            if message.redelivery_count() < args.max_failures and rng.random() < args.nack_share:
                if rng.random() < 0.5:  # a per-call delay, e.g. "retry when the payment window closes"
                    delay = rng.randint(100, args.max_delay_ms)
                    consumer.negative_acknowledge(message, delay_ms=delay)
                else:  # the backoff by redelivery count
                    delay = consumer.nack_options.delay_for(None, message.redelivery_count())
                    consumer.negative_acknowledge(message)
                due_at[key] = now + delay / 1000
                progress.nacked += 1
            else:
                consumer.acknowledge(message)
                progress.acked += 1
    finally:
        signal.signal(signal.SIGINT, previous)
        stop.set()
        printer.join(2)
        line.end()
    progress.interrupted = interrupted.is_set()
    return progress


def _print_progress(consumer: Any, progress: _Progress, stop: threading.Event, out: Any) -> None:
    while not stop.wait(0.5):
        stats = consumer.nack_stats(with_memory=True)  # a walk of the index, twice a second
        progress.memory.append((stats.pending, stats.memory_bytes))
        if stats.pending > progress.peak_pending:
            progress.peak_pending, progress.peak_bytes = stats.pending, stats.memory_bytes
            progress.peak_parts = stats.memory_parts
        late = np.percentile(progress.lateness_ms, [50, 99]) if progress.lateness_ms else (float("nan"),) * 2
        print(
            f"\rreceived {progress.received:>7}  nacked {progress.nacked:>6}  pending {stats.pending:>6}  "
            f"buckets {stats.buckets:>4}  tracker {stats.memory_bytes / 1024:8.1f} KiB  "
            f"lateness p50 {late[0]:6.0f} ms  p99 {late[1]:6.0f} ms",
            end="",
            file=out,
            flush=True,
        )


def _summary(progress: _Progress, stats: Any, args: argparse.Namespace) -> None:
    late = np.percentile(progress.lateness_ms, [0, 50, 99, 100]) if progress.lateness_ms else None
    print(
        f"messages {args.messages}, acked {progress.acked}, received {progress.received}, "
        f"nacked {progress.nacked}, redelivered {stats.redelivered}, held back {stats.held_back}, "
        f"dropped {stats.dropped}"
    )
    if late is not None:
        print(
            f"lateness (arrival − due, ms): min {late[0]:.0f}, p50 {late[1]:.0f}, p99 {late[2]:.0f}, "
            f"max {late[3]:.0f}  (k = {args.precision_bits}, ceil rounding: never early, up to "
            f"{2**args.precision_bits} ms late by design)"
        )
    if progress.peak_pending:
        for line in _memory_lines(progress, _native_cost()):
            print(line)


def _native_cost() -> dict[str, Any] | None:
    """The packaged measurement of the native client (:func:`pulsar_nack.profile.native_cost`), or None
    if it is missing or unusable — the demo then prints no native figure rather than a guessed one."""
    from pulsar_nack.profile import ProfileError, native_cost

    try:
        return native_cost()
    except ProfileError:
        return None


def marginal_bytes(samples: list[tuple[int, int]]) -> float | None:
    """Bytes per pending nack as the slope of the tracker's memory against pending over the run's samples
    (least squares): what one more pending nack costs, the fixed part left out — the definition of the
    native client's figure. None without 3 samples spread over at least 100 pending nacks. O(samples)."""
    if len(samples) < 3:
        return None
    pending = np.array([p for p, _ in samples], dtype=np.float64)
    if pending.max() - pending.min() < 100:
        return None
    memory = np.array([b for _, b in samples], dtype=np.float64)
    slope, _ = np.polyfit(pending, memory, 1)
    return float(slope)


def _memory_lines(progress: _Progress, native: dict[str, Any] | None) -> list[str]:
    """The summary's memory sentences: the marginal cost of a pending nack on both sides (one definition:
    bytes per additional pending nack), then the tracker's total at its peak and its parts."""
    ours = marginal_bytes(progress.memory)
    if ours is None:
        mine = "memory per pending nack (marginal): too few samples to tell"
    else:
        mine = (
            "memory per pending nack (marginal: slope of memory against pending over "
            f"{len(progress.memory)} samples): pulsar-nack {ours:.1f} B"
        )
    if native is None:
        theirs = (
            "the native client's figure is unavailable (no measurement in the package: "
            "bench/nack_lateness.py writes it)"
        )
    else:
        cost = native["bytes_per_nack"]
        ratio = f"; {cost / ours:.0f}× less" if ours is not None and ours > 0 else ""
        provenance = f"measured {native['date']} on {native['machine']} by {native['source']}"
        theirs = f"the native client {cost:.0f} B ({provenance}){ratio}"
    parts = ", ".join(f"{name} {size:,} B" for name, size in progress.peak_parts)
    total = (
        f"tracker memory at the peak of {progress.peak_pending:,} pending nacks: {progress.peak_bytes:,} B "
        f"in all ({parts})"
    )
    return [f"{mine}, {theirs}", total]
