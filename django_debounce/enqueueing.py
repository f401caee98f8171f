"""Enqueue: validate a call, then slide-or-insert atomically (contract §2–§5).

An enqueue is planned first (options, key, payload: every error raised before
any SQL runs, §3) and then written in one short transaction:

* debounced: lock the open window of (task, key) with ``SELECT … FOR UPDATE``
  and slide it, or insert a new one. The unique ``window_key`` column makes a
  racing second insert fail, and the loser retries and slides instead (§4.4);
* coalesced (``unique_key``/``idempotent``): return the READY/RUNNING job that
  holds the unique lock, or insert;
* plain: insert.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import DEFAULT_DB_ALIAS, IntegrityError, OperationalError, router, transaction
from django.utils import timezone

from . import codec, keys, registry, upsert
from .conf import settings
from .dependencies import CANCELLING_STATUSES, cancel_dependents
from .durations import parse_duration
from .exceptions import ConfigurationError, EnqueueContentionError, KeyResolutionError, PayloadError
from .models import Job, JobDependency
from .signals import job_enqueued, send_signal
from .tasks import check_priority, check_queue, check_task_name, check_window

if TYPE_CHECKING:
    from .tasks import MergeFunction, Task

#: The logger keeps the name of the module this one was (``core``): operators'
#: ``LOGGING`` routes it, and docs/reference/commands.md names it.
logger = logging.getLogger("django_debounce.core")

CALL_OPTIONS = frozenset(
    {
        "debounce",
        "debounce_key",
        "debounce_max_wait",
        "debounce_replace_payload",
        "debounce_merge",
        "countdown",
        "eta",
        "priority",
        "queue",
        "expires",
        "metadata",
        "notes",
        "depends_on",
        "unique_key",
        "max_retries",
    }
)


@dataclass
class Plan:
    """A validated call, ready to be written (no SQL has run yet)."""

    task_name: str
    queue: str
    priority: int
    max_retries: int
    args: list[Any]
    kwargs: dict[str, Any]
    run_at: datetime
    expires_at: datetime | None
    metadata: dict[str, Any]
    notes: str
    window: timedelta | None = None
    max_wait: timedelta | None = None
    debounce_key: str | None = None
    window_key: str | None = None
    replace_payload: bool = False
    merge: MergeFunction | None = None
    unique_key: str | None = None
    unique_lock: str | None = None
    depends_on: tuple[int, ...] = ()


def enqueue(
    task_name: str,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    **options: Any,
) -> Job:
    """Enqueue a call of the task registered as ``task_name`` (§2).

    Works from a process that never imported the task: then only the call's
    own options apply, and ``{N}``/``{name}`` in a key template are
    ``args[N]``/``kwargs[name]`` as given (§3).

    Args:
        task_name: the task's registered name.
        args: positional arguments (sequence).
        kwargs: keyword arguments (mapping with ``str`` keys).
        **options: per-call options, as for :meth:`Task.apply_async`.

    Returns:
        The job after this enqueue, with ``outcome`` set.

    Raises:
        ConfigurationError: as for :meth:`Task.apply_async`; also a task name
            that is not a non-empty ``str`` of at most 255 characters without
            NUL or lone surrogates (``Job.task_name``), raised before any SQL.
        KeyResolutionError, PayloadError, EnqueueContentionError: as for
            :meth:`Task.apply_async`.
    """
    if not isinstance(task_name, str) or not task_name:
        raise ConfigurationError(f"enqueue() needs a task name (str), got {task_name!r}.")
    check_task_name(task_name)
    return enqueue_call(registry.lookup(task_name), task_name, args, kwargs or {}, options)


def enqueue_call(
    task: Task[Any, Any] | None,
    task_name: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    options: Mapping[str, Any],
) -> Job:
    """Plan and write one call (the shared path of ``delay``, ``apply_async``, ``enqueue``).

    Raises:
        ConfigurationError: ``USE_TZ = False`` (check E011): ``timezone.now()``
            would be a naive local time, and every deadline stored with it
            would move with the clocks (§4.7). Also see ``apply_async``.
    """
    if not settings.use_tz:
        raise ConfigurationError(
            f"enqueue of {task_name!r} refused: django_debounce needs USE_TZ = True (system "
            "check django_debounce.E011). With USE_TZ = False deadlines would be stored as "
            "naive local times, which the worker refuses to run against; set USE_TZ = True."
        )
    now = timezone.now()
    plan = plan_call(task, task_name, args, kwargs, options, now)
    job = write(plan, now)
    send_signal(job_enqueued, job=job, outcome=job.outcome)
    return job


def _call_duration(options: Mapping[str, Any], name: str) -> timedelta | None:
    value = options.get(name)
    return None if value is None else parse_duration(value, name=name)


def plan_call(
    task: Task[Any, Any] | None,
    task_name: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    options: Mapping[str, Any],
    now: datetime,
) -> Plan:
    """Validate a call and resolve its key and payload; run no SQL.

    Raises:
        ConfigurationError, KeyResolutionError, PayloadError: see ``apply_async``.
    """
    unknown = set(options) - CALL_OPTIONS
    if unknown:
        raise ConfigurationError(
            f"unknown enqueue option(s) {sorted(unknown)} for task {task_name!r}; "
            f"accepted: {', '.join(sorted(CALL_OPTIONS))}."
        )
    if not isinstance(args, list | tuple):
        raise ConfigurationError(f"args must be a tuple or list, got {type(args).__name__}.")
    if not isinstance(kwargs, Mapping):
        raise ConfigurationError(f"kwargs must be a dict, got {type(kwargs).__name__}.")
    where = f"enqueue of {task_name!r}"
    depends_on = _dependency_ids(options.get("depends_on"), where)
    defaults = task.options if task is not None else None

    # Debounce: the call's options override the task's (§2).
    window = _call_duration(options, "debounce")
    if window is None and defaults is not None:
        window = defaults.debounce
    call_max_wait = _call_duration(options, "debounce_max_wait")
    key_spec = options.get("debounce_key")
    if key_spec is None and defaults is not None:
        key_spec = defaults.debounce_key
    replace = options.get("debounce_replace_payload")
    if replace is None:
        replace = defaults.debounce_replace_payload if defaults is not None else False
    merge = options.get("debounce_merge")
    if merge is None and defaults is not None:
        merge = defaults.debounce_merge
    unique_spec = options.get("unique_key")
    idempotent = False
    if defaults is not None:
        if unique_spec is None:
            unique_spec = defaults.unique_key
        idempotent = defaults.idempotent

    if window is None and (call_max_wait is not None or options.get("debounce_key") is not None):
        raise ConfigurationError(
            f"{where}: debounce_key/debounce_max_wait given for a call that is not debounced; "
            "pass debounce= too."
        )
    max_wait: timedelta | None = None
    if window is not None:
        if unique_spec is not None or idempotent:
            raise ConfigurationError(
                f"{where}: a debounce window and a unique key on one call (§1); choose one."
            )
        if options.get("countdown") is not None or options.get("eta") is not None:
            raise ConfigurationError(
                f"{where}: countdown/eta on a debounced call; the window decides when it runs."
            )
        if call_max_wait is None and defaults is not None:
            call_max_wait = defaults.debounce_max_wait
        max_wait = check_window(window, call_max_wait, where=where)
    if merge is not None and replace:
        raise ConfigurationError(
            f"{where}: debounce_merge and debounce_replace_payload=True both decide the stored "
            "call; set only one."
        )

    queue = options.get("queue")
    queue = check_queue(queue if queue is not None else (defaults.queue if defaults else "default"))
    priority = options.get("priority")
    priority = check_priority(
        priority if priority is not None else (defaults.priority if defaults else 0)
    )
    max_retries = options.get("max_retries")
    if max_retries is None:
        max_retries = defaults.max_retries if defaults is not None else None
    if max_retries is None:
        max_retries = settings.max_retries
    if (
        isinstance(max_retries, bool)
        or not isinstance(max_retries, int)
        or not 0 <= max_retries <= 10_000
    ):
        raise ConfigurationError(
            f"{where}: max_retries={max_retries!r} must be an int from 0 to 10000."
        )
    metadata = options.get("metadata")
    if metadata is None:
        metadata = dict(defaults.metadata) if defaults is not None else {}
    if not isinstance(metadata, dict):
        raise ConfigurationError(
            f"{where}: metadata must be a dict, got {type(metadata).__name__}."
        )
    if metadata:
        _check_metadata(metadata, where)
    for name in ("debounce_key", "unique_key"):
        spec = options.get(name)
        if spec is not None and not isinstance(spec, str) and not callable(spec):
            raise ConfigurationError(
                f"{where}: {name}={spec!r} must be a template str or a callable."
            )
    replace_opt = options.get("debounce_replace_payload")
    if replace_opt is not None and not isinstance(replace_opt, bool):
        raise ConfigurationError(f"{where}: debounce_replace_payload must be True or False.")
    merge_opt = options.get("debounce_merge")
    if merge_opt is not None and not callable(merge_opt):
        raise ConfigurationError(
            f"{where}: debounce_merge must be a callable (stored, new) -> call."
        )
    notes = options.get("notes")
    notes = "" if notes is None else notes
    if not isinstance(notes, str) or not codec.is_storable_text(notes):
        raise ConfigurationError(
            f"{where}: notes must be a str without NUL characters or lone surrogates."
        )
    if (
        notes and len(notes) * 4 > settings.max_payload_bytes
    ):  # 4: the most UTF-8 bytes per character
        size = len(notes.encode())
        if size > settings.max_payload_bytes:
            raise ConfigurationError(
                f"{where}: notes are {size:,} bytes of UTF-8; the limit is "
                f"{settings.max_payload_bytes:,} (DEBOUNCE_MAX_PAYLOAD_BYTES)."
            )

    # Expiry: a duration from now, or an aware datetime.
    expires = options.get("expires")
    expires_at: datetime | None
    if expires is None:
        expires_at = now + defaults.expires if defaults is not None and defaults.expires else None
    elif isinstance(expires, datetime):
        if timezone.is_naive(expires):
            raise ConfigurationError(
                f"{where}: expires={expires!r} is naive; pass an aware datetime."
            )
        expires_at = expires
    else:
        expires_at = now + parse_duration(expires, name="expires")
    if expires_at is not None and max_wait is not None and expires_at < now + max_wait:
        raise ConfigurationError(
            f"{where}: expires is sooner than the max wait {max_wait}; the job could expire "
            "before its window closes."
        )

    # When a plain job runs.
    run_at = now
    if window is None:
        countdown, eta = options.get("countdown"), options.get("eta")
        if countdown is not None and eta is not None:
            raise ConfigurationError(f"{where}: give countdown or eta, not both.")
        if countdown is not None:
            if (
                isinstance(countdown, int | float)
                and not isinstance(countdown, bool)
                and countdown == 0
            ):
                run_at = now
            else:
                run_at = now + parse_duration(countdown, name="countdown")
        elif eta is not None:
            if not isinstance(eta, datetime) or timezone.is_naive(eta):
                raise ConfigurationError(f"{where}: eta={eta!r} must be an aware datetime.")
            run_at = eta
        if expires_at is not None and expires_at <= run_at:
            raise ConfigurationError(
                f"{where}: expires ({expires_at.isoformat()}) is not after the time the job is "
                f"due ({run_at.isoformat()}), so it would expire before any worker could start "
                "it; give a later expires or an earlier eta/countdown."
            )

    # Keys are resolved before the payload is encoded (§3).
    signature = task.signature if task is not None else None
    debounce_key: str | None = None
    unique_key: str | None = None
    try:
        bound = keys.bind_call(signature, args, kwargs)
        if window is not None:
            if key_spec is None:
                debounce_key = keys.default_key(bound)
            else:
                debounce_key = keys.resolve_key(key_spec, bound, args, kwargs)
                if debounce_key is None:  # a callable opted this call out (§3)
                    window = max_wait = None
        if unique_spec is not None:
            unique_key = keys.resolve_key(unique_spec, bound, args, kwargs)
        elif idempotent:
            unique_key = keys.default_key(bound)
    except KeyResolutionError as exc:  # name the call: the key's own message does not
        raise KeyResolutionError(f"{where}: {exc}") from exc

    enc_args, enc_kwargs = codec.encode_call(args, dict(kwargs))
    return Plan(
        task_name=task_name,
        queue=queue,
        priority=priority,
        max_retries=max_retries,
        args=enc_args,
        kwargs=enc_kwargs,
        run_at=run_at,
        expires_at=expires_at,
        metadata=metadata,
        notes=notes,
        window=window,
        max_wait=max_wait,
        debounce_key=debounce_key,
        window_key=keys.window_hash(task_name, debounce_key)
        if window is not None and debounce_key is not None
        else None,
        replace_payload=bool(replace),
        merge=merge,
        unique_key=unique_key,
        unique_lock=keys.window_hash(task_name, unique_key) if unique_key is not None else None,
        depends_on=depends_on,
    )


def _check_metadata(metadata: dict[str, Any], where: str) -> None:
    """Refuse ``metadata`` a database would refuse or change, before any SQL runs.

    Plain JSON (str keys, finite floats) under the codec's limits on text, ints
    and depth, and a JSON text of at most ``DEBOUNCE_MAX_PAYLOAD_BYTES``.

    Raises:
        ConfigurationError: naming what is wrong and where.
    """
    try:
        codec.check_json(metadata, path="metadata")
    except PayloadError as exc:
        raise ConfigurationError(
            f"{where}: metadata must be plain JSON that every database stores: {exc}"
        ) from exc
    size = len(json.dumps(metadata))
    if size > settings.max_payload_bytes:
        raise ConfigurationError(
            f"{where}: metadata is {size:,} bytes of JSON; the limit is "
            f"{settings.max_payload_bytes:,} (DEBOUNCE_MAX_PAYLOAD_BYTES). Keep metadata to "
            "a few labels; store bulk data elsewhere."
        )


def _dependency_ids(value: Any, where: str) -> tuple[int, ...]:
    """Return the job ids of a ``depends_on=`` option (§6), in order, without duplicates.

    Accepts a list or tuple of :class:`Job` instances (saved) and/or integer
    ids; ``None`` or an empty list means no dependencies. Only the shape is
    checked here (no SQL); that the jobs exist is checked in :func:`write`.

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


