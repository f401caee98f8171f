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
  :func:`~django_debounce.run.outcomes.record_failure`, as before: its backoff,
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

from django.db import DatabaseError, InterfaceError, connections, transaction
from django.db.models import Q
from django.utils import timezone

from ..db_errors import is_transient, retry_transient
from ..log_fields import job_fields
from ..models import Job
from ..signals import job_finished, send_signal
from .batch_budget import MAX_BATCH_BYTES, database_answers, entry_bytes, max_batch_bytes
from .final_failures import log_discarded_late_run, log_refused
from .outcomes import record_success
from .storable import short_repr
from .success_sql import per_job, worker_fence

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
        stored: the result's stored JSON form (:func:`~django_debounce.run.storable.storable_result`).
        result: what the task returned, for the per-job fallback write.
        finished_at: when the run returned (written as ``finished_at``).
        size: the bytes it adds to the batch's statement (:func:`~django_debounce.run.batch_budget.entry_bytes`).
        worker_id: the run's own worker id (its fence), when it is not the batch's
            (the Celery executor's runs each have one, decision 215); ``""``: the batch's.
    """

    job: Job
    stored: Any
    result: object
    finished_at: datetime
    size: int = 0
    worker_id: str = ""


def write_successes(entries: list[PendingSuccess], *, worker_id: str, using: str) -> set[int]:
    """Write ``entries`` SUCCESSFUL in one ``UPDATE``; return the ids the write hit.

    The batched form of :func:`django_debounce.lifecycle.succeed`: the same
    columns (``status``, ``result``, ``finished_at``, no lease, no
    ``unique_lock``) and the same fence (§11): a row is written only while it
    is RUNNING for its run's worker id (the entry's ``worker_id``, else
    ``worker_id``; :func:`~django_debounce.run.success_sql.worker_fence`) at the
    entry's attempt (one ``attempts`` group of ids per distinct attempt). A run
    whose job was reclaimed meanwhile is not written; its id is missing from the
    answer. The per-job values go through ``CASE`` (a shared value, e.g. every
    task returned ``None``, is written plainly). When fewer rows were written
    than entries, one more query finds which.

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
    pks = [entry.job.pk for entry in entries]
    fence &= worker_fence(pks, [entry.worker_id or worker_id for entry in entries], using)
    rows = Job.objects.using(using).filter(fence, status=Status.RUNNING)
    field = Job._meta.get_field
    updated = rows.update(
        status=Status.SUCCESSFUL,
        result=per_job(pks, [entry.stored for entry in entries], field("result"), using),  # type: ignore[arg-type]
        finished_at=per_job(
            pks,
            [entry.finished_at for entry in entries],
            field("finished_at"),  # type: ignore[arg-type]
            using,
        ),
        lease_expires_at=None,
        unique_lock=None,
    )
    if updated == len(entries):
        return set(pks)
    finished = Job.objects.using(using).filter(fence, status=Status.SUCCESSFUL)
    stamps = {entry.job.pk: entry.finished_at for entry in entries}
    return {pk for pk, at in finished.values_list("pk", "finished_at") if stamps.get(pk) == at}


