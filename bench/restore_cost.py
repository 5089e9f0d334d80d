"""Benchmark: the restore of a snapshot at subscribe, batched vs non-batched, same id count (issue 27 item 4).

bench/restart_lateness.py saw the batched restore take 374-482 ms at subscribe where the non-batched one of
the same 10,000 nacks took 11-35 ms. This measures that restore alone, without a broker: the snapshot of
10,000 pending nacks in the restart benchmark's shape — messages in batches of 100 (entry ``i // 100``,
batch index ``i % 100``) or not batched (entry ``i``), one ledger, each nack with its own delay uniform
over 2-20 s (a fixed seed: the same delays in both shapes), nacked in message order as the tracker files
them and sealed into segment files in a temp directory — then restored
:data:`RESTORE_AFTER_MS` after the nacks (as the restart benchmark's B subscribes), with the consumer's
defaults (precision 8, ceil rounding):

* **store**: ``RedispatchStore.restore`` (the consumer's snapshot store: every segment read, the due ones
  loaded into its index);
* **tracker**: ``SnapshotKeeper.restore`` on such a store — what subscribe does: the store's restore, then the
  arrival filter taught every restored id.

Median and best of :data:`ROUNDS` restores (a fresh store each, same files, this process). ``--label``
names the code measured (e.g. ``before`` / ``after`` a change); the results of other labels in the file
are kept, so one table compares them. ``--commit`` names the commit measured when ``PYTHONPATH`` points
at another checkout of the package (default: this repository's HEAD).

    python bench/restore_cost.py --label after
    git archive a8608ec pulsar_nack | tar -x -C /tmp/base
    PYTHONPATH=/tmp/base python bench/restore_cost.py --label before --commit a8608ec

Writes ``bench/results/restore_cost.json`` and the ``restore-cost`` section of docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from typing import Any

import report

COUNT = 10_000
BATCH = 100
DELAY_MS = (2_000, 20_000)
#: The restore comes this long after the nacks (bench/restart_lateness.py's RESTART_AFTER_MS).
RESTORE_AFTER_MS = 2_500
ROUNDS = 7
NOW_MS = 1_800_000_000_000  # the nacks' time: epoch ms, as the segments hold them
TOPIC = "persistent://public/default/restore-cost"
LEDGER = 7


def write(directory: str, batched: bool, count: int) -> int:
    """The snapshot of ``count`` pending nacks into ``directory``; returns its files' bytes."""
    from pulsar_nack.snapshot import LocalDirectoryStorage, SegmentStore

    store = SegmentStore(LocalDirectoryStorage(directory, fsync=False), rounding="ceil")
    rng = random.Random(27)
    for i in range(count):
        due = NOW_MS + round(rng.uniform(*DELAY_MS))
        if batched:
            store.add(due, LEDGER, i // BATCH, i % BATCH, TOPIC, fresh=True)
        else:
            store.add(due, LEDGER, i, -1, TOPIC, fresh=True)
    store.checkpoint(NOW_MS)
    return sum(os.path.getsize(os.path.join(directory, name)) for name in os.listdir(directory))


def restore_once(directory: str, part: str) -> tuple[float, int]:
    """One restore (``store`` or ``tracker``) of the snapshot in ``directory``: (ms, ids restored)."""
    from pulsar_nack.snapshot import LocalDirectoryStorage
    from pulsar_nack.snapshot.keeper import SnapshotKeeper
    from pulsar_nack.snapshot.redispatch import RedispatchStore
    from pulsar_nack.timer import TimerWheel
    from pulsar_nack.tracker import NackTracker

    def clock() -> float:
        return float(NOW_MS + RESTORE_AFTER_MS)

    store = RedispatchStore(LocalDirectoryStorage(directory, fsync=False), rounding="ceil", clock=clock)
    started = time.perf_counter()
    if part == "store":
        restored = store.restore(NOW_MS + RESTORE_AFTER_MS)
    else:
        tracker = NackTracker(
            lambda due: None, clock=clock, wheel=TimerWheel(clock=clock, start=False), index=store,
            rounding="ceil",
        )  # fmt: skip
        restored = SnapshotKeeper(tracker, store).restore()
    elapsed = (time.perf_counter() - started) * 1000
    return elapsed, restored.ids


def measure(count: int, rounds: int) -> list[dict[str, Any]]:
    rows = []
    for batched in (True, False):
        with tempfile.TemporaryDirectory() as directory:
            size = write(directory, batched, count)
            for part in ("store", "tracker"):
                restore_once(directory, part)  # warm-up: imports, page cache
                times, ids = [], 0
                for _ in range(rounds):
                    elapsed, ids = restore_once(directory, part)
                    times.append(elapsed)
                rows.append({
                    "batched": batched, "part": part, "nacks": count, "restored_ids": ids, "bytes": size,
                    "median_ms": round(statistics.median(times), 2), "best_ms": round(min(times), 2),
                    "load": round(os.getloadavg()[0], 2),
                })  # fmt: skip
                print(rows[-1], file=sys.stderr)
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", default="current", help="names the code measured (before, after, ...)")
    parser.add_argument("--count", type=int, default=COUNT)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--commit", help="the commit of the package measured (default: HEAD)")
    args = parser.parse_args(argv)
    path = report.RESULTS / "restore_cost.json"
    saved: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"labels": {}}
    facts = report.machine()
    if args.commit:
        facts["commit"] = args.commit
    saved["labels"][args.label] = {"machine": facts, "rows": measure(args.count, args.rounds)}
    report.save_json("restore_cost", saved)
    text = render(saved)
    report.write_section("restore-cost", text)
    print(text)
    return 0


def render(saved: dict[str, Any]) -> str:
    """The docs/performance.md section, from the results."""
    rows = []
    for label, result in saved["labels"].items():
        facts = result["machine"]
        for row in result["rows"]:
            rows.append([
                label, f"{facts['commit']}, {facts['date']}",
                "batches of 100" if row["batched"] else "not batched", row["part"],
                f"{row['nacks']:,}", f"{row['restored_ids']:,}", f"{row['median_ms']:.1f}",
                f"{row['best_ms']:.1f}", f"{row['load']:.1f}",
            ])  # fmt: skip
    headers = [
        "code", "commit, date", "messages", "restore", "nacks", "ids restored", "median ms", "best ms",
        "load",
    ]  # fmt: skip
    latest = list(saved["labels"].values())[-1]
    return "\n\n".join([
        "## The restore at subscribe, batched vs non-batched",
        f"`python bench/restore_cost.py --label L` — the snapshot of {COUNT:,} pending nacks (delays "
        f"{DELAY_MS[0] // 1000}-{DELAY_MS[1] // 1000} s, one ledger; messages in batches of {BATCH} or not "
        f"batched, the same delays) restored {RESTORE_AFTER_MS / 1000} s after the nacks, no broker: "
        "*store* is the snapshot store's restore (segments read, the due ones loaded into its index), "
        "*tracker* what subscribe does (the store's, then the arrival filter taught every id). Median and "
        f"best of {ROUNDS} restores in one process; load: the 1-minute load average (2 cores, shared). "
        "Ids restored counts an entry once per bucket (a batch's messages in one bucket count once).",
        report.machine_line(latest["machine"]),
        report.table(headers, rows),
    ])  # fmt: skip


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
