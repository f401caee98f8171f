"""Eight producer processes sending bulk batches at once (issue #12; §4.4).

Each producer is a real process (``tests/processes/bulk_producer.py``) sending
``Task.delay_many`` batches of ``rel.hold`` (a 1 h window) as fast as it can,
released together by a barrier file. The database's row locks and the unique
``window_key`` decide every race: no error, one row per key, every call counted.
"""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest

from django_debounce.models import Job
from tests.conftest import child_env
from tests.procs import processes, wait_for

pytestmark = [pytest.mark.row_locks, pytest.mark.django_db(transaction=True)]

PRODUCERS = 8
BATCHES = 6
SIZE = 100


@pytest.mark.parametrize("keys", [1, 1000], ids=["one-hot-key", "1000-keys"])
def test_eight_bulk_producers_leave_one_window_per_key(tmp_path, keys):
    with processes(tmp_path, child_env()) as procs:
        go = tmp_path / "go"
        started = []
        for n in range(PRODUCERS):
            argv = ["-m", "tests.processes.bulk_producer", f"--producer={n}", f"--keys={keys}"]
            argv += [f"--batches={BATCHES}", f"--size={SIZE}", f"--go={go}"]
            argv += [f"--ready={tmp_path / f'ready-{n}'}", f"--out={tmp_path / f'out-{n}.json'}"]
            started.append(procs.start(f"bulk-producer-{n}", argv))
        wait_for(
            lambda: all((tmp_path / f"ready-{n}").exists() for n in range(PRODUCERS)),
            timeout=90,
            what=procs.tails,
        )
        began = time.monotonic()
        go.touch()
        for proc in started:
            assert proc.wait(120) == 0, proc.tail()
        elapsed = time.monotonic() - began
    reports = [json.loads((tmp_path / f"out-{n}.json").read_text()) for n in range(PRODUCERS)]
    errors = [error for report in reports for error in report["errors"]]
    calls = [call for report in reports for call in report["calls"]]
    print(f"\n[bulk races] {len(calls)} calls over {keys} key(s) in {elapsed:.1f}s")
    assert errors == []
    assert len(calls) == PRODUCERS * BATCHES * SIZE

    jobs = {job.debounce_key: job for job in Job.objects.all()}
    per_key = Counter(f"hold:{call['key']}" for call in calls)
    assert set(jobs) == set(per_key)  # one row per key called, no duplicate
    assert Job.objects.count() == len(per_key)
    for key, count in per_key.items():
        assert jobs[key].enqueue_count == count
        assert jobs[key].is_open_window
    for call in calls:
        assert call["job_id"] == jobs[f"hold:{call['key']}"].pk
    assert Counter(call["outcome"] for call in calls) == {
        "created": len(per_key),
        "debounced": len(calls) - len(per_key),
    }
