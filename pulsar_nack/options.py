"""The nack options: :class:`NackOptions`, the one definition of the nack keyword arguments that
``subscribe`` and ``wrap`` take (sync and asyncio), and the plumbing that turns those arguments into options
and shows them in the signatures.

Everything here is checked before anything is subscribed or wrapped; nothing here calls the client.
"""

from __future__ import annotations

import datetime
import inspect
import logging
import os
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal, TypeVar

from pulsar_nack.backoff import RedeliveryBackoff, backoff_delay, check_backoff
from pulsar_nack.checks import check_int, check_ms
from pulsar_nack.chunks import DEFAULT_MAX_HELD_CHUNKED_BYTES
from pulsar_nack.delay_limit import OnDelayLimit, check_limit_options, limit_delay
from pulsar_nack.index import DueIds, Rounding, TimeBucketIndex
from pulsar_nack.native import NATIVE_DELAY_MS, NativeTiming
from pulsar_nack.snapshot.storage import SnapshotStorage
from pulsar_nack.snapshot.wiring import SubscriptionStorage, check_snapshot_options, subscription_storage

__all__ = [
    "NACK_ARGUMENTS",
    "NackOptions",
    "OnClose",
    "nack_parameters",
    "subscribe_arguments",
    "subscribe_signature",
    "with_signature",
    "wrap_options",
]

_log = logging.getLogger(__name__)

#: The name the C++ client gives a consumer subscribed without ``consumer_name`` (10 random hex digits).
_GENERATED_NAME = re.compile(r"[0-9a-f]{10}")
OnClose = Literal["drop", "flush"]
_BACKOFF = "negative_ack_redelivery_backoff"  # names the backoff in the messages of its checks
_F = TypeVar("_F", bound=Callable[..., Any])


#: Metadata keys of a :class:`NackOptions` field that is a keyword argument of ``subscribe``/``wrap``.
_ARGUMENT, _ALIAS = "argument", "deprecated_alias"


def _argument(name: str, *, alias: str | None = None) -> dict[str, str | None]:
    """The metadata of a :class:`NackOptions` field set by the keyword ``name`` of ``subscribe``/``wrap``
    (``alias``: its deprecated former name, still accepted with a ``DeprecationWarning``)."""
    return {_ARGUMENT: name, _ALIAS: alias}


