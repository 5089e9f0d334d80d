"""bench/delayed_trackers.py and bench/delayed_tracker_sweep.py, the models of the broker's delayed-delivery
trackers: pop order, nothing lost, recovery, memory, bad parameters, what bench/broker_trackers.py renders,
and one small Spark run."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pulsar_nack.sweep.grid import GridError
from pulsar_nack.sweep.report import RunInfo

# bench/ is a directory of scripts that import each other by name, as `python bench/x.py` lets them.
sys.path.append(str(Path(__file__).resolve().parent.parent / "bench"))

import broker_trackers
import report
from delayed_tracker_sweep import (
    TRACKER_COLUMNS,
    TrackerPoint,
    article_comparison,
    load_tracker_grid,
    measure_tracker,
    plot_trackers,
    sweep_trackers,
    tracker_table,
)
from delayed_trackers import (
    ArrayBacklog,
    ArticleWorkload,
    BucketSettings,
    BucketTracker,
    DelayedTracker,
    TimeBucketTracker,
    TrackerOutOfMemory,
    TripleLongPriorityQueue,
    precision_bits_for_tick,
    recover,
)

#: A short version of the Pulsar 3.0 delayed-message article's workload: 100 messages/s for 80 s, delays of
#: 1–30 s, 1,000 entries per ledger (8 ledgers), so that everything falls due within the test.
SHORT = ArticleWorkload(8_000, rate_per_s=100, min_delay_s=1, max_delay_s=30, entries_per_ledger=1_000)
_FAR = 2**62


def _bucket_tracker(folder: Path) -> BucketTracker:
    settings = BucketSettings(
        min_index_count_per_bucket=1_000,
        max_indexes_per_segment=300,
        max_time_step_per_segment_s=5,
        tick_ms=256,
        max_loaded_ids=500,
        load_ahead_ms=2_000,
    )
    return BucketTracker(folder, settings, fsync=False)


MAKERS: dict[str, Callable[[Path], DelayedTracker]] = {
    "heap": lambda _: TripleLongPriorityQueue(),
    "heap segmented": lambda _: TripleLongPriorityQueue(growth="segmented", segment_indexes=1_000),
    "timebucket": lambda _: TimeBucketTracker(1_000),
    "timebucket strict": lambda _: TimeBucketTracker(300, "ceil"),
    "buckets": _bucket_tracker,
}


def _feed(tracker: DelayedTracker, workload: ArticleWorkload, chunk: int = 1_500) -> ArrayBacklog:
    """Publish the workload in chunks (the bucket tracker's clock following the publish time); returns
    the log as a backlog."""
    backlog = ArrayBacklog()
    for low in range(0, workload.n, chunk):
        ids = workload.slice(low, min(low + chunk, workload.n))
        if isinstance(tracker, BucketTracker):
            tracker.now_ms = workload.published_ms(low + 1)
        tracker.add_many(*ids)
        backlog.publish(*ids)
    return backlog


def _keys(rows: np.ndarray[Any, Any]) -> list[tuple[int, int]]:
    return list(zip(rows[:, 1].tolist(), rows[:, 2].tolist(), strict=True))


@pytest.mark.parametrize("name", list(MAKERS))
def test_pops_in_order_at_the_filed_time_and_loses_nothing(name: str, tmp_path: Path) -> None:
    tracker = MAKERS[name](tmp_path)
    due, ledgers, entries = SHORT.slice(0, SHORT.n)
    _feed(tracker, SHORT)
    assert len(tracker) == SHORT.n
    keys_in = list(zip(ledgers.tolist(), entries.tolist(), strict=True))
    filed = dict(zip(keys_in, tracker.filed_ms(due).tolist(), strict=True))
    due_of = dict(zip(keys_in, due.tolist(), strict=True))
    seen: list[tuple[int, int]] = []
    previous, last_filed = 0, 0
    steps = 0
    for now in range(int(due.min()) - 1_000, int(due.max()) + 2_000, 700):
        popped = tracker.pop_due(now)
        steps += 1
        assert popped.shape[1] == 3
        keys = _keys(popped)
        # each id comes at the time it was filed under, no sooner, and at the first pop past it
        assert all(filed[key] == f for key, f in zip(keys, popped[:, 0].tolist(), strict=True))
        assert all(previous < filed[key] <= now for key in keys)
        # in order: never an earlier filed time after a later one
        times = popped[:, 0].tolist()
        assert times == sorted(times) and (not times or times[0] >= last_filed)
        last_filed = times[-1] if times else last_filed
        if name.startswith("heap"):  # exact: due, ledger, entry order
            assert [tuple(r) for r in popped.tolist()] == sorted(tuple(r) for r in popped.tolist())
        if name == "timebucket strict":  # ceil: never before the due time
            assert all(due_of[key] <= now for key in keys)
        expected = {key for key, f in filed.items() if previous < f <= now}
        assert set(keys) == expected
        seen += keys
        previous = now
    assert steps < 200
    assert len(seen) == len(set(seen)) == SHORT.n, "every id popped exactly once"
    assert len(tracker) == 0 and len(tracker.pop_due(_FAR)) == 0
    tracker.close()


@pytest.mark.parametrize("name", list(MAKERS))
def test_recovery_gives_back_exactly_the_pending_set(name: str, tmp_path: Path) -> None:
    tracker = MAKERS[name](tmp_path)
    backlog = _feed(tracker, SHORT)
    crash_ms = SHORT.published_ms(SHORT.n) - 20_000  # some ids are due and dispatched by then
    if isinstance(tracker, BucketTracker):
        tracker.now_ms = crash_ms
    dispatched = tracker.pop_due(crash_ms)
    assert 0 < len(dispatched) < SHORT.n
    backlog.ack(dispatched)
    assert len(backlog) == SHORT.n - len(dispatched)
    pending = len(tracker)
    recovered, recovery = recover(tracker, backlog, crash_ms, read_cost_s=1e-4)
    assert recovery.pending == pending == len(recovered)
    assert recovery.modelled_read_s == pytest.approx(recovery.replayed * 1e-4)
    left = recovered.pop_due(_FAR)
    _, ledgers, entries = SHORT.slice(0, SHORT.n)
    gone = set(_keys(dispatched))
    want = {key for key in zip(ledgers.tolist(), entries.tolist(), strict=True) if key not in gone}
    assert len(left) == len(want) and set(_keys(left)) == want
    if isinstance(recovered, BucketTracker):  # restored from the segment files, replayed only the open bucket
        assert recovery.restored > 0 and recovery.replayed < len(backlog) // 2
    else:  # rebuilt from every message of the backlog
        assert recovery.replayed == len(backlog) and recovery.restored == 0


def test_the_bucket_tracker_seals_at_ledger_boundaries_into_segments(tmp_path: Path) -> None:
    tracker = _bucket_tracker(tmp_path)
    _feed(tracker, SHORT)
    # 8 ledgers of 1,000 ids: the first 7 sealed (at each next ledger's first id), the last still open
    assert tracker.sealed_through == SHORT.first_ledger + 6
    stats = tracker.store.stats()
    assert stats.ids_on_storage + stats.ids_in_memory == SHORT.n
    segments = tracker.store.segments()
    assert all(live <= 300 for _, _, _, live, _ in segments), "cut at max_indexes_per_segment"
    assert all(high - low < 5_000 for _, low, high, _, _ in segments), "cut at the time step"
    assert len(list(tmp_path.iterdir())) == stats.segments_total > 7 * 1_000 / 300


def test_memory_grows_with_n_for_the_heap_and_stays_bounded_for_buckets(tmp_path: Path) -> None:
    rows: dict[tuple[str, int], dict[str, Any]] = {
        (model, n): measure_tracker(
            TrackerPoint(model=model, n=n, fsync=False, max_loaded_ids=10_000), scratch=str(tmp_path)
        )
        for model in ("heap", "buckets")
        for n in (150_000, 600_000)
    }
    for row in rows.values():
        assert row["held"] == row["recovered"] == row["n"] and row["oom_at"] is None
    small, large = rows[("heap", 150_000)], rows[("heap", 600_000)]
    for row in (small, large):  # 24 B per index of a capacity doubled from 16: 262,144 and 1,048,576
        capacity = 16 << math.ceil(math.log2(row["held"] / 16))
        assert row["own_bytes"] == 24 * capacity
        assert row["own_bytes"] <= row["heap_bytes"] <= row["own_bytes"] * 1.02 + 65_536, "measured"
    assert large["heap_bytes"] > 3 * small["heap_bytes"]
    for n in (150_000, 600_000):
        buckets = rows[("buckets", n)]
        # in memory: never more than the open bucket (< one ledger past 50,000) plus the loaded budget
        assert buckets["ids_in_memory"] <= 50_000 + 50_000 + 10_000
        assert buckets["segments"] >= (n // 50_000 - 1) * 10
        assert buckets["heap_bytes"] < rows[("heap", n)]["heap_bytes"] / 4
        assert buckets["restored"] + buckets["replayed"] == n
    assert not list(tmp_path.iterdir()), "the segment folders are removed"


def test_a_memory_limit_stops_the_heap_where_growth_would_pass_it() -> None:
    # doubling from 16: 524,288 indexes hold 12.6 MB; growing to 1,048,576 needs 25.2 MB more while the
    # old buffer is still held — 37.7 MB, past a 30 MB limit
    row: dict[str, Any] = measure_tracker(
        TrackerPoint(model="heap", n=800_000, memory_limit_bytes=30_000_000)
    )
    assert row["oom_at"] == row["held"] == row["recovered"] == 524_288
    assert 24 * 524_288 <= row["heap_bytes"] < 30_000_000
    segmented = measure_tracker(
        TrackerPoint(model="heap", n=3_000_000, growth="segmented", memory_limit_bytes=60_000_000)
    )
    assert segmented["oom_at"] == 2 * 2**20  # two 25.2 MB segments fit, a third does not
    heap = TripleLongPriorityQueue(memory_limit_bytes=1_000)  # 16 × 24 = 384 B; 32 more would hold 1,152
    with pytest.raises(TrackerOutOfMemory, match="out of memory at 16 delayed indexes") as error:
        heap.add_many(np.arange(40), 1, np.arange(40))
    assert error.value.held == len(heap) == 16 and error.value.limit_bytes == 1_000
    assert heap.pop_due(100)[:, 2].tolist() == list(range(16)), "the 16 that fit are kept, in order"


def test_bad_parameters_are_rejected_naming_them(tmp_path: Path) -> None:
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: TripleLongPriorityQueue(memory_limit_bytes=-1), "memory_limit_bytes must"),
        (lambda: TripleLongPriorityQueue(growth="triple"), "growth must"),  # type: ignore[arg-type]
        (lambda: TripleLongPriorityQueue(initial_capacity=0), "initial_capacity must"),
        (lambda: TripleLongPriorityQueue(memory_limit_bytes=100), "memory_limit_bytes is 100"),
        (lambda: TimeBucketTracker(-5), "tick_ms must"),
        (lambda: TimeBucketTracker(1000, "round"), "rounding must"),  # type: ignore[arg-type]
        (lambda: BucketSettings(min_index_count_per_bucket=0), "min_index_count_per_bucket must"),
        (lambda: BucketSettings(max_indexes_per_segment=0), "max_indexes_per_segment must"),
        (lambda: BucketSettings(max_time_step_per_segment_s=0), "max_time_step_per_segment_s must"),
        (lambda: BucketSettings(max_num_buckets=-2), "max_num_buckets must"),
        (lambda: BucketSettings(max_loaded_ids=-1), "max_loaded_ids must"),
        (lambda: ArticleWorkload(10, min_delay_s=9, max_delay_s=1), "min_delay_s and max_delay_s"),
        (lambda: ArticleWorkload(10, rate_per_s=0), "rate_per_s must"),
        (lambda: TrackerPoint(model="lsm"), "model must"),  # type: ignore[arg-type]
        (lambda: TrackerPoint(n=0), "n must"),
        (lambda: TrackerPoint(read_cost_us=-1.0), "read_cost_us must"),
        (lambda: TrackerPoint(model="buckets", max_num_buckets=0), "max_num_buckets must"),
        (lambda: recover(TripleLongPriorityQueue(), ArrayBacklog(), 0, read_cost_s=-1), "read_cost_s must"),
    ]
    for make, name in cases:
        with pytest.raises((ValueError, TypeError, MemoryError), match=name):
            make()
    # bad ids leave every model as it was
    for maker in MAKERS.values():
        tracker = maker(tmp_path / "bad")
        tracker.add_many([5_000], [1], [2])
        for args, name in (
            (([-1], [1], [3]), "due_ms"),
            (([1], [-1], [3]), "ledger_ids"),
            (([1, 2], [1], [3, 4, 5]), "due_ms=2"),
        ):
            with pytest.raises(ValueError, match=name):
                tracker.add_many(*args)
        assert len(tracker) == 1 and _keys(tracker.pop_due(_FAR)) == [(1, 2)]
    with pytest.raises(GridError, match="neither a built-in tracker grid"):
        load_tracker_grid("huge")


def test_precision_bits_come_from_the_tick() -> None:
    assert [precision_bits_for_tick(t) for t in (0, 1, 2, 3, 511, 512, 1_000, 1_024, 60_000)] == [
        0,
        0,
        1,
        1,
        8,
        9,
        9,
        10,
        15,
    ]
    tracker = TimeBucketTracker(1_000, "floor")
    assert tracker.index.precision_bits == 9
    assert tracker.filed_ms(np.array([1_023, 1_024, 1_535], dtype=np.int64)).tolist() == [512, 1_024, 1_024]
    strict = TimeBucketTracker(1_000, "ceil")
    assert strict.filed_ms(np.array([1_023, 1_024, 1_025], dtype=np.int64)).tolist() == [1_024, 1_024, 1_536]


def test_bucket_settings_map_onto_the_segment_config() -> None:
    config = BucketSettings().segment_config()
    assert (config.min_ids_per_segment, config.max_segment_span_ms) == (5_000, 300_000)
    assert config.max_segments > 2**40 and config.checkpoint_interval_ms > 2**40, "no merging, no timed seal"
    unlimited = BucketSettings(max_indexes_per_segment=-1, max_num_buckets=16).segment_config()
    assert (unlimited.min_ids_per_segment, unlimited.max_segments) == (2**24, 16)


def test_the_seed_workload_is_reproducible_by_chunk() -> None:
    workload = ArticleWorkload(250_000, chunk=100_000)
    due, ledgers, entries = (np.concatenate(parts) for parts in zip(*workload.chunks(), strict=True))
    again = workload.slice(0, 250_000)
    assert all(np.array_equal(a, b) for a, b in zip((due, ledgers, entries), again, strict=True))
    published = workload.start_ms + np.arange(250_000)  # 1,000 messages/s: one per ms
    delay = due - published
    assert delay.min() >= 172_800_000 and delay.max() <= 173_400_000
    assert delay.max() - delay.min() > 599_000, "spread over the 10 minutes"
    assert ledgers.tolist()[49_999:50_002] == [10_000, 10_001, 10_001] and entries[50_000] == 0
    tail = list(workload.chunks(from_ledger=10_004))
    assert sum(len(part[0]) for part in tail) == 50_000 and tail[0][1][0] == 10_004


def _rendered(rows: list[dict[str, Any]], grid: str, read_cost_us: float = 0.0) -> str:
    """What bench/broker_trackers.py writes into docs/performance.md for ``rows``."""
    points = [TrackerPoint.from_row(row) for row in rows]
    info = RunInfo(grid, "local", len(rows), sum(p.n for p in points), "4", "3.11", "today", 1, 2, 0, 0, 0, 0)
    results = {"rows": rows, "run": asdict(info), "grid": grid, "read_cost_us": read_cost_us}
    return broker_trackers.render(results | {"machine": report.machine()})


def test_reports_and_plots_name_the_public_sources() -> None:
    """Readers cannot see the project's seed files: the tracker section, its table header and the plot's
    legend name the article itself, never "seed 004"."""
    points = [TrackerPoint("heap", n, fsync=False) for n in (2_000, 4_000)]
    points += [
        TrackerPoint("buckets", n, fsync=False, min_index_count_per_bucket=1_000) for n in (2_000, 4_000)
    ]
    rows = [measure_tracker(point) for point in points]
    text = _rendered(rows, "tiny")
    assert "“New Delayed Message In Pulsar 3.0”" in text
    assert "| figure | Pulsar 3.0 article | ours | our model |" in text
    figure = plot_trackers(rows)
    assert figure is not None
    legends = [axes.get_legend() for axes in figure.axes]
    labels = [label.get_text() for legend in legends if legend is not None for label in legend.get_texts()]
    assert any(label.startswith("Pulsar 3.0 article: in-memory tracker, 847 MB") for label in labels)
    for shown in (text, *labels):
        assert "seed 0" not in shown.lower() and "PR 23611" not in shown


def test_a_small_spark_run_of_the_models(spark: Any) -> None:
    points = load_tracker_grid("small")
    rows: list[dict[str, Any]] = sweep_trackers(spark, points, progress=False)
    assert [(row["model"], row["n"]) for row in rows] == [(p.model, p.n) for p in points]
    exact = (
        "held",
        "oom_at",
        "recovered",
        "replayed",
        "restored",
        "segments",
        "ids_in_memory",
        "snapshot_bytes",
    )
    local = [measure_tracker(point) for point in points]
    for got, want in zip(rows, local, strict=True):
        assert list(got) == list(TRACKER_COLUMNS)
        assert {name: got[name] for name in exact} == {name: want[name] for name in exact}
        assert got["heap_bytes"] > 0 and got["recovered"] == got["n"]
    text = _rendered(rows, "small", read_cost_us=100.0)
    headers, cells = tracker_table(rows)
    assert len(cells) == len(points) and "| " + " | ".join(headers) + " |" in text
    assert all("| " + " | ".join(row) + " |" in text for row in cells)
    assert all(" | ".join(row) in text for row in article_comparison(rows, read_cost_us=100.0))
    # a modelled read cost is shown apart from the measured recovery, as replayed × cost
    buckets = max((r for r in rows if r["model"] == "buckets"), key=lambda r: r["n"])
    modelled = article_comparison(rows, read_cost_us=100.0)[-1][2]
    assert modelled.startswith(f"{buckets['recovery_s']:,.1f} s (")
    assert (
        f"+ {buckets['replayed'] * 1e-4:,.1f} s modelled read at 100 µs/message of {buckets['replayed']:,}"
        in (modelled)
    )
