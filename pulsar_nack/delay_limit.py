"""PIP-315's max delivery delay, enforced on the client before anything is sent.

The broker (``delayedDeliveryMaxDelayInMillis`` in broker.conf; PIP-315 calls it
``delayedDeliveryMaxDeliveryDelayInMillis``) rejects a delayed message whose
``deliver_at - publish_time`` exceeds the limit with "Exceeds max allowed delivery delay of N
milliseconds". The same limit applies here to nack delays and backoff (``max_redelivery_delay_ms``) and
to ``deliver_after``/``deliver_at`` of a :class:`DelayLimitedProducer` — same outcome for the user, but
raised before a message leaves the process.
"""

from __future__ import annotations

import datetime
import time
from typing import Any, Literal

import numpy as np
import pulsar

__all__ = ["DelayLimitExceeded", "DelayLimitedProducer", "OnDelayLimit", "limit_delay"]

OnDelayLimit = Literal["error", "clamp"]


class DelayLimitExceeded(ValueError):
    """A delay above the configured maximum (PIP-315). ``max_delay_ms`` and ``delay_ms`` say by how much."""

    def __init__(self, delay_ms: float, max_delay_ms: int) -> None:
        self.delay_ms = delay_ms
        self.max_delay_ms = max_delay_ms
        super().__init__(
            f"Exceeds max allowed delivery delay of {max_delay_ms} milliseconds (asked for {delay_ms:.0f} ms)"
        )


def check_limit_options(max_delay_ms: int, on_limit: str, name: str = "max_redelivery_delay_ms") -> int:
    """Validate a (limit, policy) pair of options; 0 means no limit. Returns the limit as an ``int``
    (numpy integers are accepted). ``TypeError`` for a limit that is no int (bool included), ``ValueError``
    for a negative one or another policy, naming the option."""
    if isinstance(max_delay_ms, bool) or not isinstance(max_delay_ms, int | np.integer):
        raise TypeError(f"{name} must be an int >= 0 (0 = no limit), got {type(max_delay_ms).__name__}")
    if max_delay_ms < 0:
        raise ValueError(f"{name} must be an int >= 0 (0 = no limit), got {max_delay_ms!r}")
    if not isinstance(on_limit, str) or on_limit not in ("error", "clamp"):
        raise ValueError(f"on_delay_limit must be 'error' or 'clamp', got {on_limit!r}")
    return int(max_delay_ms)


def limit_delay(delay_ms: float, max_delay_ms: int, on_limit: OnDelayLimit) -> float:
    """``delay_ms`` if within the limit (0 = none), else the limit (``clamp``) or DelayLimitExceeded."""
    if max_delay_ms and delay_ms > max_delay_ms:
        if on_limit == "clamp":
            return float(max_delay_ms)
        raise DelayLimitExceeded(delay_ms, max_delay_ms)
    return delay_ms


class DelayLimitedProducer(pulsar.Producer):  # type: ignore[misc]  # pulsar is untyped
    """A ``pulsar.Producer`` that rejects ``deliver_after``/``deliver_at`` beyond ``max_delivery_delay_ms``.

    Created by :meth:`pulsar_nack.Client.create_producer`; everything else is ``pulsar.Producer``'s.
    """

    max_delivery_delay_ms: int = 0

    def send(self, content: Any, *args: Any, **kwargs: Any) -> Any:
        self._check(args, kwargs)
        return super().send(content, *args, **kwargs)

    def send_async(self, content: Any, callback: Any, *args: Any, **kwargs: Any) -> None:
        self._check(args, kwargs)
        super().send_async(content, callback, *args, **kwargs)

    def _check(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        # deliver_at and deliver_after are the 8th and 9th parameters after the content (and callback).
        deliver_at = kwargs.get("deliver_at", args[7] if len(args) > 7 else None)
        deliver_after = kwargs.get("deliver_after", args[8] if len(args) > 8 else None)
        if not self.max_delivery_delay_ms:
            return
        # A wrong type raises ValueError, as the official send's own check (_check_type_or_none) does.
        if deliver_after is not None:
            if not isinstance(deliver_after, datetime.timedelta):
                raise ValueError(
                    f"deliver_after must be a datetime.timedelta, got {type(deliver_after).__name__}"
                )
            limit_delay(deliver_after.total_seconds() * 1000.0, self.max_delivery_delay_ms, "error")
        if deliver_at is not None:
            if not isinstance(deliver_at, int):
                raise ValueError(
                    f"deliver_at must be a UTC timestamp in ms (int), got {type(deliver_at).__name__}"
                )
            limit_delay(deliver_at - time.time() * 1000.0, self.max_delivery_delay_ms, "error")