@dataclass(frozen=True)
class NackOptions:
    """How a :class:`NackConsumer` treats nacks: the nack keyword arguments of ``subscribe``/``wrap``.

    This class is the one definition of those arguments: each field below that names an argument (Java's
    ``ConsumerBuilder``/PIP-393 names in snake case) is accepted by :meth:`pulsar_nack.Client.subscribe`,
    :meth:`pulsar_nack.aio.Client.subscribe` and :func:`wrap` through :meth:`from_arguments`, and shows in
    their signatures; adding an option is adding a field here. ``negative_ack_precision_bits`` and
    ``negative_ack_backoff`` are deprecated aliases of ``negative_ack_precision_bit_cnt`` and
    ``negative_ack_redelivery_backoff``.

    ``redelivery_delay_ms``: the default delay (the official client's ``negative_ack_redelivery_delay_ms``);
    ``precision_bits``/``rounding``: the index's buckets (see :class:`~pulsar_nack.index.TimeBucketIndex`):
    ``rounding="ceil"`` (the default) never hands a message out before its due time and costs up to
    ``2**k`` ms of lateness (plus delivery), as the official Python client is never early;
    ``"floor"`` is Java's PIP-393 semantics: up to ``2**k - 1`` ms early, never late from rounding;
    ``backoff``: delay by ``redelivery_count()`` when no per-call delay is given; ``max_redelivery_delay_ms``
    and ``on_delay_limit``: PIP-315's limit applied to every nack delay (0 = none); ``on_close``: ``"drop"``
    pending nacks at close (Java's behaviour: the broker redelivers unacked messages when the consumer
    goes) or ``"flush"`` them to the broker first; ``native_delay_ms``: the wrapped native consumer's own
    ``negative_ack_redelivery_delay_ms`` (``wrap``'s own required argument); ``on_redelivery``: called on
    the timer thread with the ids of each flush (Java's ``onNegativeAcksSend`` interceptor);
    ``max_held_chunked_bytes``: payload bytes of nacked chunked messages kept in memory to be handed out
    again whole (:mod:`pulsar_nack.chunks`; 0: none, every chunked nack goes to the broker).
    ``snapshot_dir``/``snapshot_storage``: keep pending nacks on storage so that they survive a restart
    (exclusive; ``snapshot_dir=D`` is ``snapshot_storage=LocalDirectoryStorage(D)``; docs/snapshots.md).
    ``fast_receive``: while nothing is nacked, hand messages out without reading their ids (fast mode,
    docs/receive_cost.md) — the official consumer's cost per message, and its semantics for the copies a
    broker sends on its own meanwhile (a reconnect's, ``redeliver_unacknowledged_messages``): without
    batch-index acks, acked messages of a partly acked batch can come again. Off (the default): every
    copy is classified, and such copies are dropped.
    """

    redelivery_delay_ms: int = field(default=60_000, metadata=_argument("negative_ack_redelivery_delay_ms"))
    precision_bits: int = field(
        default=8, metadata=_argument("negative_ack_precision_bit_cnt", alias="negative_ack_precision_bits")
    )
    rounding: Rounding = field(default="ceil", metadata=_argument("negative_ack_rounding"))
    backoff: RedeliveryBackoff | None = field(
        default=None, metadata=_argument("negative_ack_redelivery_backoff", alias="negative_ack_backoff")
    )
    max_redelivery_delay_ms: int = field(default=0, metadata=_argument("max_redelivery_delay_ms"))
    on_delay_limit: OnDelayLimit = field(default="error", metadata=_argument("on_delay_limit"))
    on_close: OnClose = field(default="drop", metadata=_argument("on_close"))
    native_delay_ms: int = NATIVE_DELAY_MS
    on_redelivery: Callable[[Sequence[DueIds]], object] | None = field(
        default=None, metadata=_argument("on_redelivery")
    )
    max_held_chunked_bytes: int = field(
        default=DEFAULT_MAX_HELD_CHUNKED_BYTES, metadata=_argument("max_held_chunked_bytes")
    )
    snapshot_dir: str | os.PathLike[str] | None = field(default=None, metadata=_argument("snapshot_dir"))
    snapshot_storage: SnapshotStorage | None = field(default=None, metadata=_argument("snapshot_storage"))
    fast_receive: bool = field(default=False, metadata=_argument("fast_receive"))

    def __post_init__(self) -> None:
        """Check every option (docs/parameters.md), before anything is subscribed or wrapped; numpy
        integers become ``int``. ``negative_ack_redelivery_delay_ms`` of the wrong type raises
        ``ValueError``, as ``pulsar.Client.subscribe`` does for it; other options ``TypeError`` for a wrong
        type and ``ValueError`` for a wrong value, naming the option."""
        fix = object.__setattr__  # frozen: normalize numpy integers once, here
        delay = _check_delay(self.redelivery_delay_ms, "negative_ack_redelivery_delay_ms", official=True)
        fix(self, "redelivery_delay_ms", delay)
        limit = check_limit_options(self.max_redelivery_delay_ms, self.on_delay_limit)
        fix(self, "max_redelivery_delay_ms", limit)
        check_backoff(self.backoff, _BACKOFF)
        if not isinstance(self.on_close, str) or self.on_close not in ("drop", "flush"):
            raise ValueError(f"on_close must be 'drop' or 'flush', got {self.on_close!r}")
        if not isinstance(self.fast_receive, bool):
            raise TypeError(f"fast_receive must be a bool, got {self.fast_receive!r}")
        fix(self, "native_delay_ms", check_int(self.native_delay_ms, "native_delay_ms"))
        fix(self, "max_held_chunked_bytes", check_int(self.max_held_chunked_bytes, "max_held_chunked_bytes"))
        if self.on_redelivery is not None and not callable(self.on_redelivery):
            raise TypeError(f"on_redelivery must be callable or None, got {self.on_redelivery!r}")
        check_snapshot_options(self.snapshot_dir, self.snapshot_storage)
        try:  # the index checks them: now, before subscribe; its messages name its own parameters
            index = TimeBucketIndex(self.precision_bits, self.rounding)
        except (TypeError, ValueError) as error:
            message = str(error).replace("precision_bits", "precision_bit_cnt", 1)
            raise type(error)(f"negative_ack_{message}") from None
        fix(self, "precision_bits", index.precision_bits)
        if self.on_delay_limit == "error" and self.backoff is None:
            limit_delay(self.redelivery_delay_ms, self.max_redelivery_delay_ms, "error")

    @classmethod
    def from_arguments(
        cls, arguments: Mapping[str, Any], *, caller: str, stacklevel: int = 1, **values: Any
    ) -> NackOptions:
        """Options from nack keyword arguments as ``subscribe``/``wrap`` take them (:data:`NACK_ARGUMENTS`),
        plus ``values`` given by field name (what the caller knows otherwise, e.g. ``native_delay_ms``).

        A deprecated alias warns (``DeprecationWarning`` naming the new name; ``stacklevel`` as for
        ``warnings.warn``, counted from the caller of this method). Raises ``TypeError`` for a name that is
        no nack option and for an option given both by name and by alias (``caller`` names the call), and
        as the constructor does for a bad value. O(options).
        """
        unknown = [name for name in arguments if name not in NACK_ARGUMENTS]
        if unknown:
            raise TypeError(f"{caller}() got an unexpected keyword argument {unknown[0]!r}")
        named = [
            (o.name, o.metadata[_ARGUMENT], o.metadata[_ALIAS])
            for o in fields(cls)
            if _ARGUMENT in o.metadata
        ]
        for _, name, alias in named:
            if alias in arguments and name in arguments:
                raise TypeError(f"{caller}() got both {name} and its deprecated alias {alias}: pass {name}")
        for field_name, name, alias in named:
            if alias is not None and alias in arguments:
                warnings.warn(
                    f"{alias} is deprecated: use {name}", DeprecationWarning, stacklevel=stacklevel + 1
                )
                values[field_name] = arguments[alias]
            elif name in arguments:
                values[field_name] = arguments[name]
        return cls(**values)

    @property
    def native(self) -> NativeTiming:
        return NativeTiming(self.native_delay_ms)

    def snapshots_for(
        self, topic: Any, subscription: str, consumer_name: str | None = None
    ) -> SubscriptionStorage | None:
        """The storage of this subscription's snapshot (None without ``snapshot_dir``/``snapshot_storage``):
        the directory is created if missing and the subscription's key locked (see
        :mod:`pulsar_nack.snapshot.namespace`). Call it before subscribing: it raises
        :class:`~pulsar_nack.snapshot.SnapshotStorageError` if the directory cannot be used or another live
        consumer holds the key."""
        return subscription_storage(
            self.snapshot_dir, self.snapshot_storage, topic, subscription, consumer_name
        )

    def delay_for(self, delay_ms: float | datetime.timedelta | None, redelivery_count: int) -> float:
        """The delay of one nack (ms): ``delay_ms`` if given, else the backoff's for ``redelivery_count``,
        else ``redelivery_delay_ms``; then ``max_redelivery_delay_ms`` applies. O(1).

        Raises ``TypeError``/``ValueError`` naming ``delay_ms`` for a bad one (not a number or timedelta;
        negative, infinite or NaN), naming the backoff for a bad result of ``backoff.next`` (see
        :func:`~pulsar_nack.backoff.backoff_delay`), and :class:`~pulsar_nack.DelayLimitExceeded` above the
        limit (unless ``on_delay_limit="clamp"``).
        """
        if delay_ms is not None:
            delay = _check_delay(delay_ms, "delay_ms")
        elif self.backoff is not None:
            delay = backoff_delay(self.backoff, redelivery_count, _BACKOFF)
        else:
            delay = float(self.redelivery_delay_ms)
        if self.max_redelivery_delay_ms:
            delay = limit_delay(delay, self.max_redelivery_delay_ms, self.on_delay_limit)
        return delay


