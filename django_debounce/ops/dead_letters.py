"""Retrying a dead letter through the normal enqueue path (contract §8).

:meth:`DeadLetter.retry() <django_debounce.models.DeadLetter.retry>` is the
public way in; it delegates here through the app config, because ``models``
sits below the enqueue path and imports nothing above it (decision 69 in
docs/decisions.md). Bulk retries (the worker's automatic sweep, the
``retry_dead_letters`` command) are in :mod:`django_debounce.ops.sweep`; writing a
dead letter is :func:`django_debounce.lifecycle.new_dead_letter`.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from ..codec import decode_call
from ..enqueueing.call import enqueue
from ..models import DeadLetter, Job


def retry_dead_letter(letter: DeadLetter, *, force: bool = False) -> Job | None:
    """Enqueue ``letter``'s task and arguments again as a call made now (§8).

    The call carries the original's task, args, kwargs, queue, priority and
    metadata (no eta, no expiry, no dependencies), so a debounced task joins
    the key's open window if there is one. The entry's row is locked
    (``SELECT … FOR UPDATE``) in the transaction of the enqueue, so two
    callers racing on one entry retry it once. On success ``retried_at`` and
    ``retry_job`` are written and set on ``letter`` too.

    Args:
        letter: a saved entry; its database (``letter._state.db``) is used.
        force: retry even if the entry was already retried.

    Returns:
        The job the retry went to (new, or the open window it joined), or
        ``None`` when the entry was already retried and ``force`` is False.

    Raises:
        DeadLetter.DoesNotExist: the entry was deleted.
        ConfigurationError: or another error of the enqueue, if the task's
            declaration changed so that the stored call is no longer valid.
    """
    with transaction.atomic(using=letter._state.db):
        entry = DeadLetter.objects.using(letter._state.db).select_for_update().get(pk=letter.pk)
        if entry.retried_at is not None and not force:
            return None
        original = entry.job
        args, kwargs = decode_call(entry.args, entry.kwargs)
        job = enqueue(
            entry.task_name,
            args=args,
            kwargs=kwargs,
            queue=entry.queue,
            priority=original.priority if original else 0,
            metadata=original.metadata if original else {},
        )
        entry.retried_at = timezone.now()
        entry.retry_job = job
        entry.save(update_fields=["retried_at", "retry_job"])
    letter.retried_at, letter.retry_job = entry.retried_at, job
    return job