class SuccessBatch:
    """The successes a worker has not written yet; shared by its threads (thread-safe).

    Args:
        worker_id: the id the jobs were claimed under (the write's fence).
        using: database alias.
        interval: the longest a success waits for its write, in seconds
            (``DEBOUNCE_SUCCESS_FLUSH_INTERVAL``); 0 writes each one at once.
        retry_for: how long a flush retries through transient database errors
            (the worker passes its lease).
        max_bytes: most bytes of results one statement carries (``None``: the
            database's :func:`~django_debounce.run.batch_budget.max_batch_bytes`,
            4 MiB, less on a MariaDB with a small ``max_allowed_packet``).
    """

    def __init__(
        self,
        *,
        worker_id: str,
        using: str,
        interval: float,
        retry_for: timedelta,
        max_bytes: int | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.using = using
        self.interval = interval
        self.retry_for = retry_for
        self.max_bytes = max_bytes
        self._budget = max_bytes or MAX_BATCH_BYTES  # until a flush reads the database's
        self._bytes = 0  # of the pending entries
        self._lock = threading.Lock()
        self._entries: list[PendingSuccess] = []
        self._oldest = 0.0  # monotonic time the oldest pending entry was added
        self._flushing = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def add(self, job: Job, stored: Any, result: object, *, worker_id: str = "") -> None:
        """Keep the success of ``job``'s run (``stored``: the result's JSON) for the next flush.

        ``worker_id``: the run's own worker id when it is not the batch's (decision 215).
        """
        entry = PendingSuccess(
            job=job,
            stored=stored,
            result=result,
            finished_at=timezone.now(),
            size=entry_bytes(stored),
            worker_id=worker_id,
        )
        with self._lock:
            if not self._entries:
                self._oldest = time.monotonic()
            self._entries.append(entry)
            self._bytes += entry.size

    def pending_ids(self) -> list[int]:
        """Return the ids of the jobs waiting for their write (still RUNNING under their lease)."""
        with self._lock:
            return [entry.job.pk for entry in self._entries]

    def seconds_until_due(self) -> float | None:
        """Return how long until the batch must be flushed (0: now), or ``None`` when empty."""
        with self._lock:
            if not self._entries:
                return None
            if len(self._entries) >= MAX_BATCH or self._bytes >= self._budget:
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

        One ``UPDATE`` per :data:`MAX_BATCH` successes whose results add up to
        at most the byte budget (``max_bytes``; a larger result goes alone;
        :func:`write_successes`). If a statement fails while the database
        still answers (:func:`~django_debounce.run.batch_budget.database_answers`),
        the statement was refused (too large for MariaDB's
        ``max_allowed_packet``, or a result the database will not store): the
        batch is written in two halves, each split again if refused. A single
        success refused twice is written by
        :func:`~django_debounce.run.outcomes.record_success` as its short ``repr``
        (when the server drops the statement) or as it is (which stores a
        short ``repr`` or a dead letter instead, §7); it is never retried
        forever (decision 151). If the database does not answer, the batch is
        retried through transient errors for ``retry_for``. A run found
        reclaimed is logged and discarded (§11).

        Raises:
            OperationalError, InterfaceError: the database stayed unreachable for
                ``retry_for``; the successes not written stay pending (flush again later).
        """
        written = 0
        with self._flushing:  # one flush at a time; the next takes what arrived meanwhile
            self._budget = self.max_bytes or max_batch_bytes(self.using, pending=self._bytes)
            while True:
                with self._lock:
                    entries = self._next_batch()
                if not entries:
                    return written
                done = [0]  # entries ended so far: always a prefix of ``entries``
                try:
                    written += self._write(entries, done)
                finally:
                    if done[0]:
                        with self._lock:
                            self._bytes -= sum(entry.size for entry in self._entries[: done[0]])
                            del self._entries[: done[0]]
                            self._oldest = time.monotonic()

    def _next_batch(self) -> list[PendingSuccess]:
        """Return the oldest entries within :data:`MAX_BATCH` rows and the byte budget (at least one)."""
        size = 0
        for count, entry in enumerate(self._entries[:MAX_BATCH]):
            size += entry.size
            if count and size > self._budget:
                return self._entries[:count]
        return self._entries[:MAX_BATCH]

    def _attempt(self, entries: list[PendingSuccess]) -> set[int]:
        """Run :func:`write_successes` once (in a savepoint inside a caller's transaction)."""
        if connections[self.using].in_atomic_block:
            with transaction.atomic(using=self.using):
                return write_successes(entries, worker_id=self.worker_id, using=self.using)
        return write_successes(entries, worker_id=self.worker_id, using=self.using)

    def _write(self, entries: list[PendingSuccess], done: list[int]) -> int:
        """Write ``entries`` (splitting a refused batch); add how many ended to ``done[0]``."""
        if len(entries) == 1:
            return self._write_alone(entries[0], done)
        try:
            hit = self._attempt(entries)
        except (DatabaseError, InterfaceError) as exc:
            refusal: Exception = exc
            if not database_answers(self.using):  # an outage: retry the batch as it is
                try:
                    hit = retry_transient(
                        lambda: write_successes(
                            entries, worker_id=self.worker_id, using=self.using
                        ),
                        using=self.using,
                        patience=self.retry_for,
                    )
                except DatabaseError as again:
                    if is_transient(again):
                        raise
                    refusal = again
                else:
                    return self._written(entries, hit, done)
            logger.warning(
                "the database refused a batch of %d successes (%s); writing it in two halves",
                len(entries),
                refusal,
                extra={"action": "batch_refused"},
            )
            half = len(entries) // 2
            return self._write(entries[:half], done) + self._write(entries[half:], done)
        return self._written(entries, hit, done)

    def _write_alone(self, entry: PendingSuccess, done: list[int]) -> int:
        """Write one success; refused twice by a database that answers: as its short ``repr``."""
        value = entry.result
        for last in (False, True):
            try:
                return self._written([entry], self._attempt([entry]), done)
            except (DatabaseError, InterfaceError) as exc:
                if not database_answers(self.using):
                    break  # an outage: the per-job write retries it for retry_for
                if last and is_transient(exc):  # the server drops this statement each time
                    log_refused(entry.job, "result", exc)
                    value = short_repr(entry.result)  # (else record_success tries it, then this)
        record_success(
            entry.job,
            value,
            worker_id=entry.worker_id or self.worker_id,
            using=self.using,
            retry_for=self.retry_for,
            now=entry.finished_at,
        )
        done[0] += 1
        return 1

    def _written(self, entries: list[PendingSuccess], hit: set[int], done: list[int]) -> int:
        """Log and signal the written ``entries`` (``hit``: the ids written); return how many."""
        done[0] += len(entries)
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
