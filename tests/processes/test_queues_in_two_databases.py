"""Queues routed to two PostgreSQL databases by a Django router (issue #23 item 2, decision 224).

The subprocesses run ``tests.settings_two_databases``: the test database as ``default``
and a second database of this test, ``queue_b``, with ``tests.queue_router.QueueRouter``
sending the jobs of queue ``sco_b`` there. Each step is a real ``manage.py`` process:
``migrate --database``, an enqueue through ``shell``, ``run_debounce_worker --burst
--database``, ``debounce_status --database``, and the Celery executor's dispatcher with
``--database`` beside a real ``celery worker``. The second database is read here with
psycopg (this process's settings have one alias).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection

from django_debounce.models import Job, TaskState
from tests.conftest import child_env
from tests.processes.celery_rig import CeleryRig
from tests.procs import Processes, processes, wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.postgres,
    pytest.mark.timeout(240),
]

SETTINGS = "tests.settings_two_databases"

ENQUEUE = """
import json
from tests.testapp.tasks_queue_databases import fails, in_a, in_b, rated, window
jobs = [in_a.delay(1), in_a.delay(2), in_b.delay(3), in_a.apply_async((4,), queue="sco_b"),
        rated.delay(5), rated.apply_async((6,), queue="sco_b"),
        window.delay("k"), window.delay("k"), fails.delay(7)]