#: Every nack keyword argument ``subscribe``/``wrap`` take: each option's name and its deprecated alias.
NACK_ARGUMENTS: frozenset[str] = frozenset(
    name
    for option in fields(NackOptions)
    for name in (option.metadata.get(_ARGUMENT), option.metadata.get(_ALIAS))
    if name is not None
)


def nack_parameters(*, skip: Sequence[str] = ()) -> list[inspect.Parameter]:
    """The nack options as keyword-only parameters (their current names, defaults and types), but those in
    ``skip``: what the signatures of ``subscribe`` and ``wrap`` show (``help()``, ``inspect.signature``)."""
    return [
        inspect.Parameter(
            option.metadata[_ARGUMENT],
            inspect.Parameter.KEYWORD_ONLY,
            default=option.default,
            annotation=option.type,
        )
        for option in fields(NackOptions)
        if option.metadata.get(_ARGUMENT) is not None and option.metadata[_ARGUMENT] not in skip
    ]


def with_signature(signature: inspect.Signature) -> Callable[[_F], _F]:
    """Give a function taking ``**options`` the signature it accepts, for ``help()`` and IDEs."""

    def apply(function: _F) -> _F:
        function.__signature__ = signature  # type: ignore[attr-defined]
        return function

    return apply


def subscribe_arguments(
    official: inspect.Signature, client: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[dict[str, Any], NackOptions]:
    """Split ``subscribe(*args, **kwargs)`` into the arguments of the official ``subscribe`` (bound to its
    ``official`` signature: a ``TypeError`` names an unknown argument), whose nack delay becomes
    :data:`~pulsar_nack.native.NATIVE_DELAY_MS`, and the :class:`NackOptions` — the caller's
    ``negative_ack_redelivery_delay_ms`` (default 60000) and every nack option, all checked before anything
    is subscribed. Takes the nack options out of ``kwargs``. Both clients' ``subscribe`` call it directly
    (deprecation warnings name their caller's line)."""
    nack = {
        name: kwargs.pop(name)
        for name in list(kwargs)
        if name in NACK_ARGUMENTS and name not in official.parameters  # the delay: official, bound below
    }
    arguments = official.bind(client, *args, **kwargs).arguments
    arguments.pop("self")
    delay = arguments.get("negative_ack_redelivery_delay_ms", 60_000)
    arguments["negative_ack_redelivery_delay_ms"] = NATIVE_DELAY_MS
    options = NackOptions.from_arguments(nack, caller="subscribe", stacklevel=3, redelivery_delay_ms=delay)
    return arguments, options


def subscribe_signature(
    official: inspect.Signature, *extra: inspect.Parameter, returns: str = "NackConsumer"
) -> inspect.Signature:
    """``official``'s parameters, then ``extra`` and the nack options (keyword-only): what ``subscribe``
    accepts; it returns ``returns``."""
    parameters = [p for p in official.parameters.values() if p.name not in {e.name for e in extra}]
    skip = list(official.parameters)  # negative_ack_redelivery_delay_ms: the official argument already
    return official.replace(
        parameters=[*parameters, *extra, *nack_parameters(skip=skip)], return_annotation=returns
    )


def wrap_options(
    consumer: Any, native_delay_ms: int, options: dict[str, Any], *, caller: str
) -> tuple[NackOptions, SubscriptionStorage | None]:
    """What :func:`~pulsar_nack.wrap` and :func:`pulsar_nack.aio.wrap` check and set up before taking
    ``consumer`` over: the options (as :meth:`NackOptions.from_arguments` raises), the lateness warning, the
    snapshot storage. Nothing is taken over when it raises. O(options)."""
    nack = NackOptions.from_arguments(options, caller=caller, stacklevel=3, native_delay_ms=native_delay_ms)
    late_ms, short_late_ms = NativeTiming(nack.native_delay_ms).wrapped_lateness_ms()
    if nack.native_delay_ms > NATIVE_DELAY_MS and late_ms > 2**nack.precision_bits:
        _log.warning(
            "wrapped consumer has a %d ms native nack delay: nacks come back up to ~%d ms after they are due "
            "(up to ~%d ms for delays near 0; never sooner than %d ms after the nack); subscribe with "
            "negative_ack_redelivery_delay_ms=%d for ~%d ms",
            nack.native_delay_ms,
            late_ms,
            short_late_ms,
            nack.native_delay_ms,
            NATIVE_DELAY_MS,
            NativeTiming().wrapped_lateness_ms()[0],
        )
    # The consumer's name is part of the key: two wrapped consumers of one subscription sharing a directory
    # must not collide (each locks its own key). Without a consumer_name the client makes one up, which a
    # restarted process does not get again: its snapshot would not be found (docs/snapshots.md).
    keeps = nack.snapshot_dir is not None or nack.snapshot_storage is not None
    name = consumer.consumer_name() if keeps else None
    if name is not None and _GENERATED_NAME.fullmatch(name):
        _log.warning(
            "%s(): the consumer %r has a name the client made up; its snapshot is found again only by a "
            "consumer of the same name: subscribe with consumer_name=... to restore it after a restart",
            caller,
            name,
        )
    return nack, nack.snapshots_for(consumer.topic(), consumer.subscription_name(), name)


def _check_delay(value: Any, name: str, *, official: bool = False) -> float:
    """A delay in ms: finite and >= 0; else ``TypeError``/``ValueError`` naming ``name``.

    A per-call delay (``official=False``) may be an int, float, numpy number or ``datetime.timedelta``;
    returned as float ms. The official client's ``negative_ack_redelivery_delay_ms`` (``official=True``)
    must be an int (numpy ints too), returned as an int: a wrong type raises ``ValueError`` (as
    ``pulsar.Client.subscribe``'s ``_check_type``), an int beyond 64 bits ``TypeError`` (as its C++
    binding), a negative one ``ValueError`` (the official client has no check for that).
    """
    if official:
        delay = check_int(value, name, type_error=ValueError)
        if delay > 2**63 - 1:
            raise TypeError(f"{name} must fit in a 64-bit int, got {delay}")
        return delay
    return check_ms(value, name, timedelta=True)
