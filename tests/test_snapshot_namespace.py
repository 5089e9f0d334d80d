"""The key of a subscription's snapshot and the storage view under it: subscriptions sharing a directory
never mix, one subscription addressed two ways is one key, and a second live consumer with the same key
is refused (flock) while a crashed one's lock is gone."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from pulsar_nack.snapshot import InMemoryStorage, LocalDirectoryStorage, SnapshotStorageError
from pulsar_nack.snapshot.namespace import SubscriptionStorage, canonical_topic, snapshot_key
from pulsar_nack.snapshot.storage import check_name


def test_short_topic_names_are_the_brokers_full_names() -> None:
    assert canonical_topic("t") == "persistent://public/default/t"
    assert canonical_topic("tn/ns/t") == "persistent://tn/ns/t"
    assert canonical_topic("non-persistent://a/b/t") == "non-persistent://a/b/t"


def test_the_key_names_topics_subscription_and_consumer() -> None:
    key = snapshot_key("persistent://public/default/t", "orders")
    assert key == snapshot_key("t", "orders"), "a short name is the same topic"
    assert snapshot_key(["b", "a"], "orders") == snapshot_key(["a", "b", "a"], "orders"), "a set of topics"
    others = {
        snapshot_key("t2", "orders"),
        snapshot_key("t", "orders2"),
        snapshot_key("t", "orders", "c1"),
        snapshot_key(["t", "t2"], "orders"),
        snapshot_key(re.compile("persistent://public/default/t.*"), "orders"),
    }
    assert key not in others and len(others) == 5
    assert key.startswith("orders-")
    odd = snapshot_key("t", "../../a b/ü" * 20)
    check_name(odd + ".seg-0000000000000001.pnk")  # a valid file name whatever the subscription is called


@pytest.mark.parametrize(
    ("topic", "subscription", "consumer", "error", "names"),
    [
        (3, "s", None, TypeError, "topic"),
        ([], "s", None, ValueError, "topic"),
        ("t", None, None, TypeError, "subscription_name"),
        ("t", "", None, ValueError, "subscription_name"),
        ("t", "s", 5, TypeError, "consumer_name"),
    ],
)
def test_bad_key_parts_name_the_parameter(
    topic: object, subscription: object, consumer: object, error: type[Exception], names: str
) -> None:
    with pytest.raises(error, match=names):
        snapshot_key(topic, subscription, consumer)  # type: ignore[arg-type]


def test_subscriptions_sharing_a_storage_do_not_mix(tmp_path: Path) -> None:
    base = LocalDirectoryStorage(tmp_path, fsync=False)
    one = SubscriptionStorage(base, snapshot_key("t", "one"))
    two = SubscriptionStorage(base, snapshot_key("t", "two"))
    one.put("seg-0000000000000001.pnk", b"1")
    two.put("seg-0000000000000001.pnk", b"2")
    assert one.list() == two.list() == ["seg-0000000000000001.pnk"]
    assert (one.get("seg-0000000000000001.pnk"), two.get("seg-0000000000000001.pnk")) == (b"1", b"2")
    one.delete("seg-0000000000000001.pnk")
    assert (one.list(), two.list()) == ([], ["seg-0000000000000001.pnk"])


def test_a_second_live_consumer_with_the_same_key_is_refused(tmp_path: Path) -> None:
    key = snapshot_key("t", "s")
    first = SubscriptionStorage(LocalDirectoryStorage(tmp_path), key)
    first.lock()
    first.lock()  # idempotent
    second = SubscriptionStorage(LocalDirectoryStorage(tmp_path), key)
    with pytest.raises(SnapshotStorageError, match="consumer_name"):
        second.lock()
    SubscriptionStorage(LocalDirectoryStorage(tmp_path), snapshot_key("t", "s", "c2")).lock()  # own name
    first.unlock()
    second.lock()
    assert second.list() == [], "the lock file is no segment"
    second.unlock()
    SubscriptionStorage(InMemoryStorage(), key).lock()  # storages that cannot lock: nothing


def test_the_lock_of_a_killed_process_is_gone(tmp_path: Path) -> None:
    key = snapshot_key("t", "s")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from pulsar_nack.snapshot import LocalDirectoryStorage\n"
            "from pulsar_nack.snapshot.namespace import SubscriptionStorage\n"
            f"SubscriptionStorage(LocalDirectoryStorage({str(tmp_path)!r}), {key!r}).lock()\n"
            "print('locked', flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(SnapshotStorageError):
            SubscriptionStorage(LocalDirectoryStorage(tmp_path), key).lock()
    finally:
        holder.kill()  # SIGKILL: no clean-up in the holder
        holder.wait(10)
    SubscriptionStorage(LocalDirectoryStorage(tmp_path), key).lock()


def test_only_a_storage_is_accepted() -> None:
    with pytest.raises(TypeError, match="snapshot_storage"):
        SubscriptionStorage("/tmp", "k")  # type: ignore[arg-type]
