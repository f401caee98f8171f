"""Results the codec cannot store are stored as a short repr, never a rerun (issue #17 item 6).

Decisions 3, 31 and 149: whatever a task returns, recording its success never
raises. Before, a dict with a tuple key made the fallback itself raise
(``TypeError: unhashable type: 'list'``), and a value whose ``__iter__`` or
``__getattribute__`` raises escaped the codec: the job stayed RUNNING, its
lease lapsed, it ran 3 times and ended FAILED with a lease-expired dead letter.
Each path that stores a result is covered: ``record_success`` (a success
written at once), the batched write (``SuccessBatch``), and the Celery task.
"""

from __future__ import annotations

import datetime as dt
import re

import pytest

from django_debounce import enqueue
from django_debounce.claim.claiming import claim_jobs
from django_debounce.contrib.celery import handoff
from django_debounce.contrib.celery.tasks import run_handoff_message
from django_debounce.models import DeadLetter, Job
from django_debounce.run import outcomes
from django_debounce.run.storable import storable_result
from django_debounce.run.success_batches import SuccessBatch
from tests.testapp.models import CallLog
from tests.testapp.tasks_celery import tuple_key_result
from tests.testapp.tasks_storable import ODD_RESULTS

pytestmark = pytest.mark.django_db

Status = Job.Status
LEASE = dt.timedelta(seconds=60)

#: What each of ``ODD_RESULTS`` is stored as: its short repr (a pattern where it holds an address).
STORED = {
    "tuple_key": "{(1, 2): 'pair', 'n': 1}",
    "int_key": "{1: 'one'}",
    "nested_tuple_key": "[{'ok': {('a',): None}}]",
    "iter_raises": "[1, 2]",  # list.__repr__ does not call __iter__
    "iter_exits": "{'rows': [1]}",
    "no_attributes": "<NoAttributes>",
    "repr_raises": re.compile(r"\{\(0,\): <ReprRaises instance at 0x[0-9a-f]+>\}"),
    "repr_interrupts": "<unrepresentable ReprInterrupts>",
}


def _stored_as(kind: str, stored: object) -> bool:
    expected = STORED[kind]
    if isinstance(expected, re.Pattern):
        return isinstance(stored, str) and expected.fullmatch(stored) is not None
    return stored == expected


@pytest.mark.parametrize("kind", sorted(ODD_RESULTS))
def test_storable_result_stores_a_short_repr_and_never_raises(kind):
    assert _stored_as(kind, storable_result(ODD_RESULTS[kind]()))


@pytest.mark.parametrize("flush_interval", [0, 60], ids=["written-at-once", "batched"])
@pytest.mark.parametrize("kind", sorted(ODD_RESULTS))
def test_a_worker_records_an_odd_result_once_as_a_success(burst, settings, kind, flush_interval):
    settings.DEBOUNCE_SUCCESS_FLUSH_INTERVAL = flush_interval
    job = enqueue("st.odd", args=[kind])
    later = enqueue("st.returns", args=[{"after": kind}])
    burst()
    job.refresh_from_db()
    later.refresh_from_db()
    assert (job.status, job.attempts, job.lease_expires_at) == (Status.SUCCESSFUL, 1, None)
    assert _stored_as(kind, job.result), job.result
    assert (later.status, later.result) == (Status.SUCCESSFUL, {"after": kind})
    assert CallLog.objects.filter(task="st.odd").count() == 1
    assert not DeadLetter.objects.exists()


def test_record_success_writes_a_tuple_key_result_as_its_repr(clock):
    job = enqueue("st.returns", args=[0])
    (claimed,) = claim_jobs(worker_id="w", limit=1, lease=LEASE)
    outcomes.record_success(claimed, {(1, 2): "pair"}, worker_id="w", using="default")
    job.refresh_from_db()
    assert (job.status, job.result) == (Status.SUCCESSFUL, "{(1, 2): 'pair'}")
    assert claimed.result == "{(1, 2): 'pair'}"


def test_a_batch_writes_odd_results_beside_plain_ones_in_one_flush(clock):
    jobs = [enqueue("st.returns", args=[i]) for i in range(3)]
    claimed = claim_jobs(worker_id="w", limit=3, lease=LEASE)
    batch = SuccessBatch(worker_id="w", using="default", interval=60.0, retry_for=LEASE)
    values = [{(1, 2): "pair"}, ODD_RESULTS["iter_exits"](), {"plain": True}]
    for job, value in zip(claimed, values, strict=True):
        batch.add(job, storable_result(value), value)
    assert batch.flush() == 3
    rows = Job.objects.in_bulk([job.pk for job in jobs])
    assert [(rows[j.pk].status, rows[j.pk].result) for j in jobs] == [
        (Status.SUCCESSFUL, "{(1, 2): 'pair'}"),
        (Status.SUCCESSFUL, "{'rows': [1]}"),
        (Status.SUCCESSFUL, {"plain": True}),
    ]


def test_the_celery_task_returns_the_stored_repr_of_a_tuple_key_result(clock):
    job = tuple_key_result.delay()
    handoff.claim_for_handoff(scheduler_id="s", limit=10, lease=LEASE)
    assert run_handoff_message(job.pk) == "{(1, 2): 'pair'}"
    job.refresh_from_db()
    assert (job.status, job.attempts, job.result) == (Status.SUCCESSFUL, 1, "{(1, 2): 'pair'}")
    assert CallLog.objects.filter(task="cel.tuple_key_result").count() == 1
