"""Successes written in batches: one ``UPDATE`` for many finished runs (contract §7, §11; issue #12).

A worker that drains many short jobs spent a statement per job on its outcome
(decision 67's profile: 0.75 ms of a no-op job's ~2.7 ms). :class:`SuccessBatch`
keeps the plain successes of runs that returned (their results already made
storable) and :meth:`SuccessBatch.flush` writes all of them in ONE fenced
``UPDATE``, at least every ``DEBOUNCE_SUCCESS_FLUSH_INTERVAL`` seconds and when
the worker stops. Only then are their ``job_succeeded`` lines logged and their
``job_finished`` signals sent, once per job, after the write committed.

What is not batched, and why (decision 120 in docs/decisions.md):

* a failure (a retry or a dead letter) is written at once by
  :func:`~django_debounce.outcomes.record_failure`, as before: its backoff,
  its dead letter and the dependents it cancels keep their exact timing;
* a success of a task with a circuit breaker is written at once too, because
  its count in the breaker shares the outcome's transaction (§6).

A success waiting here is still RUNNING in the database under its lease, so
it keeps counting against its task's concurrency cap and keeps the later
jobs of its debounce key and its dependents waiting until the flush (never
longer than the interval while the database answers). If the worker is killed
(SIGKILL, a crash) before the flush, the lease lapses and the job runs again:
delivery is at least once (docs/explanation/semantics.md).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, InterfaceError, connections, models
from django.db.models import Q, Value
from django.db.models.expressions import RawSQL
from django.utils import timezone

from .db_errors import is_transient, retry_transient
from .final_failures import log_discarded_late_run
from .log_fields import job_fields
from .models import Job
from .outcomes import record_success
from .signals import job_finished, send_signal

#: The worker's documented logger (docs/reference/commands.md): outcome lines keep its name.
logger = logging.getLogger("django_debounce.worker")

Status = Job.Status

#: Successes one ``UPDATE`` writes at most; a fuller batch is flushed at once.
MAX_BATCH = 500


@dataclass(frozen=True)
class PendingSuccess:
    """One run that returned and waits for its write.

    Attributes:
        job: the job as claimed (its ``attempts`` is the run's fence).
        stored: the result's stored JSON form (:func:`~django_debounce.storable.storable_result`).
        result: what the task returned, for the per-job fallback write.
        finished_at: when the run returned (written as ``finished_at``).
    """

    job: Job
    stored: Any
    result: object
    finished_at: datetime


def write_successes(entries: list[PendingSuccess], *, worker_id: str, using: str) -> set[int]:
    """Write ``entries`` SUCCESSFUL in one ``UPDATE``; return the ids the write hit.

    The batched form of :func:`django_debounce.lifecycle.succeed`: the same
    columns (``status``, ``result``, ``finished_at``, no lease, no
    ``unique_lock``) and the same fence (§11): a row is written only while it
    is RUNNING for ``worker_id`` at the entry's attempt
    (:meth:`~django_debounce.models.JobQuerySet.current_run`, one ``attempts``
    group of ids per distinct attempt). A run whose job was reclaimed meanwhile
    is not written; its id is missing from the answer. The per-job values go
    through ``CASE`` (a shared value, e.g. every task returned ``None``, is
    written plainly). When fewer rows were written than entries, one more query
    finds which.

    Raises:
        DatabaseError: the statement failed; nothing was written.
    """
    if not entries:
        return set()
    groups: dict[int, list[int]] = {}
    for entry in entries:
        groups.setdefault(entry.job.attempts, []).append(entry.job.pk)
    fence = Q()
    for attempts, ids in groups.items():
        fence |= Q(attempts=attempts, pk__in=ids)
    rows = Job.objects.using(using).filter(fence, status=Status.RUNNING, worker_id=worker_id)
    updated = rows.update(
        status=Status.SUCCESSFUL,
        result=_per_job(entries, "stored", Job._meta.get_field("result"), using),  # type: ignore[arg-type]
        finished_at=_per_job(entries, "finished_at", Job._meta.get_field("finished_at"), using),  # type: ignore[arg-type]
        lease_expires_at=None,
        unique_lock=None,
    )
    if updated == len(entries):
        return {entry.job.pk for entry in entries}
    finished = Job.objects.using(using).filter(fence, status=Status.SUCCESSFUL, worker_id=worker_id)
    stamps = {entry.job.pk: entry.finished_at for entry in entries}
    return {pk for pk, at in finished.values_list("pk", "finished_at") if stamps.get(pk) == at}


def _per_job(
    entries: list[PendingSuccess], attr: str, field: models.Field[Any, Any], using: str
) -> Any:
    """Return the value of ``attr`` to write: one shared ``Value``, or a ``CASE`` on the id.

    The ``CASE`` is written as SQL with the field's own adapted parameters: built
    through ``When(pk=…)`` it cost ~0.5 ms of Python per job (a ``Q`` resolved per
    branch), more than the statement saves.
    """
    values = [getattr(entry, attr) for entry in entries]
    first = values[0]
    if all(value == first and type(value) is type(first) for value in values):
        return Value(first, output_field=field)
    connection = connections[using]
    params: list[Any] = []
    for entry, value in zip(entries, values, strict=True):
        params += [entry.job.pk, field.get_db_prep_save(value, connection)]
    column = connection.ops.quote_name(str(Job._meta.pk.column))  # type: ignore[union-attr]
    return RawSQL(
        f"CASE {column}{' WHEN %s THEN %s' * len(entries)} END", params, output_field=field
    )


class SuccessBatch:
    """The successes a worker has not written yet; shared by its threads (thread-safe).

    Args:
        worker_id: the id the jobs were claimed under (the write's fence).
        using: database alias.
        interval: the longest a success waits for its write, in seconds
            (``DEBOUNCE_SUCCESS_FLUSH_INTERVAL``); 0 writes each one at once.
        retry_for: how long a flush retries through transient database errors
            (the worker passes its lease).
    """

    def __init__(
        self, *, worker_id: str, using: str, interval: float, retry_for: timedelta
    ) -> None:
        self.worker_id = worker_id
        self.using = using
        self.interval = interval
        self.retry_for = retry_for
        self._lock = threading.Lock()
        self._entries: list[PendingSuccess] = []
        self._oldest = 0.0  # monotonic time the oldest pending entry was added
        self._flushing = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def add(self, job: Job, stored: Any, result: object) -> None:
        """Keep the success of ``job``'s run (``stored``: the result's JSON) for the next flush."""
        entry = PendingSuccess(job=job, stored=stored, result=result, finished_at=timezone.now())
        with self._lock:
            if not self._entries:
                self._oldest = time.monotonic()
            self._entries.append(entry)

    def pending_ids(self) -> list[int]:
        """Return the ids of the jobs waiting for their write (still RUNNING under their lease)."""
        with self._lock:
            return [entry.job.pk for entry in self._entries]

    def seconds_until_due(self) -> float | None:
        """Return how long until the batch must be flushed (0: now), or ``None`` when empty."""
        with self._lock:
            if not self._entries:
                return None
            if len(self._entries) >= MAX_BATCH:
                return 0.0
            return max(0.0, self._oldest + self.interval - time.monotonic())

    def cap_wait(self, timeout: float) -> float:
        """Return ``timeout`` (seconds) cut to when the pending successes are due for their write."""
        due = self.seconds_until_due()
        return timeout if due is None else min(timeout, due)

    def flush_pending(self) -> bool:
        """Write the pending successes now, due or not; return True if there were any.

        A claim that came back short calls it: a success not written yet still
        holds back the next job of its key and its dependents.
        """
        if not len(self):
            return False
        self.flush()
        return True

    def flush_or_log(self) -> None:
        """Write every pending success; a database error is logged, not raised (a stopping worker).

        Those jobs stay RUNNING and run again once their lease lapses (§7).
        """
        if not len(self):
            return
        try:
            self.flush()
        except (DatabaseError, InterfaceError):
            logger.exception(
                "could not write %d success(es); their jobs run again once their lease lapses",
                len(self),
                extra={"action": "flush_error"},
            )
            if not connections[self.using].in_atomic_block:
                connections[self.using].close()

    def flush_if_due(self) -> int:
        """Flush when the oldest success waited ``interval`` or the batch is full; return jobs written."""
        due = self.seconds_until_due()
        if due is None or due > 0:
            return 0
        return self.flush()

    def flush(self) -> int:
        """Write every pending success, log each and send its ``job_finished``; return how many hit.

        One ``UPDATE`` per :data:`MAX_BATCH` successes
        (:func:`write_successes`), retried through transient errors for
        ``retry_for``. If the database refuses the batch for another reason (a
        result it will not store), each success is written alone by
        :func:`~django_debounce.outcomes.record_success`, which stores a short
        ``repr`` or a dead letter instead (§7). A run found reclaimed is logged
        and discarded (§11).

        Raises:
            OperationalError, InterfaceError: the database stayed unreachable for
                ``retry_for``; the successes stay pending (flush again later).
        """
        written = 0
        with self._flushing:  # one flush at a time; the next takes what arrived meanwhile
            while True:
                with self._lock:
                    entries = self._entries[:MAX_BATCH]
                if not entries:
                    return written
                written += self._write(entries)
                with self._lock:
                    del self._entries[: len(entries)]
                    self._oldest = time.monotonic()

    def _write(self, entries: list[PendingSuccess]) -> int:
        try:
            hit = retry_transient(
                lambda: write_successes(entries, worker_id=self.worker_id, using=self.using),
                using=self.using,
                patience=self.retry_for,
            )
        except DatabaseError as exc:
            if is_transient(exc):
                raise
            logger.warning(
                "the database refused a batch of %d successes (%s); writing them one by one",
                len(entries),
                exc,
                extra={"action": "batch_refused"},
            )
            for entry in entries:
                record_success(
                    entry.job,
                    entry.result,
                    worker_id=self.worker_id,
                    using=self.using,
                    retry_for=self.retry_for,
                    now=entry.finished_at,
                )
            return len(entries)
        for entry in entries:
            job = entry.job
            if job.pk not in hit:
                log_discarded_late_run(job)
                continue
            job.status, job.result, job.finished_at = (
                Status.SUCCESSFUL,
                entry.stored,
                entry.finished_at,
            )
            job.lease_expires_at = job.unique_lock = None
            logger.info(
                "job %s (%s) succeeded on attempt %d",
                job.pk,
                job.task_name,
                job.attempts,
                extra=job_fields(
                    job, action="job_succeeded", outcome="succeeded", now=job.finished_at
                ),
            )
            send_signal(job_finished, job=job, status=job.status)
        return len(hit)


__all__ = ["MAX_BATCH", "PendingSuccess", "SuccessBatch", "write_successes"]
