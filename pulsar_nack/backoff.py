"""Redelivery backoff: how long a nacked message waits, by how often it was redelivered already.

Java's ``RedeliveryBackoff``/``MultiplierRedeliveryBackoff`` semantics, which the official Python client
lacks: ``next(n)`` is the delay for a message whose ``redelivery_count()`` is ``n``. Beyond the other
clients: the exponent is clamped, so no redelivery count gives a negative, wrapped or infinite delay (Go's
default policy, ``min << n``, goes negative for counts 34–54), and optional jitter (PIP-468's shape).
"""

from __future__ import annotations

import math
import random
from typing import Any, Protocol, runtime_checkable

import numpy as np

from pulsar_nack.checks import check_int

__all__ = [
    "MAX_DELAY_MS",
    "MultiplierRedeliveryBackoff",
    "RedeliveryBackoff",
    "backoff_delay",
    "check_backoff",
]

#: The largest delay a backoff may be configured with: Java's ``long`` milliseconds.
MAX_DELAY_MS = 2**63 - 1


@runtime_checkable
class RedeliveryBackoff(Protocol):
    """Anything with ``next(redelivery_count) -> delay_ms`` can be a backoff (a finite number >= 0)."""

    def next(self, redelivery_count: int) -> int: ...


class MultiplierRedeliveryBackoff:
    """``min_delay_ms · multiplier^n``, capped at ``max_delay_ms``; ``next(n <= 0) == min_delay_ms``.

    Never overflows: the exponent is clamped where the product reaches ``max_delay_ms``, so ``next(n)`` is
    non-decreasing in ``n`` and within ``min_delay_ms..max_delay_ms`` for every ``n``. O(1).

    ``jitter_percent`` *p* (0..100, default 0 = off) spreads the delays as PIP-468 does: each ``next()``
    multiplies the delay by a uniform random factor in ``[1 - p/200, 1 + p/200)`` (±p/2 %), on every call,
    the first included, and without clamping — a jittered delay may lie up to p/2 % below ``min_delay_ms``
    or above ``max_delay_ms`` (mind ``max_redelivery_delay_ms``: use ``on_delay_limit="clamp"`` or leave
    room). ``seed`` makes the jitter reproducible (``random.Random(seed)``; None: seeded from the OS).

    Example (an indented block: a code block on the API reference site too)::

        >>> b = MultiplierRedeliveryBackoff(1000, 600_000)
        >>> [b.next(n) for n in (-1, 0, 1, 4, 100)]
        [1000, 1000, 2000, 16000, 600000]
        >>> j = MultiplierRedeliveryBackoff(1000, 600_000, jitter_percent=20, seed=1)
        >>> all(900 <= j.next(0) < 1100 for _ in range(100))
        True
    """

    __slots__ = (
        "_log_multiplier",
        "_log_ratio",
        "_max_exponent",
        "_random",
        "jitter_percent",
        "max_delay_ms",
        "min_delay_ms",
        "multiplier",
        "seed",
    )

    def __init__(
        self,
        min_delay_ms: int,
        max_delay_ms: int,
        multiplier: float = 2.0,
        *,
        jitter_percent: float = 0.0,
        seed: int | None = None,
    ) -> None:
        """Raises ``TypeError`` for a wrong type (bool included; numpy numbers are fine) and ``ValueError``
        for a value out of range, naming the parameter."""
        min_delay_ms = check_int(min_delay_ms, "min_delay_ms", maximum=MAX_DELAY_MS)
        max_delay_ms = check_int(max_delay_ms, "max_delay_ms", maximum=MAX_DELAY_MS)
        if max_delay_ms < min_delay_ms:
            raise ValueError(f"max_delay_ms ({max_delay_ms}) must be >= min_delay_ms ({min_delay_ms})")
        multiplier = _check_real(multiplier, "multiplier")
        if not 1.0 <= multiplier < math.inf:
            raise ValueError(f"multiplier must be a finite number >= 1.0, got {multiplier!r}")
        jitter_percent = _check_real(jitter_percent, "jitter_percent")
        if not 0.0 <= jitter_percent <= 100.0:
            raise ValueError(f"jitter_percent must be in 0..100, got {jitter_percent!r}")
        if seed is not None:
            seed = check_int(seed, "seed", minimum=None)
        self.min_delay_ms = min_delay_ms
        self.max_delay_ms = max_delay_ms
        self.multiplier = multiplier
        self.jitter_percent = jitter_percent
        self.seed = seed
        self._random = random.Random(seed)
        # n * log(multiplier) >= log(max / min): the product reaches max_delay_ms. Compared in log space,
        # so that no power is computed that could overflow a float.
        if multiplier == 1.0 or min_delay_ms == 0:
            self._max_exponent = 0
            self._log_multiplier = self._log_ratio = 0.0
        else:
            self._log_multiplier = math.log(multiplier)
            self._log_ratio = math.log(max_delay_ms) - math.log(min_delay_ms)
            self._max_exponent = math.ceil(self._log_ratio / self._log_multiplier) + 1

    def next(self, redelivery_count: int) -> int:
        """The delay (ms) for a message redelivered ``redelivery_count`` times (an int; numpy ints too)."""
        if type(redelivery_count) is not int:
            redelivery_count = check_int(redelivery_count, "redelivery_count", minimum=None)
        delay = self._base(redelivery_count)
        if self.jitter_percent:
            factor = 1.0 + self.jitter_percent / 100.0 * (self._random.random() - 0.5)
            return round(delay * factor)
        return delay

    def _base(self, redelivery_count: int) -> int:
        if redelivery_count <= 0 or self._max_exponent == 0:
            return self.min_delay_ms
        exponent = min(redelivery_count, self._max_exponent)
        if exponent * self._log_multiplier >= self._log_ratio:
            return self.max_delay_ms
        # multiplier**exponent < max/min <= 2**63 here: finite, and >= 1 (so the product >= min).
        return min(
            max(int(self.min_delay_ms * self.multiplier**exponent), self.min_delay_ms), self.max_delay_ms
        )

    def __repr__(self) -> str:
        jitter = (
            f", jitter_percent={self.jitter_percent:g}, seed={self.seed!r}" if self.jitter_percent else ""
        )
        return (
            f"MultiplierRedeliveryBackoff(min_delay_ms={self.min_delay_ms}, "
            f"max_delay_ms={self.max_delay_ms}, multiplier={self.multiplier:g}{jitter})"
        )