class _StaleWindowError(Exception):
    """The key's open window (or coalescing job) is past its expiry: end it, then retry."""


def write(plan: Plan, now: datetime, using: str | None = None) -> Job:
    """Write ``plan`` atomically, retrying lost races and lock waits (§4.4).

    Raises:
        EnqueueContentionError: the retry budget (``DEBOUNCE_ENQUEUE_RETRIES``)
            ran out; nothing was written.
    """
    db = using or router.db_for_write(Job) or DEFAULT_DB_ALIAS
    budget = max(1, settings.enqueue_retries)
    last: Exception | None = None
    fast = plan.window_key is not None and plan.merge is None and upsert.supported(db)
    # Dependency edges are written beside the job, so such a call needs a transaction.
    single = not plan.depends_on and (
        fast or (plan.window_key is None and plan.unique_lock is None)
    )
    for attempt in range(budget):
        try:
            if single and not transaction.get_connection(db).in_atomic_block:
                # One statement is atomic on its own: no BEGIN/COMMIT round trips.
                return _slide_or_insert(plan, now, db) if fast else _write_once(plan, now, db)
            with transaction.atomic(using=db):  # a savepoint inside the caller's transaction
                doomed = _lock_dependencies(plan, db) if plan.depends_on else False
                job = _slide_or_insert(plan, now, db) if fast else _write_once(plan, now, db)
                if plan.depends_on and job.outcome == "created":
                    _link_dependencies(job, plan, now, db, doomed)
                return job
        except _StaleWindowError:
            _expire_stale(plan, now, db)
            continue
        except (IntegrityError, OperationalError) as exc:
            if not is_contention(exc):
                raise
            if isinstance(exc, IntegrityError) and _snapshot_is_fixed(db):
                # The winner committed after this transaction's snapshot: no retry inside
                # the transaction can ever see its row, so each would lose again.
                raise EnqueueContentionError(
                    f"enqueue of {plan.task_name!r} lost a race to a job another transaction "
                    "committed after this transaction began, and this transaction runs at "
                    "REPEATABLE READ or SERIALIZABLE, so it can never see that job; nothing "
                    "was written by this call. Roll the transaction back and retry it, or "
                    "enqueue at READ COMMITTED (the isolation level the package documents)."
                ) from exc
            if isinstance(exc, OperationalError) and transaction.get_connection(db).in_atomic_block:
                # A deadlock or lock timeout inside the caller's transaction: the caller
                # still holds its locks, so retrying in a savepoint would only wait again.
                raise EnqueueContentionError(
                    f"enqueue of {plan.task_name!r} hit lock contention inside the caller's "
                    f"transaction ({exc}); nothing was written by this call. Roll the "
                    "transaction back and retry it."
                ) from exc
            last = exc
            logger.debug(
                "enqueue of %s lost a race or waited on a lock (attempt %d): %s",
                plan.task_name,
                attempt + 1,
                exc,
                extra={"action": "enqueue_retry"},
            )
            if attempt:  # the first retry is immediate: a lost insert race resolves at once
                time.sleep(min(0.5, 0.002 * 2**attempt) * random.random())
    raise EnqueueContentionError(
        f"enqueue of {plan.task_name!r} gave up after {budget} attempts under lock contention; "
        "nothing was written. Retry the call, or raise DEBOUNCE_ENQUEUE_RETRIES."
    ) from last


