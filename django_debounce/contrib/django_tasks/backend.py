"""``DebounceBackend``: Django's own ``@task`` functions as debounce jobs (issue #10 item 4).

Set it in ``TASKS`` (``django.tasks`` on Django 6.0+, the ``django-tasks``
backport on Django 5.2; :mod:`django_debounce.contrib.django_tasks.results` picks one)::

    TASKS = {"default": {"BACKEND": "django_debounce.backends.DebounceBackend"}}

and ``@task`` functions enqueue as jobs through the same path as
``@debounced_task`` (:func:`~django_debounce.enqueueing.call.enqueue_call`: one
atomic write inside the caller's transaction, §4.6) and run under
``run_debounce_worker``. Extra ``@task`` keyword arguments are this
package's task options (``@task(debounce="5s", debounce_key="report:{0}",
debounce_max_wait="1m")``), checked as ``@debounced_task`` checks them.

How the worker finds a Django task without importing a dotted path read
from the database (§7): the task's declaration registers it. Django builds
every ``@task`` through the backend's ``task_class``, whose construction
calls :meth:`DebounceBackend.validate_task`; that registers the task in
:mod:`django_debounce.registry` under ``task.module_path``. The worker
imports each app's ``tasks`` module at start (``AppConfig.ready``), so the
tasks declared there (or imported from there) are known by name, exactly
like ``@debounced_task`` functions (decision 97).
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, fields, replace
from typing import Any

from django.apps import apps
from django.core.checks import CheckMessage, Error
from django.db import router

from ... import registry
from ...breaker import CircuitBreaker
from ...enqueueing.call import enqueue_call
from ...exceptions import ConfigurationError, PayloadError
from ...job_ids import storable_ids
from ...options import Origin, declare
from ...schedules import check_schedule_keys, declare_schedules
from ...tasks import call_signature
from ...validators import check_queue, check_task_name
from .results import (
    BaseTaskBackend,
    DjangoTaskEntry,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    bridge_signals,
    task_enqueued,
    to_task_result,
)

__all__ = ["BACKEND_OPTIONS", "DebounceBackend", "DebounceTask"]

#: The keys ``TASKS[alias]["OPTIONS"]`` accepts (none yet: every task option is per task).
BACKEND_OPTIONS: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True, kw_only=True)
class DebounceTask(Task):  # type: ignore[type-arg]
    """Django's ``Task`` with this package's task options (``@task(debounce=...)``).

    Every option of :func:`django_debounce.task` except the three Django's
    ``Task`` already has under its own name (``queue`` is ``queue_name``,
    ``priority`` and ``takes_context`` are Django's). ``None`` (the default)
    means the option is not given. They are checked when the task is declared,
    with the same errors as ``@debounced_task`` (``ConfigurationError``, §2).
    A Django task is registered under ``task.module_path``.
    """

    debounce: Any = None
    debounce_key: Any = None
    debounce_max_wait: Any = None
    debounce_replace_payload: bool = False
    debounce_merge: Any = None
    debounce_edge: str | None = None
    unique_key: Any = None
    idempotent: bool = False
    expires: Any = None
    timeout: Any = None
    max_retries: int | None = None
    min_backoff: Any = None
    max_backoff: Any = None
    metadata: dict[str, object] | None = None
    rate_limit: str | None = None
    rate_limit_burst: int | None = None
    rate_limit_per_key: str | None = None
    on_excess: str | None = None
    concurrency: int | None = None
    circuit_breaker: CircuitBreaker | None = None
    executor: str | None = None
    schedule: Any = None

    def __new__(cls, *args: Any, **kwargs: Any) -> DebounceTask:
        """Refuse an unknown ``@task`` keyword with the package's error, naming the likely one.

        Raises:
            ConfigurationError: a keyword that is neither Django's nor a task
                option (e.g. ``debounce_maxwait``), before anything is registered.
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            func = kwargs.get("func")
            where = f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', '?')}"
            meant = difflib.get_close_matches(unknown[0], sorted(known), n=1)
            raise ConfigurationError(
                f"@task of {where}: unknown option(s) {unknown}"
                + (f"; did you mean {meant[0]!r}?" if meant else ".")
                + f" Accepted: {', '.join(sorted(known - {'func', 'backend'}))}."
            )
        # object.__new__: slots=True makes a new class, which the zero-argument super() misses.
        return object.__new__(cls)


#: The package's task options a ``DebounceTask`` carries (the fields above).
TASK_FIELDS = tuple(
    f.name for f in fields(DebounceTask) if f.name not in {f.name for f in fields(Task)}
)


def _declared_options(task: Task[..., Any]) -> dict[str, object]:
    """Return ``task``'s options as ``@task`` of this package takes them (given ones only)."""
    options: dict[str, object] = {"queue": task.queue_name, "priority": task.priority}
    if task.takes_context:
        options["takes_context"] = True
    for name in TASK_FIELDS:
        value = getattr(task, name, None)
        if value is not None and value is not False:
            options[name] = value
    return options


class DebounceBackend(BaseTaskBackend):
    """A ``TASKS`` backend whose tasks are django_debounce jobs (issue #10 item 4).

    ``QUEUES`` (Django's list of allowed queue names; default ``["default"]``,
    ``[]`` allows any) limits ``queue_name``; ``OPTIONS`` takes no key yet
    (:data:`BACKEND_OPTIONS`). A problem with either is reported by
    :meth:`check` (``manage.py check``, E031/E032) and raised by
    :meth:`enqueue`, never while Django builds the backend, so a typo in
    ``TASKS`` cannot stop unrelated management commands (decision 99).

    Capabilities (decision 95): ``supports_defer`` (``run_after`` becomes the
    job's ``eta``; a debounced task refuses it, the window decides, §2),
    ``supports_async_task`` (the worker runs ``async def`` tasks),
    ``supports_get_result`` (results are rows any process reads),
    ``supports_priority`` (-100..100, higher first, as the claim orders).
    """

    task_class = DebounceTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        bridge_signals()

    # -- declaration -------------------------------------------------------------------

    def validate_task(self, task: Task[..., Any]) -> None:
        """Check ``task`` as Django does, then as ``@debounced_task`` does, and register it.

        Runs whenever Django builds a task for this backend (``@task`` and
        ``.using()``). The first declaration of a function registers it under
        ``task.module_path``; a ``.using()`` copy keeps that entry.

        Raises:
            InvalidTask: a rule of Django's (module-level function, ``context``
                first with ``takes_context``, priority range, queue not in
                ``QUEUES``, naive ``run_after``).
            ConfigurationError: an option error of contract §2 (the errors of
                ``@debounced_task``), or the name already registered for
                another function.
        """
        super().validate_task(task)
        entry = _entry(task, type(self))
        existing = registry.lookup(entry.name)
        if isinstance(existing, DjangoTaskEntry) and existing.task.func is task.func:
            return
        registry.register(entry)

    # -- enqueue and results -----------------------------------------------------------

    def enqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any, Any]:
        """Enqueue a call of ``task`` as a job and return it as a ``TaskResult`` (READY).

        One write, inside the caller's transaction if there is one (§4.6):
        it commits or rolls back with the caller's work. A debounced task's
        burst returns results with one ``id`` (the window's job). Sends
        Django's ``task_enqueued``.

        Raises:
            ConfigurationError: ``OPTIONS``/``QUEUES`` problems (E031/E032), a
                ``run_after`` on a debounced task, or any error of an enqueue (§2).
            PayloadError: an argument that is not a JSON value (a ``UUID``,
                ``Decimal``, ``datetime``, ...): Django's ``TaskResult`` holds JSON
                values only, so it is refused before anything is written.
            KeyResolutionError, EnqueueContentionError: as
                :meth:`django_debounce.Task.apply_async` raises them (§3–§4).
        """
        problems = self.check()
        if problems:
            raise ConfigurationError(f"{problems[0].msg} {problems[0].hint or ''}".strip())
        name = check_task_name(task.module_path)
        entry = registry.lookup(name)
        if not (isinstance(entry, DjangoTaskEntry) and entry.task.func is task.func):
            self.validate_task(task)
            entry = registry.lookup(name)
        assert isinstance(entry, DjangoTaskEntry)
        _check_json_arguments(name, args, kwargs)
        options: dict[str, object] = {"queue": task.queue_name, "priority": task.priority}
        if task.run_after is not None:
            options["eta"] = task.run_after
        job = enqueue_call(entry, name, tuple(args), dict(kwargs), options)
        result = to_task_result(task, job, backend=self.alias)
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult[Any, Any]:
        """Return the job ``result_id`` as a ``TaskResult``, read now (decision 96).

        Raises:
            TaskResultDoesNotExist: no job has that id, the id is not an
                integer, or the job runs a task that is not a Django task
                registered in this process.
        """
        job_model = apps.get_model("django_debounce", "Job")
        try:
            pk = int(result_id)
        except (TypeError, ValueError):
            raise TaskResultDoesNotExist(f"no job has id {result_id!r}") from None
        ids = storable_ids([pk])
        job = (
            job_model.objects.using(router.db_for_read(job_model)).filter(pk__in=ids).first()
            if ids
            else None
        )
        if job is None:
            raise TaskResultDoesNotExist(f"no job has id {result_id!r}")
        entry = registry.lookup(job.task_name)
        if not isinstance(entry, DjangoTaskEntry):
            raise TaskResultDoesNotExist(
                f"job {pk} runs {job.task_name!r}, which is not a Django @task registered in "
                "this process; read it as a Job (django_debounce.models.Job) instead."
            )
        return to_task_result(entry.task, job, backend=self.alias)

    # -- configuration -----------------------------------------------------------------

    def check(self, **kwargs: Any) -> list[CheckMessage]:
        """Return this backend's configuration errors: E031 (``OPTIONS``), E032 (``QUEUES``)."""
        messages: list[CheckMessage] = []
        where = f"TASKS[{self.alias!r}]"
        if not isinstance(self.options, dict):
            messages.append(
                Error(
                    f"{where}['OPTIONS'] is {type(self.options).__name__}, not a dict.",
                    hint="Leave OPTIONS out: DebounceBackend takes its options per task.",
                    id="django_debounce.E031",
                )
            )
        else:
            for key in sorted(set(self.options) - BACKEND_OPTIONS, key=str):
                meant = difflib.get_close_matches(str(key), sorted(BACKEND_OPTIONS), n=1)
                messages.append(
                    Error(
                        f"{where}['OPTIONS'] has {key!r}, which DebounceBackend does not take.",
                        hint=(f"Did you mean {meant[0]!r}? " if meant else "")
                        + "Give task options to @task itself, e.g. @task(debounce='5s', "
                        "debounce_max_wait='1m') (docs/howto/django-tasks.md).",
                        id="django_debounce.E031",
                    )
                )
        for queue in sorted(self.queues, key=str):
            try:
                check_queue(queue)
            except ConfigurationError as exc:
                messages.append(
                    Error(
                        f"{where}['QUEUES'] has {queue!r}: {exc}",
                        hint="Queue names are job queues: non-empty text of at most 100 "
                        "characters (Job.queue).",
                        id="django_debounce.E032",
                    )
                )
        return messages