def check_backoff(backoff: Any, name: str = "negative_ack_redelivery_backoff") -> None:
    """A backoff must be None or have a callable ``next``; else ``TypeError`` naming ``name``."""
    if backoff is not None and not callable(getattr(backoff, "next", None)):
        raise TypeError(f"{name} must have a callable next(redelivery_count) method, got {backoff!r}")


def backoff_delay(
    backoff: RedeliveryBackoff, redelivery_count: int, name: str = "negative_ack_redelivery_backoff"
) -> float:
    """``backoff.next(redelivery_count)`` as float ms, checked: a number (not bool; numpy numbers are
    fine), finite and >= 0. Else ``TypeError``/``ValueError`` naming the backoff, the count and the result,
    e.g. ``negative_ack_redelivery_backoff.next(3) returned -5``."""
    value: Any = backoff.next(redelivery_count)
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(
            f"{name}.next({redelivery_count}) returned {value!r} ({type(value).__name__}); "
            "a backoff must return a number of milliseconds"
        )
    try:
        delay = float(value)
    except OverflowError:  # an int beyond any float
        delay = math.inf
    if not math.isfinite(delay) or delay < 0:
        raise ValueError(
            f"{name}.next({redelivery_count}) returned {value!r}; "
            "a backoff must return a finite number of milliseconds >= 0"
        )
    return delay


def _check_real(value: Any, name: str) -> float:
    """A real number (int, float, numpy number; not bool) as float, NaN rejected; else Type/ValueError."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    number = float(value)
    if number != number:
        raise ValueError(f"{name} must be a number, got {value!r}")
    return number
