"""``@debounced_task`` stacked on a Celery task: what to register for it (issue #10).

::

    @debounced_task(debounce="10s", debounce_max_wait="1m")
    @shared_task
    def rebuild(user_id): ...

:func:`adopt` turns the Celery task (or the lazy proxy ``@shared_task``
returns) into what :func:`~django_debounce.tasks.task` registers: a function
with the Celery task's signature that calls the Celery task (so ``bind=True``
tasks get ``self`` and a request, as when Celery runs them), the Celery
task's name as the default name, and ``executor="celery"`` unless given. The
decorated name then is a debounce :class:`~django_debounce.tasks.Task`:
``.delay()``/``.apply_async()`` enqueue through the window and return the
job, whose id is the Celery task id of the message that runs it (decision 90).

Celery is never imported here: a Celery task exists only once Celery is.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping
from typing import Any


def celery_task_of(obj: object) -> Any | None:
    """Return the Celery task ``obj`` is (a proxy resolved), or ``None`` if it is not one."""
    # Celery's classes are looked up, never imported: a Celery task (or the proxy
    # ``@shared_task`` returns) exists only once Celery has loaded them.
    proxy_module = sys.modules.get("celery.local")
    if proxy_module is not None and isinstance(obj, proxy_module.Proxy):
        obj = obj._get_current_object()  # evaluating the proxy makes the task (and loads its class)
    task_module = sys.modules.get("celery.app.task")
    if task_module is None:
        return None
    return obj if isinstance(obj, task_module.Task) else None


def adopt(
    func: Any, name: str | None, options: Mapping[str, object]
) -> tuple[Callable[..., Any], str | None, Mapping[str, object]]:
    """Return ``(function, name, options)`` to register for ``func`` (unchanged if not a Celery task).

    For a Celery task: a function with the task's ``run`` signature (key
    templates bind against it, §3) that calls the task; ``name`` defaulting
    to the Celery task's name; ``executor`` defaulting to ``"celery"``.
    """
    celery_task = celery_task_of(func)
    if celery_task is None:
        return func, name, options

    def call_celery_task(*args: Any, **kwargs: Any) -> Any:
        request = _run_request()
        if request is None:  # called inline, or run outside a Celery worker (a test)
            return celery_task(*args, **kwargs)
        # Celery's Task.__call__ pushes a request merged over the task's current one: give
        # it the message's id (the job id) and worker hostname first (issue #17 item 11).
        celery_task.push_request(**request)
        try:
            return celery_task(*args, **kwargs)
        finally:
            celery_task.pop_request()

    functools.update_wrapper(call_celery_task, celery_task.run)
    # The Celery task stays reachable (Task.celery_task): publishing it bypasses the window.
    setattr(call_celery_task, "celery_task", celery_task)  # noqa: B010 - a function attribute
    return (
        call_celery_task,
        name or celery_task.name,
        {"executor": "celery", **options},
    )


#: The Celery task that runs a handed-off job (``celery_routing.RUN_TASK``; not imported: no models here).
_RUN_TASK = "django_debounce.run_job"
#: What a stacked task's request takes from the ``run_job`` message running it.
_REQUEST_FIELDS = ("id", "hostname", "delivery_info", "correlation_id", "root_id", "parent_id")


def _run_request() -> dict[str, Any] | None:
    """Return the request fields of the ``run_job`` message this thread runs, or ``None``.

    A stacked task's body runs inside the Celery task ``django_debounce.run_job``
    (whose task id is the job id), not as its own message, so Celery would give a
    ``bind=True`` task an empty request (``self.request.id`` and ``.hostname``
    ``None``). These fields make its request the message's: ``id`` the job id,
    ``hostname`` the Celery worker's node name. ``called_directly`` stays true,
    so ``self.retry()`` raises (the job's retry, never a Celery one).
    """
    state = sys.modules.get("celery._state")  # loaded by any Celery app; never imported here
    outer = state.get_current_task() if state is not None else None
    if outer is None or outer.name != _RUN_TASK or outer.request.called_directly:
        return None
    return {name: getattr(outer.request, name, None) for name in _REQUEST_FIELDS}


#: Celery task attributes a stacked task does not offer: its canvas and Celery-side calls.
CELERY_ONLY = frozenset(
    {
        "s",
        "si",
        "signature",
        "subtask",
        "map",
        "starmap",
        "chunks",
        "chunk",
        "apply",
        "retry",
        "AsyncResult",
        "update_state",
        "request",
        "send_event",
    }
)


def missing_attribute(task_name: str, func: object, attr: str) -> AttributeError:
    """Return the error for ``attr`` missing on the debounce task ``task_name`` (decision 140).

    For a task stacked on a Celery task and a Celery-only attribute
    (:data:`CELERY_ONLY`): :class:`~django_debounce.exceptions.CeleryFeatureError`
    naming the alternatives; otherwise Python's usual ``AttributeError``.
    """
    from .exceptions import CeleryFeatureError

    celery_task = getattr(func, "celery_task", None)
    if celery_task is None or attr not in CELERY_ONLY:
        return AttributeError(f"'Task' object has no attribute {attr!r}")
    return CeleryFeatureError(
        f"task {task_name!r} is stacked on the Celery task {celery_task.name!r}: "
        f".{attr} is not available, because the debounce window decides when it runs "
        "(Celery's canvas would publish the Celery task itself, outside the window). Use "
        ".delay()/.apply_async() to go through the window, or .celery_task."
        f"{attr} for the plain Celery task (no window, no job)."
    )


__all__ = ["CELERY_ONLY", "adopt", "celery_task_of", "missing_attribute"]
