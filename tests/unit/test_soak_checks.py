"""The real-row checks of the rate-accuracy and soak tests catch what they are meant to catch.

``tests/soak_checks.py`` judges what worker processes left; a checker that
passes everything would make those tests lie. Synthetic rows, no database.
"""

from __future__ import annotations

import datetime as dt

from tests.conftest import T
from tests.soak_checks import (
    Rows,
    account,
    bucket_dry_at,
    keyed_overlaps,
    most_in_window,
    most_overlapping,
    wasted_refill,
    worst_rate_interval,
)


def at(seconds: float) -> dt.datetime:
    return T + dt.timedelta(seconds=seconds)


def test_the_rate_rule_is_exact_over_every_pair_of_starts():
    # A bucket of 2 at 1/s: 2 at once, then one a second, is exactly allowed.
    starts = [at(0), at(0), at(1), at(2), at(3)]
    worst = worst_rate_interval(starts, 2, 1.0)
    assert worst is not None and abs(worst.excess) < 1e-9
    # One start 10 ms early breaks it: 3 starts in [0, 0.99] where 2.99 are allowed.
    early = worst_rate_interval([at(0), at(0), at(0.99), at(2)], 2, 1.0)
    assert early is not None and early.excess > 0 and early.count == 3
    assert worst_rate_interval([], 2, 1.0) is None


def test_windows_dry_bucket_and_lost_refill():
    starts = [at(0), at(0), at(1), at(2), at(3)]
    assert most_in_window(starts, 1.0) == 3  # [0, 1] holds three
    assert bucket_dry_at(starts, 2, 1.0) == at(0)
    assert wasted_refill(starts, 2, 1.0, since=at(0), until=at(3)) == 0.0
    # A 3 s gap after the burst: the bucket is full from t=2 to t=3 and loses one token.
    gap = [at(0), at(0), at(3)]
    assert abs(wasted_refill(gap, 2, 1.0, since=at(0), until=at(3)) - 1.0) < 1e-9


def test_overlaps_of_runs_and_of_one_key():
    assert most_overlapping([(at(0), at(2)), (at(1), at(3)), (at(2), at(4))]) == 2
    runs = [
        {"task": "soak.merged", "key": "k1", "started": at(0), "finished": at(2), "job_id": 1},
        {"task": "soak.merged", "key": "k1", "started": at(1), "finished": at(3), "job_id": 2},
        {"task": "soak.merged", "key": "k2", "started": at(1), "finished": at(3), "job_id": 3},
        {"task": "soak.rated", "key": "", "started": at(1), "finished": at(3), "job_id": 4},
    ]
    assert keyed_overlaps(runs) == [("soak.merged|k1", 1, 2)]


def _job(task: str, status: str = "SUCCESSFUL", count: int = 1, attempts: int = 1) -> dict:
    return {
        "task": task,
        "status": status,
        "args": [],
        "count": count,
        "attempts": attempts,
        "started_at": at(0),
        "expires_at": None,
    }


def _run(task: str, job_id: int, ids: list[str]) -> dict:
    return {"task": task, "key": "k", "ids": ids, "job_id": job_id, "attempt": 1}


def test_the_accounting_finds_a_lost_item_a_double_run_and_a_stuck_job():
    calls = [
        {"kind": "merged", "item": "0:1", "key": "k", "job_id": 1, "outcome": "created"},
        {"kind": "merged", "item": "0:2", "key": "k", "job_id": 1, "outcome": "debounced"},
        {"kind": "rated", "item": "0:3", "key": "k", "job_id": 2, "outcome": "created"},
    ]
    good = Rows(
        jobs={1: _job("soak.merged", count=2), 2: _job("soak.rated")},
        runs=[_run("soak.merged", 1, ["0:1", "0:2"]), _run("soak.rated", 2, ["0:3"])],
        letters={},
    )
    assert account(calls, good, 3) == []
    lost = Rows(good.jobs, [_run("soak.merged", 1, ["0:1"]), good.runs[1]], {})
    assert any("0:2" in p for p in account(calls, lost, 3))
    twice = Rows(good.jobs, [*good.runs, _run("soak.merged", 1, ["0:2"])], {})
    assert any("ran 2 times" in p for p in account(calls, twice, 3))
    stuck = Rows({**good.jobs, 2: _job("soak.rated", status="RUNNING")}, good.runs, {})
    assert any("left RUNNING" in p for p in account(calls, stuck, 3))
    stray = Rows({**good.jobs, 9: _job("soak.rated", attempts=0)}, good.runs, {})
    assert any("#9" in p for p in account(calls, stray, 3))
