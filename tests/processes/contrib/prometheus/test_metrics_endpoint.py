"""Real worker processes serve ``--metrics-port``; a scrape over HTTP shows exact counts (issue #11).

The scripted burst (``tests/metrics_burst.py``) runs in its own process, as a
web process would, and the workers count the runs. They share one
``PROMETHEUS_MULTIPROC_DIR``, the documented set-up for several processes on
one host, so any worker's endpoint serves the sum over all of them.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from django_debounce.models import Job
from tests.conftest import child_env
from tests.procs import processes, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(port: int) -> tuple[str, Samples]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    return text, samples


def answering(port: int) -> bool:
    try:
        scrape(port)
    except OSError:
        return False
    return True


def run_burst(env: dict[str, str], out: Path, *options: str) -> list[dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.metrics_burst", str(out), *options],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def all_finished(task: str) -> bool:
    jobs = Job.objects.filter(task_name=task)
    return jobs.exists() and not jobs.filter(status__in=["READY", "RUNNING"]).exists()


def labels(task: str, **more: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"queue": "metrics", "task_name": task, **more}.items()))


def test_a_scripted_burst_scraped_from_the_worker_shows_exact_counts(tmp_path):
    multiproc = tmp_path / "prom"
    multiproc.mkdir()
    env = child_env(PROMETHEUS_MULTIPROC_DIR=str(multiproc))
    port = free_port()
    with processes(tmp_path, env) as procs:
        worker = procs.worker(
            "--queue=metrics",
            "--poll-interval=0.05",
            f"--metrics-port={port}",
            "--metrics-addr=127.0.0.1",
        )
        wait_for(lambda: answering(port), timeout=30, what=worker.tail)
        calls = run_burst(env, tmp_path / "calls.json")
        wait_for(lambda: all_finished("met.fast"), timeout=30, what=worker.tail)
        text, got = scrape(port)

    jobs = list(Job.objects.filter(task_name="met.fast"))
    outcomes = [call["outcome"] for call in calls]
    created, debounced = outcomes.count("created"), outcomes.count("debounced")
    forced = [job for job in jobs if job.run_reason == "max_wait"]
    # What the burst must have produced, from the rows (independent of the metrics):
    assert created == len(jobs) and created + debounced == len(calls) == 35
    assert debounced == sum(job.enqueue_count - 1 for job in jobs)
    assert all(job.status == Job.Status.SUCCESSFUL and job.attempts == 1 for job in jobs)
    assert len(forced) >= 2, "the steady calls never went quiet: the max wait forced runs"
    fast = labels("met.fast")
    assert got[("django_debounce_created_total", fast)] == created
    assert got[("django_debounce_debounced_total", fast)] == debounced
    assert got[("django_debounce_runs_started_total", fast)] == len(jobs)
    assert got[("django_debounce_forced_runs_total", fast)] == len(forced)
    succeeded = labels("met.fast", status="SUCCESSFUL")
    assert got[("django_debounce_jobs_finished_total", succeeded)] == len(jobs)
    # The delay histogram: one observation per run, the sum of (started − opened).
    assert got[("django_debounce_debounce_delay_seconds_count", fast)] == len(jobs)
    delays = sum((job.started_at - job.opened_at).total_seconds() for job in jobs)
    assert got[("django_debounce_debounce_delay_seconds_sum", fast)] == pytest.approx(delays)
    everything = labels("met.fast", le="+Inf")
    assert got[("django_debounce_debounce_delay_seconds_bucket", everything)] == len(jobs)
    # The gauges read at the scrape: nothing left to run.
    assert got[("django_debounce_ready_jobs", fast)] == 0
    assert got[("django_debounce_collector_up", ())] == 1
    (tmp_path / "scrape.txt").write_text(text)
    print("\n".join(line for line in text.splitlines() if "met.fast" in line)[:4000])


def test_two_workers_on_one_host_serve_the_sum_of_their_counts(tmp_path):
    multiproc = tmp_path / "prom"
    multiproc.mkdir()
    env = child_env(PROMETHEUS_MULTIPROC_DIR=str(multiproc))
    ports = [free_port(), free_port()]
    with processes(tmp_path, env) as procs:
        workers = [
            procs.worker(
                "--queue=metrics",
                "--poll-interval=0.05",
                f"--metrics-port={port}",
                "--metrics-addr=127.0.0.1",
                f"--worker-id=w{i}",
                name=f"worker-{i}",
            )
            for i, port in enumerate(ports)
        ]
        for port in ports:
            wait_for(lambda port=port: answering(port), timeout=30, what=procs.tails)
        run_burst(env, tmp_path / "calls.json", "--plain=30", "--sleep=0.1", "--no-burst")
        wait_for(lambda: all_finished("met.plain"), timeout=60, what=procs.tails)
        scrapes = [scrape(port)[1] for port in ports]
        pids = {worker.pid for worker in workers}

    by_worker = {
        worker_id: Job.objects.filter(task_name="met.plain", worker_id=worker_id).count()
        for worker_id in ("w0", "w1")
    }
    assert sum(by_worker.values()) == 30 and all(by_worker.values()), by_worker
    plain = labels("met.plain")
    for got in scrapes:  # either worker's endpoint serves the host's sum
        assert got[("django_debounce_created_total", plain)] == 30  # counted by the producer
        assert got[("django_debounce_runs_started_total", plain)] == 30  # by both workers
        assert got[("django_debounce_attempt_duration_seconds_count", plain)] == 30
        done = labels("met.plain", status="SUCCESSFUL")
        assert got[("django_debounce_jobs_finished_total", done)] == 30
    # Each worker process wrote its own file of counts (prometheus_client's multiprocess mode).
    written = {int(path.stem.rsplit("_", 1)[1]) for path in multiproc.glob("counter_*.db")}
    assert pids <= written


@pytest.mark.postgres
def test_a_single_worker_serves_its_own_registry_and_closes_each_scrape_s_connection(tmp_path):
    """Without PROMETHEUS_MULTIPROC_DIR: the worker's default registry, plus the gauges.

    Each scrape is answered in a new thread of the worker; its database
    connection is closed when the scrape ends, so scraping never piles up
    connections (pg_stat_activity shows only the worker's own).
    """
    from tests.factories import JobFactory
    from tests.procs import app_name, pg_backends

    for i in range(5):
        JobFactory(task_name="met.plain", queue="metrics", args=[f"s{i}"])
    name = app_name("metrics")
    env = child_env(DEBOUNCE_TEST_APP_NAME=name)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    port = free_port()
    with processes(tmp_path, env) as procs:
        worker = procs.worker("--queue=metrics", "--poll-interval=0.05", f"--metrics-port={port}")
        wait_for(lambda: all_finished("met.plain"), timeout=30, what=worker.tail)
        before = len(pg_backends(name))
        for _ in range(5):
            text, got = scrape(port)
        after = len(pg_backends(name))

    plain = labels("met.plain")
    assert got[("django_debounce_runs_started_total", plain)] == 5
    assert (
        got[("django_debounce_jobs_finished_total", labels("met.plain", status="SUCCESSFUL"))] == 5
    )
    assert got[("django_debounce_ready_jobs", plain)] == 0
    assert "process_cpu_seconds_total" in text  # the process's default registry is served
    assert after == before, f"{after - before} connection(s) left open by the scrapes"
