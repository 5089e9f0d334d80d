"""``pulsar_nack.profile_broker`` (``pulsar-nack profile --broker URL``): a small workload through a real
pulsar-lite — every message consumed once by each probe, the nacks the workload's seed asks for, the copies
that fell due acked, the native client's tracker measured beside ours — and bad input named."""

from __future__ import annotations

import random

import pytest

from pulsar_nack.cli import main
from pulsar_nack.profile import Delay, ProfileError, Workload, native_cost
from pulsar_nack.profile_broker import MAX_BROKER_MESSAGES, profile_broker
from pulsar_nack.testing import PulsarLite

#: 4,000 messages over two topics, half nacked, delays of 100 ms to 60 s: a few dozen fall due while the
#: run lasts (~2 s paced at the rate), the rest are pending at its end.
SMALL = Workload(
    rate=2_000.0, duration_s=2.0, topics=2, nack_share=0.5, delay=Delay("uniform", 100.0, 60_000.0), seed=11
)


#: The most a tracker keeps with nothing pending (issue 23: 16 KiB). 16.4 KB after this run at ffe03a2
#: (the lateness estimator's offsets of the nacks dropped, 6 KB, among them); with those gone with the
#: nacks, ~10 KB: the lateness histogram 3.6 KB, the index's 2.6 KB, the timer's levels 1.2-2.7 KB.
FIXED_BYTES = 16 * 1024


def _nacks_asked(workload: Workload) -> int:
    """How many messages the workload's seed nacks: one draw per message, a delay drawn per nack."""
    rng = random.Random(workload.seed)
    draw = workload.delay.sampler(rng)
    nacked = 0
    for _ in range(workload.messages):
        if rng.random() < workload.nack_share:
            draw()
            nacked += 1
    return nacked


def test_a_small_workload_through_pulsar_lite(pulsar_lite: PulsarLite) -> None:
    stages: list[tuple[str, int, int]] = []
    result = profile_broker(
        SMALL,
        pulsar_lite.service_url,
        java=False,
        timeout_s=120.0,
        progress=lambda stage, done, total: stages.append((stage, done, total)),
    )
    assert result.broker is not None and pulsar_lite.service_url in result.broker
    # every probe saw every message: produce + the five probes each reported the total
    finished = {stage for stage, done, total in stages if done == total == SMALL.messages}
    assert finished == {"produce", "default", "malloc", "tracemalloc", "native", "native-malloc"}
    assert result.messages == SMALL.messages
    assert result.nacked == _nacks_asked(SMALL)  # the seed's nacks, whatever order the broker delivered
    # copies of the nacks that fell due came back and were acked; the rest are pending in the tracker
    assert 0 < result.pending < result.nacked
    # ids still in the tracker; the rest of the pending were forwarded and their copies are on the way
    assert result.pending - 200 < result.pending_ids <= result.pending
    assert result.forwards > 0 and result.ledgers >= SMALL.topics and result.buckets > 0
    assert result.memory["reported"] > 0 and result.breakdown_total > 0
    assert set(result.memory) == {"malloc", "tracemalloc", "rss", "reported", "released", "dropped", "kept"}
    # dropping the pending nacks gives back what the tracker's walk says they cost (a real heap delta; the
    # walk's own difference, read in that process: ~35 KB of the ~63 KB reported here) ...
    dropped = result.memory["dropped"]
    assert dropped > 0
    # (a heap delta of ~40 KB: the client library's threads move it by up to a third either way)
    assert 0.5 * dropped < result.memory["released"] < 2 * dropped
    # ... and what stays is the fixed part (the timer's levels, the lateness estimator, empty tables)
    assert result.memory["kept"] <= FIXED_BYTES
    assert result.nack_us > 0 and result.forward_us > 0
    # the native client's own tracker, measured in the same run: hundreds of bytes per pending nack
    # (448 B measured by bench/nack_lateness.py), above our tracker's own walk
    native = result.native
    assert native is not None and native["pending"] > 1_000
    # ~2,000 native nacks cost ~0.9 MB at the measured 448 B; at this scale the client library's own churn
    # moves a process figure by a few hundred KB (65 B per nack was seen on a machine loaded by other
    # test runs), so the bound only tells a native tracker from none: a tenth of its packaged cost
    assert native["bytes_per_nack"] > native_cost()["bytes_per_nack"] / 10
    assert native["bytes"] > result.memory["reported"]  # sparse here: ~2 ids per (bucket, ledger)


def test_the_command_line_runs_it_and_prints_both_clients(
    pulsar_lite: PulsarLite, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["profile", "--broker", pulsar_lite.service_url, "--rate", "1000", "--duration", "1s", "--delay",
         "1h", "--nack-share", "0.5", "--no-java", "--no-progress", "--broker-timeout", "2m"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert f"through a broker: {pulsar_lite.service_url}" in out
    assert "memory of the consumer with pulsar-nack" in out
    assert "native client:" in out and "measured in this run" in out


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"service_url": "http://127.0.0.1:8080"}, r"^broker: expected a pulsar://"),
        ({"timeout_s": 0.0}, r"^timeout_s: "),
        ({"timeout_s": float("inf")}, r"^timeout_s: "),
        ({"workload": Workload(partitions=2)}, r"^partitions: a broker run uses non-partitioned topics"),
        (
            {"workload": Workload(rate=1e6, duration_s=2.0)},
            rf"^rate × duration_s: .* {MAX_BROKER_MESSAGES:,}",
        ),
        ({"workload": "60s"}, r"^workload: expected a Workload"),
    ],
)
def test_bad_input_is_named_before_anything_is_sent(kwargs: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {"workload": Workload(), "service_url": "pulsar://127.0.0.1:9", **kwargs}
    with pytest.raises(ProfileError, match=message):
        profile_broker(**arguments)  # type: ignore[arg-type]


def test_bad_broker_options_name_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    for args, option in (
        (["--broker", "localhost:6650"], "--broker"),
        (["--broker", "pulsar://127.0.0.1:9", "--broker-timeout", "soon"], "--broker-timeout"),
        (["--broker", "pulsar://127.0.0.1:9", "--partitions", "3"], "--partitions"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(["profile", "--no-progress", "--no-java", *args])
        assert exit_info.value.code == 2
        assert f"pulsar-nack profile: error: {option}:" in capsys.readouterr().err
