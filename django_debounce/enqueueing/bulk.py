"""Enqueue many calls at once: plan them all, then write them in a few statements (issue #12).

:func:`enqueue_many` is :func:`~django_debounce.enqueueing.call.enqueue_call` for a
batch. Every call is planned first (options, keys, payload: the same checks
and errors as one call, each error naming the index of its call), so a bad
call writes nothing. Then one transaction writes them all:

* plain calls: one multi-row ``INSERT`` (``bulk_create``);
* debounced calls on PostgreSQL and SQLite: one multi-row ``INSERT … ON
  CONFLICT (window_key) DO UPDATE … RETURNING``. The calls of one key are
  folded first into the one row they would leave if made one after another at
  the batch's instant (PostgreSQL refuses to touch a row twice in one
  statement): the first call's options and ceiling, the last call's window,
  the count of calls, the last replacing call's payload (decision 116);
* debounced calls elsewhere (MariaDB/MySQL: no ``ON CONFLICT … RETURNING``),
  and keys with a ``debounce_merge`` or whose last window outlasts the
  opener's max wait: the keys' open windows are locked with one ``SELECT …
  FOR UPDATE``, every call is applied in Python in order exactly as one call
  would be (§4.2, §4.8), then one ``bulk_update`` and one ``bulk_create``;
* calls with ``unique_key``/``idempotent`` or ``depends_on``, and every call
  of a key one of whose calls has ``depends_on``: one at a time, in order,
  inside the same transaction.

Lost races and lock waits retry the whole transaction, as one call does
(§4.4). The whole batch shares one ``now``: it is as if its calls were made
one after another at that instant.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from django.db import (
    DatabaseError,
    IntegrityError,
    OperationalError,
    transaction,
)
from django.utils import timezone

from .. import databases, lifecycle, registry, tracing
from ..conf import settings
from ..exceptions import (
    ConfigurationError,
    DebounceError,
    EnqueueContentionError,
    KeyResolutionError,
    PayloadError,
)
from ..models import Job
from ..options import Plan
from ..schema_ready import not_migrated
from ..signals import job_enqueued, send_signal
from ..validators import check_task_name
from . import upsert
from .call import apply_slide, new_job, refuse_without_tz, write_locked
from .contention import contended
from .planning import plan_call

if TYPE_CHECKING:
    from ..registry import RegisteredTask

__all__ = ["Call", "enqueue_many"]

#: Window keys per ``SELECT … FOR UPDATE`` of the locking path (SQLite binds at most 999).
_LOCK_CHUNK = 500
#: Rounds of the bulk upsert at most: each ends the stale windows the previous one met.
_MAX_ROUNDS = 5


class Call(NamedTuple):
    """One call of :func:`enqueue_many`: a task, its arguments and its per-call options.

    A plain tuple of the same shape (2 to 4 items) works too.
    """

    task: Any
    """A :class:`~django_debounce.tasks.Task`, or a registered task name (``str``)."""
    args: Sequence[object] = ()
    """Positional arguments (list or tuple), stored through the codec (§5)."""
    kwargs: Mapping[str, object] | None = None
    """Keyword arguments."""
    options: Mapping[str, object] | None = None
    """Per-call options, as for ``apply_async`` (§2)."""


def enqueue_many(calls: Iterable[Call | Sequence[Any]], *, using: str | None = None) -> list[Job]:
    """Enqueue many calls in one transaction and few statements (issue #12; decisions 115–119).

    The result is the one of making the calls one after another, in order, at
    one instant (``timezone.now()`` read once): several calls of one debounce
    key slide one window (or open it, then slide it), a coalescing call returns
    the job an earlier call of the batch created, and so on (§4). Inside a
    caller's ``transaction.atomic()`` the batch commits or rolls back with it (§4.6).

    Args:
        calls: :class:`Call` items (or tuples ``(task, args[, kwargs[, options]])``);
            ``task`` is a ``Task`` or a task name.
        using: database alias; default: the router's choice for ``Job`` told each
            call's ``queue`` and ``task_name`` (decision 224), which must be one
            database for the whole batch.

    Returns:
        One :class:`~django_debounce.models.Job` per call, in the calls' order,
        each with its call's ``outcome`` (``"created"``, ``"debounced"``,
        ``"coalesced"``). The calls of one key get the same ``id``; each job
        shows the row as it is after the whole batch (decision 117).
        ``job_enqueued`` is sent once per call, after the write.

    Raises:
        ConfigurationError, KeyResolutionError, PayloadError: a call is
            invalid, as for ``apply_async``; the message starts with
            ``enqueue_many: call [i]`` (its index) and nothing is written.
            Also ``USE_TZ = False`` (check E011), and a call that is not a
            ``Call``/tuple of 2 to 4 items; and calls the database router sends to
            two databases, without ``using=`` (decision 224).
        EnqueueContentionError: lock contention outlasted the retry budget
            (``DEBOUNCE_ENQUEUE_RETRIES``) for the whole batch; nothing was written.
        NotMigratedError: the database has no django_debounce tables (``migrate``
            not run), chained from the driver's error.
    """
    if not settings.use_tz:
        refuse_without_tz("enqueue_many")
    now = timezone.now()
    plans = [_plan(index, call, now) for index, call in enumerate(calls)]
    if not plans:
        return []
    db = using or _one_database(plans)
    tracer = tracing.tracer()  # None while tracing is off (decision 211)
    try:
        if tracer is None:
            jobs = _write_retrying(plans, now, db)
        else:
            from ..tracing.spans import traced_enqueue_many

            jobs = traced_enqueue_many(tracer, plans, lambda: _write_retrying(plans, now, db))
    except DatabaseError as exc:
        error = not_migrated(exc, db, "enqueue_many")
        if error is None:
            raise
        raise error from exc
    for job in jobs:
        send_signal(job_enqueued, job=job, outcome=job.outcome)
    return jobs


def _one_database(plans: list[Plan]) -> str:
    """Return the database the router gives every call of the batch, or refuse a split batch.

    Raises:
        ConfigurationError: the router sends calls to two databases (one transaction
            cannot span them); nothing was written.
    """
    chosen = {databases.for_job(plan.queue, plan.task_name) for plan in plans}
    if len(chosen) > 1:
        raise ConfigurationError(
            f"enqueue_many: the database router sends these calls to {sorted(chosen)}; one "
            "batch is one transaction in one database: split the batch by database, or "
            "give using=."
        )
    return chosen.pop()


def _plan(index: int, call: object, now: datetime) -> Plan:
    """Plan call number ``index``; an error names that index and keeps its type."""
    where = f"enqueue_many: call [{index}]"
    if not isinstance(call, tuple) or not 2 <= len(call) <= 4:
        raise ConfigurationError(
            f"{where} is {call!r}; give a Call(task, args, kwargs, options) or a tuple "
            "(task, args[, kwargs[, options]])."
        )
    task, args, kwargs, options = Call(*call)
    found: RegisteredTask | None
    if isinstance(task, str):
        name = task
        found = registry.lookup(name)
    else:
        given = getattr(task, "name", None)
        if not isinstance(given, str) or not hasattr(task, "options"):
            raise ConfigurationError(
                f"{where}: the task must be a Task or a task name, got {task!r}."
            )
        name, found = given, task
    try:
        check_task_name(name)
        return plan_call(found, name, args, kwargs or {}, options or {}, now)
    except DebounceError as exc:
        raise type(exc)(f"{where}: {exc}") from exc


@contextmanager
def _naming(index: int) -> Iterator[None]:
    """Prefix a bad-input error found while writing call ``index`` with its index.

    Some errors show only at the write (a ``depends_on`` id that names no job,
    a ``debounce_merge`` that returns no call); the transaction they escape
    rolls the whole batch back, so nothing is written either way.
    """
    try:
        yield
    except (ConfigurationError, KeyResolutionError, PayloadError) as exc:
        raise type(exc)(f"enqueue_many: call [{index}]: {exc}") from exc


def _write_retrying(plans: list[Plan], now: datetime, db: str) -> list[Job]:
    """Write ``plans`` in one transaction, retrying it all after a lost race or lock wait (§4.4)."""
    budget = max(1, settings.enqueue_retries)
    last: Exception | None = None
    what = f"enqueue_many of {len(plans)} calls"
    for attempt in range(budget):
        try:
            with transaction.atomic(using=db):
                return _write(plans, now, db)
        except (IntegrityError, OperationalError) as exc:
            last = contended(exc, what, "this batch", db, attempt)
    raise EnqueueContentionError(
        f"{what} gave up after {budget} attempts under lock contention; nothing was written. "
        "Retry the batch, or raise DEBOUNCE_ENQUEUE_RETRIES."
    ) from last


def _write(plans: list[Plan], now: datetime, db: str) -> list[Job]:
    """Write every plan inside the open transaction; return one job per plan, in order."""
    jobs: list[Job | None] = [None] * len(plans)
    plain: list[int] = []
    windows: dict[str, list[int]] = {}
    one_by_one: list[int] = []
    for index, plan in enumerate(plans):
        if plan.window_key is not None and plan.edge != "trailing":
            one_by_one.append(index)  # a leading or both edge reads its burst (decision 180)
        elif plan.window_key is not None:
            windows.setdefault(plan.window_key, []).append(index)
        elif plan.unique_lock is None and not plan.depends_on:
            plain.append(index)
        else:
            one_by_one.append(index)
    fast: list[list[int]] = []
    locked: list[list[int]] = []
    can_upsert = upsert.supported(db)
    for group in windows.values():
        members = [plans[i] for i in group]
        if any(p.depends_on for p in members):
            one_by_one.extend(group)
        elif can_upsert and _foldable(members):
            fast.append(group)
        else:
            locked.append(group)
    if plain:
        created = Job.objects.using(db).bulk_create([new_job(plans[i], now) for i in plain])
        for index, job in zip(plain, created, strict=True):
            job.outcome = "created"
            jobs[index] = job
    if fast:
        _upsert_windows(plans, fast, now, db, jobs)
    if locked:
        _lock_and_apply(plans, locked, now, db, jobs)
    for index in sorted(one_by_one):
        with _naming(index):
            jobs[index] = write_locked(plans[index], now, db)
    assert all(job is not None for job in jobs)
    return jobs  # type: ignore[return-value]


def _foldable(members: list[Plan]) -> bool:
    """True when one upsert row can stand for these calls of one key (no merge, §4.8).

    The row's ``run_at`` is the last call's window capped by the opener's max
    wait; that also serves a slide only when the last window is no longer than it.
    """
    first, last = members[0], members[-1]
    assert first.max_wait is not None and last.window is not None
    return all(p.merge is None for p in members) and last.window <= first.max_wait


def _upsert_windows(
    plans: list[Plan], groups: list[list[int]], now: datetime, db: str, jobs: list[Job | None]
) -> None:
    """Slide or open the windows of ``groups`` with the bulk upsert (PostgreSQL, SQLite)."""
    pending = groups
    for _round in range(_MAX_ROUNDS):
        if not pending:
            return
        rows: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
        for group in pending:
            members = [plans[i] for i in group]
            replacing = [p for p in members if p.replace_payload]
            payload = replacing[-1] if replacing else members[0]
            last_window = members[-1].window
            assert last_window is not None
            row = upsert.window_row(members[0], last_window, len(members), payload, now)
            rows[bool(replacing)].append(row)
        found: dict[str, Job] = {}
        chunk = upsert.max_rows(db)
        for replace_payload, batch in rows.items():
            for start in range(0, len(batch), chunk):
                found.update(
                    upsert.slide_or_insert_many(batch[start : start + chunk], replace_payload, db)
                )
        stale = []
        for group in pending:
            job = found.get(plans[group[0]].window_key)  # type: ignore[arg-type]
            if job is None:
                stale.append(group)
                continue
            _hand_out(job, group, opened=job.enqueue_count == len(group), jobs=jobs)
        # A stale window took no call: end it EXPIRED, then open a new one for its key (§6).
        _expire([plans[group[0]].window_key for group in stale], now, db)  # type: ignore[misc]
        pending = stale
    raise EnqueueContentionError(
        f"enqueue_many: {len(pending)} open window(s) stayed past their expiry after "
        f"{_MAX_ROUNDS} attempts to end them; nothing was written. Retry the batch."
    )


def _lock_and_apply(
    plans: list[Plan], groups: list[list[int]], now: datetime, db: str, jobs: list[Job | None]
) -> None:
    """Lock the keys' open windows, apply each call in order in Python, write the rows back."""
    keys = sorted(plans[group[0]].window_key for group in groups)  # type: ignore[type-var]
    found: dict[str, Job] = {}
    for start in range(0, len(keys), _LOCK_CHUNK):
        rows = (
            Job.objects.using(db)
            .select_for_update()
            .filter(window_key__in=keys[start : start + _LOCK_CHUNK])
            .order_by("window_key")
        )
        found.update((job.window_key, job) for job in rows)  # type: ignore[misc]
    stale = [job for job in found.values() if _is_stale(job, now)]
    if stale:
        lifecycle.expire([job.pk for job in stale], now=now, using=db)
        for job in stale:
            del found[job.window_key]  # type: ignore[arg-type]
    slid: list[Job] = []
    opened: list[tuple[Job, list[int]]] = []
    fields = {"run_at", "enqueue_count", "last_enqueued_at"}
    for group in groups:
        existing = found.get(plans[group[0]].window_key)  # type: ignore[arg-type]
        is_new = existing is None
        calls = group
        if existing is None:
            job = new_job(plans[group[0]], now)
            calls = group[1:]
        else:
            job = existing
        for index in calls:
            with _naming(index):
                fields.update(apply_slide(job, plans[index], now))
        if is_new:
            opened.append((job, group))
        else:
            slid.append(job)
            _hand_out(job, group, opened=False, jobs=jobs)
    if slid:
        Job.objects.using(db).bulk_update(slid, sorted(fields))
    if opened:
        Job.objects.using(db).bulk_create([job for job, _group in opened])
        for job, group in opened:
            _hand_out(job, group, opened=True, jobs=jobs)


def _hand_out(job: Job, group: list[int], *, opened: bool, jobs: list[Job | None]) -> None:
    """Give each call of ``group`` the job (its own instance) with that call's outcome."""
    for position, index in enumerate(group):
        mine = job if position == len(group) - 1 else copy.copy(job)
        mine.outcome = "created" if opened and position == 0 else "debounced"
        jobs[index] = mine


def _is_stale(job: Job, now: datetime) -> bool:
    """True for a READY job already past its expiry: it takes no calls (§6)."""
    return job.status == Job.Status.READY and job.expires_at is not None and job.expires_at <= now


def _expire(window_keys: list[str], now: datetime, db: str) -> None:
    """End the open windows of ``window_keys`` that are past their expiry EXPIRED (§6, §11)."""
    if not window_keys:
        return
    ids = list(
        Job.objects.using(db)
        .select_for_update()
        .filter(window_key__in=window_keys, status=Job.Status.READY, expires_at__lte=now)
        .values_list("pk", flat=True)
    )
    lifecycle.expire(ids, now=now, using=db)
