"""A task's options and one call's: validated once, merged, planned (contract §2, §3, §6).

:class:`TaskOptions` is what a task declares; its ``__post_init__`` checks it,
so every instance is valid. A call's own options are merged onto the task's
with :func:`dataclasses.replace`, which runs the same checks again as a call
(:func:`~django_debounce.options.merge_call`). The options a call may give are the fields marked
``per_call`` plus the fields of :class:`CallOnlyOptions`; the options a task
may declare are the fields of :class:`TaskOptions`. :class:`Plan` is what
:mod:`django_debounce.enqueueing.planning` makes of a call and
:mod:`django_debounce.enqueueing.call` writes.

The order of the checks is part of the contract: when several things are
wrong, the first check listed in :func:`_check_declaration` (at registration)
or :func:`_check_call` (at enqueue) names the error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import InitVar, dataclass, field, fields, replace
from datetime import datetime, timedelta
from typing import Final, NamedTuple

from .breaker import CircuitBreaker
from .conf import settings
from .conf.durations import DurationLike
from .conf.executor import parse_executor
from .conf.numbers import parse_max_retries
from .exceptions import ConfigurationError
from .keys import check_template

# Re-exported: where callers import them from.
from .plans import MergeFunction as MergeFunction
from .plans import Plan as Plan
from .plans import StoredCall as StoredCall
from .validators import (
    check_duration,
    check_edge,
    check_flow_control,
    check_metadata,
    check_priority,
    check_queue,
    check_rate_per_key,
    check_window,
    did_you_mean,
)

#: A key option (§3): a template ``str``, or a callable of the task's arguments
#: returning the key (``None`` opts the call out of keying).
KeySpec = str | Callable[..., object]

#: ``on_excess`` values: wait for a token, or shed the job (§6).
ON_EXCESS = ("defer", "drop")
#: Field metadata of the task options a call may also give (§2).
_PER_CALL: Final = {"per_call": True}


class Origin(NamedTuple):
    """Who an options object is checked for: a task's declaration or one call (§2)."""

    where: str
    """The message prefix naming the task or the call, e.g. ``"task 'app.f'"``."""
    call: Mapping[str, object] | None = None
    """The call's own options as given (``None``: a declaration)."""


