"""What pulsar_nack knows about the official client's native (C++) core, in one package.

* this top level: the native nack tracker's **timing** (:class:`NativeTiming`, :data:`NATIVE_DELAY_MS`,
  :data:`NATIVE_MIN_DELAY_MS`) — numbers and arithmetic only, with no import of the client, so the index,
  the tracker and :mod:`pulsar_nack.lowlevel` stay usable without ``pulsar-client``;
* :mod:`pulsar_nack.native.client`: the **calls** — message ids and batch sizes read from native
  objects, and due ids forwarded as native nacks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["NATIVE_DELAY_MS", "NATIVE_MIN_DELAY_MS", "NativeTiming"]

#: The native client's minimum nack delay (``max(delay, 100)`` in pulsar-client-cpp): a copy a forward
#: asked for never arrives sooner after the forward.
NATIVE_MIN_DELAY_MS = 100
#: The native delay pulsar_nack subscribes with: the smallest multiple of 3 above the minimum, so that the
#: native timer's third check (every delay/3) falls exactly on the due time: a deterministic latency.
NATIVE_DELAY_MS = 102


@dataclass(frozen=True)
class NativeTiming:
    """When the native tracker (pulsar-client-cpp 3.x/4.x ``NegativeAcksTracker``) redelivers a nacked id.

    Each native nack re-arms one timer to fire ``interval = delay // 3`` ms later; each firing redelivers
    the ids nacked at least ``delay`` ago and re-arms it again. So an id forwarded at t comes back at the
    first check at or after t + delay — at t + ``latency`` — *unless* another forward re-arms the timer
    in between and shifts the checks. Hence forwards go only at moments that keep earlier forwards on time:
    exactly ``2 * interval`` after the previous one (the checks stay on the same grid, and the check in
    between still fires), or once the previous forward's ids are out (``latency`` + a margin). Forwarding
    every ``interval`` or faster would postpone the native check for ever (the native starvation).

    A timer never fires exactly on the same-grid slot; up to ``margin`` after it still counts: the
    native check of the slot has fired, and the forward re-arms the next one, so the previous forward's ids
    come back that much late. (Without this tolerance, a 1 ms late timer pushed the forward to the free
    slot: ~40 ms later.)
    """

    delay_ms: int = NATIVE_DELAY_MS
    margin_ms: float = 5.0  # timer jitter allowed for before a fresh forward may re-arm the native timer
    _free_after: float = field(init=False, repr=False, compare=False, default=0.0)
    _same_grid_after: float = field(init=False, repr=False, compare=False, default=0.0)

    def __post_init__(self) -> None:
        # forward_at's two constants, computed once: it runs at every forward, with cold caches, where
        # the two property calls cost several µs.
        object.__setattr__(self, "_free_after", self.latency_ms + self.margin_ms)
        object.__setattr__(self, "_same_grid_after", 2 * self.interval_ms)

    @property
    def interval_ms(self) -> int:
        return max(self.delay_ms, NATIVE_MIN_DELAY_MS) // 3

    @property
    def latency_ms(self) -> int:
        """Forward → redelivery request sent. Exact when ``delay_ms`` is a multiple of 3."""
        delay = max(self.delay_ms, NATIVE_MIN_DELAY_MS)
        return -(-delay // self.interval_ms) * self.interval_ms

    def forward_at(self, desired_ms: float, last_ms: float) -> float:
        """The earliest moment >= ``desired_ms`` at which a forward keeps the one at ``last_ms`` on time."""
        free_ms = last_ms + self._free_after
        same_grid_ms = last_ms + self._same_grid_after
        if desired_ms >= free_ms:
            return desired_ms
        if desired_ms <= same_grid_ms:
            return same_grid_ms
        return desired_ms if desired_ms <= same_grid_ms + self.margin_ms else free_ms

    def wrapped_lateness_ms(self) -> tuple[int, int]:
        """How late a consumer subscribed with this native delay redelivers, at most (ms, give or take the
        timer's few ms): for delays of at least ``delay_ms``, and for a delay near 0. A forward may wait two
        native check intervals for its slot, and the native tracker needs its latency. O(1)."""
        slot_ms = 2 * self.interval_ms
        return slot_ms, self.latency_ms + slot_ms
