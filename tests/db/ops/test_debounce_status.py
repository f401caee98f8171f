"""``manage.py debounce_status`` (issue #11, item 2): its numbers are the database's."""

from __future__ import annotations

import datetime as dt
import io
import json

import pytest
from django.core.management import call_command
from django.db.models import Min

from django_debounce import registry
from django_debounce.models import Job, TaskState
from tests.conftest import T
from tests.factories import DeadLetterFactory, JobFactory
from tests.testapp import tasks_flow

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _forget_registered_tasks():
    """Unregister what :func:`seed` registered: a gated task left behind sends every later
    test's claim through the gate (its extra queries)."""
    before = set(registry.all_tasks())
    yield
    for name in set(registry.all_tasks()) - before:
        registry.unregister(name)


Status = Job.Status
S = dt.timedelta(seconds=1)


def seed() -> None:
    """Jobs in every state on two queues, dead letters of three kinds, flow-control rows."""
    for seconds in (5, 30, 0):
        JobFactory(run_at=T - seconds * S)  # due
    JobFactory.create_batch(2, run_at=T + 60 * S)  # READY, not due
    for n, calls in ((1, 7), (2, 3), (3, 12)):
        JobFactory(
            task_name="docs.rebuild",
            debounce_key=f"docs:{n}",
            window_key=f"w{n}",
            key_hash=f"k{n}",
            enqueue_count=calls,
            opened_at=T - 100 * S,
            run_at=T + n * 10 * S,
            max_run_at=T + 20 * S,
        )
    live = {"status": Status.RUNNING, "started_at": T - 3 * S, "attempts": 1}
    JobFactory(worker_id="w1", lease_expires_at=T + 50 * S, **live)
    JobFactory(worker_id="w2", lease_expires_at=T - 1 * S, **live)  # lapsed: not a live worker
    JobFactory(queue="mail", run_at=T - 120 * S)
    JobFactory(queue="mail", worker_id="w1", lease_expires_at=T + 40 * S, **live)
    JobFactory(queue="mail", worker_id="w3", lease_expires_at=T + 10 * S, **live)
    for status, seconds, queue in (
        (Status.SUCCESSFUL, 10, "default"),
        (Status.SUCCESSFUL, 59, "default"),
        (Status.FAILED, 50, "mail"),
        (Status.SUCCESSFUL, 70, "default"),  # over a minute ago
        (Status.CANCELLED, 5, "default"),  # never ran
        (Status.EXPIRED, 5, "mail"),  # never ran
    ):
        JobFactory(status=status, queue=queue, finished_at=T - seconds * S)
    for kind_reason, minutes in (
        ("failed: boom", 10),
        ("failed: boom", 120),
        ("shed: rate limit", 30),
        ("codel: sojourn", 3),
        ("failed: old", 60 * 25),  # over a day ago
    ):
        DeadLetterFactory(
            reason=kind_reason,
            created_at=T - minutes * 60 * S,
            job__finished_at=T - dt.timedelta(days=2),
        )
    tasks_flow.register()
    TaskState.objects.create(
        task_name="flow.guarded", breaker_state="open", failures=3, opened_at=T - 20 * S
    )
    TaskState.objects.create(task_name="flow.rate", tokens=0.0, tokens_at=T - 0.05 * S)
    TaskState.objects.create(task_name="b38.call_api", tokens=5.0, tokens_at=T)  # not exhausted


def status_json(**options) -> dict:
    out = io.StringIO()
    call_command("debounce_status", format="json", stdout=out, **options)
    return json.loads(out.getvalue())


def test_json_numbers_equal_counts_taken_from_the_database(clock):
    seed()
    status = status_json()
    jobs = Job.objects.all()
    for queue in ("default", "mail"):
        row = next(q for q in status["queues"] if q["queue"] == queue)
        mine = jobs.filter(queue=queue)
        due = mine.filter(status=Status.READY, run_at__lte=T)
        oldest = due.aggregate(m=Min("run_at"))["m"]
        assert row == {
            "queue": queue,
            "ready": mine.filter(status=Status.READY).count(),
            "due": due.count(),
            "running": mine.filter(status=Status.RUNNING).count(),
            "oldest_due_age": (T - oldest).total_seconds(),
            "runs_last_minute": mine.filter(
                status__in=[Status.SUCCESSFUL, Status.FAILED],
                finished_at__gte=T - 60 * S,
            ).count(),
        }
    # The same numbers, written out: the seed above, counted by hand.
    assert [(q["queue"], q["ready"], q["due"], q["running"]) for q in status["queues"]] == [
        ("default", 8, 3, 2),
        ("mail", 1, 1, 2),
    ]
    assert [(q["oldest_due_age"], q["runs_last_minute"]) for q in status["queues"]] == [
        (30.0, 2),
        (120.0, 1),
    ]
    assert [(w["key"], w["calls"], w["deadline"]) for w in status["windows"]] == [
        ("docs:3", 12, (T + 30 * S).isoformat()),
        ("docs:1", 7, (T + 10 * S).isoformat()),
        ("docs:2", 3, (T + 20 * S).isoformat()),
    ]
    assert status["dead_letters"] == {
        "last_hour": {"codel": 1, "failure": 1, "shed": 1},
        "last_day": {"codel": 1, "failure": 2, "shed": 1},
    }
    assert [(b["task_name"], b["state"], b["reset_due_at"]) for b in status["breakers"]] == [
        ("flow.guarded", "open", (T + 40 * S).isoformat())
    ]
    assert [(b["task_name"], b["tokens"], b["capacity"]) for b in status["buckets"]] == [
        ("flow.rate", 0.5, 10)
    ]
    assert [(w["worker_id"], w["running"]) for w in status["workers"]] == [("w1", 2), ("w3", 1)]
    assert status["now"] == T.isoformat()