def _check_json_arguments(name: str, args: Any, kwargs: Any) -> None:
    """Refuse arguments Django's ``TaskResult`` cannot hold (it keeps JSON values only).

    Without this the job would be written and then ``TaskResult`` would raise
    a bare ``TypeError`` while building the result (and again in the worker).

    Raises:
        PayloadError: an argument is not a JSON value; nothing has been written.
    """
    try:
        json.dumps([list(args), dict(kwargs)])
    except (TypeError, ValueError) as exc:
        raise PayloadError(
            f"task {name!r}: Django's tasks framework takes JSON arguments only ({exc}). "
            "Pass JSON values (e.g. str(uuid), str(decimal), a datetime's isoformat()), or "
            "declare the function with @debounced_task, whose codec carries UUID, Decimal "
            "and datetime values (contract §5)."
        ) from None


def _entry(task: Task[..., Any], backend: type[BaseTaskBackend]) -> DjangoTaskEntry:
    """Return the registry entry of Django ``task``, its options checked as a declaration.

    Raises:
        ConfigurationError: any error of contract §2 for these options.
    """
    name = check_task_name(task.module_path)
    options = declare(f"task {name!r}", _declared_options(task))
    signature = call_signature(task.func, takes_context=task.takes_context, where=f"task {name!r}")
    if options.schedule:  # periodic (decision 177): checked against the function, as @task does
        schedules = declare_schedules(options.schedule, task_name=name, signature=signature)
        options = replace(options, schedule=schedules, origin=Origin(f"task {name!r}"))
    entry = DjangoTaskEntry(task, name=name, options=options, signature=signature, backend=backend)
    if options.schedule:
        check_schedule_keys(entry)
    return entry