def _snapshot_is_fixed(db: str) -> bool:
    """Return True inside a PostgreSQL transaction whose snapshot does not move.

    At REPEATABLE READ or SERIALIZABLE a transaction sees the rows committed
    before its first statement and no others; its locking reads too, so a row
    that won a race after that can never be found and slid or coalesced.
    Asked only after a lost race inside an atomic block (one ``SHOW``), never
    on the path of a call that wins. On MySQL/MariaDB a locking read sees the
    latest committed row at any level; SQLite serialises writers.
    """
    conn = transaction.get_connection(db)
    if conn.vendor != "postgresql" or not conn.in_atomic_block:
        return False
    with conn.cursor() as cursor:
        cursor.execute("SHOW transaction_isolation")
        row = cursor.fetchone()
    return row is not None and row[0] in ("repeatable read", "serializable")


#: SQLSTATEs of lock contention on PostgreSQL: serialization failure, deadlock, lock timeout.
_CONTENTION_SQLSTATES = frozenset({"40001", "40P01", "55P03"})
#: MySQL/MariaDB error codes of lock contention: lock wait timeout (1205), deadlock (1213).
_CONTENTION_MYSQL_CODES = frozenset({1205, 1213})


def is_contention(exc: Exception) -> bool:
    """Return True when ``exc`` means "lost a race or waited on a lock" (§4.4), so a retry can help.

    A unique violation on the open-window or unique-lock column (a racing
    producer inserted first), SQLite's "database is locked", PostgreSQL's
    serialization failures, deadlocks and lock timeouts, and MySQL/MariaDB's
    lock wait timeouts (1205) and deadlocks (1213), by their error codes (the
    server may word its messages in another language). Anything else (a
    missing table, a failed check constraint) is a real error and is raised.
    """
    cause = exc.__cause__
    sqlstate = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
    text = str(exc)
    if isinstance(exc, IntegrityError):
        return "window_key" in text or "unique_lock" in text
    code = exc.args[0] if exc.args else None
    if isinstance(code, int) and not isinstance(code, bool):  # MySQL/MariaDB: (code, message)
        return code in _CONTENTION_MYSQL_CODES
    if sqlstate is not None:
        return sqlstate in _CONTENTION_SQLSTATES
    return "locked" in text or "busy" in text or "deadlock" in text.lower()


