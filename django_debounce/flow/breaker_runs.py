"""Count a finished run in its task's circuit breaker (contract §6).

The claim decides whether a breaker lets a job start
(:mod:`django_debounce.flow.admission`); this module records how the run ended, in
the transaction that writes the outcome (:mod:`django_debounce.run.outcomes`).
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import connections, transaction

from .. import registry
from ..breaker import OPEN
from ..models import Job, TaskState

#: The breaker's log lines keep the admission logger's name (docs/howto/logging.md).
logger = logging.getLogger("django_debounce.admission")


def record_run(job: Job, *, succeeded: bool, now: datetime, using: str) -> None:
    """Count a finished run of ``job`` in its task's circuit breaker (§6).

    Every run that raised is a failure, one that will be retried included; a
    success resets the count. Call it in the transaction that writes the
    run's outcome: the task's TaskState row is locked (created if missing)
    and saved there. Does nothing for a task without a breaker or one this
    process does not know (an ``unknown_task:`` dead letter never counts).

    Args:
        job: the job whose run finished (its ``pk`` identifies the probe).
        succeeded: True for a run that returned, False for one that raised.
        now: the outcome's instant (aware datetime).
        using: database alias.
    """
    task = registry.lookup(job.task_name)
    breaker = task.options.circuit_breaker if task is not None else None
    if breaker is None:
        return
    with transaction.atomic(using=using):
        qs = TaskState.objects.using(using).filter(task_name=job.task_name)
        if connections[using].features.has_select_for_update:
            qs = qs.select_for_update()
        state = qs.first()
        if state is None:
            TaskState.objects.using(using).bulk_create(
                [TaskState(task_name=job.task_name)], ignore_conflicts=True
            )
            state = qs.get()
        before = state.breaker_state
        if succeeded:
            changed = breaker.record_success(state, job.pk)
        else:
            changed = breaker.record_failure(state, job.pk, now)
        if changed:
            state.save(using=using, update_fields=TaskState.STATE_FIELDS)
    if state.breaker_state != before:
        log = logger.warning if state.breaker_state == OPEN else logger.info
        log(
            "circuit breaker of %s: %s -> %s after job %s %s (%d consecutive failure(s))",
            job.task_name,
            before,
            state.breaker_state,
            job.pk,
            "succeeded" if succeeded else "failed",
            state.failures,
            extra={"action": "breaker", "job_id": job.pk},
        )


__all__ = ["record_run"]
