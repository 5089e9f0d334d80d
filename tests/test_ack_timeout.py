"""The ack timeout (``unacked_messages_timeout_ms``) beside the official consumer, on both brokers (issue 27).

The official consumer asks the broker, at each timeout, to redeliver every message it handed out that the
application has not acked, and hands each out again: a worker that lost its messages gets them back. The
wrapped consumers (sync and asyncio) must do the same — batched messages too, where the timeout's copies
used to be taken for duplicates of messages the application holds and dropped, at every timeout — while a
nacked message still comes back once, at its time.

One test per broker runs the three consumers side by side, each on its own subscription of one topic:
100 messages in batches of 10 that the application receives and holds (never acks), and a batch of 10 it
nacks and acks when they come back. Every consumer must hand each held message out again at each of two
timeouts, never sooner than a timeout after the previous hand-out, and each nacked message exactly twice.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pulsar
from messaging import produce_bursts

import pulsar_nack
from pulsar_nack import aio
from pulsar_nack.testing import Broker

TIMEOUT_MS = 10_000  # the official client's minimum
NACK_DELAY_MS = 3_000
HELD = 100  # received and never acked: in 10 batches of 10
NACKED = 10  # one batch of 10, nacked at once, acked when back
ROUNDS = 2  # ack timeouts each held message must come back at
DEADLINE_S = 75.0  # a safety net: two timeouts take ~22 s
EARLY_S = 0.5  # reading two clocks on a loaded machine (the native tracker never fires early)
EARLY_NACK_MS = 255 + 5  # the wrapper's 2^k - 1 ms with floor rounding (k = 8), plus the clocks


class Run:
    """One consumer's hand-outs: message → monotonic times (s) it was handed to the application."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.handouts: dict[str, list[float]] = {}
        self.nacked_at: dict[str, float] = {}
        self.error: BaseException | None = None
        self.extra: list[str] = []  # handed out after everything was acked

    def record(self, message: Any) -> str:
        key: str = message.data().decode()
        self.handouts.setdefault(key, []).append(time.monotonic())
        return key

    def done(self) -> bool:
        held = [self.handouts.get(f"h{i}", []) for i in range(HELD)]
        nacked = [self.handouts.get(f"n{i}", []) for i in range(NACKED)]
        return all(len(h) > ROUNDS for h in held) and all(len(n) >= 2 for n in nacked)


def _consume_sync(consumer: Any, run: Run) -> None:
    """Receive until every held message has come back ``ROUNDS`` times and every nacked one once; then ack
    every copy held and check that nothing more comes."""
    copies: list[Any] = []
    deadline = time.monotonic() + DEADLINE_S
    while not run.done() and time.monotonic() < deadline:
        try:
            message = consumer.receive(500)
        except pulsar.Timeout:
            continue
        key = run.record(message)
        if key.startswith("h"):
            copies.append(message)
        elif len(run.handouts[key]) == 1:
            run.nacked_at[key] = time.monotonic()
            consumer.negative_acknowledge(message)
        else:
            consumer.acknowledge(message)
    for message in copies:
        consumer.acknowledge(message)
    end = time.monotonic() + 1.5
    while (left := end - time.monotonic()) > 0:
        try:
            run.extra.append(consumer.receive(max(1, int(left * 1000))).data().decode())
        except pulsar.Timeout:
            break


async def _consume_aio(consumer: aio.NackConsumer, run: Run) -> None:
    """:func:`_consume_sync` with ``await``."""
    copies: list[Any] = []
    deadline = time.monotonic() + DEADLINE_S
    while not run.done() and time.monotonic() < deadline:
        try:
            message = await asyncio.wait_for(consumer.receive(), 0.5)
        except TimeoutError:
            continue
        key = run.record(message)
        if key.startswith("h"):
            copies.append(message)
        elif len(run.handouts[key]) == 1:
            run.nacked_at[key] = time.monotonic()
            await consumer.negative_acknowledge(message)
        else:
            await consumer.acknowledge(message)
    for message in copies:
        await consumer.acknowledge(message)
    try:
        async with asyncio.timeout(1.5):
            while True:
                run.extra.append((await consumer.receive()).data().decode())
    except TimeoutError:
        pass


