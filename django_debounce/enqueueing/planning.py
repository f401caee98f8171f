"""Plan a call: check it, resolve its keys, encode its payload; run no SQL (contract §2–§6).

:func:`plan_call` turns one call into the :class:`~django_debounce.options.Plan`
that :func:`django_debounce.enqueueing.call.write` writes, in four steps whose
errors win in this order: the call's shape, its options (merged onto the
task's and checked by :func:`~django_debounce.options.merge_call`, then
:func:`schedule`), its keys (§3), its payload (§5).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import NamedTuple

from django.utils import timezone

from .. import codec, keys
from ..conf import settings
from ..exceptions import ConfigurationError, KeyResolutionError
from ..models import Job
from ..options import CALL_OPTIONS, Plan, TaskOptions, merge_call
from ..registry import RegisteredTask
from ..validators import check_duration, did_you_mean

#: Options of a call of a task this process never imported: the defaults of §2.
_UNREGISTERED = TaskOptions()


def plan_call(
    task: RegisteredTask | None,
    task_name: str,
    args: Sequence[object],
    kwargs: Mapping[str, object],
    options: Mapping[str, object],
    now: datetime,
) -> Plan:
    """Validate a call and resolve its key and payload; run no SQL.

    The steps, in the order their errors win: resolve the call's options
    (its shape, then its options merged onto the task's:
    :func:`~django_debounce.options.merge_call`), validate what only a call
    has (:func:`schedule`), its keys (§3), its payload (§5).

    Raises:
        ConfigurationError, KeyResolutionError, PayloadError: see ``apply_async``.
    """
    where = f"enqueue of {task_name!r}"
    # Resolve: the call's shape, and its options merged onto the task's (checked as a call).
    depends_on = _check_shape(task_name, args, kwargs, options, where)
    defaults = task.options if task is not None else _UNREGISTERED
    merged, max_retries = _merge(defaults, options, where)
    # Validate what only a call has: its notes, expiry and due time.
    when = schedule(merged, options, where, now)
    # Key: resolved before the payload is encoded (§3); a key callable may opt out.
    debounce_key, unique_key = _resolve_keys(task, merged, args, kwargs, where)
    window = merged.debounce if debounce_key is not None else None
    # Codec: the payload as stored (§5).
    enc_args, enc_kwargs = codec.encode_call(args, dict(kwargs))
    metadata = options.get("metadata")
    return Plan(
        task_name=task_name,
        queue=merged.queue,
        priority=merged.priority,
        max_retries=max_retries,
        args=enc_args,
        kwargs=enc_kwargs,
        run_at=when.run_at,
        expires_at=when.expires_at,
        metadata=metadata if isinstance(metadata, dict) else dict(merged.metadata),
        notes=when.notes,
        window=window,
        max_wait=merged.debounce_max_wait if window is not None else None,
        debounce_key=debounce_key,
        window_key=None if debounce_key is None else keys.window_hash(task_name, debounce_key),
        replace_payload=merged.debounce_replace_payload,
        merge=merged.debounce_merge,
        edge=merged.debounce_edge if window is not None else "trailing",
        unique_key=unique_key,
        unique_lock=keys.window_hash(task_name, unique_key) if unique_key is not None else None,
        depends_on=depends_on,
        timeout=merged.timeout,
    )


def debounce_key_of_call(
    task: RegisteredTask,
    args: Sequence[object],
    kwargs: Mapping[str, object],
    where: str,
) -> str:
    """Return the debounce key ``task.delay(*args, **kwargs)`` would use (§3); run no SQL.

    The key is resolved as :func:`plan_call` resolves it for a call with no
    options of its own (the task's options checked as a call, then the key),
    so a window handle addresses exactly the window that call would join.

    Args:
        task: a registered task.
        args, kwargs: the call's arguments, as ``delay`` takes them.
        where: the message prefix naming the caller, e.g. ``"window of 'app.f'"``.

    Raises:
        ConfigurationError: the task has no debounce window.
        KeyResolutionError: the arguments do not fit the task's signature, a
            placeholder does not resolve, or a key callable returned ``None``
            (such a call is not debounced, so it has no window).
        PayloadError: an argument the default key cannot hash.
    """
    merged = require_window(task, where)
    debounce_key, _ = _resolve_keys(task, merged, args, kwargs, where)
    if debounce_key is None:
        raise KeyResolutionError(
            f"{where}: the debounce_key callable returned None for these arguments, so such "
            "a call is not debounced and has no window."
        )
    return debounce_key


def require_window(task: RegisteredTask, where: str) -> TaskOptions:
    """Return the options a call of ``task`` with no options of its own has, if it is debounced.

    Raises:
        ConfigurationError: the task has no debounce window (so no windows to address).
    """
    merged, _ = _merge(task.options, {}, where)
    if merged.debounce is None:
        raise ConfigurationError(
            f"{where}: task {task.name!r} is not debounced (no debounce= window), so it has "
            "no windows; declare it with @debounced_task or debounce=."
        )
    return merged


#: Merged options of calls already seen: ``(id(defaults), DEBOUNCE_MAX_RETRIES,
#: DEBOUNCE_MAX_PAYLOAD_BYTES, options)`` to ``(defaults, merged, retries)``. The entry holds ``defaults`` itself, so its ``id`` in the
#: key can never be reused by another object while the entry lives.
_merged: dict[tuple[int, int, int, tuple[tuple[str, object], ...]], tuple[object, TaskOptions, int]]
_merged = {}
#: Entries at most; past it the cache starts over.
_MERGED_MAX = 256


def _merge(
    defaults: TaskOptions, options: Mapping[str, object], where: str
) -> tuple[TaskOptions, int]:
    """Return :func:`merge_call` of a call's options, reusing the result of an equal earlier call.

    ``merge_call`` builds a new checked ``TaskOptions`` with ``dataclasses.replace``
    (~8 µs) for every call that overrides an option. Its result depends only on
    the task's options, the call's options and ``DEBOUNCE_MAX_RETRIES``, so a call
    whose options are all hashable (e.g. ``priority=5, queue="mail"``) reuses the
    result of an equal earlier call; only successes are kept, so every error is
    still raised by the checks themselves.
    """
    if not options:  # merge_call returns the task's own options: nothing to save
        return merge_call(defaults, options, where)
    try:
        limits = (settings.max_retries, settings.max_payload_bytes)
        key = (id(defaults), *limits, tuple(sorted(options.items())))
        found = _merged.get(key)
    except TypeError:  # an unhashable option value (metadata, depends_on): merge it
        return merge_call(defaults, options, where)
    if found is not None and found[0] is defaults:
        return found[1], found[2]
    merged, retries = merge_call(defaults, options, where)
    if len(_merged) >= _MERGED_MAX:
        _merged.clear()
    _merged[key] = (defaults, merged, retries)
    return merged, retries


def _check_shape(
    task_name: str,
    args: Sequence[object],
    kwargs: Mapping[str, object],
    options: Mapping[str, object],
    where: str,
) -> tuple[int, ...]:
    """Check the option names, ``args`` and ``kwargs``; return the ``depends_on`` ids.

    Raises:
        ConfigurationError: an option not in ``CALL_OPTIONS``; ``args`` not a
            list or tuple; ``kwargs`` not a mapping; a bad ``depends_on``.
    """
    unknown = sorted(set(options) - CALL_OPTIONS)
    if unknown:
        raise ConfigurationError(
            f"unknown enqueue option(s) {unknown} for task {task_name!r}"
            f"{did_you_mean(unknown, CALL_OPTIONS)}; accepted: {', '.join(sorted(CALL_OPTIONS))}."
        )
    if not isinstance(args, list | tuple):
        raise ConfigurationError(f"args must be a tuple or list, got {type(args).__name__}.")
    if not isinstance(kwargs, Mapping):
        raise ConfigurationError(f"kwargs must be a dict, got {type(kwargs).__name__}.")
    return _dependency_ids(options.get("depends_on"), where)


def _resolve_keys(
    task: RegisteredTask | None,
    options: TaskOptions,
    args: Sequence[object],
    kwargs: Mapping[str, object],
    where: str,
) -> tuple[str | None, str | None]:
    """Return the call's ``(debounce key, unique key)`` (§3), before its payload is encoded.

    The debounce key is ``None`` for a call that is not debounced, or whose
    key callable returned ``None`` (the call opts out of its window).

    Raises:
        KeyResolutionError: naming the call; PayloadError: an argument the
            default key cannot hash.
    """
    debounce_key: str | None = None
    unique_key: str | None = None
    try:
        bound = keys.bind_call(task.signature if task is not None else None, args, kwargs)
        if options.debounce is not None:
            if options.debounce_key is None:
                debounce_key = keys.default_key(bound)
            else:
                debounce_key = keys.resolve_key(
                    options.debounce_key, bound, args, kwargs, option="debounce_key"
                )
        if options.unique_key is not None:
            unique_key = keys.resolve_key(
                options.unique_key, bound, args, kwargs, option="unique_key"
            )
        elif options.idempotent:
            unique_key = keys.default_key(bound)
    except KeyResolutionError as exc:  # name the call: the key's own message does not
        raise KeyResolutionError(f"{where}: {exc}") from exc
    return debounce_key, unique_key


def _dependency_ids(value: object, where: str) -> tuple[int, ...]:
    """Return the job ids of a ``depends_on=`` option (§6), in order, without duplicates.

    Accepts a list or tuple of :class:`Job` instances (saved) and/or integer
    ids; ``None`` or an empty list means no dependencies. Only the shape is
    checked here (no SQL); that the jobs exist is checked when the call is written
    (:func:`django_debounce.enqueueing.call.write`).

    Raises:
        ConfigurationError: not a list/tuple, or an element that is neither a
            saved ``Job`` nor a positive ``int``.
    """
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise ConfigurationError(
            f"{where}: depends_on must be a list of jobs or job ids, got "
            f"{type(value).__name__}; wrap a single job in a list: depends_on=[job]."
        )
    ids: dict[int, None] = {}
    for item in value:
        if isinstance(item, Job):
            if item.pk is None:
                raise ConfigurationError(
                    f"{where}: depends_on holds an unsaved Job; enqueue the dependency first."
                )
            ids[item.pk] = None
        elif isinstance(item, int) and not isinstance(item, bool) and item > 0:
            ids[item] = None
        else:
            raise ConfigurationError(
                f"{where}: depends_on element {item!r} is neither a Job nor a job id (int >= 1)."
            )
    return tuple(ids)


class Schedule(NamedTuple):
    """When a call's job is due and expires, and its notes (checked by :func:`schedule`)."""

    run_at: datetime
    expires_at: datetime | None
    notes: str


def schedule(
    options: TaskOptions, call: Mapping[str, object], where: str, now: datetime
) -> Schedule:
    """Check a call's notes, expiry and due time, after :func:`merge_call` (§2, §6).

    Args:
        options: the call's merged options (their ``expires`` is the task's).
        call: the call's own options (``notes``, ``expires``, ``countdown``, ``eta``).
        where: the message prefix naming the call.
        now: the enqueue's instant (aware).

    Raises:
        ConfigurationError: notes that are not storable text or are over
            ``DEBOUNCE_MAX_PAYLOAD_BYTES``; a bad or naive ``expires``, or one
            before the max wait of a debounced call or not after the due time;
            ``countdown`` and ``eta`` together, a bad ``countdown``, a naive ``eta``.
    """
    notes = _notes(call.get("notes"), where)
    expires_at = _expires_at(options, call.get("expires"), where, now)
    run_at = now
    if options.debounce is None:
        run_at = _due(call.get("countdown"), call.get("eta"), where, now)
        if expires_at is not None and expires_at <= run_at:
            raise ConfigurationError(
                f"{where}: expires ({expires_at.isoformat()}) is not after the time the job is "
                f"due ({run_at.isoformat()}), so it would expire before any worker could start "
                "it; give a later expires or an earlier eta/countdown."
            )
    return Schedule(run_at=run_at, expires_at=expires_at, notes=notes)


def _notes(notes: object, where: str) -> str:
    notes = "" if notes is None else notes
    if not isinstance(notes, str) or not codec.is_storable_text(notes):
        raise ConfigurationError(
            f"{where}: notes must be a str without NUL characters or lone surrogates."
        )
    # 4: the most UTF-8 bytes per character, so only long notes are encoded to be measured.
    if notes and len(notes) * 4 > settings.max_payload_bytes:
        size = len(notes.encode())
        if size > settings.max_payload_bytes:
            raise ConfigurationError(
                f"{where}: notes are {size:,} bytes of UTF-8; the limit is "
                f"{settings.max_payload_bytes:,} (DEBOUNCE_MAX_PAYLOAD_BYTES)."
            )
    return notes


def _expires_at(
    options: TaskOptions, expires: object, where: str, now: datetime
) -> datetime | None:
    """Return when the job expires: a duration from now, or an aware datetime (§6)."""
    expires_at: datetime | None
    if expires is None:
        expires_at = now + options.expires if options.expires else None
    elif isinstance(expires, datetime):
        if timezone.is_naive(expires):
            raise ConfigurationError(
                f"{where}: expires={expires!r} is naive; pass an aware datetime."
            )
        expires_at = expires
    else:
        expires_at = now + check_duration(expires, "expires")
    max_wait = options.debounce_max_wait if options.debounce is not None else None
    if expires_at is not None and max_wait is not None and expires_at < now + max_wait:
        raise ConfigurationError(
            f"{where}: expires is sooner than the max wait {max_wait}; the job could expire "
            "before its window closes."
        )
    return expires_at


def _due(countdown: object, eta: object, where: str, now: datetime) -> datetime:
    """Return when a plain (not debounced) job is due: now, after ``countdown``, or at ``eta``."""
    if countdown is not None and eta is not None:
        raise ConfigurationError(f"{where}: give countdown or eta, not both.")
    if countdown is not None:
        if (
            isinstance(countdown, int | float)
            and not isinstance(countdown, bool)
            and countdown == 0
        ):
            return now
        return now + check_duration(countdown, "countdown")
    if eta is not None:
        if not isinstance(eta, datetime) or timezone.is_naive(eta):
            raise ConfigurationError(f"{where}: eta={eta!r} must be an aware datetime.")
        return eta
    return now
