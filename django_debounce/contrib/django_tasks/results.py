"""Django's tasks framework seen from a job: which framework, and a job as a ``TaskResult``.

Edge layer, used by :mod:`django_debounce.contrib.django_tasks.backend` (issue #10 item 4):

* the framework: ``django.tasks`` on Django 6.0+, else the ``django-tasks``
  backport (``pip install "django-debounce[tasks]"``) on Django 5.2; the two
  share one API, so the rest of the package names them once, here
  (decision 95);
* :func:`to_task_result`: a :class:`~django_debounce.models.Job` as the
  framework's ``TaskResult``, with the status mapping of decision 96;
* :func:`bridge_signals`: Django's ``task_started``/``task_finished`` sent
  from this package's ``job_started``/``job_finished`` for jobs of Django
  tasks, so the worker (or any executor) needs no import of this module.

Importing this module never imports the models (``Job`` is a type-only
import), so ``backends`` can be imported from settings-time code such as
``TASKS`` resolution while the app registry is still loading.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ... import codec, registry
from ...signals import job_finished, job_started

if TYPE_CHECKING:
    from ...models import Job

try:  # Django 6.0+: the framework is part of Django.
    from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskError
    from django.tasks.exceptions import InvalidTask, InvalidTaskBackend, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started

    FRAMEWORK = "django.tasks"
except ImportError:  # Django 5.2: the django-tasks backport, if installed.
    try:
        from django_tasks import (  # type: ignore[import-not-found,no-redef,assignment,unused-ignore]
            task_backends,
        )
        from django_tasks.backends.base import (  # type: ignore[import-not-found,no-redef,assignment,unused-ignore]
            BaseTaskBackend,
        )
        from django_tasks.base import (  # type: ignore[import-not-found,no-redef,assignment,unused-ignore]
            Task,
            TaskContext,
            TaskError,
            TaskResult,
            TaskResultStatus,
        )
        from django_tasks.exceptions import (  # type: ignore[import-not-found,no-redef,assignment,unused-ignore]
            InvalidTaskBackendError as InvalidTaskBackend,
        )
        from django_tasks.exceptions import (  # type: ignore[import-not-found,no-redef,assignment,unused-ignore]
            InvalidTaskError as InvalidTask,
        )
        from django_tasks.exceptions import (  # type: ignore[import-not-found,no-redef,assignment,unused-ignore]
            TaskResultDoesNotExist,
        )
        from django_tasks.signals import (  # type: ignore[import-not-found,no-redef,assignment,unused-ignore]
            task_enqueued,
            task_finished,
            task_started,
        )
    except ImportError as exc:
        raise ImportError(
            "django_debounce.backends needs Django's tasks framework: django.tasks (Django 6.0 "
            "or later) or, on Django 5.2, the django-tasks backport: pip install "
            '"django-debounce[tasks]" and add "django_tasks" to INSTALLED_APPS.'
        ) from exc
    FRAMEWORK = "django_tasks"


class JobNotRunError(Exception):
    """The job ended without running its task: cancelled, expired or shed (decision 96)."""


class JobCancelledError(JobNotRunError):
    """A dependency of the job ended without success, or an operator cancelled it (§6)."""


class JobExpiredError(JobNotRunError):
    """The job was not started before its ``expires`` (§6)."""


class JobShedError(JobNotRunError):
    """Flow control dropped the job (``on_excess="drop"``: a rate limit or CoDel, §6)."""


#: Job status -> (TaskResult status, the error class of a job that ended without a run).
_STATUS: dict[str, tuple[str, type[JobNotRunError] | None]] = {
    "READY": ("READY", None),
    "RUNNING": ("RUNNING", None),
    "SUCCESSFUL": ("SUCCESSFUL", None),
    "FAILED": ("FAILED", None),
    "CANCELLED": ("FAILED", JobCancelledError),
    "EXPIRED": ("FAILED", JobExpiredError),
    "SHED": ("FAILED", JobShedError),
}


def result_status(job_status: str) -> TaskResultStatus:
    """Return the ``TaskResultStatus`` a job of status ``job_status`` is shown with (decision 96).

    READY, RUNNING, SUCCESSFUL and FAILED map to themselves (a READY job may
    be waiting for a retry). CANCELLED, EXPIRED and SHED map to FAILED,
    Django's status for a task that "was unable to start"; the result's
    ``errors`` then names which (:class:`JobCancelledError`,
    :class:`JobExpiredError`, :class:`JobShedError`).

    Raises:
        KeyError: ``job_status`` is not a ``Job.Status`` value.
    """
    return TaskResultStatus(_STATUS[job_status][0])


def _errors(job: Job) -> list[TaskError]:
    """Return the result's ``errors``: the job's last failure, or why it never ran.

    A job keeps only its last failure (``Job.error``/``Job.traceback``), so
    ``errors`` holds at most one entry for the exceptions a task raised.
    """
    not_run = _STATUS[job.status][1]
    if not_run is not None:
        path = f"{not_run.__module__}.{not_run.__qualname__}"
        return [TaskError(exception_class_path=path, traceback=_why_not_run(job))]
    if not job.error:
        return []
    name = job.error.split(":", 1)[0].strip()
    path = name if "." in name else f"builtins.{name}"
    return [TaskError(exception_class_path=path, traceback=job.traceback or job.error)]


def _why_not_run(job: Job) -> str:
    """Return the newest dead-letter reason of a shed job, else a sentence naming the status."""
    if job.status == "SHED" and job.pk is not None:
        letter = job.dead_letters.order_by("-id").values_list("reason", flat=True).first()
        if letter:
            return str(letter)
    return f"job {job.pk} ended {job.status} without running its task"


def to_task_result(task: Task[..., Any], job: Job, *, backend: str) -> TaskResult[..., Any]:
    """Return ``job`` as a ``TaskResult`` of the Django ``task`` (issue #10 item 4).

    Args:
        task: the Django task the job runs (``result.task``).
        job: the job row (as enqueued, claimed or read back).
        backend: the ``TASKS`` alias the result belongs to.

    Fields: ``id`` is ``str(job.pk)``; ``status`` per :func:`result_status`;
    ``enqueued_at`` the job's ``created_at`` (a debounced job: when its window
    opened); ``started_at`` and ``last_attempted_at`` the start of the latest
    attempt (a job keeps only that one); ``finished_at``; ``args``/``kwargs``
    decoded by the codec (§5; with ``debounce_replace_payload`` the call that
    will run); ``worker_ids`` one entry per attempt, the latest attempt's worker
    last and ``""`` for earlier attempts, whose workers a job does not keep
    (so ``attempts`` and ``TaskContext.attempt`` count every run); the return
    value decoded from ``Job.result`` (decision 96). A running job's progress is not
    carried: ``TaskResult`` is a slotted dataclass without a metadata field; read
    ``django_debounce.progress.progress_of`` of the job ``result.id`` names (decision 204).
    """
    args, kwargs = codec.decode_call(list(job.args or []), dict(job.kwargs or {}))
    attempts = job.attempts or 0
    worker_ids = [""] * max(0, attempts - 1) + ([job.worker_id] if attempts else [])
    result = TaskResult(
        task=task,
        id=str(job.pk),
        status=result_status(job.status),
        enqueued_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        last_attempted_at=job.started_at,
        args=list(args),
        kwargs=dict(kwargs),
        backend=backend,
        errors=_errors(job),
        worker_ids=worker_ids,
    )
    if job.status == "SUCCESSFUL":
        object.__setattr__(result, "_return_value", codec.decode(job.result))
    return result


class DjangoTaskEntry:
    """What the registry holds for a Django ``@task`` (a :class:`~django_debounce.registry.RegisteredTask`).

    ``func`` is the user's function; for ``takes_context=True`` a wrapper of
    it that turns the worker's :class:`~django_debounce.context.JobContext`
    into Django's ``TaskContext`` (whose ``task_result`` is the running job).
    """

    def __init__(
        self,
        task: Task[..., Any],
        *,
        name: str,
        options: Any,
        signature: Any,
        backend: type[BaseTaskBackend],
    ) -> None:
        self.task = task
        self.name = name
        self.options = options
        self.signature = signature
        self.backend = backend
        self.is_async = _is_async(task.func)
        self.func: Callable[..., Any] = _with_context(task) if task.takes_context else task.func

    def __repr__(self) -> str:
        return f"<Django task {self.name}>"


def _is_async(func: Callable[..., Any]) -> bool:
    import inspect

    return inspect.iscoroutinefunction(func)


def _with_context(task: Task[..., Any]) -> Callable[..., Any]:
    """Wrap ``task.func`` to take the worker's JobContext first and pass Django's TaskContext."""
    import functools

    func = task.func

    def context_of(job_context: Any) -> TaskContext[..., Any]:
        return TaskContext(task_result=to_task_result(task, job_context.job, backend=task.backend))

    if _is_async(func):

        @functools.wraps(func)
        async def run_async(job_context: Any, *args: Any, **kwargs: Any) -> Any:
            return await func(context_of(job_context), *args, **kwargs)

        return run_async

    @functools.wraps(func)
    def run(job_context: Any, *args: Any, **kwargs: Any) -> Any:
        return func(context_of(job_context), *args, **kwargs)

    return run


def _entry(job: Job) -> DjangoTaskEntry | None:
    entry = registry.lookup(job.task_name)
    return entry if isinstance(entry, DjangoTaskEntry) else None


def _started(sender: Any, job: Job, **kwargs: Any) -> None:
    entry = _entry(job)
    if entry is not None:
        result = to_task_result(entry.task, job, backend=entry.task.backend)
        task_started.send(sender=entry.backend, task_result=result)


def _finished(sender: Any, job: Job, **kwargs: Any) -> None:
    entry = _entry(job)
    if entry is not None:
        result = to_task_result(entry.task, job, backend=entry.task.backend)
        task_finished.send(sender=entry.backend, task_result=result)


def bridge_signals() -> None:
    """Send Django's ``task_started``/``task_finished`` for runs of Django tasks (decision 98).

    Connected to :data:`~django_debounce.signals.job_started` and
    :data:`~django_debounce.signals.job_finished` (``dispatch_uid``: once,
    however often it is called). ``task_finished`` follows every run, paired
    with its ``task_started``: status SUCCESSFUL, FAILED, or READY when a
    retry is scheduled. A receiver that raises is logged by
    :func:`~django_debounce.signals.send_signal` and never stops the job.
    """
    job_started.connect(
        _started, dispatch_uid="django_debounce.contrib.django_tasks.results.started"
    )
    job_finished.connect(
        _finished, dispatch_uid="django_debounce.contrib.django_tasks.results.finished"
    )


__all__ = [
    "FRAMEWORK",
    "BaseTaskBackend",
    "DjangoTaskEntry",
    "InvalidTask",
    "InvalidTaskBackend",
    "JobCancelledError",
    "JobExpiredError",
    "JobNotRunError",
    "JobShedError",
    "Task",
    "TaskContext",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "bridge_signals",
    "result_status",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
    "to_task_result",
]
