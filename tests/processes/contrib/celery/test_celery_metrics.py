"""``celery worker --debounce-metrics-port``: a real Celery worker serves exact counts (issue #11).

Debounced bursts go through the dispatcher (``run_debounce_worker
--dispatch-only``) to a real ``celery -A tests.celery_app worker`` on the local
Redis; the test scrapes the worker's endpoint over HTTP and compares with the
job rows. Solo pool: the worker serves its own registry. Prefork pool: the
children count into ``PROMETHEUS_MULTIPROC_DIR`` and the main process serves
the sum (decisions 135–137).
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator

import pytest

from django_debounce.models import Job
from tests.processes.celery_rig import CeleryRig
from tests.processes.contrib.prometheus.test_metrics_endpoint import answering, free_port, scrape
from tests.procs import Processes, processes, wait_for
from tests.testapp.tasks_celery import stacked

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.timeout(180),
]

KEYS = ("a", "b", "c")
CALLS_PER_KEY = 4
LABELS = (("queue", "default"), ("task_name", "cel.stacked"))


@pytest.fixture
def procs(tmp_path) -> Iterator[Processes]:
    with processes(tmp_path, {}) as group:
        yield group


@pytest.fixture
def rig(procs: Processes, settings) -> Iterator[CeleryRig]:
    built = CeleryRig("redis", procs)
    built.env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    for name, value in built.settings().items():
        setattr(settings, name, value)
    yield built
    procs.kill_all()
    built.close()


def _burst() -> list[int]:
    """Call ``cel.stacked`` CALLS_PER_KEY times on each key; return the job ids (one per key)."""
    ids = []
    for key in KEYS:
        calls = [stacked.delay(key=key, n=n) for n in range(CALLS_PER_KEY)]
        assert [c.outcome for c in calls] == ["created"] + ["debounced"] * (CALLS_PER_KEY - 1)
        ids.append(calls[0].pk)
    return ids


def _all_done(ids: list[int]) -> bool:
    return Job.objects.filter(pk__in=ids, status=Job.Status.SUCCESSFUL).count() == len(ids)


def _run_and_scrape(rig: CeleryRig, port: int) -> tuple[list[Job], dict]:
    ids = _burst()
    rig.dispatcher("--poll-interval", "0.2")
    wait_for(lambda: _all_done(ids), timeout=60, what=rig.procs.tails)
    text, got = scrape(port)
    print("\n".join(line for line in text.splitlines() if "cel.stacked" in line)[:4000])
    return list(Job.objects.filter(pk__in=ids)), got


def _assert_counts(jobs: list[Job], got: dict) -> None:
    assert len(jobs) == len(KEYS)
    assert all(job.attempts == 1 and job.worker_id.startswith("celery:") for job in jobs)
    assert all(job.enqueue_count == CALLS_PER_KEY for job in jobs)
    assert got[("django_debounce_runs_started_total", LABELS)] == len(jobs)
    done = tuple(sorted((*LABELS, ("status", "SUCCESSFUL"))))
    assert got[("django_debounce_jobs_finished_total", done)] == len(jobs)
    assert got[("django_debounce_debounce_delay_seconds_count", LABELS)] == len(jobs)
    delays = sum((job.started_at - job.opened_at).total_seconds() for job in jobs)
    assert got[("django_debounce_debounce_delay_seconds_sum", LABELS)] == pytest.approx(delays)
    assert got[("django_debounce_attempt_duration_seconds_count", LABELS)] == len(jobs)
    # The calls were counted by this test process (the producer), not by the worker.
    assert got.get(("django_debounce_debounced_total", LABELS), 0) == 0
    # The database gauges, read at the scrape.
    assert got[("django_debounce_ready_jobs", LABELS)] == 0
    assert got[("django_debounce_collector_up", ())] == 1


def test_a_solo_worker_serves_the_exact_counts_of_the_jobs_it_ran(rig: CeleryRig) -> None:
    port = free_port()
    worker = rig.worker(
        f"--debounce-metrics-port={port}", "--debounce-metrics-addr=127.0.0.1", pool="solo"
    )
    wait_for(lambda: answering(port), timeout=30, what=worker.tail)
    jobs, got = _run_and_scrape(rig, port)
    _assert_counts(jobs, got)
    assert {int(job.worker_id.split(":")[2]) for job in jobs} == {worker.pid}


def test_a_prefork_worker_serves_the_sum_of_its_children_counts(rig: CeleryRig, tmp_path) -> None:
    multiproc = tmp_path / "prom"
    multiproc.mkdir()
    rig.env["PROMETHEUS_MULTIPROC_DIR"] = str(multiproc)
    port = free_port()
    worker = rig.worker(
        f"--debounce-metrics-port={port}",
        "--debounce-metrics-addr=127.0.0.1",
        "--concurrency=2",
        pool="prefork",
    )
    del rig.env["PROMETHEUS_MULTIPROC_DIR"]  # the dispatcher writes nothing there
    wait_for(lambda: answering(port), timeout=30, what=worker.tail)
    jobs, got = _run_and_scrape(rig, port)
    _assert_counts(jobs, got)
    # The children ran the jobs and wrote the counts; the main process served them.
    ran_in = {int(job.worker_id.split(":")[2]) for job in jobs}
    wrote = {int(p.stem.rsplit("_", 1)[1]) for p in multiproc.glob("counter_*.db")}
    assert worker.pid not in ran_in
    assert wrote == ran_in


def test_a_worker_that_cannot_serve_refuses_to_start(rig: CeleryRig, tmp_path) -> None:
    # prefork without PROMETHEUS_MULTIPROC_DIR: the page would show zeros, so a usage error.
    prefork = rig.worker("--debounce-metrics-port=9", pool="prefork", wait=False)
    assert prefork.wait(60) == 2
    assert re.search(r"needs PROMETHEUS_MULTIPROC_DIR", prefork.stderr()), prefork.tail()
    # A port already taken: the worker exits before it consumes anything.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        solo = rig.worker(
            f"--debounce-metrics-port={port}", "--debounce-metrics-addr=127.0.0.1", wait=False
        )
        assert solo.wait(60) == 1
    assert f"cannot serve on 127.0.0.1:{port}" in solo.stderr(), solo.tail()
    assert " ready." not in solo.stderr()
