"""Exceptions raised by django_debounce (contract §10).

Every exception derives from :class:`DebounceError`. Each class's docstring is
its default message, so ``raise ConfigurationError()`` still says something
useful, but callers should always pass a message naming what was wrong and how
to fix it.
"""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError


class DebounceError(Exception):
    """A django_debounce error occurred."""

    def __init__(self, message: str | None = None, *args: Any) -> None:
        super().__init__(message or (self.__doc__ or "").strip(), *args)


class ConfigurationError(DebounceError, ValueError):
    """A task or an enqueue call was configured in a way the contract forbids (§2)."""


class KeyResolutionError(DebounceError, ValueError):
    """A debounce or unique key template could not be resolved from the call's arguments (§3)."""


class PayloadError(DebounceError, TypeError):
    """An argument cannot be stored as a job payload by the codec (§5)."""


class EnqueueContentionError(DebounceError):
    """The enqueue kept losing races or lock waits and gave up; nothing was written (§4.4)."""


class WindowContentionError(DebounceError):
    """A window handle's flush or cancel kept meeting lock contention and gave up; nothing changed.

    Raised at once inside the caller's transaction, where a deadlock has
    already rolled that transaction back on MariaDB/MySQL (roll back and retry
    it); outside one, after the handle's own retries (issue #21, decision 172).
    """


class CancelContentionError(DebounceError):
    """``cancel_jobs`` (``Job.cancel()``, ``debounce_cancel``, the admin's Cancel) kept meeting
    lock contention and gave up; nothing changed (decision 210).

    Raised at once inside the caller's transaction (a deadlock has rolled it back on
    MariaDB/MySQL: roll back and retry it); outside one, after the cancel's own retries.
    """


class NotMigratedError(DebounceError, DatabaseError):
    """The database has no django_debounce tables: run ``python manage.py migrate``.

    Raised by an enqueue (``delay()``, ``apply_async()``, ``enqueue()``,
    ``enqueue_many()``, ``DeadLetter.retry()``) whose write failed because a
    table is missing, chained from the driver's error. Also a Django
    ``DatabaseError``, so code that caught the driver's error still does.
    """


class UnknownTaskError(DebounceError, LookupError):
    """No task is registered under that name in this process."""


class JobFailedError(DebounceError):
    """A job handed to Celery ended FAILED on this attempt (its dead letter is written).

    Raised by the Celery task ``django_debounce.run_job`` after the outcome is
    recorded, so Celery's result backend and Flower show FAILURE for it
    (issue #10 tester item 1, decision 138). Never raised by the built-in worker.
    """


class JobRetryError(DebounceError):
    """A job handed to Celery goes back to READY after this attempt: it runs again later.

    The result the Celery task ``django_debounce.run_job`` stores (in Celery's
    ``RETRY`` state, raised inside :class:`celery.exceptions.Retry`) when the
    attempt it ran failed with a retry scheduled, or when its task is not yet
    known to the Celery worker (decision 152). A later attempt's ``SUCCESS``
    or ``FAILURE`` replaces it; Celery's result backends never replace a
    ``SUCCESS``, which is why a retried attempt must not end in one. Never
    raised by the built-in worker.
    """


class CeleryFeatureError(DebounceError, AttributeError):
    """A Celery feature (canvas signature, ``.map()``, ...) was asked of a task stacked on ``@shared_task``.

    The debounce window decides when such a task runs, so Celery's canvas,
    which publishes the Celery task itself, is not offered on it; the plain
    Celery task stays reachable as ``.celery_task`` (bypassing the window).
    An ``AttributeError``, so ``hasattr`` still answers ``False``.
    """


class JobCancelled(DebounceError):  # noqa: N818 (a signal to the task; decision 186)
    """The running job was asked to stop (``Job.cancel()``, the admin, ``debounce_cancel``).

    Raised by :meth:`~django_debounce.context.JobContext.checkpoint` once a
    cancel was requested; a task that lets it propagate ends CANCELLED (no
    retry, no dead letter, decision 186). A task that catches it and returns
    ends as it returned. Decision 186; docs/howto/cancel-running-jobs.md.
    """


class ProgressError(DebounceError, ValueError):
    """``JobContext.set_progress`` was given a value it cannot store; nothing was written.

    ``done`` and ``total`` must be ints from 0 to 2**63 - 1 (not bools), ``done`` at most
    ``total`` when a total is given, and ``note`` a string of at most 200
    characters. Decision 202; docs/howto/progress.md.
    """


class JobTimeout(DebounceError):  # noqa: N818 (a signal to the task; decision 187)
    """The running job passed its ``timeout`` (its soft limit).

    Raised by :meth:`~django_debounce.context.JobContext.checkpoint` past the
    limit, and recorded as the error of an async task cancelled at its limit
    and of a sync task that ran past its hard limit: a failure like any
    other, retried or dead-lettered by the task's policy (decision 187;
    docs/howto/time-limits.md).
    """