@dataclass(frozen=True, slots=True)
class TaskOptions:
    """A task's validated defaults; a call's options override the ``per_call`` ones (§2).

    Construction checks the options (``ConfigurationError`` for any error of
    contract §2); :func:`~django_debounce.options.declare` builds one from a decorator's options and
    :func:`~django_debounce.options.merge_call` merges a call's options onto one.
    """

    queue: str = field(default="default", metadata=_PER_CALL)
    priority: int = field(default=0, metadata=_PER_CALL)
    max_retries: int | None = field(default=None, metadata=_PER_CALL)
    """Retries after the first attempt, 0..10000; ``None``: ``DEBOUNCE_MAX_RETRIES``."""
    debounce: timedelta | None = field(default=None, metadata=_PER_CALL)
    """The debounce window (§4); ``None``: not debounced."""
    debounce_key: KeySpec | None = field(default=None, metadata=_PER_CALL)
    debounce_max_wait: timedelta | None = field(default=None, metadata=_PER_CALL)
    """The ceiling fixed when a window opens; set whenever ``debounce`` is."""
    debounce_replace_payload: bool = field(default=False, metadata=_PER_CALL)
    debounce_merge: MergeFunction | None = field(default=None, metadata=_PER_CALL)
    debounce_edge: str = "trailing"
    """Which calls of a burst run: ``"trailing"``, ``"leading"`` or ``"both"`` (decision 180)."""
    unique_key: KeySpec | None = field(default=None, metadata=_PER_CALL)
    idempotent: bool = False
    expires: timedelta | None = field(default=None, metadata=_PER_CALL)
    """How long after an enqueue the job expires; a call may give an aware datetime."""
    timeout: timedelta | None = field(default=None, metadata=_PER_CALL)
    """The run's soft time limit (decision 187); ``None``: none."""
    min_backoff: timedelta | None = None
    max_backoff: timedelta | None = None
    metadata: dict[str, object] = field(default_factory=dict, metadata=_PER_CALL)
    rate_limit: str | None = None
    """Token-bucket rate ``"N/period"`` enforced at claim time across the deployment (§6)."""
    rate_limit_burst: int | None = None
    """Bucket capacity; ``None``: the N of ``rate_limit`` (§11)."""
    rate_limit_per_key: str | None = None
    """Token-bucket rate ``"N/period"`` per debounce key, enforced at claim time (decision 189)."""
    on_excess: str = "defer"
    """``"defer"`` (wait for a token, keeping ``run_at``) or ``"drop"`` (shed the job, §6)."""
    concurrency: int | None = None
    """Most jobs of the task RUNNING at once across the deployment; ``None``: no cap."""
    circuit_breaker: CircuitBreaker | None = None
    """The task's circuit breaker (§6), or ``None``."""
    takes_context: bool = False
    """The function receives a :class:`~django_debounce.context.JobContext` first."""
    executor: str | None = None
    """Who runs the task's jobs: ``"worker"`` or ``"celery"``; ``None``: ``DEBOUNCE_EXECUTOR``
    (issue #10, decision 85)."""
    schedule: tuple[object, ...] = ()
    """The task's :class:`~django_debounce.schedules.Schedule` objects (checked by
    :func:`~django_debounce.schedules.declare_schedules` at registration; decision 177)."""
    origin: InitVar[Origin | None] = None
    """Who the options are checked for (not stored); ``None``: a declaration."""

    def __post_init__(self, origin: Origin | None) -> None:
        if origin is not None and origin.call is not None:
            max_wait, retries = _check_call(self, origin.where, origin.call)
            if retries != self.max_retries:  # a call's options carry the retries in force
                _set(self, "max_retries", retries)
        else:
            max_wait = _check_declaration(self, origin.where if origin else "task options")
            _set(self, "debounce_replace_payload", bool(self.debounce_replace_payload))
            _set(self, "idempotent", bool(self.idempotent))
            if self.rate_limit is not None:
                _set(self, "rate_limit", self.rate_limit.strip())
            if self.rate_limit_per_key is not None:
                _set(self, "rate_limit_per_key", self.rate_limit_per_key.strip())
        if max_wait != self.debounce_max_wait:
            _set(self, "debounce_max_wait", max_wait)


@dataclass(frozen=True)
class CallOnlyOptions:
    """The options a call may give that a task never declares (§2).

    Checked by :func:`django_debounce.enqueueing.planning.schedule` (``depends_on``:
    by the planning's first step), not merged onto the task's options.
    """

    countdown: DurationLike | None = None
    """Run this long after the enqueue (not on a debounced call)."""
    eta: datetime | None = None
    """Run at this aware datetime (not on a debounced call)."""
    notes: str | None = None
    """Free text stored on the job."""
    depends_on: Sequence[object] | None = None
    """Jobs or job ids (int) this job waits for (§6)."""


#: The options a decorator takes (§2).
TASK_OPTIONS: Final = frozenset(f.name for f in fields(TaskOptions))
#: The options a call takes (§2): the ``per_call`` task options and the call-only ones.
CALL_OPTIONS: Final = frozenset(
    [f.name for f in fields(TaskOptions) if f.metadata.get("per_call")]
    + [f.name for f in fields(CallOnlyOptions)]
)
#: The call options merged onto the task's with ``replace`` (``expires`` is scheduled apart).
_MERGED: Final = frozenset(f.name for f in fields(TaskOptions) if f.metadata.get("per_call")) - {
    "expires"
}


def _set(options: TaskOptions, name: str, value: object) -> None:
    object.__setattr__(options, name, value)


def _duration(value: object, name: str) -> timedelta | None:
    return None if value is None else check_duration(value, name)


