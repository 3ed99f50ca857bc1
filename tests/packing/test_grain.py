"""How many shards a Dask task packs (``shardkit.packing.grain``): one until a shard's time is
known, then the next shards up to about TASK_SECONDS, never more than MOST_SHARDS, twice the
largest group so far, nor more than leaves every worker thread two tasks' worth; the cluster
tests run it on a real cluster."""

from __future__ import annotations

from collections import deque

import pytest

from shardkit.packing.grain import MOST_SHARDS, RATES_KEPT, TASK_SECONDS, Grain, named


def grown(grain: Grain, to: int) -> Grain:
    """``grain`` after groups that doubled up to ``to`` shards (each take may double the last)."""
    while grain.largest < to:
        grain.largest *= 2
    return grain


def test_one_shard_a_task_until_a_shard_has_finished_then_about_a_second_of_them():
    grain = Grain({k: 1000 for k in range(400)})
    pending = deque(range(400))
    assert grain.take(pending, threads=2) == [0]
    grain.finished(0, 0.099)  # 0.099 s a shard: ten make a task of (just under) a second
    assert [len(grain.take(pending, threads=2)) for _ in range(5)] == [2, 4, 8, 10, 10]
    assert list(pending)[:2] == [35, 36]  # taken in line, none skipped
    grain.finished(1, 0.3)
    grain.finished(2, 0.3)  # the median is 0.3 s: three shards
    assert grain.take(pending, threads=2) == [35, 36, 37]


def test_a_few_fast_shards_grow_the_tasks_step_by_step():
    grain = Grain({k: 1000 for k in range(400)})
    grain.finished(0, 0.001)  # a first shard of skipped files: a thousand would fit a second
    pending = deque(range(1, 400))
    assert [len(grain.take(pending, threads=1)) for _ in range(4)] == [2, 4, 8, 16]
    for k in range(1, 4):
        grain.finished(k, 0.5)  # the real rate: two shards a second
    assert len(grain.take(pending, threads=1)) == 2


def test_a_shard_longer_than_the_target_is_a_task_of_its_own():
    grain = grown(Grain({0: 10, 1: 10, 2: 10_000, 3: 10, 4: 10}), 8)
    grain.finished(0, 0.01)  # 1 ms an image: shard 2 takes 10 s
    pending = deque([1, 2, 3, 4])
    assert grain.take(pending, threads=1) == [1]  # shard 2 does not fit beside it
    assert grain.take(pending, threads=1) == [2]


def test_the_caps_leave_every_thread_work_and_bound_a_task():
    grain = grown(Grain({k: 1 for k in range(1000)}), MOST_SHARDS)
    grain.finished(0, 1e-6)  # a second holds a million of them
    pending = deque(range(1, 1000))
    assert len(grain.take(pending, threads=1)) == MOST_SHARDS
    pending = deque(range(1, 17))  # 16 left, 4 threads: two tasks a thread
    assert grain.take(pending, threads=4) == [1, 2]
    assert grain.take(deque([5, 6, 7]), threads=4) == [5]  # the last tasks are single shards
    one = Grain({k: 1 for k in range(10)}, most=1)
    one.finished(0, 1e-6)
    assert one.take(deque(range(1, 10)), threads=1) == [1]
    with pytest.raises(ValueError, match="`most`"):
        Grain({}, most=0)


def test_the_rate_is_the_median_of_the_latest_shards():
    grain = grown(Grain({**{k: 100 for k in range(1000)}, 999: 0}), 8)
    for k in range(RATES_KEPT):
        grain.finished(k, 1.0)  # slow at first: one shard a task
    assert grain.take(deque(range(500, 600)), threads=1) == [500]
    for k in range(RATES_KEPT, 2 * RATES_KEPT):
        grain.finished(k, TASK_SECONDS / 4.5)  # then four fit; the early ones no longer count
    assert grain.take(deque(range(500, 600)), threads=1) == [500, 501, 502, 503]
    grain.finished(999, 5.0)  # an empty shard's time says nothing of the rate: not counted
    assert grain.take(deque(range(500, 600)), threads=1) == [500, 501, 502, 503]


def test_named():
    assert named([3]) == "shard 3"
    assert named([3, 4, 5]) == "shards 3-5"
    assert named([3, 5, 9]) == "shards 3, 5, 9"