def _lock_dependencies(plan: Plan, db: str) -> bool:
    """Lock the rows of ``plan.depends_on`` and return True if one already ended without success.

    The lock (``SELECT … FOR UPDATE``, in id order) makes a dependency's own
    final write wait until this enqueue commits, so the dependency's
    :func:`~django_debounce.dependencies.cancel_dependents` then sees the new
    edge: a job can never be left waiting on a dependency that failed
    meanwhile (§6).

    Raises:
        ConfigurationError: an id names no job (nothing has been written).
    """
    found = dict(
        Job.objects.using(db)
        .select_for_update()
        # An id past the 64-bit range names no job (and SQLite cannot even bind it).
        .filter(pk__in=[pk for pk in plan.depends_on if pk < 2**63])
        .order_by("pk")
        .values_list("pk", "status")
    )
    missing = [pk for pk in plan.depends_on if pk not in found]
    if missing:
        raise ConfigurationError(
            f"enqueue of {plan.task_name!r}: depends_on names job id(s) {missing} that do not "
            "exist; pass jobs returned by an enqueue."
        )
    return any(status in CANCELLING_STATUSES for status in found.values())


def _link_dependencies(job: Job, plan: Plan, now: datetime, db: str, doomed: bool) -> None:
    """Write the new job's dependency edges; cancel it at once if a dependency already failed.

    Only a call that created the job stores its dependencies: a slide keeps
    the opener's (§4.2) and a coalesced call returns the existing job. A job
    created after one of its dependencies ended FAILED, SHED, CANCELLED or
    EXPIRED is created CANCELLED, as it would have been had it existed then (§6).
    """
    JobDependency.objects.using(db).bulk_create(
        [JobDependency(job_id=job.pk, dependency_id=pk) for pk in plan.depends_on]
    )
    if doomed:
        Job.objects.using(db).filter(pk=job.pk).update(
            status=Job.Status.CANCELLED, finished_at=now, window_key=None, unique_lock=None
        )
        job.status, job.finished_at = Job.Status.CANCELLED, now
        job.window_key = job.unique_lock = None
        logger.info(
            "job %s (%s) created CANCELLED: a dependency had already ended without success",
            job.pk,
            job.task_name,
            extra={"action": "cancel_dependents", "job_id": job.pk},
        )