def declare(where: str, options: Mapping[str, object]) -> TaskOptions:
    """Return a decorator's ``options`` as :class:`TaskOptions` (registration-time errors, §2).

    Args:
        where: the message prefix, ``"task '<name>'"``.
        options: the decorator's keyword options (any of :data:`TASK_OPTIONS`).

    Raises:
        ConfigurationError: an unknown option, or any error of contract §2; in
            the order of :func:`_check_declaration`, the durations ``expires``,
            ``min_backoff`` and ``max_backoff`` last.
    """
    unknown = sorted(set(options) - TASK_OPTIONS)
    if unknown:
        raise ConfigurationError(
            f"{where}: unknown option(s) {unknown}{did_you_mean(unknown, TASK_OPTIONS)}; "
            f"accepted: {', '.join(sorted(TASK_OPTIONS))}."
        )
    later = ("expires", "min_backoff", "max_backoff", "metadata")
    first = {name: value for name, value in options.items() if name not in later}
    first["debounce"] = _duration(options.get("debounce"), "debounce")
    first["debounce_max_wait"] = _duration(options.get("debounce_max_wait"), "debounce_max_wait")
    first["timeout"] = _duration(options.get("timeout"), "timeout")
    # The caller's values are unchecked here: ``__post_init__`` checks them.
    declared = TaskOptions(**first, origin=Origin(where))  # type: ignore[arg-type]
    if all(options.get(name) is None for name in later):
        return declared
    return replace(
        declared,
        expires=_duration(options.get("expires"), "expires"),
        min_backoff=_duration(options.get("min_backoff"), "min_backoff"),
        max_backoff=_duration(options.get("max_backoff"), "max_backoff"),
        metadata=dict(options.get("metadata") or {}),  # type: ignore[call-overload]
        origin=Origin(where),
    )


def merge_call(
    defaults: TaskOptions, options: Mapping[str, object], where: str
) -> tuple[TaskOptions, int]:
    """Return ``defaults`` with a call's ``options`` merged on, and the retries in force (§2).

    The merge is :func:`dataclasses.replace`, so the result is checked as a
    call (:func:`_check_call`). An option given as ``None`` is not given. Only
    the call's own options are checked for their type; the task's were
    checked when it was declared. The retries in force are ``max_retries``,
    or ``DEBOUNCE_MAX_RETRIES`` when neither the task nor the call gives it.

    Raises:
        ConfigurationError: a bad duration, or any error of :func:`_check_call`.
    """
    changes: dict[str, object] = {
        name: value for name, value in options.items() if name in _MERGED and value is not None
    }
    if "debounce" in changes:
        changes["debounce"] = _duration(changes["debounce"], "debounce")
    if "debounce_max_wait" in changes:
        changes["debounce_max_wait"] = _duration(changes["debounce_max_wait"], "debounce_max_wait")
    if "timeout" in changes:
        changes["timeout"] = _duration(changes["timeout"], "timeout")
    if not changes:  # the task's own options: check them as this call without copying them
        return defaults, _check_call(defaults, where, options)[1]
    # The caller's values are unchecked here: ``__post_init__`` checks them.
    merged = replace(defaults, origin=Origin(where, options), **changes)  # type: ignore[arg-type]
    return merged, retries_in_force(merged)


def retries_in_force(options: TaskOptions) -> int:
    """Return ``options.max_retries``, or ``DEBOUNCE_MAX_RETRIES`` when it is ``None``."""
    return settings.max_retries if options.max_retries is None else options.max_retries


def _key_needs_window(options: TaskOptions, where: str, *, call: bool) -> None:
    if options.debounce is None and (
        options.debounce_key is not None or options.debounce_max_wait is not None
    ):
        if call:
            raise ConfigurationError(
                f"{where}: debounce_key/debounce_max_wait given for a call that is not "
                "debounced; pass debounce= too."
            )
        raise ConfigurationError(
            f"{where}: debounce_key/debounce_max_wait without debounce=; use @debounced_task or "
            "pass debounce=."
        )


def _window_or_unique(options: TaskOptions, where: str, *, call: bool) -> None:
    if options.unique_key is not None or options.idempotent:
        if call:
            raise ConfigurationError(
                f"{where}: a debounce window and a unique key on one call (§1); choose one."
            )
        raise ConfigurationError(
            f"{where}: debounce and unique_key/idempotent on one task: coalescing returns the "
            "pending job unchanged, debouncing slides it (§1). Choose one."
        )


def _merge_or_replace(options: TaskOptions, where: str) -> None:
    if options.debounce_merge is not None and options.debounce_replace_payload:
        raise ConfigurationError(
            f"{where}: debounce_merge and debounce_replace_payload=True both decide the stored "
            "call; set only one."
        )