print(json.dumps([[j.pk, j._state.db, j.queue] for j in jobs]))
"""


def _url(name: str) -> str:
    db = connection.settings_dict
    host, port = db.get("HOST") or "127.0.0.1", db.get("PORT") or 5432
    return f"postgresql://{db.get('USER') or 'postgres'}@{host}:{port}/{name}"


@pytest.fixture
def second_db() -> Iterator[str]:
    """Create the second database (``<test database>_qb``) empty; drop it afterwards."""
    name = f"{connection.settings_dict['NAME']}_qb"
    with psycopg.connect(_url("postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    yield name
    with psycopg.connect(_url("postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _rows(name: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(_url(name)) as conn:
        return conn.execute(sql).fetchall()


def _jobs_b(name: str) -> list[tuple[Any, ...]]:
    """(task, args, status, worker_id, result, enqueue_count) of every job in ``queue_b``."""
    return _rows(
        name,
        "SELECT task_name, args, status, worker_id, result, enqueue_count "
        "FROM django_debounce_job ORDER BY id",
    )


def _jobs_a() -> list[tuple[Any, ...]]:
    return list(
        Job.objects.filter(task_name__startswith="sco.")
        .order_by("pk")
        .values_list("task_name", "args", "status", "worker_id", "result", "enqueue_count")
    )


def _run(procs: Processes, name: str, *argv: str) -> str:
    """Run ``python -m django ARGV`` to its end; return its stdout (fail on a non-zero exit)."""
    proc = procs.start(name, ["-m", "django", *argv, "-v", "0"])
    assert proc.wait(timeout=120) == 0, proc.tail()
    return proc.stderr()  # stdout and stderr share the file


def _json(text: str) -> Any:
    """Parse the JSON a command printed after any other lines (its output shares stderr's file)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(("{", "[")))
    return json.loads("\n".join(lines[start:]))


@pytest.fixture
def procs(tmp_path, second_db: str) -> Iterator[Processes]:
    env = child_env(DJANGO_SETTINGS_MODULE=SETTINGS, DEBOUNCE_TEST_SECOND_DB=second_db)
    with processes(tmp_path, env) as group:
        yield group


def _enqueue(procs: Processes, second_db: str) -> list[list[Any]]:
    """Migrate ``queue_b``, enqueue the test's calls in a subprocess; return [id, alias, queue]."""
    _run(procs, "migrate", "migrate", "--database", "queue_b")
    tables = _rows(second_db, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    names = {t for (t,) in tables}
    assert {"django_debounce_job", "django_debounce_taskstate"} <= names
    assert not any(t.startswith(("auth_", "testapp_")) for t in names)  # allow_migrate
    out = _run(procs, "enqueue", "shell", "-c", ENQUEUE)
    return json.loads(out.strip().splitlines()[-1])


def test_jobs_of_each_queue_land_in_their_database_and_a_worker_serves_only_its_own(
    procs: Processes, second_db: str
) -> None:
    made = _enqueue(procs, second_db)
    assert [(alias, queue) for _pk, alias, queue in made] == [
        ("default", "sco_a"),
        ("default", "sco_a"),
        ("queue_b", "sco_b"),
        ("queue_b", "sco_b"),  # the call's queue= decides, not the task's
        ("default", "sco_a"),
        ("queue_b", "sco_b"),
        ("queue_b", "sco_b"),
        ("queue_b", "sco_b"),
        ("queue_b", "sco_b"),
    ]
    assert made[6][0] == made[7][0]  # the second call slid the window in queue_b
    ready = [("sco.a", [1], "READY", "", None, 1), ("sco.a", [2], "READY", "", None, 1)]
    assert _jobs_a() == [*ready, ("sco.rated", [5], "READY", "", None, 1)]
    assert _jobs_b(second_db) == [
        ("sco.b", [3], "READY", "", None, 1),
        ("sco.a", [4], "READY", "", None, 1),
        ("sco.rated", [6], "READY", "", None, 1),
        ("sco.window", ["k"], "READY", "", None, 2),
        ("sco.fails", [7], "READY", "", None, 1),
    ]

    status = _json(
        _run(procs, "status_b", "debounce_status", "--database", "queue_b", "--format", "json")
    )
    assert [(q["queue"], q["ready"], q["due"]) for q in status["queues"]] == [("sco_b", 5, 4)]
    assert [(w["task_name"], w["key"], w["calls"]) for w in status["windows"]] == [
        ("sco.window", "w:k", 2)
    ]

    _run(
        procs,
        "worker_b",
        "run_debounce_worker",
        "--burst",
        "--database",
        "queue_b",
        "--worker-id",
        "wb",
    )
    assert _jobs_b(second_db) == [
        ("sco.b", [3], "SUCCESSFUL", "wb", 3, 1),
        ("sco.a", [4], "SUCCESSFUL", "wb", 4, 1),
        ("sco.rated", [6], "SUCCESSFUL", "wb", 6, 1),
        ("sco.window", ["k"], "READY", "", None, 2),  # its window is an hour long
        ("sco.fails", [7], "FAILED", "wb", None, 1),
    ]
    letters = "SELECT task_name, args, retry_job_id IS NOT NULL FROM django_debounce_deadletter"
    assert _rows(second_db, letters) == [("sco.fails", [7], False)]
    # The dead letters of queue_b are retried there (the new job too: the router's choice).
    out = _run(procs, "retry_b", "retry_dead_letters", "--database", "queue_b")
    assert "retried 1, " in out, out
    assert _rows(second_db, letters) == [("sco.fails", [7], True)]
    assert _jobs_b(second_db)[-1] == ("sco.fails", [7], "READY", "", None, 1)
    assert _jobs_a() == [*ready, ("sco.rated", [5], "READY", "", None, 1)]  # untouched
    # Flow control state is per database: the rate limit's bucket row is queue_b's.
    assert _rows(second_db, "SELECT task_name FROM django_debounce_taskstate") == [("sco.rated",)]
    assert not TaskState.objects.filter(task_name="sco.rated").exists()

    _run(procs, "worker_a", "run_debounce_worker", "--burst", "--worker-id", "wa")
    assert _jobs_a() == [
        ("sco.a", [1], "SUCCESSFUL", "wa", 1, 1),
        ("sco.a", [2], "SUCCESSFUL", "wa", 2, 1),
        ("sco.rated", [5], "SUCCESSFUL", "wa", 5, 1),
    ]
    assert TaskState.objects.filter(task_name="sco.rated").count() == 1  # a bucket of its own


def test_an_unknown_database_alias_is_refused_before_anything_runs(procs: Processes) -> None:
    proc = procs.start(
        "bad", ["-m", "django", "run_debounce_worker", "--burst", "--database", "nope"]
    )
    assert proc.wait(timeout=60) == 1
    assert "--database: using='nope' is not a database alias" in proc.stderr()


@pytest.mark.slow
def test_the_celery_executor_runs_each_database_s_jobs_from_its_own_dispatcher(
    procs: Processes, second_db: str
) -> None:
    rig = CeleryRig("redis", procs, DEBOUNCE_TEST_EXECUTOR="celery")
    rig.env.update(DJANGO_SETTINGS_MODULE=SETTINGS, DEBOUNCE_TEST_SECOND_DB=second_db)
    procs.env = rig.env
    try:
        _enqueue(procs, second_db)
        rig.worker()
        _run(
            procs,
            "dispatch_b",
            "run_debounce_worker",
            "--dispatch-only",
            "--burst",
            "--database",
            "queue_b",
        )
        wait_for(
            lambda: (
                [row[2] for row in _jobs_b(second_db)] == ["SUCCESSFUL"] * 3 + ["READY", "FAILED"]
            ),
            timeout=60,
            what=lambda: f"queue_b's jobs to run on Celery: {_jobs_b(second_db)}",
        )
        assert [(r[0], r[1], r[4]) for r in _jobs_b(second_db)][:3] == [
            ("sco.b", [3], 3),
            ("sco.a", [4], 4),
            ("sco.rated", [6], 6),
        ]
        assert all(r[3].startswith("celery:") for r in _jobs_b(second_db)[:3])
        assert [row[2] for row in _jobs_a()] == ["READY"] * 3  # no dispatcher of default yet
        _run(procs, "dispatch_a", "run_debounce_worker", "--dispatch-only", "--burst")
        wait_for(
            lambda: [row[2] for row in _jobs_a()] == ["SUCCESSFUL"] * 3,
            timeout=60,
            what=lambda: f"default's jobs to run on Celery: {_jobs_a()}",
        )
    finally:
        procs.kill_all()
        rig.close()
