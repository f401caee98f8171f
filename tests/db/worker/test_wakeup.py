"""The wake-up's pieces in one process: the NOTIFY triggers, the next deadline, the mode, the checks.

Decisions 80–84; the end-to-end latency tests are tests/processes/worker/test_wakeup.py.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

import pytest
from django.core.checks import run_checks
from django.db import connection, transaction
from django.utils import timezone

from django_debounce.models import Job
from django_debounce.worker import wakeup
from django_debounce.worker.deadlines import next_run_at
from django_debounce.worker.wakeup_modes import NOTIFY_TRIGGERS as TRIGGERS
from django_debounce.worker.wakeup_modes import wakeup_mode
from tests.testapp.tasks_wakeup import stamp

Status = Job.Status


# -- the next deadline (every database) ---------------------------------------------------------


@pytest.mark.django_db
def test_next_run_at_is_the_earliest_future_ready_run_at_in_the_span(clock):
    now = clock()
    stamp.apply_async(args=["a"], countdown=30)
    stamp.apply_async(args=["b"], countdown=2)
    stamp.apply_async(args=["c"], countdown=3, queue="other")
    stamp.delay("due-now")  # due: not a deadline to wait for
    done = stamp.apply_async(args=["d"], countdown=1)
    Job.objects.filter(pk=done.pk).update(status=Status.SUCCESSFUL)
    assert next_run_at(now, within=timedelta(seconds=10)) == now + timedelta(seconds=2)
    assert next_run_at(now, within=timedelta(seconds=1)) is None
    assert next_run_at(now, within=timedelta(seconds=10), queues=["other"]) == now + timedelta(
        seconds=3
    )
    assert next_run_at(now, within=timedelta(seconds=10), queues=["nothing"]) is None


@pytest.mark.django_db
def test_idle_timeout_sleeps_until_the_deadline_capped_by_the_poll(clock):
    clock()
    assert wakeup.idle_timeout(5.0, queues=[], using="default") == 5.0
    stamp.apply_async(args=["soon"], countdown=1.25)
    assert wakeup.idle_timeout(5.0, queues=[], using="default") == pytest.approx(
        1.25 + wakeup.DEADLINE_SLACK
    )
    assert wakeup.idle_timeout(0.5, queues=[], using="default") == 0.5


@pytest.mark.django_db
def test_due_but_held_back_jobs_do_not_make_an_idle_worker_spin(clock):
    """A due job the claim does not take (here: an unmet dependency) is no deadline."""
    clock()
    first = stamp.apply_async(args=["first"], countdown=60)
    stamp.apply_async(args=["held"], depends_on=[first.pk])
    assert wakeup.idle_timeout(2.0, queues=[], using="default") == 2.0


@pytest.mark.django_db
def test_the_deadline_query_on_a_queue_subset_never_wakes_late(clock):
    """More than SCAN_LIMIT rows of other queues first: the last one read is the bound."""
    now = clock()
    from django_debounce.worker.deadlines import SCAN_LIMIT

    for i in range(SCAN_LIMIT + 5):
        stamp.apply_async(args=[f"o{i}"], countdown=1 + i / 100, queue="busy")
    stamp.apply_async(args=["mine"], countdown=5, queue="mine")
    bound = next_run_at(now, within=timedelta(seconds=10), queues=["mine"])
    assert bound == now + timedelta(seconds=1 + (SCAN_LIMIT - 1) / 100)
    assert bound <= now + timedelta(seconds=5)


# -- the mode -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_wakeup_mode(settings):
    postgres = connection.vendor == "postgresql"
    settings.DEBOUNCE_WAKEUP = "auto"
    settings.DEBOUNCE_REDIS = None
    assert wakeup_mode("default") == ("notify" if postgres else "poll")
    settings.DEBOUNCE_WAKEUP = "poll"
    assert wakeup_mode("default") == "poll"
    settings.DEBOUNCE_WAKEUP = "redis"
    assert wakeup_mode("default") == "poll"  # no DEBOUNCE_REDIS (E022)
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "r": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://127.0.0.1:1/0"},
    }
    settings.DEBOUNCE_REDIS = "r"
    assert wakeup_mode("default") == "redis"
    settings.DEBOUNCE_WAKEUP = "auto"
    assert wakeup_mode("default") == ("notify" if postgres else "redis")


# -- the checks -----------------------------------------------------------------------------------


def _ids(**kwargs):
    return sorted(
        m.id
        for m in run_checks(**kwargs)
        if m.id
        and m.id.startswith("django_debounce.")
        and m.id[-3:]
        in {"020", "021", "022", "035", "036", "037", "038", "039", "010", "011", "012"}
    )


def test_wakeup_checks(settings):
    assert _ids() == []
    settings.DEBOUNCE_WAKEUP = "listen"
    assert _ids() == ["django_debounce.E020"]
    settings.DEBOUNCE_WAKEUP = "redis"
    assert _ids() == ["django_debounce.E022"]
    settings.DEBOUNCE_WAKEUP = "auto"
    settings.DEBOUNCE_REDIS = "missing"
    assert _ids() == ["django_debounce.E036"]
    settings.DEBOUNCE_REDIS = 3
    assert _ids() == ["django_debounce.E035"]
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    settings.DEBOUNCE_REDIS = "default"
    assert _ids() == ["django_debounce.E038"]
    settings.CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",
            "OPTIONS": {"CLIENT_CLASS": "django_redis.client.ShardClient"},
        }
    }
    assert _ids() == ["django_debounce.E039"]
    settings.DEBOUNCE_REDIS = None
    settings.DEBOUNCE_WAKEUP = "notify"
    if connection.vendor == "postgresql":
        assert _ids() == []
        settings.DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
        try:
            assert _ids() == ["django_debounce.W012"]
        finally:
            settings.DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = False
    else:
        assert _ids() == ["django_debounce.E021"]


# -- the triggers (PostgreSQL) ------------------------------------------------------------------


class Listener:
    """LISTEN on the wake-up channel on a connection of its own; collect payloads."""

    def __init__(self) -> None:
        import psycopg

        params = wakeup._listen_params("default")
        self.conn = psycopg.Connection.connect(**params, autocommit=True)
        self.conn.execute(f"LISTEN {wakeup.CHANNEL}")

    def drain(self, wait: float = 0.3) -> list[str]:
        return [n.payload for n in self.conn.notifies(timeout=wait)]

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def listener():
    if connection.vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's")
    box = Listener()
    yield box
    box.close()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_triggers_notify_new_ready_jobs_at_commit_once_per_queue(listener):
    stamp.delay("one")
    assert listener.drain() == ["default"]
    with transaction.atomic():
        for i in range(20):
            stamp.delay(f"bulk-{i}")
        stamp.apply_async(args=["x"], queue="other")
        assert listener.drain(0.1) == []  # nothing before the commit
    assert sorted(listener.drain()) == ["default", "other"]  # collapsed per transaction
    with transaction.atomic():
        stamp.delay("rolled back")
        transaction.set_rollback(True)
    assert listener.drain() == []


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_triggers_notify_an_earlier_deadline_or_a_return_to_ready_not_a_later_one(listener):
    job = stamp.apply_async(args=["later"], countdown=600)
    assert listener.drain() == ["default"]
    Job.objects.filter(pk=job.pk).update(run_at=job.run_at + timedelta(seconds=60))  # a slide
    assert listener.drain() == []
    Job.objects.filter(pk=job.pk).update(run_at=timezone.now())  # "run now"
    assert listener.drain() == ["default"]
    Job.objects.filter(pk=job.pk).update(status=Status.RUNNING)
    assert listener.drain() == []
    Job.objects.filter(pk=job.pk).update(status=Status.READY)  # a retry, a put-back job
    assert listener.drain() == ["default"]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_listener_thread_wakes_the_worker_event_for_its_queues_only():
    event = threading.Event()
    waker = wakeup.PostgresListener(event, queues=["mine"], using="default")
    try:
        assert waker.connected.wait(10)
        event.clear()
        stamp.apply_async(args=["x"], queue="theirs")
        assert not event.wait(0.5)
        stamp.apply_async(args=["y"], queue="mine")
        assert event.wait(5)
    finally:
        waker.stop()
    assert not waker.is_alive()


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_worker_without_the_notify_triggers_warns_once_and_polls(caplog):
    """Migration 0007 not applied: LISTEN would hear nothing, so the worker says so and polls."""
    with caplog.at_level(logging.INFO, logger="django_debounce.wakeup"):
        waker = wakeup.start_wakeup(threading.Event(), queues=[], using="default")
        waker.stop()
    assert waker.listens, "with the triggers it listens"
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    caplog.clear()
    with connection.cursor() as cursor:  # undone with the test's transaction (DDL is transactional)
        for name in TRIGGERS:
            cursor.execute(f"DROP TRIGGER {name} ON django_debounce_job")
    with caplog.at_level(logging.INFO, logger="django_debounce.wakeup"):
        waker = wakeup.start_wakeup(threading.Event(), queues=[], using="default")
    waker.stop()
    assert not waker.listens
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        (
            "WARNING",
            "wake-up: polling, not LISTEN/NOTIFY: database 'default' lacks the triggers of "
            "migration django_debounce.0007_wakeup_notify (run manage.py migrate django_debounce)",
        ),
        ("INFO", "wake-up: poll"),
    ]


@pytest.mark.postgres
@pytest.mark.django_db
def test_w011_only_when_migration_0007_is_applied_and_its_triggers_are_gone():
    def w011() -> list[str]:
        found = run_checks(databases=["default"])
        return [m.hint for m in found if m.id == "django_debounce.W011"]

    assert w011() == []
    with connection.cursor() as cursor:  # all undone with the test's transaction
        for name in TRIGGERS:
            cursor.execute(f"DROP TRIGGER {name} ON django_debounce_job")
        (hint,) = w011()
        assert "re-apply it with manage.py migrate django_debounce 0006" in hint
        cursor.execute(
            "DELETE FROM django_migrations WHERE app = 'django_debounce' AND name = %s",
            ["0007_wakeup_notify"],
        )
    assert w011() == [], "0007 not applied yet (as during migrate): nothing to warn about"


# -- the Redis publisher (a private redis-server) ------------------------------------------------


@pytest.fixture
def redis_wakeup(settings):
    from tests.redis_server import running

    for server in running():
        settings.CACHES = {
            "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
            "wake": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": server.url},
        }
        settings.DEBOUNCE_REDIS = "wake"
        settings.DEBOUNCE_WAKEUP = "redis"
        from django_debounce.worker.wakeup_redis import CHANNEL, redis_client

        pubsub = redis_client("wake").pubsub()
        pubsub.subscribe(CHANNEL)
        assert pubsub.get_message(timeout=5)["type"] == "subscribe"  # subscribed before enqueues

        def received(wait: float = 0.3, pubsub=pubsub) -> list[str]:
            got = []
            while (message := pubsub.get_message(timeout=wait)) is not None:
                got.append(message["data"].decode())
            return got

        yield received
        pubsub.close()


@pytest.mark.django_db(transaction=True)
def test_enqueues_publish_after_commit_once_per_queue_and_transaction(redis_wakeup):
    stamp.delay("a")
    stamp.delay("b")
    assert redis_wakeup() == ["default", "default"]  # autocommit: each at once
    with transaction.atomic():
        for i in range(10):
            stamp.delay(f"bulk-{i}")
        stamp.apply_async(args=["o"], queue="other")
        assert redis_wakeup(0.1) == []  # nothing before the commit
    assert sorted(redis_wakeup()) == ["default", "other"]
    with transaction.atomic():
        stamp.delay("rolled back")
        transaction.set_rollback(True)
    assert redis_wakeup() == []
    with transaction.atomic():
        try:
            with transaction.atomic():  # a savepoint whose callback is discarded
                stamp.delay("inner")
                raise RuntimeError
        except RuntimeError:
            pass
        stamp.delay("outer")  # registers its own callback again
    assert redis_wakeup() == ["default"]


@pytest.mark.django_db(transaction=True)
def test_a_debounce_redis_naming_a_missing_alias_is_one_warning_not_a_traceback_per_enqueue(
    settings, caplog, monkeypatch
):
    from django_debounce.worker import wakeup_redis

    monkeypatch.setattr(wakeup_redis, "_publisher", wakeup_redis._Publisher())
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    settings.DEBOUNCE_REDIS = "wake-typo"
    settings.DEBOUNCE_WAKEUP = "redis"
    with caplog.at_level("DEBUG", logger="django_debounce"):
        for i in range(5):
            stamp.delay(f"t{i}")
    assert Job.objects.count() == 5, "the enqueues are unaffected"
    lines = [r for r in caplog.records if r.levelno >= 30]
    assert [(r.name, r.levelname, r.exc_info) for r in lines] == [
        ("django_debounce.wakeup", "WARNING", None)
    ]
    assert (
        lines[0]
        .getMessage()
        .startswith(
            "Redis wake-up: DEBOUNCE_REDIS='wake-typo' gives no Redis connection "
            "(InvalidCacheBackendError: "
        )
    )
    assert lines[0].getMessage().endswith("Run `manage.py check` (django_debounce.E036-E039)")
