"""Declaring tasks: :func:`~django_debounce.task`, :func:`~django_debounce.debounced_task` and :class:`~django_debounce.Task` (contract §2).

Nothing here touches the database; ``delay``/``apply_async`` hand over to
:mod:`django_debounce.enqueueing.call`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Concatenate, Generic, Literal, ParamSpec, TypeVar, overload

from . import registry
from .conf import settings
from .exceptions import ConfigurationError
from .options import Origin, TaskOptions, declare
from .schedules import Schedule, check_schedule_keys, declare_schedules
from .task_stacking import adopt, missing_attribute
from .validators import check_task_name

if TYPE_CHECKING:
    from .conf.durations import DurationLike
    from .context import JobContext
    from .models import Job
    from .ops.window_handles import Window, Windows

__all__ = ["Task", "TaskOptions", "call_signature", "debounced_task", "periodic_task", "task"]

P = ParamSpec("P")
R = TypeVar("R")


def call_signature(
    func: Callable[..., Any], *, takes_context: bool, where: str = "task"
) -> inspect.Signature:
    """Return the signature a call of ``func`` binds against (key templates, §3).

    With ``takes_context`` the first positional parameter receives the
    :class:`~django_debounce.context.JobContext` and is left out, so ``{0}`` in
    a key template is the first argument the caller passes. A function taking
    only ``*args`` keeps its signature (the context is the first item of
    ``args`` at run time and never part of a call's arguments).

    Raises:
        ConfigurationError: ``takes_context`` is set and ``func`` has no
            positional parameter to receive the context.
    """
    signature = inspect.signature(func)
    if not takes_context:
        return signature
    params = list(signature.parameters.values())
    if params and params[0].kind in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        return signature.replace(parameters=params[1:])
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return signature
    raise ConfigurationError(
        f"{where}: takes_context=True passes a JobContext as the first positional argument, "
        f"but the function's signature {signature} has no positional parameter for it; "
        "add one first, e.g. def f(context, ...)."
    )


class Task(Generic[P, R]):
    """A registered task: call it to run inline, ``delay``/``apply_async`` to enqueue."""

    def __init__(self, func: Callable[P, R], *, name: str, options: TaskOptions) -> None:
        #: The decorated function; with ``takes_context`` it takes the context first.
        self.func: Callable[..., R] = func
        self.name = name
        self.options = options
        #: The signature key templates bind against (§3): with ``takes_context``,
        #: without the context parameter, so ``{0}`` is the first real argument.
        self.signature = call_signature(
            func, takes_context=options.takes_context, where=f"task {name!r}"
        )
        self.is_async = inspect.iscoroutinefunction(func)
        self.__doc__ = func.__doc__
        self.__name__ = getattr(func, "__name__", name)
        self.__qualname__ = getattr(func, "__qualname__", name)
        self.__module__ = func.__module__
        self.__wrapped__ = func

    def __repr__(self) -> str:
        return f"<Task {self.name}>"

    @property
    def celery_task(self) -> Any:
        """The Celery task under a ``@debounced_task`` stacked on ``@shared_task``, else ``None``.

        Publishing it (``.celery_task.delay()``, ``.celery_task.s()``) bypasses
        the window: a plain Celery message, no job (docs/howto/celery.md).
        """
        return getattr(self.__dict__.get("func"), "celery_task", None)

    if not TYPE_CHECKING:  # hidden from type checkers: a typo stays a static error

        def __getattr__(self, attr: str) -> Any:
            """Only for attributes a Task lacks: name the alternatives to Celery's canvas.

            Raises:
                CeleryFeatureError: ``attr`` is a Celery-only attribute (``s``,
                    ``si``, ``map``, ...) of a task stacked on a Celery task.
                AttributeError: any other missing attribute.
            """
            func = self.__dict__.get("func")
            raise missing_attribute(self.__dict__.get("name", "?"), func, attr)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function inline (no job); an ``async def`` task returns its coroutine.

        With ``takes_context=True`` the function receives
        :meth:`JobContext.inline() <django_debounce.context.JobContext.inline>`
        (no job, attempt 1, ``run_reason="inline"``) before the arguments, so
        the call takes the same arguments as :meth:`delay`; a caller that passes
        a :class:`~django_debounce.context.JobContext` first (e.g. a test
        building one) has it passed through instead.
        """
        if self.options.takes_context:
            from .context import JobContext

            if not (args and isinstance(args[0], JobContext)):
                return self.func(JobContext.inline(), *args, **kwargs)
        return self.func(*args, **kwargs)

    def delay(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Enqueue a call with the task's default options (§2). See :meth:`apply_async`."""
        # At call time: the enqueue path needs the models, and this module is imported
        # before the app registry is ready (settings, ``tasks.py`` modules).
        from .enqueueing.call import enqueue_call

        return enqueue_call(self, self.name, args, kwargs, {})

    def delay_many(self, calls: Iterable[tuple[Any, ...] | list[Any]]) -> list[Job]:
        """Enqueue one call per item of ``calls`` in one transaction (issue #12, decision 115).

        Each item is one call's positional arguments, as ``delay(*item)`` would
        take them: ``build_report.delay_many([(1,), (2,)])``. For keyword
        arguments, options or several tasks use
        :func:`~django_debounce.enqueueing.bulk.enqueue_many`, which this calls.

        Returns:
            One job per call, in order, each with its call's ``outcome``.

        Raises:
            ConfigurationError, KeyResolutionError, PayloadError: a call is
                invalid (the message names its index, ``call [i]``); nothing is written.
            EnqueueContentionError: as for :meth:`apply_async`.
        """
        from .enqueueing.bulk import enqueue_many

        return enqueue_many([(self, args) for args in calls])

    def window(self, *args: P.args, **kwargs: P.kwargs) -> Window:
        """Return the handle of the window ``delay(*args, **kwargs)`` would join (issue #21).

        The key resolves exactly as that call's would (§3); no SQL runs. The
        handle's ``inspect()``, ``pending()``, ``flush()`` and ``cancel()`` read
        or act on the key's window when called
        (:class:`~django_debounce.ops.window_handles.Window`).

        Raises:
            ConfigurationError: the task is not debounced.
            KeyResolutionError: the arguments do not fit the signature or the key
                template, or a key callable returned ``None`` (no window).
            PayloadError: an argument the default key cannot hash.
        """
        # At call time: ops/ sits above the kernel (a crossing of the layer table, decision 172).
        from .ops.window_handles import window_of_call

        return window_of_call(self, args, kwargs)

    def window_for(self, key: str, *, using: str | None = None) -> Window:
        """Return the handle of this task's window for the resolved ``key`` (no SQL).

        Raises:
            ConfigurationError: the task is not debounced.
            KeyResolutionError: ``key`` is not usable key text (§3).
        """
        from .ops.window_handles import windows_of_keys

        return windows_of_keys(self, [key], using=using).windows[0]

    def windows(self, calls: Iterable[tuple[Any, ...] | list[Any]]) -> Windows:
        """Return the windows of many calls, each given as ``delay_many`` takes it (positional).

        The :class:`~django_debounce.ops.window_handles.Windows` returned reads
        or acts on all of them at once (one locking read).

        Raises:
            ConfigurationError, KeyResolutionError, PayloadError: as :meth:`window`,
                naming the call's index (``call [i]``).
        """
        from .ops.window_handles import windows_of_calls

        return windows_of_calls(self, calls)

    def windows_for(self, keys: Iterable[str], *, using: str | None = None) -> Windows:
        """Return the windows of many resolved keys (see :meth:`windows`).

        Raises:
            ConfigurationError: the task is not debounced.
            KeyResolutionError: a key that is not usable key text.
        """
        from .ops.window_handles import windows_of_keys

        return windows_of_keys(self, keys, using=using)

    def apply_async(
        self,
        args: tuple[Any, ...] | list[Any] = (),
        kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> Job:
        """Enqueue a call with per-call options overriding the task's defaults.

        Args:
            args: positional arguments for the task (stored through the codec, §5).
            kwargs: keyword arguments for the task.
            **options: any of ``debounce``, ``debounce_key``, ``debounce_max_wait``,
                ``debounce_replace_payload``, ``debounce_merge``, ``countdown``
                (seconds or a duration), ``eta`` (aware datetime), ``priority``,
                ``queue``, ``expires``, ``metadata``, ``notes``, ``unique_key``,
                ``max_retries``, ``depends_on``
                (:data:`~django_debounce.options.CALL_OPTIONS`).

        Returns:
            The :class:`~django_debounce.models.Job` after this enqueue, with
            ``outcome`` set to ``"created"``, ``"debounced"`` or ``"coalesced"``.

        Raises:
            ConfigurationError: an unknown or invalid option, or a combination
                the contract forbids (§2); nothing is written.
            KeyResolutionError: a key placeholder does not resolve (§3).
            PayloadError: an argument the codec cannot store (§5).
            EnqueueContentionError: lock contention outlasted the retry budget (§4.4).
            NotMigratedError: the database has no django_debounce tables (run
                ``python manage.py migrate``).
        """
        from .enqueueing.call import enqueue_call

        return enqueue_call(self, self.name, args, kwargs or {}, options)


def _make(func: Callable[P, R], name: str | None, options: Mapping[str, object]) -> Task[P, R]:
    # A Celery task under the decorator: register its body, routed through the window (#10).
    func, name, options = adopt(func, name, options)
    if not callable(func):
        raise ConfigurationError(f"@task decorates a function, got {func!r}.")
    task_name = check_task_name(name or f"{func.__module__}.{func.__qualname__}")
    created: Task[P, R] = Task(
        func, name=task_name, options=declare(f"task {task_name!r}", options)
    )
    if created.options.schedule:
        where = f"task {task_name!r}"
        schedules = declare_schedules(
            created.options.schedule, task_name=task_name, signature=created.signature
        )
        _check_schedule_names(task_name, schedules)
        created.options = replace(created.options, schedule=schedules, origin=Origin(where))
        check_schedule_keys(created)
    registry.register(created)
    return created


def _check_schedule_names(task_name: str, schedules: tuple[Schedule, ...]) -> None:
    """Refuse a schedule name another registered task's schedule holds (decision 177)."""
    mine = {s.name or task_name for s in schedules}
    for other in registry.all_tasks().values():
        if other.name == task_name:
            continue
        taken = mine & {getattr(s, "name", None) for s in other.options.schedule}
        if taken:
            raise ConfigurationError(
                f"task {task_name!r}: schedule name(s) {sorted(taken)} already belong to "
                f"task {other.name!r}; give the Schedule another name=."
            )


@overload
def task(func: Callable[P, R], /) -> Task[P, R]: ...


@overload
def task(
    *, name: str | None = None, takes_context: Literal[True], **options: Any
) -> Callable[[Callable[Concatenate[JobContext, P], R]], Task[P, R]]: ...


@overload
def task(*, name: str | None = None, **options: Any) -> Callable[[Callable[P, R]], Task[P, R]]: ...


def task(func: Any = None, /, *, name: str | None = None, **options: Any) -> Any:
    """Register a function (plain or ``async def``) as a task (§2).

    Usable bare (``@task``) or with options (``@task(queue="mail")``). The task
    name defaults to ``"<module>.<qualname>"``.

    Options: ``queue`` (str), ``priority`` (-100..100), ``max_retries`` (int),
    ``min_backoff``/``max_backoff`` (durations), ``expires`` (duration),
    ``debounce``/``debounce_max_wait`` (durations), ``debounce_key`` (template
    or callable), ``debounce_replace_payload`` (bool), ``debounce_merge``
    (callable), ``unique_key``/``idempotent`` (coalescing), ``rate_limit``
    (``"N/period"``), ``rate_limit_burst`` (int ≥ 1, the bucket's capacity),
    ``on_excess`` (``"defer"``/``"drop"``), ``concurrency`` (int ≥ 1),
    ``circuit_breaker`` (:class:`~django_debounce.CircuitBreaker`),
    ``metadata`` (dict), ``takes_context`` (bool: the function receives a
    :class:`~django_debounce.context.JobContext` as its first argument, as
    with Django's ``@task(takes_context=True)``; callers never pass it).

    Raises:
        ConfigurationError: at decoration, for any error listed in §2, or
            ``takes_context=True`` on a function with no positional parameter.
    """
    if func is not None:
        return _make(func, name, options)

    def decorator(f: Callable[P, R]) -> Task[P, R]:
        return _make(f, name, options)

    return decorator


@overload
def debounced_task(func: Callable[P, R], /) -> Task[P, R]: ...


@overload
def debounced_task(
    *, name: str | None = None, debounce: DurationLike | None = None, **options: Any
) -> Callable[[Callable[P, R]], Task[P, R]]: ...


def debounced_task(
    func: Any = None,
    /,
    *,
    name: str | None = None,
    debounce: DurationLike | None = None,
    **options: Any,
) -> Any:
    """Register a task with a debounce window (§2).

    Usable bare (``@debounced_task``, taking both durations from the settings)
    or with options (``@debounced_task(debounce="5m", debounce_max_wait="30m")``).
    ``debounce`` defaults to ``DEBOUNCE_DEFAULT_WINDOW``; ``debounce_max_wait``
    to ``DEBOUNCE_DEFAULT_MAX_WAIT``. Takes every option of :func:`task`.

    Raises:
        ConfigurationError: no window is given and the setting is unset, or any
            error of :func:`task`.
    """
    if debounce is None:
        debounce = settings.default_window
        if debounce is None:
            raise ConfigurationError(
                "@debounced_task needs debounce= (e.g. debounce='5m') or the "
                "DEBOUNCE_DEFAULT_WINDOW setting."
            )
    if func is not None:
        return _make(func, name, {**options, "debounce": debounce})

    def decorator(f: Callable[P, R]) -> Task[P, R]:
        return _make(f, name, {**options, "debounce": debounce})

    return decorator


def periodic_task(
    cron: str,
    /,
    *,
    tz: str | None = None,
    args: tuple[Any, ...] | list[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    schedule_name: str | None = None,
    overlap: bool = False,
    pass_tick: bool = False,
    max_lateness: DurationLike | None = None,
    **options: Any,
) -> Callable[[Callable[P, R]], Task[P, R]]:
    """Register a task that also runs on a cron schedule (docs/howto/periodic-tasks.md).

    ``@periodic_task("0 3 * * *", tz="Europe/Paris")`` is
    ``@task(schedule=Schedule("0 3 * * *", tz="Europe/Paris"))``: an
    ordinary task (``delay()`` still enqueues it; every option of
    :func:`task` applies to its periodic jobs too, flow control included)
    whose ticks the built-in worker and the Celery dispatcher defer, one
    job per tick (decision 177).

    Args:
        cron: a five-field cron expression (or six, seconds first), read by cronsim.
        tz: an IANA zone name; ``None``: Django's ``TIME_ZONE``.
        args, kwargs: the fixed arguments of every periodic job.
        schedule_name: the schedule's name (default: the task's name).
        overlap: defer a tick even while the previous tick's job is READY or RUNNING.
        pass_tick: pass the tick's instant as the keyword argument ``tick``.
        max_lateness: how late a tick may still be deferred (a duration;
            ``None``: ``DEBOUNCE_PERIODIC_MAX_LATENESS``).
        **options: any option of :func:`task` (``name``, ``queue``, ``rate_limit``, ...).

    Raises:
        ConfigurationError: at decoration: a bad cron expression, an unknown
            zone, arguments that do not fit the function, or any error of :func:`task`.
    """
    schedule = Schedule(
        cron,
        tz=tz,
        args=tuple(args),
        kwargs=dict(kwargs or {}),
        name=schedule_name,
        overlap=overlap,
        pass_tick=pass_tick,
        max_lateness=max_lateness,
    )
    return task(**options, schedule=schedule)  # type: ignore[no-any-return]