def _slide_or_insert(plan: Plan, now: datetime, db: str) -> Job:
    job = upsert.slide_or_insert(plan, now, db)
    if job is None:
        raise _StaleWindowError
    return job


def _is_stale(job: Job, now: datetime) -> bool:
    """True for a READY job already past its expiry: it will never run, so it takes no calls."""
    return job.status == Job.Status.READY and job.expires_at is not None and job.expires_at <= now


def _expire_stale(plan: Plan, now: datetime, db: str) -> None:
    """End the key's stale open window (or coalescing job) EXPIRED, cancelling its dependents.

    The worker would do the same at its next claim (§6, §11); doing it here lets
    the call open a new window instead of sliding into one that will never run.
    """
    with transaction.atomic(using=db):
        qs = (
            Job.objects.using(db)
            .select_for_update()
            .filter(status=Job.Status.READY, expires_at__lte=now)
        )
        if plan.window_key is not None:
            qs = qs.filter(window_key=plan.window_key)
        else:
            qs = qs.filter(unique_lock=plan.unique_lock)
        ids = list(qs.values_list("pk", flat=True))
        if not ids:
            return  # a worker expired or claimed it meanwhile
        Job.objects.using(db).filter(pk__in=ids).update(
            status=Job.Status.EXPIRED, finished_at=now, window_key=None, unique_lock=None
        )
        cancel_dependents(ids, now=now, using=db)
    logger.info(
        "job(s) %s expired before a worker started them; the new call opens a new job",
        ids,
        extra={"action": "expire"},
    )


