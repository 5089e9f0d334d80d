"""Argument checks shared by the public entry points (one rule per kind of value; docs/parameters.md).

* Integers: ``int`` or any numpy integer (converted to ``int``); ``bool`` is never an integer here.
* Delays in ms: a finite, non-negative number (ints, floats, numpy numbers), or a ``datetime.timedelta``
  where the parameter says so.
* Where the official client checks the same argument, its exception type is kept: ``pulsar.Client.subscribe``
  rejects a non-``int`` ``negative_ack_redelivery_delay_ms`` with ``ValueError`` (its ``_check_type``).
  Elsewhere a wrong type raises ``TypeError`` and a wrong value ``ValueError``; every message names the
  parameter.
"""

from __future__ import annotations

import datetime
import math
from typing import Any

import numpy as np

__all__ = ["check_int", "check_ms"]

_NUMBER = (int, float, np.integer, np.floating)


def check_int(
    value: Any,
    name: str,
    *,
    minimum: int | None = 0,
    maximum: int | None = None,
    type_error: type[Exception] = TypeError,
) -> int:
    """``value`` as an ``int`` (numpy integers accepted) within ``minimum..maximum``; else ``type_error``
    (wrong type, bool included) or ``ValueError`` (out of range), naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise type_error(f"{name} must be an int, got {type(value).__name__} {value!r}")
    number = int(value)
    if minimum is not None and number < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {number}")
    if maximum is not None and number > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {number}")
    return number


def check_ms(
    value: Any,
    name: str,
    *,
    integer: bool = False,
    timedelta: bool = False,
    type_error: type[Exception] = TypeError,
) -> float:
    """A delay in milliseconds as a float: finite and >= 0. ``integer``: only ints (numpy ints too);
    ``timedelta``: a ``datetime.timedelta`` is accepted too. A wrong type (bool, str, None, ...) raises
    ``type_error``, a negative, infinite or NaN value ``ValueError``; both name ``name``."""
    if timedelta and isinstance(value, datetime.timedelta):
        value = value.total_seconds() * 1000.0
    elif integer:
        return float(check_int(value, name, type_error=type_error))
    if isinstance(value, bool) or not isinstance(value, _NUMBER):
        kinds = "a number of milliseconds" + (" or a datetime.timedelta" if timedelta else "")
        raise type_error(f"{name} must be {kinds}, got {type(value).__name__} {value!r}")
    try:
        delay = float(value)
    except OverflowError:  # an int beyond any float
        raise ValueError(f"{name} must be a finite number of milliseconds, got {value!r}") from None
    if not math.isfinite(delay):
        raise ValueError(f"{name} must be a finite number of milliseconds, got {value!r}")
    if delay < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return delay
