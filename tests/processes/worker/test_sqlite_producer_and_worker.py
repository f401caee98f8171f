"""B30: a producer and a worker share one database file (real time, §4.4, §7).

Written for SQLite (one file, writers serialised by ``IMMEDIATE``
transactions and a 20 s busy timeout); on PostgreSQL the same producer and
worker code runs against the server, so the test passes on both.

Decision asserted here: ``--concurrency 4`` works on SQLite (each job thread
has its own connection; writers queue on the file lock under the busy
timeout). It is not refused at startup.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import pytest
from django.db import connections
from django.utils import timezone

from django_debounce.exceptions import EnqueueContentionError
from django_debounce.models import Job
from tests.conftest import child_env
from tests.procs import WorkerThread, processes, wait_for
from tests.testapp.models import CallLog
from tests.testapp.tasks_reliability import contended, plain

pytestmark = pytest.mark.django_db(transaction=True)

KEYS = 30
PLAIN = 300
DEBOUNCED = 300


class Producer(threading.Thread):
    """A web writer: 300 plain and 300 debounced calls over 30 keys, interleaved."""

    def __init__(self) -> None:
        super().__init__(name="b30-producer", daemon=True)
        self.calls: list[dict] = []
        self.contention = 0
        self.other_errors: list[str] = []

    def run(self) -> None:
        rng = random.Random(30)
        kinds = ["plain"] * PLAIN + ["debounced"] * DEBOUNCED
        rng.shuffle(kinds)
        debounced = 0
        try:
            for seq, kind in enumerate(kinds):
                # Runs of 5 debounced calls per key (interleaved with plain ones), so windows
                # slide, hit their ceiling, and get claimed while the next call arrives.
                key = f"k{(debounced // 5) % KEYS}"
                debounced += kind == "debounced"
                call = {"kind": kind, "seq": seq, "key": key, "before": timezone.now()}
                try:
                    job = plain.delay(seq) if kind == "plain" else contended.delay(key, seq=seq)
                except EnqueueContentionError:
                    self.contention += 1
                    call["error"] = "contention"
                except Exception as exc:  # a raw OperationalError would land here
                    self.other_errors.append(f"{type(exc).__name__}: {exc}")
                    call["error"] = "other"
                else:
                    call["job_id"] = job.pk
                self.calls.append(call)
                time.sleep(rng.uniform(0, 0.008))
        finally:
            connections.close_all()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("where", "concurrency"),
    [("thread", 1), ("thread", 4), ("process", 4)],
    ids=["worker-thread", "worker-thread-concurrency-4", "worker-process-concurrency-4"],
)
def test_b30_sqlite_file_contention(tmp_path, where, concurrency):
    producer = Producer()
    started = time.monotonic()
    with processes(tmp_path, child_env()) as procs:
        if where == "thread":
            worker = WorkerThread("b30", concurrency=concurrency, poll_interval=0.05).start()
            alive = worker.alive
        else:
            proc = procs.worker("--concurrency", str(concurrency), "--poll-interval", "0.05")
            alive = proc.alive
        try:
            producer.start()
            producer.join(120)
            assert not producer.is_alive(), "the producer hung"
            produced = time.monotonic() - started

            def drained() -> bool:
                assert alive(), "the worker died"
                return not Job.objects.filter(
                    status__in=[Job.Status.READY, Job.Status.RUNNING]
                ).exists()

            wait_for(drained, timeout=60, interval=0.1, what="the worker to drain")
            drain = time.monotonic() - started - produced
            assert alive()  # the worker stays up
        finally:
            if where == "thread":
                worker.stop()
        if where == "process":
            assert proc.alive(), proc.tail()
        final = procs.worker("--burst", name="final-burst")
        assert final.wait(60) == 0, final.tail()
        if where == "process":
            assert "Traceback" not in proc.stderr(), proc.tail()

    calls = producer.calls
    print(
        f"\n[b30 {connections['default'].vendor} {where} concurrency={concurrency}] "
        f"{len(calls)} calls in {produced:.1f}s, drained {drain:.1f}s later; "
        f"EnqueueContentionError: {producer.contention}; "
        f"other errors: {len(producer.other_errors)}; jobs: {Job.objects.count()}"
    )
    assert len(calls) == PLAIN + DEBOUNCED
    assert producer.other_errors == []  # no raw OperationalError reaches the caller
    assert producer.contention == 0  # allowed by §4.4, but never needed at this load
    assert Job.objects.due().count() == 0
    assert not Job.objects.exclude(status=Job.Status.SUCCESSFUL).exists()

    runs = Counter(CallLog.objects.values_list("job_id", flat=True))
    assert set(runs.values()) == {1}  # nothing ran twice
    plain_jobs = [c["job_id"] for c in calls if c["kind"] == "plain" and "job_id" in c]
    assert len(plain_jobs) == len(set(plain_jobs)) == PLAIN
    assert all(runs[job_id] == 1 for job_id in plain_jobs)
    assert sorted(CallLog.objects.filter(task="rel.plain").values_list("job_id", flat=True)) == (
        sorted(plain_jobs)
    )

    debounced = [c for c in calls if c["kind"] == "debounced" and "job_id" in c]
    windows = {c["job_id"] for c in debounced}
    assert set(CallLog.objects.filter(task="rel.contended").values_list("job_id", flat=True)) == (
        windows
    )
    assert sum(Job.objects.filter(pk__in=windows).values_list("enqueue_count", flat=True)) == len(
        debounced
    )
    for key in {c["key"] for c in debounced}:
        last = max((c for c in debounced if c["key"] == key), key=lambda c: c["seq"])
        log = CallLog.objects.get(job_id=last["job_id"])
        assert runs[last["job_id"]] == 1
        assert log.started_at >= last["before"]  # the key's last window ran after its last call
