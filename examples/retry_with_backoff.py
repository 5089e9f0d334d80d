#!/usr/bin/env python3
"""Retry transient failures with exponential backoff, then give up — with ``pulsar_nack.aio``.

Each job fails transiently a few times before it succeeds (job *i* fails its first *i* attempts). A failed
job is nacked without a delay: the consumer's ``MultiplierRedeliveryBackoff`` picks the delay from the
message's ``redelivery_count()`` (min, min·2, min·4, ... up to max), which the official Python client cannot
do (it has one fixed nack delay; delays under its 100 ms minimum come back after about 100 ms). After
``--max-attempts`` failures the job is given up: logged and acked.
(Pulsar's ``dead_letter_policy`` is the other way to give up: the native client then moves the message to a
dead-letter topic once its redelivery count exceeds ``max_redeliver_count``.)

    python examples/retry_with_backoff.py                          # embedded broker, 5 jobs
    python examples/retry_with_backoff.py --jobs 6 --max-attempts 3 --min-delay-ms 50
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid

import pulsar

from pulsar_nack import MultiplierRedeliveryBackoff, aio
from pulsar_nack.testing import broker_url


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--service-url", help="a running broker (default: start an embedded pulsar-lite)")
    parser.add_argument("--jobs", type=positive_int, default=5, help="jobs to process (default 5)")
    parser.add_argument("--max-attempts", type=positive_int, default=4, help="attempts before giving up")
    parser.add_argument("--min-delay-ms", type=positive_int, default=200, help="first retry delay")
    parser.add_argument("--max-delay-ms", type=positive_int, default=2000, help="longest retry delay")
    parser.add_argument("--multiplier", type=float, default=2.0, help="delay growth per retry")
    parser.add_argument("--max-seconds", type=positive_int, default=60, help="give up after this long")
    args = parser.parse_args()
    if args.max_delay_ms < args.min_delay_ms:
        parser.error("--max-delay-ms must be >= --min-delay-ms")
    if args.multiplier < 1:
        parser.error("--multiplier must be >= 1")
    return args


class TransientError(Exception):
    pass


def process(job: int, attempt: int) -> None:
    """The work: job ``i`` fails its first ``i`` attempts (a flaky downstream service)."""
    if attempt <= job:
        raise TransientError(f"downstream unavailable (attempt {attempt})")


async def run(service_url: str, args: argparse.Namespace) -> int:
    backoff = MultiplierRedeliveryBackoff(args.min_delay_ms, args.max_delay_ms, args.multiplier)
    topic = f"persistent://public/default/jobs-{uuid.uuid4().hex[:8]}"
    client = aio.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        consumer = await client.subscribe(
            topic,
            "workers",
            consumer_type=pulsar.ConsumerType.Shared,
            negative_ack_redelivery_backoff=backoff,
            negative_ack_rounding="ceil",  # never retry before the backoff delay
            negative_ack_precision_bit_cnt=4,
        )
        producer = await client.create_producer(topic)
        for job in range(args.jobs):
            await producer.send(f"job-{job}".encode())
        print(f"queued {args.jobs} jobs; backoff {backoff}; at most {args.max_attempts} attempts", flush=True)

        last_attempt: dict[str, float] = {}
        succeeded: list[str] = []
        gave_up: list[str] = []
        async with asyncio.timeout(args.max_seconds):
            while len(succeeded) + len(gave_up) < args.jobs:
                message = await consumer.receive()
                name = message.data().decode()
                count = message.redelivery_count()
                attempt = count + 1
                now = time.monotonic()
                waited = f" after {(now - last_attempt[name]) * 1000:.0f} ms" if name in last_attempt else ""
                last_attempt[name] = now
                try:
                    process(int(name.split("-")[1]), attempt)
                except TransientError as error:
                    if attempt >= args.max_attempts:
                        print(f"{name} attempt {attempt}{waited}: {error}; giving up -> ack", flush=True)
                        gave_up.append(name)
                        await consumer.acknowledge(message)
                    else:
                        delay = backoff.next(count)
                        print(
                            f"{name} attempt {attempt}{waited}: {error}; "
                            f"redelivery_count={count} -> retry in {delay} ms",
                            flush=True,
                        )
                        await consumer.negative_acknowledge(message)  # the backoff picks the delay
                    continue
                print(f"{name} attempt {attempt}{waited}: ok -> ack", flush=True)
                succeeded.append(name)
                await consumer.acknowledge(message)

        stats = consumer.nack_stats()
        print(f"summary: {len(succeeded)} succeeded, {len(gave_up)} gave up ({', '.join(gave_up) or 'none'})")
        print(f"tracker: {stats.nacked} nacked, {stats.redelivered} redelivered, {stats.pending} pending")
        await consumer.close()
        await producer.close()
        return 0
    except TimeoutError:
        print(f"error: jobs not settled within {args.max_seconds} s", file=sys.stderr)
        return 1
    finally:
        await client.close()


def main() -> int:
    args = parse_args()
    with broker_url(args.service_url) as service_url:
        return asyncio.run(run(service_url, args))


if __name__ == "__main__":
    sys.exit(main())
