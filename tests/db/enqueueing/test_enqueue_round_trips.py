"""What an enqueue sends inside the caller's transaction: a savepoint only where needed (decision 205).

A plain call and a trailing debounced call send one statement (PostgreSQL and
SQLite: the ``INSERT`` or the ``INSERT … ON CONFLICT``); on MariaDB the
debounced call is a locking read and its write, and a coalescing or merging
call takes no savepoint either (InnoDB rolls a failed statement back alone).
What keeps its savepoint: coalescing and merging on PostgreSQL (a lost insert
race there aborts the transaction), ``depends_on`` (several rows), and a
PostgreSQL connection's calls until it has written a job once (a missing table).
Each test counts the statements with ``CaptureQueriesContext`` on the real
database and checks the rows.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from django_debounce import debounced_task, task
from django_debounce.exceptions import PayloadError
from django_debounce.models import Job, JobDependency
from tests.conftest import T
from tests.procs import in_thread
from tests.testapp.models import Order

pytestmark = pytest.mark.django_db(transaction=True)

WINDOW = {"debounce": "5m", "debounce_max_wait": "1h"}


@task(name="rt.plain", max_retries=0)
def plain(n: object) -> None:
    """A plain job."""


@debounced_task(name="rt.window", debounce_key="w:{0}", max_retries=0, **WINDOW)
def window(key: str, v: int = 0) -> None:
    """A trailing window per key."""


@task(name="rt.coalesced", unique_key="c:{0}", max_retries=0)
def coalesced(n: int) -> None:
    """Coalesced per ``n``."""


def _keep_last(stored: object, new: object) -> object:
    return new


@debounced_task(
    name="rt.merged", debounce_key="m:{0}", debounce_merge=_keep_last, max_retries=0, **WINDOW
)
def merged(key: str, v: int = 0) -> None:
    """A window whose calls merge their payloads."""


def sent(call: object) -> list[str]:
    """Run ``call()`` and return the SQL it sent on the default connection."""
    with CaptureQueriesContext(connection) as captured:
        call()  # type: ignore[operator]
    return [q["sql"] for q in captured.captured_queries]


def savepoints(statements: list[str]) -> list[str]:
    return [s for s in statements if "SAVEPOINT" in s.upper()]


@pytest.fixture
def written() -> None:
    """This connection has written a job (the tables are there): bare calls from now on."""
    plain.delay("warm-up")


def test_a_plain_call_in_the_callers_transaction_is_one_insert(clock, written):
    with transaction.atomic():
        Order.objects.create(name="a")
        statements = [sent(lambda n=n: plain.delay(f"n{n}")) for n in range(3)]
    assert all(len(s) == 1 and s[0].startswith("INSERT") for s in statements), statements
    assert sorted(Job.objects.filter(task_name="rt.plain").values_list("args", flat=True)) == [
        ["n0"],
        ["n1"],
        ["n2"],
        ["warm-up"],
    ]


def test_a_debounced_call_in_the_callers_transaction_takes_no_savepoint(clock, written):
    with transaction.atomic():
        opened = sent(lambda: window.delay("k", v=1))
        clock(seconds=60)
        slid = sent(lambda: window.delay("k", v=2))
    assert savepoints(opened + slid) == []
    if connection.vendor == "mysql":  # a locking read, then the INSERT / the UPDATE
        assert [len(opened), len(slid)] == [2, 2]
    else:  # the one INSERT … ON CONFLICT (window_key) DO UPDATE
        assert [len(opened), len(slid)] == [1, 1]
        assert "ON CONFLICT" in opened[0] and "ON CONFLICT" in slid[0]
    job = Job.objects.get(task_name="rt.window")
    assert (job.enqueue_count, job.run_at, job.max_run_at) == (
        2,
        T + timedelta(seconds=60, minutes=5),
        T + timedelta(hours=1),
    )


def test_coalescing_and_merging_keep_their_savepoint_only_on_postgresql(clock, written):
    with transaction.atomic():
        first = coalesced.delay(1)
        again = sent(lambda: coalesced.delay(1))
        merged.delay("k", v=1)
        merging = sent(lambda: merged.delay("k", v=2))
    pairs = 2 if connection.vendor == "postgresql" else 0  # SAVEPOINT + RELEASE
    assert (len(savepoints(again)), len(savepoints(merging))) == (pairs, pairs)
    assert list(Job.objects.filter(task_name="rt.coalesced").values_list("pk", flat=True)) == [
        first.pk
    ]
    assert Job.objects.get(task_name="rt.merged").kwargs == {"v": 2}


def test_a_call_with_dependencies_keeps_its_savepoint(clock, written):
    dependency = plain.delay("dep")
    with transaction.atomic():
        statements = sent(lambda: plain.apply_async(("after",), depends_on=[dependency]))
    assert len(savepoints(statements)) == 2
    job = Job.objects.filter(task_name="rt.plain").latest("pk")
    assert job.args == ["after"]
    edges = JobDependency.objects.values_list("job_id", "dependency_id")
    assert list(edges) == [(job.pk, dependency.pk)]


def test_rolling_back_the_callers_transaction_undoes_a_bare_insert_and_slide(clock, written):
    window.delay("r", v=1)
    with pytest.raises(RuntimeError), transaction.atomic():
        clock(seconds=30)
        assert savepoints(sent(lambda: window.delay("r", v=2))) == []
        assert savepoints(sent(lambda: plain.delay("gone"))) == []
        raise RuntimeError
    job = Job.objects.get(task_name="rt.window")
    assert (job.enqueue_count, job.run_at) == (1, T + timedelta(minutes=5))
    assert ["gone"] not in Job.objects.values_list("args", flat=True)


def test_a_refused_call_leaves_the_callers_transaction_usable(clock, written):
    with transaction.atomic():
        Order.objects.create(name="before")
        with pytest.raises(PayloadError):
            sent(lambda: plain.delay({"bad": object()}))
        with pytest.raises(PayloadError):
            window.delay("p", v=object())
        Order.objects.create(name="after")
        plain.delay("good")
    assert sorted(Order.objects.values_list("name", flat=True)) == ["after", "before"]
    assert sorted(Job.objects.values_list("args", flat=True)) == [["good"], ["warm-up"]]


@pytest.mark.postgres
def test_a_new_postgresql_connection_takes_the_savepoint_until_it_has_written():
    def fresh_connection() -> list[list[str]]:
        with transaction.atomic():
            return [sent(lambda n=n: plain.delay(n)) for n in range(2)]

    first, second = in_thread(fresh_connection)
    assert [len(savepoints(first)), len(savepoints(second))] == [2, 0]
    assert Job.objects.filter(task_name="rt.plain").count() == 2


@pytest.mark.row_locks
def test_a_lost_race_in_the_callers_transaction_slides_the_winners_window():
    """The winner's window is uncommitted when the call writes; the call waits, then slides it."""
    window.delay("warm-up")
    opened, release = threading.Event(), threading.Event()

    def winner() -> int:
        with transaction.atomic():
            job = window.delay("race", v=1)
            opened.set()
            release.wait(30)
        return job.pk

    thread_result: dict[str, int] = {}

    def run_winner() -> None:
        try:
            thread_result["pk"] = winner()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run_winner, daemon=True)
    thread.start()
    assert opened.wait(30)
    with transaction.atomic():
        Order.objects.create(name="kept")
        threading.Timer(0.3, release.set).start()  # commit while the call waits on the key
        statements = sent(lambda: window.delay("race", v=2))
        loser = window.delay("race", v=3)
    thread.join(30)
    assert savepoints(statements) == []
    job = Job.objects.get(debounce_key="w:race")
    assert (job.pk, job.enqueue_count, loser.outcome) == (thread_result["pk"], 3, "debounced")
    assert list(Order.objects.values_list("name", flat=True)) == ["kept"]
