"""Declaring tasks: :func:`task`, :func:`debounced_task` and :class:`Task` (contract §2).

Nothing here touches the database; ``delay``/``apply_async`` hand over to
:mod:`django_debounce.core`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

from . import registry
from .conf import settings
from .durations import DurationLike, parse_duration
from .exceptions import ConfigurationError
from .rates import parse_rate

if TYPE_CHECKING:
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
    """Return ``queue`` if it is a non-empty name of at most 100 characters."""
    if (
        not isinstance(queue, str)
        or not queue
        or len(queue) > 100
        or queue != queue.strip()
        or "\x00" in queue
    ):
        raise ConfigurationError(
            f"queue={queue!r} must be a non-empty str of at most 100 characters."
        )
    return queue


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


class Task(Generic[P, R]):
    """A registered task: call it to run inline, ``delay``/``apply_async`` to enqueue."""

    def __init__(self, func: Callable[P, R], *, name: str, options: TaskOptions) -> None:
        self.func = func
        self.name = name
        self.options = options
        self.signature = inspect.signature(func)
        self.is_async = inspect.iscoroutinefunction(func)
        self.__doc__ = func.__doc__
        self.__name__ = getattr(func, "__name__", name)
        self.__qualname__ = getattr(func, "__qualname__", name)
        self.__module__ = func.__module__
        self.__wrapped__ = func

    def __repr__(self) -> str:
        return f"<Task {self.name}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function inline (no job); an ``async def`` task returns its coroutine."""
        return self.func(*args, **kwargs)

    def delay(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Enqueue a call with the task's default options (§2). See :meth:`apply_async`."""
        from .core import enqueue_call

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
        from .core import enqueue_call

        return enqueue_call(self, self.name, args, kwargs or {}, options)


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
    on_excess: str = "defer",
    metadata: dict[str, Any] | None = None,
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
    if on_excess not in ON_EXCESS:
        raise ConfigurationError(
            f"{where}: on_excess={on_excess!r} is unknown; use 'defer' (wait for a token) or "
            "'drop' (dead-letter the job)."
        )
    if rate_limit is not None:
        parse_rate(rate_limit)
        raise ConfigurationError(
            f"{where}: rate_limit is parsed but not enforced by this release yet; remove it "
            "rather than rely on a limit that does not hold."
        )
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
    )


def _make(func: Callable[P, R], name: str | None, options: dict[str, Any]) -> Task[P, R]:
    if not callable(func):
        raise ConfigurationError(f"@task decorates a function, got {func!r}.")
    task_name = name or f"{func.__module__}.{func.__qualname__}"
    if (
        not isinstance(task_name, str)
        or not task_name
        or len(task_name) > 255
        or "\x00" in task_name
    ):
        raise ConfigurationError(
            f"task name {task_name!r} must be a non-empty str of at most 255 characters."
        )
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
def task(*, name: str | None = None, **options: Any) -> Callable[[Callable[P, R]], Task[P, R]]: ...


def task(func: Any = None, /, *, name: str | None = None, **options: Any) -> Any:
    """Register a function (plain or ``async def``) as a task (§2).

    Usable bare (``@task``) or with options (``@task(queue="mail")``). The task
    name defaults to ``"<module>.<qualname>"``.

    Options: ``queue`` (str), ``priority`` (-100..100), ``max_retries`` (int),
    ``min_backoff``/``max_backoff`` (durations), ``expires`` (duration),
    ``debounce``/``debounce_max_wait`` (durations), ``debounce_key`` (template
    or callable), ``debounce_replace_payload`` (bool), ``debounce_merge``
    (callable), ``unique_key``/``idempotent`` (coalescing), ``on_excess``,
    ``metadata`` (dict).

    Raises:
        ConfigurationError: at decoration, for any error listed in §2.
    """
    if func is not None:
        return _make(func, name, options)

    def decorator(f: Callable[P, R]) -> Task[P, R]:
        return _make(f, name, options)

    return decorator


def debounced_task(
    *, name: str | None = None, debounce: DurationLike | None = None, **options: Any
) -> Callable[[Callable[P, R]], Task[P, R]]:
    """Register a task with a debounce window (§2).

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

    def decorator(f: Callable[P, R]) -> Task[P, R]:
        return _make(f, name, {**options, "debounce": debounce})

    return decorator


def with_options(options: TaskOptions, **changes: Any) -> TaskOptions:
    """Return ``options`` with ``changes`` applied (for tests and integrations)."""
    return replace(options, **changes)