def _write_once(plan: Plan, now: datetime, db: str) -> Job:
    if plan.window_key is not None:
        found = list(
            Job.objects.using(db).select_for_update().filter(window_key=plan.window_key)[:1]
        )
        if found:
            if _is_stale(found[0], now):
                raise _StaleWindowError
            return _slide(found[0], plan, now, db)
    elif plan.unique_lock is not None:
        found = list(
            Job.objects.using(db).select_for_update().filter(unique_lock=plan.unique_lock)[:1]
        )
        if found:
            if _is_stale(found[0], now):
                raise _StaleWindowError
            found[0].outcome = "coalesced"
            return found[0]
    debounced = plan.window is not None
    assert plan.max_wait is not None or not debounced
    job = Job(
        task_name=plan.task_name,
        queue=plan.queue,
        priority=plan.priority,
        status=Job.Status.READY,
        args=plan.args,
        kwargs=plan.kwargs,
        run_at=now + plan.window if debounced else plan.run_at,  # type: ignore[operator]
        opened_at=now if debounced else None,
        max_run_at=now + plan.max_wait if debounced else None,  # type: ignore[operator]
        debounce_key=plan.debounce_key if debounced else None,
        window_key=plan.window_key,
        key_hash=plan.window_key,
        unique_key=plan.unique_key,
        unique_lock=plan.unique_lock,
        enqueue_count=1,
        last_enqueued_at=now,
        max_retries=plan.max_retries,
        metadata=plan.metadata,
        notes=plan.notes,
        expires_at=plan.expires_at,
        created_at=now,
    )
    job.save(force_insert=True, using=db)
    job.outcome = "created"
    return job


def _slide(job: Job, plan: Plan, now: datetime, db: str) -> Job:
    """Slide an open window (§4.2): later deadline, capped by the ceiling fixed at opening."""
    assert plan.window is not None and job.max_run_at is not None
    job.run_at = min(now + plan.window, job.max_run_at)
    job.enqueue_count += 1
    job.last_enqueued_at = now
    fields = ["run_at", "enqueue_count", "last_enqueued_at"]
    if plan.replace_payload:
        job.args, job.kwargs = plan.args, plan.kwargs
        fields += ["args", "kwargs"]
    elif plan.merge is not None:
        stored = codec.decode_call(job.args, job.kwargs)
        new = codec.decode_call(plan.args, plan.kwargs)
        merged = plan.merge(stored, new)
        try:
            merged_args, merged_kwargs = merged
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"debounce_merge of {plan.task_name!r} returned {merged!r}; it must return "
                "(args, kwargs)."
            ) from exc
        job.args, job.kwargs = codec.encode_call(list(merged_args), dict(merged_kwargs))
        fields += ["args", "kwargs"]
    job.save(update_fields=fields, using=db)
    job.outcome = "debounced"
    return job
