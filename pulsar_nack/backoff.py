"""Redelivery backoff: how long a nacked message waits, by how often it was redelivered already.

Java's ``RedeliveryBackoff``/``MultiplierRedeliveryBackoff`` semantics, which the official Python client
lacks: ``next(n)`` is the delay for a message whose ``redelivery_count()`` is ``n``.
"""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

__all__ = ["MultiplierRedeliveryBackoff", "RedeliveryBackoff"]


@runtime_checkable
class RedeliveryBackoff(Protocol):
    """Anything with ``next(redelivery_count) -> delay_ms`` can be a backoff."""

    def next(self, redelivery_count: int) -> int: ...


class MultiplierRedeliveryBackoff:
    """``min_delay_ms · multiplier^n``, capped at ``max_delay_ms``; ``next(n <= 0) == min_delay_ms``.

    Never overflows: huge ``n`` gives ``max_delay_ms``. O(1).

    >>> b = MultiplierRedeliveryBackoff(1000, 600_000)
    >>> [b.next(n) for n in (-1, 0, 1, 4, 100)]
    [1000, 1000, 2000, 16000, 600000]
    """

    __slots__ = ("_max_exponent", "max_delay_ms", "min_delay_ms", "multiplier")

    def __init__(self, min_delay_ms: int, max_delay_ms: int, multiplier: float = 2.0) -> None:
        for name, value in (("min_delay_ms", min_delay_ms), ("max_delay_ms", max_delay_ms)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int (milliseconds), got {type(value).__name__}")
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if max_delay_ms < min_delay_ms:
            raise ValueError(f"max_delay_ms ({max_delay_ms}) must be >= min_delay_ms ({min_delay_ms})")
        if isinstance(multiplier, bool) or not isinstance(multiplier, int | float) or not multiplier >= 1.0:
            raise ValueError(f"multiplier must be a number >= 1.0, got {multiplier!r}")
        self.min_delay_ms = min_delay_ms
        self.max_delay_ms = max_delay_ms
        self.multiplier = float(multiplier)
        # Beyond this exponent the product exceeds max_delay_ms anyway (and floats would overflow).
        if self.multiplier == 1.0 or min_delay_ms == 0:
            self._max_exponent = 0
        else:
            ratio = max(max_delay_ms / min_delay_ms, 1.0)
            self._max_exponent = math.ceil(math.log(ratio, self.multiplier)) + 1

    def next(self, redelivery_count: int) -> int:
        if redelivery_count <= 0 or self._max_exponent == 0:
            return self.min_delay_ms
        exponent = min(redelivery_count, self._max_exponent)
        return int(min(self.min_delay_ms * self.multiplier**exponent, self.max_delay_ms))

    def __repr__(self) -> str:
        return (
            f"MultiplierRedeliveryBackoff(min_delay_ms={self.min_delay_ms}, "
            f"max_delay_ms={self.max_delay_ms}, multiplier={self.multiplier:g})"
        )