def _merge_is_callable(merge: object, where: str) -> None:
    if merge is not None and not callable(merge):
        raise ConfigurationError(
            f"{where}: debounce_merge must be a callable (stored, new) -> call."
        )


def _retries_in_range(max_retries: object, where: str) -> None:
    parse_max_retries(max_retries, name=f"{where}: max_retries")


def _check_declaration(options: TaskOptions, where: str) -> timedelta | None:
    """Check a task's declared options, in this order; return the max wait in force (§2)."""
    _key_needs_window(options, where, call=False)
    max_wait = None
    if options.debounce is not None:
        max_wait = check_window(options.debounce, options.debounce_max_wait, where=where)
        _window_or_unique(options, where, call=False)
    _merge_or_replace(options, where)
    _merge_is_callable(options.debounce_merge, where)
    check_edge(
        options.debounce_edge,
        options.debounce is not None,
        options.debounce_replace_payload or options.debounce_merge is not None,
        where,
    )
    if options.unique_key is not None and options.idempotent:
        raise ConfigurationError(f"{where}: give unique_key= or idempotent=True, not both.")
    if not isinstance(options.takes_context, bool):
        raise ConfigurationError(f"{where}: takes_context must be True or False.")
    if options.executor is not None:
        parse_executor(options.executor, where=f"{where}: executor")
    if options.on_excess not in ON_EXCESS:
        raise ConfigurationError(
            f"{where}: on_excess={options.on_excess!r} is unknown; use 'defer' (wait for a "
            "token) or 'drop' (dead-letter the job)."
        )
    check_flow_control(
        where,
        options.rate_limit,
        options.rate_limit_burst,
        options.concurrency,
        options.circuit_breaker,
    )
    check_rate_per_key(where, options.rate_limit_per_key, options.debounce_key)
    if options.max_retries is not None:
        _retries_in_range(options.max_retries, where)
    for name, spec in (("debounce_key", options.debounce_key), ("unique_key", options.unique_key)):
        if isinstance(spec, str):
            check_template(spec, where=where, option=name)
    check_queue(options.queue)
    check_priority(options.priority)
    if max_wait is not None and options.expires is not None and options.expires < max_wait:
        raise ConfigurationError(
            f"{where}: expires={options.expires} is shorter than the max wait "
            f"{max_wait}; the job could expire before its window closes."
        )
    return max_wait


def _check_call(
    options: TaskOptions, where: str, call: Mapping[str, object]
) -> tuple[timedelta | None, int]:
    """Check a call's merged options, in this order; return the max wait and retries in force (§2).

    ``call`` is the call's own options: the type checks of the key, payload
    and merge options look at those only (the task's were checked at
    declaration).
    """
    _key_needs_window(options, where, call=True)
    max_wait = None
    if options.debounce is not None:
        _window_or_unique(options, where, call=True)
        if call.get("countdown") is not None or call.get("eta") is not None:
            raise ConfigurationError(
                f"{where}: countdown/eta on a debounced call; the window decides when it runs."
            )
        max_wait = check_window(options.debounce, options.debounce_max_wait, where=where)
    _merge_or_replace(options, where)
    if options.debounce_replace_payload or options.debounce_merge is not None:
        check_edge(options.debounce_edge, True, True, where)
    check_queue(options.queue)
    check_priority(options.priority)
    retries = retries_in_force(options)
    _retries_in_range(retries, where)
    metadata: object = options.metadata
    if not isinstance(metadata, dict):
        raise ConfigurationError(
            f"{where}: metadata must be a dict, got {type(metadata).__name__}."
        )
    if metadata:
        check_metadata(metadata, where)
    for name in ("debounce_key", "unique_key"):
        spec = call.get(name)
        if spec is not None and not isinstance(spec, str) and not callable(spec):
            raise ConfigurationError(
                f"{where}: {name}={spec!r} must be a template str or a callable."
            )
        if isinstance(spec, str):
            check_template(spec, where=where, option=name)
    replace_payload = call.get("debounce_replace_payload")
    if replace_payload is not None and not isinstance(replace_payload, bool):
        raise ConfigurationError(f"{where}: debounce_replace_payload must be True or False.")
    _merge_is_callable(call.get("debounce_merge"), where)
    return max_wait, retries
