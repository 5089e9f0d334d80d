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
import inspect
import time
from collections.abc import Mapping
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


class DelayLimitedProducer:
    """A producer that rejects ``deliver_after``/``deliver_at`` beyond ``max_delivery_delay_ms`` before
    sending (PIP-315, client side). Created by :meth:`pulsar_nack.Client.create_producer`.

    Composition: it holds the official ``pulsar.Producer`` (:attr:`producer`) and forwards every attribute
    it does not define itself (``flush``, ``close``, ``topic``, ...) to it; only ``send`` and
    ``send_async`` are its own. Their arguments are bound to the official methods' signatures, so
    ``deliver_at``/``deliver_after`` are found wherever they are passed (by keyword or by position), and
    a call the official method would reject for its arguments (``TypeError``) is rejected the same way,
    before anything is sent.

    It is **not** a ``pulsar.Producer`` subclass: ``isinstance(p, pulsar.Producer)`` is False. A subclass
    would have to take over the official producer's private state (``_producer``, ``_schema``,
    ``_client``: the copied ``__dict__`` this class replaced), and would hand every method a future
    ``pulsar.Producer`` adds to the unchecked official path while claiming to be checked. Code that tests
    for a producer with ``isinstance`` should accept ``(pulsar.Producer, DelayLimitedProducer)``; code that
    needs the official object itself gets :attr:`producer` (which sends without the limit).
    """

    def __init__(self, producer: pulsar.Producer, max_delivery_delay_ms: int) -> None:
        """``max_delivery_delay_ms``: int > 0 (numpy ints too): ``TypeError``/``ValueError`` otherwise."""
        if not isinstance(producer, pulsar.Producer):
            raise TypeError(f"DelayLimitedProducer wraps a pulsar.Producer, got {type(producer).__name__}")
        limit = check_limit_options(max_delivery_delay_ms, "error", "max_delivery_delay_ms")
        if not limit:
            raise ValueError("max_delivery_delay_ms must be > 0 for a DelayLimitedProducer (0 = no limit)")
        self.producer = producer
        self.max_delivery_delay_ms = limit

    def __getattr__(self, name: str) -> Any:
        """Everything but ``send``/``send_async`` is the official producer's. Only called for names this
        object lacks."""
        if name == "producer":  # not set yet (a half-built object): no recursion
            raise AttributeError(name)
        return getattr(self.producer, name)

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *dir(self.producer)})

    def __repr__(self) -> str:
        return f"DelayLimitedProducer({self.producer!r}, max_delivery_delay_ms={self.max_delivery_delay_ms})"

    def send(self, *args: Any, **kwargs: Any) -> Any:
        """``pulsar.Producer.send``, after checking ``deliver_after``/``deliver_at`` against the limit:
        :class:`DelayLimitExceeded` (a ``ValueError``) beyond it, ``ValueError`` for a wrong type (as the
        official ``send``), ``TypeError`` for arguments ``send`` does not take. Nothing is sent then."""
        self._check(_SEND.bind(self.producer, *args, **kwargs).arguments)
        return self.producer.send(*args, **kwargs)

    def send_async(self, *args: Any, **kwargs: Any) -> None:
        """``pulsar.Producer.send_async``, checked as :meth:`send` is (before anything is queued)."""
        self._check(_SEND_ASYNC.bind(self.producer, *args, **kwargs).arguments)
        self.producer.send_async(*args, **kwargs)

    def _check(self, arguments: Mapping[str, Any]) -> None:
        """Raise if ``deliver_after``/``deliver_at`` in the bound ``arguments`` exceed the limit. O(1)."""
        deliver_after = arguments.get("deliver_after")
        deliver_at = arguments.get("deliver_at")
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


_SEND = inspect.signature(pulsar.Producer.send)
_SEND_ASYNC = inspect.signature(pulsar.Producer.send_async)
