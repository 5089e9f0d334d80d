"""pulsar_nack.native: the native tracker's timing model (no client needed)."""

from __future__ import annotations

from pulsar_nack.native import NATIVE_DELAY_MS, NativeTiming


def test_native_timing_matches_the_cpp_tracker() -> None:
    timing = NativeTiming()  # 102 ms: checks every 34 ms, the third lands on the due time
    assert (timing.interval_ms, timing.latency_ms) == (34, 102)
    assert NativeTiming(100).latency_ms == 132, "100/3 = 33: the third check at 99 ms is 1 ms short"
    assert NativeTiming(60_000).interval_ms == 20_000


def test_forward_times_keep_the_previous_forward_on_time() -> None:
    timing = NativeTiming()
    last = 1_000.0
    assert timing.forward_at(last + 500, last) == last + 500, "free once the last forward's ids are out"
    assert timing.forward_at(last + 10, last) == last + 68, "soon after: on the same check grid"
    assert timing.forward_at(last + 80, last) == last + 102 + timing.margin_ms
    # A timer re-armed for the same-grid slot fires a little late: it still takes the slot.
    assert timing.forward_at(last + 68.9, last) == last + 68.9
    assert timing.forward_at(last + 68 + timing.margin_ms, last) == last + 68 + timing.margin_ms
    assert timing.forward_at(last + 68.1 + timing.margin_ms, last) == last + 102 + timing.margin_ms
    assert timing.forward_at(5.0, -float("inf")) == 5.0


def test_a_wrapped_consumers_lateness_follows_its_native_delay() -> None:
    """A forward may wait two native check intervals (2·D/3) for its slot; a delay under D also waits for the
    native latency D. Measured on pulsar-lite (D = 3000): up to 2.0 s late for delays of 4-8 s, 3.0-4.9 s
    for delays under 0.1 s."""
    assert NativeTiming(3000).wrapped_lateness_ms() == (2000, 5000)
    assert NativeTiming(NATIVE_DELAY_MS).wrapped_lateness_ms() == (68, 170)
    timing = NativeTiming(999)
    slot_ms = 2 * timing.interval_ms
    assert timing.wrapped_lateness_ms() == (slot_ms, timing.latency_ms + slot_ms)