def _thread(run: Run, body: Callable[[], None]) -> threading.Thread:
    def target() -> None:
        try:
            body()
        except BaseException as error:  # reported by the test
            run.error = error

    thread = threading.Thread(target=target, name=run.name)
    thread.start()
    return thread


def _check(run: Run) -> None:
    """The ack timeout's behaviour, for one consumer."""
    assert run.error is None, f"{run.name}: {run.error!r}"
    held = {f"h{i}": run.handouts.get(f"h{i}", []) for i in range(HELD)}
    short = {k: len(v) for k, v in held.items() if len(v) <= ROUNDS}
    assert not short, f"{run.name}: held messages not back at each of {ROUNDS} timeouts: {short}"
    soon = {
        k: round(b - a, 2)
        for k, times in held.items()
        for a, b in itertools.pairwise(times)
        if b - a < TIMEOUT_MS / 1000 - EARLY_S
    }
    assert not soon, f"{run.name}: handed out again sooner than the ack timeout (s): {soon}"
    nacked = {f"n{i}": run.handouts.get(f"n{i}", []) for i in range(NACKED)}
    counts = {k: len(v) for k, v in nacked.items() if len(v) != 2}
    assert not counts, f"{run.name}: nacked messages not handed out exactly twice: {counts}"
    early = {
        k: round(v[1] - run.nacked_at[k], 3)
        for k, v in nacked.items()
        if v[1] - run.nacked_at[k] < (NACK_DELAY_MS - EARLY_NACK_MS) / 1000
    }
    assert not early, f"{run.name}: nacked messages back early (s after the nack): {early}"
    assert not run.extra, f"{run.name}: handed out after every copy was acked: {run.extra}"


def test_the_ack_timeout_brings_back_held_batched_messages_as_the_official_consumer_does(
    broker: Broker,
) -> None:
    topic = f"persistent://public/default/ackto-{uuid.uuid4().hex[:8]}"
    logger = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    options: dict[str, Any] = {
        "consumer_type": pulsar.ConsumerType.Shared,
        "unacked_messages_timeout_ms": TIMEOUT_MS,
        "negative_ack_redelivery_delay_ms": NACK_DELAY_MS,
    }
    official_client = pulsar.Client(broker.service_url, logger=logger)
    wrapped_client = pulsar_nack.Client(broker.service_url, logger=logger)
    runs = {name: Run(name) for name in ("official", "wrapped", "wrapped-aio")}
    threads: list[threading.Thread] = []
    ready = threading.Event()

    async def aio_side() -> None:
        client = aio.Client(broker.service_url, logger=logger)
        try:
            consumer = await client.subscribe(topic, "wrapped-aio", **options)
            ready.set()
            await _consume_aio(consumer, runs["wrapped-aio"])
        finally:
            ready.set()
            await client.close()

    try:
        official = official_client.subscribe(topic, "official", **options)
        wrapped = wrapped_client.subscribe(topic, "wrapped", **options)
        threads.append(_thread(runs["wrapped-aio"], lambda: asyncio.run(aio_side())))
        assert ready.wait(60), "the asyncio consumer did not subscribe"
        produce_bursts(official_client, topic, HELD, batch_size=10, prefix="h")
        produce_bursts(official_client, topic, NACKED, batch_size=NACKED, prefix="n")
        threads.append(_thread(runs["official"], lambda: _consume_sync(official, runs["official"])))
        threads.append(_thread(runs["wrapped"], lambda: _consume_sync(wrapped, runs["wrapped"])))
        for thread in threads:
            thread.join(DEADLINE_S + 30)
        assert not any(t.is_alive() for t in threads), "a consumer did not finish"
    finally:
        wrapped_client.close()
        official_client.close()
    # Each consumer on its own, then side by side: the official figures are the reference.
    for run in runs.values():
        _check(run)
    figures = {
        name: (sum(len(v) for k, v in run.handouts.items() if k.startswith("h")), len(run.handouts))
        for name, run in runs.items()
    }
    held_official = figures["official"][0]
    for name in ("wrapped", "wrapped-aio"):
        assert figures[name][1] == figures["official"][1] == HELD + NACKED, figures
        # as many hand-outs of held messages as the official consumer, give or take a timeout of some
        assert abs(figures[name][0] - held_official) <= HELD, figures

