"""Declaring tasks: :func:`task`, :func:`debounced_task` and :class:`Task` (contract §2).

Nothing here touches the database; ``delay``/``apply_async`` hand over to
:mod:`django_debounce.enqueueing`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Concatenate, Generic, Literal, ParamSpec, TypeVar, overload

from . import registry
from .codec import is_storable_text
from .conf import settings
from .durations import DurationLike, parse_duration
from .exceptions import ConfigurationError
from .rates import parse_rate

if TYPE_CHECKING:
    from .breaker import CircuitBreaker
    from .context import JobContext
    from .models import Job

P = ParamSpec("P")
R = TypeVar("R")

KeySpec = str | Callable[..., Any]
MergeFunction = Callable[
    [tuple[list[Any], dict[str, Any]], tuple[list[Any], dict[str, Any]]],
    tuple[list[Any] | tuple[Any, ...], dict[str, Any]],
]

ON_EXCESS = ("defer", "drop")


def check_priority(priority: Any) -> int:
    """Return ``priority`` if it is an int in -100..100, else raise ``ConfigurationError``."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not -100 <= priority <= 100:
        raise ConfigurationError(
            f"priority={priority!r} is out of range: give an integer from -100 to 100 "
            "(higher runs first, default 0)."
        )
    return priority


def check_queue(queue: Any) -> str:
    """Return ``queue`` if it is a non-empty name of at most 100 characters.

    Raises:
        ConfigurationError: not a ``str``, empty, longer than the column's 100
            characters, surrounding spaces, or text no database can store (NUL,
            a lone surrogate).
    """
    if (
        not isinstance(queue, str)
        or not queue
        or len(queue) > 100
        or queue != queue.strip()
        or not is_storable_text(queue)
    ):
        raise ConfigurationError(
            f"queue={queue!r} must be a non-empty str of at most 100 characters, without "
            "surrounding spaces, NUL characters or lone surrogates."
        )
    return queue


#: Longest task name (``Job.task_name`` is a ``CharField(max_length=255)``).
MAX_TASK_NAME_LENGTH = 255


def check_task_name(task_name: Any) -> str:
    """Return ``task_name`` if it fits ``Job.task_name`` on every database.

    Checked when a task is declared and when ``enqueue("name", ...)`` names a
    task this process never imported, so a bad name is refused before any SQL.

    Raises:
        ConfigurationError: not a ``str``, empty, longer than 255 characters,
            or text no database can store (NUL, a lone surrogate).
    """
    if (
        not isinstance(task_name, str)
        or not task_name
        or len(task_name) > MAX_TASK_NAME_LENGTH
        or not is_storable_text(task_name)
    ):
        shown = repr(task_name)
        if isinstance(task_name, str) and len(task_name) > 80:
            shown = f"{task_name[:60]!r}… ({len(task_name)} characters)"
        raise ConfigurationError(
            f"task name {shown} must be a non-empty str of at most "
            f"{MAX_TASK_NAME_LENGTH} characters, without NUL characters or lone surrogates."
        )
    return task_name


def check_window(window: timedelta, max_wait: timedelta | None, *, where: str) -> timedelta:
    """Return the max wait in force for ``window``, validating the pair (§2).

    Raises:
        ConfigurationError: no max wait is given and ``DEBOUNCE_DEFAULT_MAX_WAIT``
            is unset (an unbounded window starves the job), or the max wait is
            shorter than the window.
    """
    if max_wait is None:
        default = settings.default_max_wait
        if default is None:
            raise ConfigurationError(
                f"{where}: debounce={window} needs debounce_max_wait= (or the "
                "DEBOUNCE_DEFAULT_MAX_WAIT setting): without a ceiling a steady stream of calls "
                "would push the run back forever."
            )
        max_wait = parse_duration(default, name="DEBOUNCE_DEFAULT_MAX_WAIT")
    if max_wait < window:
        raise ConfigurationError(
            f"{where}: debounce_max_wait={max_wait} is shorter than the window debounce={window}; "
            "the max wait must be at least the window."
        )
    return max_wait


def _optional_duration(value: DurationLike | None, name: str) -> timedelta | None:
    return None if value is None else parse_duration(value, name=name)


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


