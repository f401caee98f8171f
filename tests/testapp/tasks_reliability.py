"""Tasks the reliability suite runs in worker subprocesses and worker threads.

Every task has an explicit ``name=`` (``rel.*``) so a worker subprocess that
imports this module through autodiscovery knows it. Each run writes one
:class:`~tests.testapp.models.CallLog` row with the process id, the job id
(taken from the ``job_started`` signal, sent in the thread that runs the
task), and the start and finish instants, so tests can count runs across
processes and check that runs never overlap.

Sleeping is scaled by the environment variable ``REL_SLEEP_SCALE`` (default
1): a test that reruns a job inside its own process after a worker subprocess
died sets it to 0 there, so the rerun is quick while the subprocess run was
slow.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

from django.core.mail import send_mail
from django.dispatch import receiver
from django.utils import timezone

from django_debounce import debounced_task, task
from django_debounce.models import Job
from django_debounce.signals import job_started

from .models import CallLog, Order

_current = threading.local()


@receiver(job_started, sender=Job, dispatch_uid="tests.testapp.tasks_reliability.current_job")
def _remember_job(sender: Any, job: Job, **kwargs: Any) -> None:
    _current.job_id = job.pk
    _current.attempt = job.attempts


def current_job_id() -> int | None:
    """Return the id of the job this thread is running (None outside a worker)."""
    return getattr(_current, "job_id", None)


def _sleep(seconds: float) -> None:
    scale = float(os.environ.get("REL_SLEEP_SCALE", "1"))
    if seconds * scale > 0:
        time.sleep(seconds * scale)


def _start(name: str, key: str = "", payload: dict[str, Any] | None = None) -> CallLog:
    return CallLog.objects.create(
        task=name,
        key=key,
        payload=payload or {},
        job_id=current_job_id(),
        pid=os.getpid(),
        started_at=timezone.now(),
    )


def _finish(log: CallLog) -> None:
    log.finished_at = timezone.now()
    log.save(update_fields=["finished_at"])


@task(name="rel.work", max_retries=3)
def work(tag: str, seconds: float = 0.0) -> dict[str, Any]:
    """Record a run, sleep ``seconds`` (scaled), record its end; return who ran it."""
    log = _start(
        "rel.work", key=tag, payload={"tag": tag, "attempt": getattr(_current, "attempt", 0)}
    )
    _sleep(seconds)
    _finish(log)
    return {"pid": os.getpid(), "tag": tag}


def wait_for_file(path: str, timeout: float = 120.0) -> None:
    """Block until the file ``path`` exists (a test's barrier); raise after ``timeout`` seconds."""
    deadline_at = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline_at:
            raise TimeoutError(f"the barrier file {path} never appeared")
        time.sleep(0.02)


@task(name="rel.gate", max_retries=3)
def gate(tag: str, path: str) -> dict[str, Any]:
    """Record a run, block until the file ``path`` exists, record its end; return who ran it.

    A test holds a run at "mid-job" for as long as it needs, then lets it end by creating
    the file: no sleep decides when the run ends.
    """
    log = _start(
        "rel.gate", key=tag, payload={"tag": tag, "attempt": getattr(_current, "attempt", 0)}
    )
    wait_for_file(path)
    _finish(log)
    return {"pid": os.getpid(), "tag": tag}


@task(name="rel.one_query")
def one_query(n: int) -> None:
    """Exactly one ORM query (an INSERT)."""
    now = timezone.now()
    CallLog.objects.create(
        task="rel.one_query",
        payload={"n": n},
        job_id=current_job_id(),
        pid=os.getpid(),
        started_at=now,
        finished_at=now,
    )


@task(name="rel.kill_own_worker", max_retries=1)
def kill_own_worker(tag: str) -> None:
    """Record the run, then SIGKILL the process running it (a job that kills its workers)."""
    _start("rel.kill_own_worker", key=tag)
    if os.environ.get("REL_ALLOW_SUICIDE") == "1":
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # never reached


@debounced_task(name="rel.hold", debounce="1h", debounce_max_wait="2h", debounce_key="hold:{0}")
def hold(key: str, producer: int = 0, seq: int = 0) -> None:
    """A window that never becomes due during a test (races on enqueue only)."""
    _start("rel.hold", key=key, payload={"producer": producer, "seq": seq})


@debounced_task(
    name="rel.race",
    debounce="200ms",
    debounce_max_wait="1s",
    debounce_key="race:{0}",
    debounce_replace_payload=True,
    max_retries=0,
)
def race(key: str, producer: int = 0, seq: int = 0) -> None:
    """A short window raced by producers while a worker runs it (replace: newest payload)."""
    log = _start("rel.race", key=key, payload={"producer": producer, "seq": seq})
    time.sleep(0.01)  # long enough for an overlap to show in started/finished instants
    _finish(log)


@debounced_task(
    name="rel.edge_leading",
    debounce="200ms",
    debounce_max_wait="1s",
    debounce_key="edge:{0}",
    debounce_edge="leading",
    max_retries=0,
)
def edge_leading(key: str, producer: int = 0, seq: int = 0) -> None:
    """A leading edge raced by producers while a worker runs it (decision 180)."""
    log = _start("rel.edge_leading", key=key, payload={"producer": producer, "seq": seq})
    time.sleep(0.01)
    _finish(log)


@debounced_task(
    name="rel.edge_both",
    debounce="200ms",
    debounce_max_wait="1s",
    debounce_key="edge:{0}",
    debounce_edge="both",
    debounce_replace_payload=True,
    max_retries=0,
)
def edge_both(key: str, producer: int = 0, seq: int = 0) -> None:
    """Both edges raced by producers while a worker runs them (decision 180)."""
    log = _start("rel.edge_both", key=key, payload={"producer": producer, "seq": seq})
    time.sleep(0.01)
    _finish(log)


@debounced_task(
    name="rel.edge_slow",
    debounce="1s",
    debounce_max_wait="30s",
    debounce_key="slow:{0}",
    debounce_edge="both",
    debounce_replace_payload=True,
    max_retries=0,
)
def edge_slow(key: str, seq: int = 0, seconds: float = 0.0) -> None:
    """Both edges with a slow run: a worker is killed while its leading job runs (attack)."""
    log = _start("rel.edge_slow", key=key, payload={"seq": seq})
    _sleep(seconds)
    _finish(log)


@debounced_task(
    name="rel.report", debounce="10s", debounce_max_wait="1m", debounce_key="report:{user_id}"
)
def report(user_id: int, seconds: float = 0.0) -> dict[str, Any]:
    """B27's debounced report; sleeps ``seconds`` (scaled) between its start and end rows."""
    log = _start("rel.report", key=f"report:{user_id}", payload={"user_id": user_id})
    _sleep(seconds)
    _finish(log)
    return {"pid": os.getpid()}


@debounced_task(
    name="rel.deadline", debounce="2h", debounce_max_wait="3h", debounce_key="deadline:{0}"
)
def deadline(key: str) -> None:
    """B23: a window whose deadline lies hours ahead."""
    log = _start("rel.deadline", key=key)
    _finish(log)


@task(name="rel.email_report")
def email_report(user_id: int, seconds: float = 3.0) -> None:
    """B24: a long report that is emailed when done (Django's locmem backend in tests)."""
    log = _start("rel.email_report", key=str(user_id))
    _sleep(seconds)
    send_mail("report", f"report for {user_id}", "jobs@example.com", ["user@example.com"])
    _finish(log)


@task(name="rel.welcome")
def welcome(user_id: int) -> None:
    """B19: greet a user created in the caller's transaction."""
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.get(pk=user_id)
    log = _start("rel.welcome", key=user.username, payload={"user_id": user_id})
    _finish(log)


@task(name="rel.process_order", max_retries=0)
def process_order(order_id: int) -> None:
    """B20: the order must exist when the job runs (it was created in the same transaction)."""
    order = Order.objects.get(pk=order_id)
    log = _start("rel.process_order", key=order.name, payload={"order_id": order_id})
    _finish(log)


@debounced_task(
    name="rel.contended", debounce="250ms", debounce_max_wait="1s", debounce_key="c:{0}"
)
def contended(key: str, seq: int = 0) -> None:
    """B30: a debounced task raced by a producer while a worker drains the file."""
    log = _start("rel.contended", key=key, payload={"seq": seq})
    _finish(log)


@task(name="rel.plain")
def plain(seq: int) -> None:
    """B30: a plain job; each must run exactly once."""
    log = _start("rel.plain", key=str(seq), payload={"seq": seq})
    _finish(log)


@debounced_task(
    name="rel.slide",
    debounce="5m",
    debounce_max_wait="30m",
    debounce_key="slide:{0}",
    debounce_replace_payload=True,
)
def slide(key: str, version: str) -> None:
    """B19's slide rollback: a replace-payload window."""
    log = _start("rel.slide", key=key, payload={"version": version})
    _finish(log)
