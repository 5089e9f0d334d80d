"""The one fake clock of the tests: what the trackers, wheels, filters and exporters take as ``clock``,
moved by hand."""

from __future__ import annotations


class FakeClock:
    """A clock (milliseconds, as ``pulsar_nack.timer.monotonic_ms``) that reads ``now`` and moves only when
    a test sets it. Starts at ``now`` (default 1,000,000 ms: far enough from 0 that a time before the first
    reading is still positive)."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