@dataclass(frozen=True)
class TaskOptions:
    """A task's validated defaults; per-call options override them (§2)."""

    queue: str = "default"
    priority: int = 0
    max_retries: int | None = None
    debounce: timedelta | None = None
    debounce_key: KeySpec | None = None
    debounce_max_wait: timedelta | None = None
    debounce_replace_payload: bool = False
    debounce_merge: MergeFunction | None = None
    unique_key: KeySpec | None = None
    idempotent: bool = False
    expires: timedelta | None = None
    min_backoff: timedelta | None = None
    max_backoff: timedelta | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    rate_limit: str | None = None
    """Token-bucket rate ``"N/period"`` enforced at claim time across the deployment (§6)."""
    rate_limit_burst: int | None = None
    """Bucket capacity; ``None``: the N of ``rate_limit`` (§11)."""
    on_excess: str = "defer"
    """``"defer"`` (wait for a token, keeping ``run_at``) or ``"drop"`` (shed the job, §6)."""
    concurrency: int | None = None
    """Most jobs of the task RUNNING at once across the deployment; ``None``: no cap."""
    circuit_breaker: CircuitBreaker | None = None
    """The task's circuit breaker (§6), or ``None``."""
    takes_context: bool = False
    """The function receives a :class:`~django_debounce.context.JobContext` first."""


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
        from .enqueueing import enqueue_call

        return enqueue_call(self, self.name, args, kwargs, {})

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
                ``queue``, ``expires``, ``metadata``, ``notes``, ``unique_key``.

        Returns:
            The :class:`~django_debounce.models.Job` after this enqueue, with
            ``outcome`` set to ``"created"``, ``"debounced"`` or ``"coalesced"``.

        Raises:
            ConfigurationError: an unknown or invalid option, or a combination
                the contract forbids (§2); nothing is written.
            KeyResolutionError: a key placeholder does not resolve (§3).
            PayloadError: an argument the codec cannot store (§5).
            EnqueueContentionError: lock contention outlasted the retry budget (§4.4).
        """
        from .enqueueing import enqueue_call

        return enqueue_call(self, self.name, args, kwargs or {}, options)


def _check_flow_control(
    where: str,
    rate_limit: Any,
    rate_limit_burst: Any,
    concurrency: Any,
    circuit_breaker: Any,
) -> None:
    """Validate the throttle, concurrency and breaker options (§6, §11).

    Raises:
        ConfigurationError: ``rate_limit`` is not ``"N/period"``;
            ``rate_limit_burst`` is given without ``rate_limit`` or is not an
            int ≥ 1; ``concurrency`` is not an int ≥ 1; ``circuit_breaker`` is
            not a :class:`~django_debounce.CircuitBreaker`.
    """
    from .breaker import CircuitBreaker

    if rate_limit is not None:
        if not isinstance(rate_limit, str):
            raise ConfigurationError(
                f"{where}: rate_limit={rate_limit!r} must be a str 'N/period', e.g. '10/s', "
                "'100/m', '5/10s'."
            )
        parse_rate(rate_limit)
    if rate_limit_burst is not None:
        if rate_limit is None:
            raise ConfigurationError(
                f"{where}: rate_limit_burst= sizes the bucket of a rate_limit=; give rate_limit= "
                "too, or drop rate_limit_burst=."
            )
        if (
            isinstance(rate_limit_burst, bool)
            or not isinstance(rate_limit_burst, int)
            or rate_limit_burst < 1
        ):
            raise ConfigurationError(
                f"{where}: rate_limit_burst={rate_limit_burst!r} must be an int >= 1 (the most "
                "jobs that may start at once; default: the N of rate_limit='N/period')."
            )
    if concurrency is not None and (
        isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
    ):
        raise ConfigurationError(
            f"{where}: concurrency={concurrency!r} must be an int >= 1 (the most jobs of this "
            "task running at once across the deployment), or None for no cap."
        )
    if circuit_breaker is not None and not isinstance(circuit_breaker, CircuitBreaker):
        raise ConfigurationError(
            f"{where}: circuit_breaker={circuit_breaker!r} must be a "
            "django_debounce.CircuitBreaker(failures=5, reset='1m')."
        )


def build_options(
    *,
    where: str,
    queue: str = "default",
    priority: int = 0,
    max_retries: int | None = None,
    debounce: DurationLike | None = None,
    debounce_key: KeySpec | None = None,
    debounce_max_wait: DurationLike | None = None,
    debounce_replace_payload: bool = False,
    debounce_merge: MergeFunction | None = None,
    unique_key: KeySpec | None = None,
    idempotent: bool = False,
    expires: DurationLike | None = None,
    min_backoff: DurationLike | None = None,
    max_backoff: DurationLike | None = None,
    rate_limit: str | None = None,
    rate_limit_burst: int | None = None,
    on_excess: str = "defer",
    concurrency: int | None = None,
    circuit_breaker: CircuitBreaker | None = None,
    metadata: dict[str, Any] | None = None,
    takes_context: bool = False,
) -> TaskOptions:
    """Validate decorator options into :class:`TaskOptions` (registration-time errors, §2).

    Raises:
        ConfigurationError: see the list in contract §2.
    """
    window = _optional_duration(debounce, "debounce")
    max_wait = _optional_duration(debounce_max_wait, "debounce_max_wait")
    if window is None and (debounce_key is not None or max_wait is not None):
        raise ConfigurationError(
            f"{where}: debounce_key/debounce_max_wait without debounce=; use @debounced_task or "
            "pass debounce=."
        )
    if window is not None:
        max_wait = check_window(window, max_wait, where=where)
        if unique_key is not None or idempotent:
            raise ConfigurationError(
                f"{where}: debounce and unique_key/idempotent on one task: coalescing returns the "
                "pending job unchanged, debouncing slides it (§1). Choose one."
            )
    if debounce_merge is not None and debounce_replace_payload:
        raise ConfigurationError(
            f"{where}: debounce_merge and debounce_replace_payload=True both decide the stored "
            "call; set only one."
        )
    if debounce_merge is not None and not callable(debounce_merge):
        raise ConfigurationError(
            f"{where}: debounce_merge must be a callable (stored, new) -> call."
        )
    if unique_key is not None and idempotent:
        raise ConfigurationError(f"{where}: give unique_key= or idempotent=True, not both.")
    if not isinstance(takes_context, bool):
        raise ConfigurationError(f"{where}: takes_context must be True or False.")
    if on_excess not in ON_EXCESS:
        raise ConfigurationError(
            f"{where}: on_excess={on_excess!r} is unknown; use 'defer' (wait for a token) or "
            "'drop' (dead-letter the job)."
        )
    _check_flow_control(where, rate_limit, rate_limit_burst, concurrency, circuit_breaker)
    if max_retries is not None and (
        isinstance(max_retries, bool)
        or not isinstance(max_retries, int)
        or not 0 <= max_retries <= 10_000
    ):
        raise ConfigurationError(
            f"{where}: max_retries={max_retries!r} must be an int from 0 to 10000."
        )
    return TaskOptions(
        queue=check_queue(queue),
        priority=check_priority(priority),
        max_retries=max_retries,
        debounce=window,
        debounce_key=debounce_key,
        debounce_max_wait=max_wait,
        debounce_replace_payload=bool(debounce_replace_payload),
        debounce_merge=debounce_merge,
        unique_key=unique_key,
        idempotent=bool(idempotent),
        expires=_optional_duration(expires, "expires"),
        min_backoff=_optional_duration(min_backoff, "min_backoff"),
        max_backoff=_optional_duration(max_backoff, "max_backoff"),
        metadata=dict(metadata or {}),
        rate_limit=rate_limit.strip() if rate_limit is not None else None,
        rate_limit_burst=rate_limit_burst,
        on_excess=on_excess,
        concurrency=concurrency,
        circuit_breaker=circuit_breaker,
        takes_context=takes_context,
    )


def _make(func: Callable[P, R], name: str | None, options: dict[str, Any]) -> Task[P, R]:
    if not callable(func):
        raise ConfigurationError(f"@task decorates a function, got {func!r}.")
    task_name = check_task_name(name or f"{func.__module__}.{func.__qualname__}")
    known = set(inspect.signature(build_options).parameters) - {"where"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigurationError(
            f"task {task_name!r}: unknown option(s) {unknown}; accepted: {', '.join(sorted(known))}."
        )
    built = build_options(where=f"task {task_name!r}", **options)
    if built.debounce is not None and built.expires is not None:
        assert built.debounce_max_wait is not None
        if built.expires < built.debounce_max_wait:
            raise ConfigurationError(
                f"task {task_name!r}: expires={built.expires} is shorter than the max wait "
                f"{built.debounce_max_wait}; the job could expire before its window closes."
            )
    created = Task(func, name=task_name, options=built)
    registry.register(created)
    return created


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


def with_options(options: TaskOptions, **changes: Any) -> TaskOptions:
    """Return ``options`` with ``changes`` applied (for tests and integrations)."""
    return replace(options, **changes)