def test_top_limits_the_windows_listed(clock):
    seed()
    assert [w["calls"] for w in status_json(top=1)["windows"]] == [12]


def test_text_fits_80_columns_and_shows_the_numbers(clock):
    seed()
    out = io.StringIO()
    call_command("debounce_status", stdout=out)
    text = out.getvalue()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert any(line.split()[:6] == ["default", "8", "3", "2", "30s", "2"] for line in lines)
    assert any(line.split()[:6] == ["mail", "1", "1", "2", "2m00s", "1"] for line in lines)
    assert "live workers (RUNNING jobs under a live lease): 2" in text
    assert "open circuit breakers: 1" in text
    assert any(line.split()[:3] == ["failure", "1", "2"] for line in lines)


def test_empty_database(clock):
    status = status_json()
    assert status["queues"] == [] and status["windows"] == [] and status["workers"] == []
    out = io.StringIO()
    call_command("debounce_status", stdout=out)
    assert "(no READY or RUNNING jobs" in out.getvalue()


@pytest.mark.parametrize("every", ["inf", "nan", "0.0001", "0.49", "86401", "-2", "soon"])
def test_watch_interval_outside_half_a_second_to_a_day_is_refused(every):
    """``--watch inf`` was an OverflowError; ``--watch 0.0001`` hammered the database."""
    from django.core.management import CommandError

    with pytest.raises(CommandError) as caught:
        call_command("debounce_status", watch=every)
    assert str(caught.value).startswith(f"argument --watch: {every!r} ")


def test_watch_json_writes_one_compact_document_per_line(clock, monkeypatch):
    """JSON Lines under ``--watch`` (decision 133): each line parses on its own."""
    from django_debounce.management.commands import debounce_status

    seed()
    naps = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(debounce_status.time, "sleep", sleep)
    out = io.StringIO()
    call_command("debounce_status", format="json", watch="0.5", stdout=out)
    lines = out.getvalue().splitlines()
    assert naps == [0.5, 0.5]
    assert len(lines) == 3 and lines[2] == ""  # Ctrl-C ends the output with a newline
    documents = [json.loads(line) for line in lines[:2]]
    assert [d["queues"][0]["ready"] for d in documents] == [8, 8]


# -- token buckets kept in Redis (DEBOUNCE_REDIS; decisions 104, 139) ---------------------------


def _rated_in_redis(settings, url: str) -> list[int]:
    from django_debounce import task

    caches = {alias: dict(config) for alias, config in settings.CACHES.items()}
    caches["redis"]["LOCATION"] = url
    settings.CACHES = caches
    settings.DEBOUNCE_REDIS = "redis"
    task(name="st.redis_rate", rate_limit="2/m")(lambda n: None)
    ids = [JobFactory(task_name="st.redis_rate", args=[i], run_at=T).pk for i in range(3)]
    from django_debounce.claim.claiming import claim_jobs

    claimed = claim_jobs(worker_id="w", limit=10, lease=dt.timedelta(minutes=1))
    assert [job.pk for job in claimed] == ids[:2]
    return ids


def test_buckets_kept_in_redis_are_shown_from_redis(settings, clock, tmp_path):
    from tests.redis_support import private_redis

    with private_redis(tmp_path) as server:
        _rated_in_redis(settings, server.url)
        assert not TaskState.objects.filter(task_name="st.redis_rate").exists(), "Redis only"
        clock(seconds=15)
        status = status_json()
    assert status["buckets"] == [
        {
            "task_name": "st.redis_rate",
            "tokens": 0.5,
            "capacity": 2,
            "next_token_at": (T + 30 * S).isoformat(),
        }
    ]


def test_while_redis_is_down_the_database_bucket_is_shown(settings, clock, tmp_path, monkeypatch):
    from django_debounce.flow import redis_buckets
    from tests.redis_support import private_redis

    monkeypatch.setattr(redis_buckets, "PROBE_INTERVAL", 0.0)
    with private_redis(tmp_path) as server:
        _rated_in_redis(settings, server.url)
        server.stop()
        TaskState.objects.create(task_name="st.redis_rate", tokens=0.0, tokens_at=T)
        clock(seconds=6)
        status = status_json()
    assert [(b["task_name"], b["tokens"]) for b in status["buckets"]] == [("st.redis_rate", 0.2)]


@pytest.mark.parametrize("top", ["99999999999999999999", "10001", "0", "-1", "abc"])
def test_top_outside_1_to_10000_ends_in_a_usage_error_with_exit_status_2(top, capsys):
    """``--top 99999999999999999999`` was a traceback: PostgreSQL ``DataError: bigint out
    of range``, MariaDB ``ProgrammingError 1064`` (issue #17 follow-up 3)."""
    from django_debounce.management.commands.debounce_status import Command

    with pytest.raises(SystemExit) as exited:
        Command().run_from_argv(["manage.py", "debounce_status", "--top", top])

    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"debounce_status: error: argument --top: {top!r} " in err
    assert "Traceback" not in err


def test_top_from_call_command_is_held_to_the_same_bound():
    from django.core.management import CommandError

    with pytest.raises(CommandError) as caught:
        call_command("debounce_status", top=10**20)
    assert str(caught.value) == f"argument --top: '{10**20}' must be at most 10000"


def test_top_10000_lists_every_window(clock):
    seed()
    assert len(status_json(top=10_000)["windows"]) == 3
