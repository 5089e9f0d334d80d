"""How a consumer gets its snapshot: the ``snapshot_dir`` / ``snapshot_storage`` options → the subscription's
storage view (:mod:`~pulsar_nack.snapshot.namespace`) → a :class:`~pulsar_nack.snapshot.segments.SegmentStore`
and an epoch clock for its :class:`~pulsar_nack.tracker.NackTracker`.

Kept out of the bridge (``bridge.py``) so that its wiring is a few calls: check the options
(:func:`check_snapshot_options`), open the storage before subscribing (:func:`arguments_snapshots` or
:func:`subscription_storage`), build the tracker with :func:`tracker_snapshot_arguments`, restore with its
:func:`snapshot_keeper`, and take over the dead members' snapshots (:func:`start_takeover`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from pulsar_nack.index import Rounding
from pulsar_nack.snapshot.keeper import SnapshotKeeper
from pulsar_nack.snapshot.namespace import SubscriptionStorage, legacy_snapshot_key, snapshot_key
from pulsar_nack.snapshot.redispatch import RedispatchStore
from pulsar_nack.snapshot.segments import SegmentStore
from pulsar_nack.snapshot.storage import LocalDirectoryStorage, SnapshotStorage
from pulsar_nack.snapshot.takeover import Adoption, Takeover
from pulsar_nack.tracker import NackTracker, epoch_clock

__all__ = [
    "SubscriptionStorage",
    "arguments_snapshots",
    "check_snapshot_options",
    "snapshot_keeper",
    "start_takeover",
    "subscription_storage",
    "tracker_snapshot_arguments",
]


def check_snapshot_options(snapshot_dir: Any, snapshot_storage: Any) -> None:
    """``TypeError`` for both given (naming both), for a ``snapshot_dir`` that is not a ``str`` or
    ``os.PathLike`` of one (or is empty: ``ValueError``), and for a ``snapshot_storage`` that is not a
    :class:`~pulsar_nack.snapshot.storage.SnapshotStorage` (``put``/``get``/``delete``/``list``). Touches
    no file. O(1)."""
    if snapshot_dir is not None and snapshot_storage is not None:
        raise TypeError(
            "snapshot_dir and snapshot_storage are exclusive: snapshot_dir=D is snapshot_storage="
            "LocalDirectoryStorage(D); pass one of them"
        )
    if snapshot_dir is not None:
        path = os.fspath(snapshot_dir) if isinstance(snapshot_dir, str | os.PathLike) else None
        if not isinstance(path, str):
            raise TypeError(f"snapshot_dir must be a str or os.PathLike, got {type(snapshot_dir).__name__}")
        if not path:
            raise ValueError("snapshot_dir must not be empty")
    if snapshot_storage is not None and (
        isinstance(snapshot_storage, str | os.PathLike) or not isinstance(snapshot_storage, SnapshotStorage)
    ):
        raise TypeError(
            "snapshot_storage must be a SnapshotStorage (put/get/delete/list), got "
            f"{type(snapshot_storage).__name__}"
            + (": use snapshot_dir for a path" if isinstance(snapshot_storage, str | os.PathLike) else "")
        )


def subscription_storage(
    snapshot_dir: str | os.PathLike[str] | None,
    snapshot_storage: SnapshotStorage | None,
    topic: Any,
    subscription: str,
    consumer_name: str | None = None,
) -> SubscriptionStorage | None:
    """The subscription's view of the configured storage, locked (None if neither option is set). Creates
    ``snapshot_dir`` (0700) if missing. Raises :class:`~pulsar_nack.snapshot.SnapshotStorageError` if the
    directory cannot be used or another live consumer holds the key. O(1)."""
    if snapshot_dir is None and snapshot_storage is None:
        return None
    key = snapshot_key(topic, subscription, consumer_name)
    base = snapshot_storage if snapshot_storage is not None else LocalDirectoryStorage(snapshot_dir)  # type: ignore[arg-type]
    view = SubscriptionStorage(base, key, legacy_snapshot_key(topic, subscription, consumer_name))
    view.lock()
    return view


def arguments_snapshots(options: Any, arguments: Mapping[str, Any]) -> SubscriptionStorage | None:
    """:func:`subscription_storage` for the bound arguments of ``subscribe`` (``topic``,
    ``subscription_name``, ``consumer_name``) and the ``options`` (a :class:`~pulsar_nack.NackOptions`)."""
    if options.snapshot_dir is None and options.snapshot_storage is None:
        return None
    return subscription_storage(
        options.snapshot_dir,
        options.snapshot_storage,
        arguments.get("topic"),
        arguments.get("subscription_name"),  # type: ignore[arg-type]  # checked by snapshot_key
        arguments.get("consumer_name"),
    )


def start_takeover(
    keeper: SnapshotKeeper,
    view: SubscriptionStorage | None,
    hold: Callable[[Adoption | None], None] | None = None,
    publish: Callable[[Callable[[], None] | None], None] | None = None,
) -> Takeover | None:
    """After the keeper restored the tracker's own snapshot: adopt every dead member's of the subscription now
    (before the application can receive) and watch the live ones, then keep looking on the tracker's
    timer (:mod:`~pulsar_nack.snapshot.takeover`). ``hold``: the consumer's, to hold arrivals back
    while a dead member's snapshot is adopted; ``publish``: the consumer's, to receive
    :attr:`Takeover.check_deaths <pulsar_nack.snapshot.takeover.Takeover.check_deaths>` whenever it
    changes. None without snapshots."""
    if view is None:
        return None
    takeover = Takeover(view, keeper.adopt, hold=hold, publish=publish)
    takeover.run()
    keeper.tracker.takeover = takeover
    return takeover


def tracker_snapshot_arguments(
    snapshots: SnapshotStorage | None, precision_bits: int, rounding: Rounding
) -> dict[str, Any]:
    """The :class:`~pulsar_nack.tracker.NackTracker` keyword arguments that keep snapshots in
    ``snapshots``: a :class:`~pulsar_nack.snapshot.redispatch.RedispatchStore` (a
    :class:`~pulsar_nack.snapshot.segments.SegmentStore` whose restored ids wait for the broker's
    re-dispatch) with the tracker's precision and an epoch clock (segments hold epoch ms), shared with the
    tracker (as its ``index`` and ``clock``). Empty without snapshots (the tracker's defaults: a bare
    index, the monotonic clock)."""
    if snapshots is None:
        return {}
    clock = epoch_clock()
    store = RedispatchStore(snapshots, precision_bits=precision_bits, rounding=rounding, clock=clock)
    return {"index": store, "clock": clock}


def snapshot_keeper(tracker: NackTracker) -> SnapshotKeeper | None:
    """The keeper of a tracker built with :func:`tracker_snapshot_arguments` (it restores the snapshot:
    :mod:`~pulsar_nack.snapshot.keeper`); None if the tracker's index keeps no snapshots. O(1)."""
    index = tracker.index
    return SnapshotKeeper(tracker, index) if isinstance(index, SegmentStore) else None
