"""The worker: claim due jobs, run them, record the outcome (contract §7, §11).

:class:`Worker` takes keyword-only options and has no argparse; the
``run_debounce_worker`` command only maps its flags onto it.

How a claim works. One short transaction selects up to as many due jobs as
there are free threads with ``SELECT … FOR UPDATE SKIP LOCKED`` (plain ``FOR
UPDATE`` where the database lacks SKIP LOCKED; SQLite serialises writers with
its ``IMMEDIATE`` transactions), ordered by priority (higher first), then
``run_at``, then id, and marks them RUNNING in one ``UPDATE``: that closes each
job's window (``window_key = NULL``), sets the lease and counts the attempt.
A job is left out while another job of its debounce key is RUNNING under a
live lease or is due earlier, so runs of one key never overlap (§4.5). Tasks
run outside any transaction; the outcome is written with one ``UPDATE``
fenced on (worker id, attempt), so a worker whose lease lapsed and whose job
was reclaimed cannot overwrite the newer run (§11).

On PostgreSQL a plain claim (no gated task, no CoDel queue served, not inside
an atomic block) is the same SELECT and UPDATE as ONE autocommit statement
(``WITH picked AS (… FOR UPDATE SKIP LOCKED) UPDATE … RETURNING``): one round
trip instead of four. If a picked job has expired it claims nothing and the
transactional claim runs, which expires it (decision 67 in docs/decisions.md).
"""

from __future__ import annotations

import logging
import os
import queue as queue_module
import random
import re
import reprlib
import signal
import socket
import threading
import time
import traceback as traceback_module
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from types import FrameType
from typing import Any

from asgiref.sync import async_to_sync
from django.db import (
    DEFAULT_DB_ALIAS,
    DatabaseError,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connections,
    router,
    transaction,
)
from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone

from . import admission, codec, compiled, registry
from .codel import apply_codel
from .conf import settings
from .context import JobContext
from .dependencies import cancel_dependents
from .enqueueing import is_contention
from .exceptions import PayloadError, UnknownTaskError
from .models import DeadLetter, Job, JobDependency
from .retry import backoff_delay
from .shedding import shed_job
from .signals import job_dead_lettered, job_finished, job_started, send_signal
from .sweep import auto_retry

logger = logging.getLogger("django_debounce.worker")

#: Seconds a busy worker's loop connection may sit unused before the loop tests it
#: (``SELECT 1``) instead of trusting it: a fast drain never pays the test, a loop that
#: waited through long jobs notices a connection a server idle timeout closed.
LOOP_RECHECK_AFTER = 1.0

#: Claims a worker makes in a row when each loses to lock contention (``Worker._claim``).
CLAIM_ATTEMPTS = 5

Status = Job.Status


#: Most characters of an error message or a traceback stored on a job and its dead
#: letter; the rest is cut (a 20 MB exception message must not make the write fail).
MAX_ERROR_CHARS = 65_536
#: Most characters of the ``repr`` recorded for a result the codec cannot store.
MAX_REPR_CHARS = 10_000

_SURROGATE = re.compile("[\ud800-\udfff]")


def storable_text(text: str, limit: int | None = None) -> str:
    """Return ``text`` in a form every supported database stores.

    NUL characters (PostgreSQL refuses them) and lone surrogates (not Unicode
    text: no driver can encode them, e.g. from ``os.fsdecode(b"\\xff")``)
    become U+FFFD; text longer than ``limit`` characters is cut to ``limit``
    characters, its end a note of how much was cut.
    """
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    if not text.isascii():
        text = _SURROGATE.sub("\ufffd", text)
    if limit is not None and len(text) > limit:
        # The note counts against the limit: cut for the longest note this text can need.
        keep = limit - len(f"… [cut: {len(text):,} more characters]")
        text = f"{text[:keep]}… [cut: {len(text) - keep:,} more characters]"
    return text


class _ShortRepr(reprlib.Repr):
    """``repr`` that stays short for big or deep values and never raises on a huge int."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 10
        self.maxtuple = self.maxlist = self.maxarray = self.maxdict = 100
        self.maxset = self.maxfrozenset = self.maxdeque = 100
        self.maxstring = self.maxother = MAX_REPR_CHARS
        self.maxlong = 100

    def repr_int(self, x: int, level: int) -> str:
        try:
            return super().repr_int(x, level)
        except ValueError:  # more digits than int -> str converts
            return f"<int of {x.bit_length():,} bits, too long to write in decimal>"


_short_repr = _ShortRepr()


def _safe_repr(value: Any) -> str:
    try:
        text = _short_repr.repr(value)
    except Exception:  # a repr that raises must not lose the run
        text = f"<unrepresentable {type(value).__qualname__}>"
    return storable_text(text, MAX_REPR_CHARS)


def storable_result(value: Any) -> Any:
    """Return the JSON a task's return value is recorded as (§7); never raises.

    The codec's form when it can store the value under the payload limits
    (decision 29 in docs/decisions.md), after turning NUL characters and
    lone surrogates in its strings into U+FFFD if it has any. Otherwise a
    shortened ``repr`` string (at most :data:`MAX_REPR_CHARS` characters): a
    set or a model instance, an ``int`` of more than 4,300 digits, a value
    nested more than 31 levels deep or whose JSON is longer than
    ``DEBOUNCE_MAX_PAYLOAD_BYTES``. A result that cannot be written must never
    turn a successful run into a rerun.
    """
    try:
        return codec.encode(value, path="result", sized=True)
    except (PayloadError, ValueError, RecursionError):
        pass
    try:
        return codec.encode(_scrub(value), path="result", sized=True)
    except (PayloadError, ValueError, RecursionError):
        return _safe_repr(value)


def _scrub(value: Any) -> Any:
    """Return ``value`` with NUL characters and lone surrogates in its strings made U+FFFD."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, list | tuple):
        return [_scrub(item) for item in value]
    if isinstance(value, dict):
        return {_scrub(key): _scrub(item) for key, item in value.items()}
    return value


def format_error(exc: BaseException) -> str:
    """Return ``"dotted.ExceptionClass: message"`` (builtins without module, §11).

    Made storable (:func:`storable_text`) and cut to :data:`MAX_ERROR_CHARS`.
    """
    cls = type(exc)
    name = (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )
    try:
        message = str(exc)
    except Exception:
        message = "<the exception's message could not be rendered>"
    return storable_text(f"{name}: {message}", MAX_ERROR_CHARS)


def format_traceback(exc: BaseException) -> str:
    """Return the formatted traceback of ``exc``, storable and cut to :data:`MAX_ERROR_CHARS`."""
    try:
        text = "".join(traceback_module.format_exception(exc))
    except Exception:
        text = "<the traceback could not be formatted>"
    return storable_text(text, MAX_ERROR_CHARS)


def _ascii(text: str) -> str:
    """Return ``text`` with every non-ASCII character escaped (``\\xe9``): storable anywhere."""
    return text.encode("ascii", "backslashreplace").decode("ascii")


#: PostgreSQL SQLSTATE classes after which the same write may succeed: connection
#: exception, transaction rollback (serialization failure, deadlock), insufficient
#: resources, operator intervention (a server shutting down), system error.
_PG_TRANSIENT_CLASSES = frozenset({"08", "40", "53", "57", "58"})
#: MySQL/MariaDB error codes after which the same write may succeed: too many
#: connections, server shutdown, lock wait timeout, deadlock, and the client's lost or
#: refused connection (2002, 2003, 2006, 2013, 2055) or idle timeout (4031).
_MYSQL_TRANSIENT = frozenset({1040, 1053, 1205, 1213, 2002, 2003, 2006, 2013, 2055, 4031})


def _transient(exc: BaseException) -> bool:
    """Return True for an error a later attempt of the same write may not meet.

    A dropped or refused connection, a lock wait, a deadlock, a server
    shutting down. Not a refusal of the data (PostgreSQL's "program limit
    exceeded", MySQL's "incorrect string value", a trigger's error), which
    every attempt would meet again: retrying it through a lease would leave
    the job RUNNING until another worker ran it again. An
    ``OperationalError`` of an unknown driver counts as transient.
    """
    if isinstance(exc, InterfaceError):
        return True
    if not isinstance(exc, OperationalError):
        return False
    cause = exc.__cause__
    module = type(cause).__module__
    sqlstate = getattr(cause, "sqlstate", None)
    if sqlstate:  # psycopg; an error without SQLSTATE is a lost connection
        return sqlstate[:2] in _PG_TRANSIENT_CLASSES or sqlstate == "55P03"
    if module.startswith("MySQLdb"):
        code = exc.args[0] if exc.args else None
        return code in _MYSQL_TRANSIENT
    if module == "sqlite3":
        text = str(exc)
        return "locked" in text or "busy" in text
    return True


def claimable_jobs(now: datetime, queues: Sequence[str] | None = None) -> Any:
    """Return the queryset of jobs a worker may claim at ``now``, in claim order.

    Due (``run_at <= now``), READY, in ``queues`` (all when ``None``), and
    not held back by another job of the same debounce key that
    is RUNNING under a live lease or READY and due ahead of it (§4.5), nor
    by a dependency that has not succeeded yet (§6; a job without
    dependencies costs one probe of the ``JobDependency.job`` index).
    """
    waiting = JobDependency.objects.filter(job=OuterRef("pk")).exclude(
        dependency__status=Status.SUCCESSFUL
    )
    ahead = (
        Job.objects.filter(key_hash=OuterRef("key_hash"))
        .exclude(pk=OuterRef("pk"))
        .filter(
            Q(status=Status.RUNNING, lease_expires_at__gt=now)
            | Q(status=Status.READY, run_at__lt=OuterRef("run_at"))
            | Q(status=Status.READY, run_at=OuterRef("run_at"), pk__lt=OuterRef("pk"))
        )
    )
    qs = Job.objects.filter(status=Status.READY, run_at__lte=now)
    if queues:
        qs = qs.filter(queue__in=list(queues))
    qs = qs.filter(Q(key_hash__isnull=True) | ~Exists(ahead))
    qs = qs.filter(~Exists(waiting))
    return qs.order_by("-priority", "run_at", "id")


def claim_jobs(
    *,
    worker_id: str,
    limit: int,
    lease: timedelta,
    queues: Sequence[str] | None = None,
    using: str = DEFAULT_DB_ALIAS,
    peek: bool = False,
) -> list[Job]:
    """Claim up to ``limit`` due jobs for ``worker_id`` in one transaction.

    With ``peek``, first look (without locks) whether anything is claimable and
    return ``[]`` at once if not: cheaper for a worker that expects an idle queue.

    Flow control (§6): when a registered task has a rate limit, a concurrency
    cap or a circuit breaker, the due jobs pass :mod:`django_debounce.admission`
    in this same transaction (the tasks' TaskState rows locked), so the limits
    hold across every worker; jobs held back stay READY with their ``run_at``
    and ``on_excess="drop"`` jobs without a token are shed. Only the jobs the
    claim takes are locked (:func:`_take_admitted`), so a concurrent claim
    finds the others. With no gated task registered the claim runs exactly as
    without flow control (no extra query).

    On PostgreSQL, with no gated task, no CoDel queue served and no atomic block
    around the call, the claim is one autocommit statement (:func:`_claim_oneshot`).

    Returns the claimed jobs as they are after the claim (RUNNING, attempts
    counted, lease set), in claim order.
    """
    return _claim_batch(
        worker_id=worker_id, limit=limit, lease=lease, queues=queues, using=using, peek=peek
    ).jobs


@dataclass
class _Claim:
    """What one claim took: the jobs, and what :func:`release_claimed` needs to undo it."""

    jobs: list[Job]
    """The claimed jobs as after the claim, in claim order."""
    started_before: dict[int, datetime | None]
    """Each claimed job's ``started_at`` from before the claim, by id."""


def _claim_batch(
    *,
    worker_id: str,
    limit: int,
    lease: timedelta,
    queues: Sequence[str] | None,
    using: str,
    peek: bool,
) -> _Claim:
    """Do what :func:`claim_jobs` says; return the jobs with their ``started_at`` before the claim."""
    if limit <= 0:
        return _Claim([], {})
    queues = list(queues) if queues is not None else None  # read more than once below
    features = connections[using].features
    if peek and not _anything_claimable(timezone.now(), queues, using):
        # Nothing due: answer without a locking transaction (on SQLite an IMMEDIATE
        # transaction takes the database's write lock and would stall producers).
        return _Claim([], {})
    gates = admission.current_gates()  # pure Python; empty: the fast path
    if not gates and _oneshot_applies(queues, using):
        claimed = _claim_oneshot(
            worker_id=worker_id, limit=limit, lease=lease, queues=queues, using=using
        )
        if claimed is not None:
            return claimed
        # An expired job was among the picked ones: the transaction below expires it (and
        # cancels its dependents with it) and claims the rest.
    busy: set[str] = set()  # CoDel queues whose state row another claim holds right now
    while True:
        with transaction.atomic(using=using):
            now = timezone.now()
            shape = _ClaimShape(
                queues=tuple(queues or ()),
                busy=tuple(sorted(busy)),
                lock=(
                    "skip_locked"
                    if features.has_select_for_update_skip_locked
                    else "for_update"
                    if features.has_select_for_update
                    else ""
                ),
            )
            if gates:
                jobs = _take_admitted(shape, gates, limit=limit, now=now, using=using)
            else:
                jobs = _take_due(shape, limit=limit, now=now, using=using)
            # CoDel (§6): shed what each queue's control law drops (no query unless a candidate's
            # queue has CoDel). If it shed every candidate, commit that and claim again in a new
            # transaction (each round sheds a job; QueueState locks are taken last, see codel.py).
            # A queue whose state row another claim holds is left out of the next round, so a
            # claimer stalled in its claim never stalls this one (each round sheds a job or
            # finds one more busy queue, so the loop ends).
            seen_busy = len(busy)
            kept = apply_codel(jobs, now=now, using=using, busy=busy)
            if jobs and not kept:
                if len(busy) > seen_busy or any(job.status == Status.SHED for job in jobs):
                    continue
            jobs = kept
            if not jobs:
                return _Claim([], {})
            ids = [job.pk for job in jobs]
            lease_until = now + lease
            updated = _mark_running(
                ids, worker_id=worker_id, now=now, lease_until=lease_until, using=using
            )
            if updated != len(jobs):  # a database without row locks let another worker win some
                mine = set(
                    Job.objects.using(using)
                    .filter(pk__in=ids, status=Status.RUNNING, worker_id=worker_id, started_at=now)
                    .values_list("pk", flat=True)
                )
                jobs = [job for job in jobs if job.pk in mine]
        break
    claim = _Claim(jobs=jobs, started_before={job.pk: job.started_at for job in jobs})
    for job in jobs:
        job.status = Status.RUNNING
        job.window_key = None
        job.worker_id = worker_id
        job.started_at = now
        job.lease_expires_at = lease_until
        job.attempts += 1
    return claim


#: The one slot of the claim's SELECT: the claim's clock (compared with ``run_at`` and leases).
_NOW_SLOT = {"now": Job._meta.get_field("run_at")}


@dataclass(frozen=True)
class _ClaimShape:
    """What a claim's SQL depends on besides ``now``, the alias and the limit (a cache key)."""

    queues: tuple[str, ...]
    """Queues served; empty: all."""
    busy: tuple[str, ...]
    """CoDel queues left out of this round (sorted)."""
    lock: str
    """``"skip_locked"``, ``"for_update"`` or ``""`` (the database has no row locks)."""

    def queryset(self, now: datetime, using: str) -> Any:
        """Return the claim's locked queryset at ``now`` (:func:`claimable_jobs` and this shape)."""
        qs = claimable_jobs(now, self.queues).using(using)
        if self.busy:
            qs = qs.exclude(queue__in=list(self.busy))
        if self.lock == "skip_locked":
            qs = qs.select_for_update(skip_locked=True)
        elif self.lock == "for_update":
            qs = qs.select_for_update()
        return qs


@cache
def _mark_running_slots(count: int) -> dict[str, Any]:
    field = Job._meta.get_field
    return {
        **{f"id{i}": Job._meta.pk for i in range(count)},
        "worker_id": field("worker_id"),
        "now": field("started_at"),
        "lease_until": field("lease_expires_at"),
    }


def _mark_running(
    ids: list[int], *, worker_id: str, now: datetime, lease_until: datetime, using: str
) -> int:
    """Mark the READY jobs ``ids`` RUNNING for ``worker_id``; return how many were.

    One ``UPDATE`` that closes each job's window, sets the lease until
    ``lease_until`` and counts the attempt, compiled once per number of ids
    and alias (:mod:`django_debounce.compiled`).
    """
    count = len(ids)

    def build(slot: Mapping[str, Any]) -> Any:
        return compiled.update_query(
            Job.objects.using(using).filter(
                pk__in=[slot[f"id{i}"] for i in range(count)], status=Status.READY
            ),
            status=Status.RUNNING,
            window_key=None,
            worker_id=slot["worker_id"],
            started_at=slot["now"],
            lease_expires_at=slot["lease_until"],
            attempts=F("attempts") + 1,
        )

    entry = compiled.compiled(("mark_running", count), build, _mark_running_slots(count), using)
    values: dict[str, Any] = {f"id{i}": pk for i, pk in enumerate(ids)}
    values.update(worker_id=worker_id, now=now, lease_until=lease_until)
    return compiled.execute_update(entry, values, using)


def _fenced_success(using: str) -> Any:
    def build(slot: Mapping[str, Any]) -> Any:
        return compiled.update_query(
            Job.objects.using(using).filter(
                pk=slot["pk"],
                status=Status.RUNNING,
                worker_id=slot["worker_id"],
                attempts=slot["attempts"],
            ),
            status=Status.SUCCESSFUL,
            result=slot["result"],
            finished_at=slot["now"],
            lease_expires_at=None,
            unique_lock=None,
        )

    return build


_SUCCESS_SLOTS = {
    "pk": Job._meta.pk,
    "worker_id": Job._meta.get_field("worker_id"),
    "attempts": Job._meta.get_field("attempts"),
    "result": Job._meta.get_field("result"),
    "now": Job._meta.get_field("finished_at"),
}


def _record_success(job: Job, *, worker_id: str, result: Any, now: datetime, using: str) -> int:
    """Record ``job``'s run as SUCCESSFUL with ``result`` (its stored JSON); return 1, or 0 if late.

    Fenced on (id, RUNNING, ``worker_id``, attempts) like every outcome write
    (§11); the ``UPDATE`` is compiled once per alias (:mod:`django_debounce.compiled`).
    """
    entry = compiled.compiled(("record_success",), _fenced_success(using), _SUCCESS_SLOTS, using)
    values = {
        "pk": job.pk,
        "worker_id": worker_id,
        "attempts": job.attempts,
        "result": result,
        "now": now,
    }
    return compiled.execute_update(entry, values, using)


def _anything_claimable(now: datetime, queues: Sequence[str] | None, using: str) -> bool:
    """Return True when :func:`claimable_jobs` at ``now`` has a row (no lock taken).

    The ``exists()`` query is compiled once per (queues, alias) and reused
    (:mod:`django_debounce.compiled`): an idle worker peeks on every poll.
    """
    shape = tuple(queues or ())
    entry = compiled.compiled(
        ("peek", shape),
        lambda slot: claimable_jobs(slot["now"], shape).using(using).query.exists(),
        _NOW_SLOT,
        using,
    )
    return compiled.has_rows(entry, {"now": now}, using)


def _take_due(shape: _ClaimShape, *, limit: int, now: datetime, using: str) -> list[Job]:
    """Return up to ``limit`` due jobs of ``shape``'s claim query, locked, expiring stale ones.

    The query's SQL is compiled once per (shape, limit, alias) and reused with
    this ``now`` (:mod:`django_debounce.compiled`; docs/decisions.md).
    """
    entry = compiled.compiled(
        ("claim", shape, limit),
        lambda slot: shape.queryset(slot["now"], using)[:limit].query,
        _NOW_SLOT,
        using,
    )
    while True:
        jobs = compiled.fetch_jobs(entry, {"now": now}, using)
        if not jobs:
            return []
        expired = [job.pk for job in jobs if job.expires_at is not None and job.expires_at <= now]
        if not expired:
            return jobs
        _expire(expired, now, using)
        jobs = [job for job in jobs if job.pk not in expired]
        if jobs:
            return jobs


def _oneshot_applies(queues: Sequence[str] | None, using: str) -> bool:
    """Return True when a plain claim on ``using`` may run as one statement (:func:`_claim_oneshot`).

    Only on PostgreSQL with SKIP LOCKED (the statement is written for it; without
    it the claim keeps its transaction and plain ``FOR UPDATE``), outside any
    atomic block (the statement commits on its own), and when no served queue has
    CoDel (every queue when ``queues`` is empty or None): CoDel reads and sheds
    the candidates before they are marked RUNNING, which needs the transaction.
    The caller checks that no gated task is registered.

    Raises:
        ConfigurationError: ``DEBOUNCE_QUEUES`` is invalid.
    """
    connection = connections[using]
    if (
        connection.vendor != "postgresql"
        or not connection.features.has_select_for_update_skip_locked
        or connection.in_atomic_block
    ):
        return False
    codel = settings.codel
    return not codel or (bool(queues) and not any(queue in codel for queue in queues or ()))


#: The one-statement claim's SQL by the SQL of its compiled id query (see :func:`_oneshot_sql`).
_oneshot_sqls: dict[str, str] = {}


def _oneshot_sql(pick_sql: str, quote: Callable[[str], str]) -> str:
    """Return the one-statement claim around the compiled id query ``pick_sql``.

    ``quote`` quotes a column or table name (``connection.ops.quote_name``). Built
    once per id query and kept (as many as :data:`compiled.MAX_ENTRIES`).

    ``picked`` locks the claim's rows (``FOR UPDATE SKIP LOCKED``, in claim
    order, up to the limit) with their ``started_at`` from before the claim;
    ``stale`` counts the picked rows already past their expiry; ``claimed``
    marks the picked rows RUNNING only if none is stale, so the caller can
    fall back to the transaction that expires them (an expired job never
    runs, §6). Each row is ``(stale count, started_at before the claim, the
    job's columns…)``; the outer ``LEFT JOIN`` returns one row even when
    nothing was claimed: ``(stale count, NULL, NULL, …)``.

    Parameters, in order: the pick query's own, then ``now`` (expiry), the
    RUNNING status, worker id, ``now`` (started_at), the lease's end, the READY
    status.
    """
    found = _oneshot_sqls.get(pick_sql)
    if found is not None:
        return found
    meta = Job._meta
    table = quote(meta.db_table)
    columns = {field.name: quote(str(field.column)) for field in meta.concrete_fields}

    def column(name: str) -> str:
        return columns[name]

    returning = ", ".join(f"{table}.{name}" for name in columns.values())
    found = (
        f"WITH picked (pk, expires_at, started_before) AS ({pick_sql}), "
        "stale AS (SELECT count(*) AS n FROM picked WHERE picked.expires_at <= %s), "
        f"claimed AS (UPDATE {table} SET {column('status')} = %s, {column('window_key')} = NULL, "
        f"{column('worker_id')} = %s, {column('started_at')} = %s, "
        f"{column('lease_expires_at')} = %s, "
        f"{column('attempts')} = {table}.{column('attempts')} + 1 "
        f"FROM picked, stale WHERE {table}.{column('id')} = picked.pk "
        f"AND stale.n = 0 AND {table}.{column('status')} = %s "
        f"RETURNING picked.started_before, {returning}) "
        "SELECT stale.n, claimed.* FROM stale LEFT JOIN claimed ON TRUE"
    )
    if len(_oneshot_sqls) >= compiled.MAX_ENTRIES:
        _oneshot_sqls.clear()
    _oneshot_sqls[pick_sql] = found
    return found


def _claim_oneshot(
    *,
    worker_id: str,
    limit: int,
    lease: timedelta,
    queues: Sequence[str] | None,
    using: str,
) -> _Claim | None:
    """Claim up to ``limit`` due jobs in ONE autocommit statement (PostgreSQL, decision 67).

    The rows are chosen by the compiled claim query (:func:`claimable_jobs`
    through :class:`_ClaimShape`, ``FOR UPDATE SKIP LOCKED``, its ids and
    expiries) and marked RUNNING by the same statement, as ``_mark_running``
    would: one round trip instead of BEGIN, SELECT, UPDATE, COMMIT.

    Args:
        worker_id: the claiming worker's id.
        limit: most jobs to claim, >= 1.
        lease: how long the claim's lease lasts from the claim's ``now``.
        queues: queues served; empty or None: all.
        using: database alias (PostgreSQL, autocommit).

    Returns:
        The claim: the jobs as stored after it, in claim order (priority
        descending, then ``run_at``, then id), with each one's ``started_at``
        from before it; or None, claiming nothing, when a picked job is past
        its expiry: the caller's transactional claim must expire it together
        with cancelling its dependents (§6, §11).

    Raises:
        DatabaseError: the statement failed (nothing was claimed).
    """
    connection = connections[using]
    shape = _ClaimShape(queues=tuple(queues or ()), busy=(), lock="skip_locked")
    entry = compiled.compiled(
        ("claim_oneshot", shape, limit),
        lambda slot: (
            shape.queryset(slot["now"], using)[:limit]
            .values_list("pk", "expires_at", "started_at")
            .query
        ),
        _NOW_SLOT,
        using,
    )
    sql = _oneshot_sql(entry.sql, connection.ops.quote_name)
    now = timezone.now()
    when = Job._meta.get_field("started_at").get_db_prep_save(now, connection)
    lease_until = Job._meta.get_field("lease_expires_at").get_db_prep_save(now + lease, connection)
    params = [
        *entry.bind(connection, {"now": now}),
        when,
        Status.RUNNING.value,
        worker_id,
        when,
        lease_until,
        Status.READY.value,
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    if rows[0][0]:
        return None
    claim = _Claim([], {})
    for row in rows:
        if row[2] is None:  # the LEFT JOIN's row when nothing was claimed
            continue
        job = compiled.job_from_row(row[2:], using)
        claim.jobs.append(job)
        claim.started_before[job.pk] = row[1]  # psycopg's aware datetime, as the ORM's
    # RETURNING has no order: put them back in claim order.
    claim.jobs.sort(key=lambda job: (-job.priority, job.run_at, job.pk))
    return claim


#: Candidate rounds per gated claim that shed nothing (each round leaves out the
#: task names found exhausted in the previous one).
_MAX_ROUNDS = 4
#: Jobs one gated claim examines at most (shedding rounds continue up to this).
_MAX_EXAMINED = 2000


def _take_admitted(
    shape: _ClaimShape,
    gates: dict[str, admission.Gate],
    *,
    limit: int,
    now: datetime,
    using: str,
) -> list[Job]:
    """Return up to ``limit`` due jobs the flow-control gate admits (§6), in claim order, locked.

    Task names that surely admit nothing (:meth:`Admission.blocked_names`) are
    left out of the candidate query, so a blocked task's backlog does not starve
    other tasks; candidates are oversampled, and a bounded number of further
    rounds leave out the names exhausted meanwhile. Jobs of ``on_excess="drop"``
    tasks without a token are shed here (dead letter ``shed:``, no signal).

    Candidates are read without row locks; only the jobs this claim takes (to
    run, to shed, to expire) are then locked (:func:`_lock_due`), so another
    worker's claim still finds every job this one examined but did not take
    (decision 43 in docs/decisions.md).
    """
    gate = admission.Admission(gates, now=now, using=using)
    skip = gate.blocked_names()
    unlocked = _ClaimShape(queues=shape.queues, busy=shape.busy, lock="")
    jobs: list[Job] = []
    seen: list[int] = []  # examined: later rounds leave them out
    idle_rounds = examined = 0
    while idle_rounds < _MAX_ROUNDS and examined < _MAX_EXAMINED:
        room = limit - len(jobs)
        batch = room + max(8, room)
        if seen:  # a later round: its excludes vary, so it stays on the ORM
            round_qs = unlocked.queryset(now, using).exclude(pk__in=seen)
            if skip:
                round_qs = round_qs.exclude(task_name__in=sorted(skip))
            candidates = list(round_qs[:batch])
        else:
            candidates = _first_candidates(unlocked, tuple(sorted(skip)), batch, now, using)
        if not candidates:
            break
        read = len(candidates)
        examined += read
        seen.extend(job.pk for job in candidates)
        expired = [
            job.pk for job in candidates if job.expires_at is not None and job.expires_at <= now
        ]
        if expired:
            mine = _lock_due(shape, expired, now, using) if shape.lock else set(expired)
            if mine:
                _expire([pk for pk in expired if pk in mine], now, using)
            candidates = [job for job in candidates if job.pk not in expired]
        decision, lost = _admit_and_lock(gate, shape, candidates, room, now=now, using=using)
        for job, job_gate in decision.to_shed:
            reason, metadata = admission.shed_reason(job_gate)
            shed_job(job, reason=reason, metadata=metadata, now=now, using=using)
        jobs.extend(decision.admitted)
        if len(jobs) >= limit or read < batch:
            break
        exhausted = gate.exhausted_names()
        changed = decision.to_shed or expired or lost
        if not (changed or decision.admitted or exhausted - skip):
            break  # nothing changed: the next candidates would fare the same
        if not changed:
            idle_rounds += 1
        skip |= exhausted
    gate.save()
    return jobs


def _first_candidates(
    shape: _ClaimShape, skip: tuple[str, ...], batch: int, now: datetime, using: str
) -> list[Job]:
    """Return a gated claim's first ``batch`` candidates, not locked, leaving out ``skip`` names.

    The claim query of ``shape`` (no lock) compiled once per (shape, names left
    out, batch) and alias (:mod:`django_debounce.compiled`).
    """

    def build(slot: Mapping[str, Any]) -> Any:
        qs = shape.queryset(slot["now"], using)
        if skip:
            qs = qs.exclude(task_name__in=list(skip))
        return qs[:batch].query

    entry = compiled.compiled(("gated_pick", shape, skip, batch), build, _NOW_SLOT, using)
    return compiled.fetch_jobs(entry, {"now": now}, using)


def _admit_and_lock(
    gate: admission.Admission,
    shape: _ClaimShape,
    candidates: list[Job],
    room: int,
    *,
    now: datetime,
    using: str,
) -> tuple[admission.Decision, set[int]]:
    """Admit up to ``room`` of ``candidates`` and lock exactly the jobs taken (run or shed).

    A taken job that another transaction holds or changed since the candidates
    were read (another claim took it, an enqueue is sliding its window) is
    lost: the gate's decisions are taken back (:meth:`Admission.restore`: the
    tokens, concurrency slots and probe it was given) and made again without
    it, so the limits count only jobs this claim really takes. Returns the
    final decision and the ids lost.
    """
    gate.hold(candidates)
    before = gate.checkpoint()
    lost: set[int] = set()
    while True:
        decision = gate.admit(candidates, room)
        taken = [job.pk for job in decision.admitted] + [job.pk for job, _ in decision.to_shed]
        if not taken or not shape.lock:  # no row locks (SQLite): the claim has the database
            return decision, lost
        missing = set(taken) - _lock_due(shape, taken, now, using)
        if not missing:
            return decision, lost
        lost |= missing
        gate.restore(before)
        candidates = [job for job in candidates if job.pk not in missing]


@cache
def _lock_due_slots(count: int) -> dict[str, Any]:
    return {**{f"id{i}": Job._meta.pk for i in range(count)}, **_NOW_SLOT}


def _lock_due(shape: _ClaimShape, ids: list[int], now: datetime, using: str) -> set[int]:
    """Lock those of the jobs ``ids`` that are still claimable at ``now``; return their ids.

    The claim query restricted to ``ids`` (:func:`claimable_jobs`, so a job
    that stopped being due, READY or first of its key since it was read is
    not taken), ``FOR UPDATE SKIP LOCKED`` where the database has it (rows
    another transaction holds are not waited for), in id order; compiled once
    per number of ids (:mod:`django_debounce.compiled`).
    """
    count = len(ids)
    entry = compiled.compiled(
        ("lock_due", shape, count),
        lambda slot: (
            shape.queryset(slot["now"], using)
            .filter(pk__in=[slot[f"id{i}"] for i in range(count)])
            .order_by("pk")
            .values_list("pk", flat=True)
            .query
        ),
        _lock_due_slots(count),
        using,
    )
    values: dict[str, Any] = {f"id{i}": pk for i, pk in enumerate(ids)}
    values["now"] = now
    connection = connections[using]
    with connection.cursor() as cursor:
        cursor.execute(entry.sql, entry.bind(connection, values))
        return {row[0] for row in cursor.fetchall()}


def _expire(ids: list[int], now: datetime, using: str) -> None:
    """End jobs not started by their expiry as EXPIRED; they never run (§6, §11).

    No dead letter (§8: a planned outcome); their dependents are cancelled in
    the same transaction (§11).
    """
    Job.objects.using(using).filter(pk__in=ids).update(
        status=Status.EXPIRED, finished_at=now, window_key=None, unique_lock=None
    )
    cancel_dependents(ids, now=now, using=using)
    logger.info(
        "expired %d job(s) not started by their expiry: %s",
        len(ids),
        ids,
        extra={"action": "expire"},
    )


def _dead_letter(
    job: Job,
    *,
    reason: str,
    error: str,
    tb: str,
    metadata: dict[str, Any],
    using: str = DEFAULT_DB_ALIAS,
) -> DeadLetter:
    return DeadLetter(
        job=job,
        task_name=job.task_name,
        queue=job.queue,
        args=job.args,
        kwargs=job.kwargs,
        reason=reason,
        metadata=metadata,
        error=error,
        traceback=tb,
        created_at=timezone.now(),
        retry_depth=DeadLetter.retry_depth_for(job, using=using),
    )


def reclaim_expired_leases(
    *, using: str = DEFAULT_DB_ALIAS, limit: int = 500, exclude_ids: Iterable[int] = ()
) -> tuple[int, int]:
    """Put back RUNNING jobs whose lease lapsed (their worker died, §7).

    ``exclude_ids`` are the jobs the calling worker is running right now: it
    is alive and renewing them (its clock may have jumped past their leases,
    e.g. under time-machine in tests). Everything else with a lapsed lease is
    an orphan, including jobs of an earlier process that used the same
    ``--worker-id``.

    A job that still has retries left goes back to READY, keeping its
    ``run_at`` (its place in line); one whose ``attempts`` already used every
    retry is FAILED with a dead letter (a job that kills its workers, §11).

    Returns:
        ``(requeued, dead_lettered)`` counts.
    """
    features = connections[using].features
    letters: list[DeadLetter] = []
    lapsed = Job.objects.using(using).filter(
        status=Status.RUNNING, lease_expires_at__lte=timezone.now()
    )
    exclude = list(exclude_ids)
    if not lapsed.exclude(pk__in=exclude).exists():  # the usual case: no lock taken
        return 0, 0
    with transaction.atomic(using=using):
        now = timezone.now()
        # A lease is live while lease_expires_at > now (as in claimable_jobs), so it has
        # lapsed at lease_expires_at itself: reclaim then, before a later job of the key runs.
        qs = Job.objects.using(using).filter(status=Status.RUNNING, lease_expires_at__lte=now)
        if exclude:
            qs = qs.exclude(pk__in=exclude)
        if features.has_select_for_update_skip_locked:
            qs = qs.select_for_update(skip_locked=True)
        stale = list(qs.order_by("lease_expires_at")[:limit])
        if not stale:
            return 0, 0
        requeue = [job.pk for job in stale if job.attempts <= job.max_retries]
        exhausted = [job for job in stale if job.attempts > job.max_retries]
        if requeue:
            Job.objects.using(using).filter(pk__in=requeue, status=Status.RUNNING).update(
                status=Status.READY, worker_id="", lease_expires_at=None
            )
        if exhausted:
            error = "django_debounce.worker.LeaseExpired: the worker running this job stopped renewing its lease"
            Job.objects.using(using).filter(pk__in=[j.pk for j in exhausted]).update(
                status=Status.FAILED,
                finished_at=now,
                lease_expires_at=None,
                unique_lock=None,
                error=error,
            )
            for job in exhausted:
                letters.append(
                    _dead_letter(
                        job,
                        reason=f"failed: lease expired after {job.attempts} attempt(s); {error}",
                        error=error,
                        tb="",
                        metadata={"attempts": job.attempts, "worker_id": job.worker_id},
                        using=using,
                    )
                )
            DeadLetter.objects.using(using).bulk_create(letters)
            cancel_dependents([job.pk for job in exhausted], now=now, using=using)
    for job in stale:
        logger.warning(
            "job %s (%s) lost its lease on worker %s; %s",
            job.pk,
            job.task_name,
            job.worker_id,
            "requeued" if job.pk in requeue else "dead-lettered",
            extra={"action": "reclaim", "job_id": job.pk},
        )
    for letter in letters:
        send_signal(job_dead_lettered, job=letter.job, dead_letter=letter)
    return len(requeue), len(letters)


def _release_unstarted(
    jobs: Sequence[Job],
    started_before: Mapping[int, datetime | None],
    *,
    worker_id: str,
    using: str,
) -> int:
    """Put claimed jobs that never started back as they were before the claim (§7 shutdown).

    Undoes what the claim wrote (``_mark_running``): READY again, no lease, no
    worker, the attempt not counted, ``started_at`` as it was before the claim
    (``started_before``, by id). The window the claim closed stays closed (§4.1:
    a job put back after a claim takes no calls). Each job's update is fenced
    on this worker and the claim's attempt, so a job whose lease lapsed and
    that another worker took meanwhile is left alone. A token or a breaker
    probe the claim took from the admission gate (§6) is not given back.

    Returns:
        How many jobs were put back.
    """
    groups: dict[tuple[int, datetime | None], list[int]] = {}
    for job in jobs:
        groups.setdefault((job.attempts, started_before.get(job.pk)), []).append(job.pk)
    released = 0
    with transaction.atomic(using=using):
        for (attempts, started_at), ids in groups.items():
            released += (
                Job.objects.using(using)
                .filter(pk__in=ids, status=Status.RUNNING, worker_id=worker_id, attempts=attempts)
                .update(
                    status=Status.READY,
                    worker_id="",
                    lease_expires_at=None,
                    started_at=started_at,
                    attempts=attempts - 1,
                )
            )
    logger.info(
        "stopping: put back %d claimed job(s) that had not started: %s",
        released,
        [job.pk for job in jobs],
        extra={"action": "release"},
    )
    return released


def _close_dropped_connections() -> None:
    """Close this thread's persistent connections that the server dropped (§7).

    ``close_old_connections()`` tests a connection only after an error on it,
    so one killed while idle (``CONN_MAX_AGE`` > 0, a database restart, an
    idle timeout) would fail the next job's first query and spend a retry.
    One ``SELECT 1`` before a job on a reused connection avoids that.
    """
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and not conn.in_atomic_block and not conn.is_usable():
            conn.close()


class Worker:
    """Run due jobs until stopped (or, with ``burst``, until none is due).

    Args:
        queues: queue names to serve; ``None`` or empty serves every queue.
        concurrency: threads running jobs (≥ 1). Each holds at most one
            database connection; the loop holds one more for claims and
            lease renewal.
        burst: run every job due and runnable now, then return (§11). Jobs
            held back (a run of the same key in flight on another worker, a
            rate limit without a token, a full concurrency cap, an open circuit
            breaker) are not waited for. With ``concurrency=1`` the jobs run in the calling
            thread.
        max_jobs: stop after claiming this many jobs.
        poll_interval: seconds between polls when idle (``DEBOUNCE_POLL_INTERVAL``).
        lease: claim lease (``DEBOUNCE_LEASE``); renewed every third of it.
        shutdown_grace: how long a stop waits for running jobs (``DEBOUNCE_SHUTDOWN_GRACE``).
        worker_id: identity recorded on claimed jobs (default host:pid:random).
        handle_signals: install SIGTERM/SIGINT handlers (main thread only).
        using: database alias.
    """

    def __init__(
        self,
        *,
        queues: Iterable[str] | None = None,
        concurrency: int = 1,
        burst: bool = False,
        max_jobs: int | None = None,
        poll_interval: float | None = None,
        lease: timedelta | None = None,
        shutdown_grace: timedelta | None = None,
        worker_id: str | None = None,
        handle_signals: bool = True,
        using: str | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency={concurrency} must be at least 1")
        if max_jobs is not None and max_jobs < 1:
            raise ValueError(f"max_jobs={max_jobs} must be at least 1")
        self.queues = sorted(set(queues or ()))
        self.concurrency = concurrency
        self.burst = burst
        self.max_jobs = max_jobs
        self.poll_interval = settings.poll_interval if poll_interval is None else poll_interval
        self.lease = lease or settings.lease
        self.shutdown_grace = (
            shutdown_grace if shutdown_grace is not None else settings.shutdown_grace
        )
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.handle_signals = handle_signals
        self.using = using or router.db_for_write(Job) or DEFAULT_DB_ALIAS
        self.processed = 0
        self._claimed_total = 0
        self._next_maintenance = 0.0
        self._next_sweep_at: datetime | None = None
        self._idle = True
        self._stopping = threading.Event()
        self._signals_seen = 0
        self._done: queue_module.Queue[int | None] = queue_module.Queue()
        self._work: queue_module.Queue[Job | None] = queue_module.Queue()
        self._in_flight: dict[int, Job] = {}
        # Claimed jobs not started yet: their started_at from before the claim (to put back).
        self._started_before: dict[int, datetime | None] = {}
        self._lock = threading.Lock()
        # Inline mode's lease keeper (one thread per run): when the running job's lease is due
        # for renewal (monotonic seconds; None while no job runs), and whether the run is over.
        self._keeper = threading.Condition()
        self._renew_due: float | None = None
        self._run_over = False
        self._loop_used_at = 0.0  # monotonic time the threaded loop last used its connection

    # -- control -----------------------------------------------------------------
    def stop(self) -> None:
        """Stop claiming; running jobs finish within the grace period."""
        self._stopping.set()
        self._done.put(None)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals_seen += 1
        if self._signals_seen > 1:
            logger.warning("second signal %s: exiting now", signum, extra={"action": "abort"})
            raise SystemExit(1)
        logger.info(
            "signal %s: finishing running jobs (grace %ss), claiming no more",
            signum,
            self.shutdown_grace.total_seconds(),
            extra={"action": "shutdown"},
        )
        self.stop()

    def run(self) -> int:
        """Run until stopped, ``max_jobs`` reached or (burst) nothing is due; return jobs run."""
        previous: dict[signal.Signals, Any] = {}
        if self.handle_signals and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                previous[signum] = signal.signal(signum, self._on_signal)
        logger.info(
            "worker %s starting: queues=%s concurrency=%s burst=%s",
            self.worker_id,
            self.queues or "all",
            self.concurrency,
            self.burst,
            extra={"action": "start_worker"},
        )
        try:
            if self.burst and self.concurrency == 1:
                self._run_inline()
            else:
                self._run_threaded()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            if not connections[self.using].in_atomic_block:
                connections[self.using].close()
        logger.info(
            "worker %s stopped after %d job(s)",
            self.worker_id,
            self.processed,
            extra={"action": "stop_worker"},
        )
        return self.processed

    # -- modes -------------------------------------------------------------------
    def _room(self) -> int:
        """Return how many jobs to claim now: free threads, capped by ``max_jobs``."""
        free = self.concurrency - len(self._in_flight)
        if self.max_jobs is None:
            return free
        return max(0, min(free, self.max_jobs - self._claimed_total))

    def _maintain(self) -> None:
        """Reclaim lapsed leases (at start, then at most once per poll interval)."""
        if time.monotonic() < self._next_maintenance:
            return
        with self._lock:
            running = list(self._in_flight)
        reclaim_expired_leases(using=self.using, exclude_ids=running)
        self._next_maintenance = time.monotonic() + min(self.poll_interval, 1.0)
        self._sweep()

    def _sweep(self) -> None:
        """Run the dead-letter auto-retry sweep (§8, §11) when it is due.

        Due at a worker's start (so at the start of every ``--burst``) and then
        at most once per ``every`` of ``DEBOUNCE_DEAD_LETTER_AUTO_RETRY``,
        timed on the package's clock (§4.7). Off when the setting is ``None``.
        """
        config = settings.dead_letter_auto_retry
        if config is None:
            return
        now = timezone.now()
        if self._next_sweep_at is not None and now < self._next_sweep_at:
            return
        # The sweep runs on the loop thread, which also renews the running jobs' leases: renew
        # them between entries when a third of the lease has passed, and stop on shutdown, so a
        # sweep through a large backlog never lets a lease lapse (a lapsed lease is a rerun).
        renew_at = now + self.lease / 3

        def progress() -> bool:
            nonlocal renew_at
            if self._stopping.is_set():
                return False
            if self._in_flight and timezone.now() >= renew_at:
                self._renew()
                renew_at = timezone.now() + self.lease / 3
            return True

        auto_retry(config, using=self.using, progress=progress)
        self._next_sweep_at = now + config.every

    def _claim(self, limit: int) -> list[Job]:
        """Claim up to ``limit`` jobs; a claim that lost a deadlock or lock wait claims again.

        Lock contention (:func:`~django_debounce.core.is_contention`, as on the
        enqueue side, §4.4: e.g. MariaDB's deadlock 1213) rolled the claim
        back whole; it is retried at once, up to ``CLAIM_ATTEMPTS`` claims,
        and logged at DEBUG, not taken for a database outage (an ERROR and a
        back-off in the loop). Inside a caller's transaction it is raised: the
        server rolled that transaction back too.
        """
        for attempt in range(1, CLAIM_ATTEMPTS + 1):
            try:
                claim = _claim_batch(
                    worker_id=self.worker_id,
                    limit=limit,
                    lease=self.lease,
                    queues=self.queues,
                    using=self.using,
                    peek=self._idle,
                )
            except OperationalError as exc:
                if (
                    attempt == CLAIM_ATTEMPTS
                    or not is_contention(exc)
                    or connections[self.using].in_atomic_block
                ):
                    raise
                logger.debug(
                    "claim lost a deadlock or waited on a lock (attempt %d): %s; claiming again",
                    attempt,
                    exc,
                    extra={"action": "claim_retry"},
                )
                if attempt > 1:  # the first retry is immediate, as on the enqueue side
                    time.sleep(min(0.5, 0.002 * 2**attempt) * random.random())
                continue
            break
        with self._lock:
            self._started_before.update(claim.started_before)
        # After a short batch the queue is probably drained: peek before locking next time.
        self._idle = len(claim.jobs) < limit
        return claim.jobs

    def _may_start(self, job: Job) -> bool:
        """Return True if the claimed ``job`` starts now; once stopping, put it back (§7).

        Called where a claimed job is handed to :meth:`_process`: a stop that
        arrived while the job was being claimed, or before a thread took it,
        leaves it unstarted, so it goes back to READY at once
        (:meth:`_release`) instead of running into the grace period.
        """
        if self._stopping.is_set():
            self._release([job])
            return False
        with self._lock:
            self._started_before.pop(job.pk, None)
        return True

    def _release(self, jobs: Sequence[Job]) -> None:
        """Put claimed, unstarted ``jobs`` back as before their claim (:func:`_release_unstarted`).

        A database error is logged, not raised: the jobs then stay RUNNING until
        their lease lapses and are run again after it, as after a crash (§7).
        """
        with self._lock:
            before = {job.pk: self._started_before.pop(job.pk, None) for job in jobs}
        try:
            _release_unstarted(jobs, before, worker_id=self.worker_id, using=self.using)
        except (DatabaseError, InterfaceError):
            logger.exception(
                "could not put back %d claimed job(s) that had not started; they run again "
                "once their lease lapses",
                len(jobs),
                extra={"action": "release_error"},
            )
            if not connections[self.using].in_atomic_block:
                connections[self.using].close()

    def _run_inline(self) -> None:
        # One lease keeper for the whole run, not a thread per job: starting and joining a
        # thread per job took about a third of a no-op job's time (bench/peers.py, decision 66).
        interval = self.lease.total_seconds() / 3
        with self._keeper:
            self._renew_due, self._run_over = None, False
        keeper = threading.Thread(
            target=self._keep_lease_inline, name="debounce-lease", daemon=True
        )
        keeper.start()
        try:
            self._maintain()
            while not self._stopping.is_set() and self._room() > 0:
                jobs = self._claim(1)
                if not jobs:
                    return
                job = jobs[0]
                if not self._may_start(job):  # stopped during the claim
                    return
                self._claimed_total += 1
                with self._lock:
                    self._in_flight[job.pk] = job
                with self._keeper:
                    self._renew_due = time.monotonic() + interval
                    self._keeper.notify()
                try:
                    self._process(job)
                finally:
                    with self._keeper:
                        self._renew_due = None
                    with self._lock:
                        self._in_flight.pop(job.pk, None)
        finally:
            with self._keeper:
                self._run_over = True
                self._keeper.notify()
            keeper.join()

    def _keep_lease_inline(self) -> None:
        """Renew the lease of the job running inline each time it has run a third of the lease.

        A job that finishes within a third of its lease is never renewed (its claim's lease
        is enough), so a run of short jobs costs no query here.
        """
        interval = self.lease.total_seconds() / 3
        try:
            while True:
                with self._keeper:
                    while True:
                        if self._run_over:
                            return
                        now = time.monotonic()
                        due = self._renew_due
                        if due is not None and now >= due:
                            break
                        self._keeper.wait(None if due is None else due - now)
                    self._renew_due = now + interval
                try:
                    self._renew()  # renews whatever is in flight: a job that just ended has left
                except (DatabaseError, InterfaceError):
                    logger.exception("lease renewal failed", extra={"action": "renew_error"})
                finally:
                    # Idle until the next renewal: CONN_MAX_AGE decides whether to keep it.
                    close_old_connections()
        finally:
            connections.close_all()

    def _run_threaded(self) -> None:
        threads = [
            threading.Thread(target=self._thread_main, name=f"debounce-job-{i}", daemon=True)
            for i in range(self.concurrency)
        ]
        for thread in threads:
            thread.start()
        renew_every = self.lease.total_seconds() / 3
        next_renew = time.monotonic() + renew_every
        failures = 0
        idle = True  # the last poll claimed nothing and no job was running
        try:
            while not self._stopping.is_set():
                claimed: list[Job] = []
                room = self._room()
                try:
                    self._upkeep_loop_connection(idle)
                    self._maintain()
                    if self._in_flight and time.monotonic() >= next_renew:
                        self._renew()
                        next_renew = time.monotonic() + renew_every
                    if room and not self._stopping.is_set():
                        claimed = self._claim(room)
                    failures = 0
                    self._loop_used_at = time.monotonic()
                except (DatabaseError, InterfaceError) as exc:
                    failures += 1
                    delay = min(30.0, 0.5 * 2 ** min(failures, 6))
                    logger.error(
                        "database error in the worker loop (%s); reconnecting in %.1fs",
                        exc,
                        delay,
                        extra={"action": "db_error"},
                    )
                    connections[self.using].close()
                    self._wait(delay)
                    continue
                if claimed and self._stopping.is_set():
                    # Stopped during the claim (a signal while the claim statement ran):
                    # nothing of it starts; the loop ends and drains.
                    self._release(claimed)
                    claimed = []
                self._claimed_total += len(claimed)
                idle = not claimed and not self._in_flight
                for job in claimed:
                    with self._lock:
                        self._in_flight[job.pk] = job
                    self._work.put(job)
                if not claimed and not self._in_flight and (self.burst or self._room() == 0):
                    return
                full = bool(claimed) and len(claimed) == room
                self._wait(
                    renew_every if (full or self.burst) else min(self.poll_interval, renew_every)
                )
        finally:
            self._drain(threads)

    def _upkeep_loop_connection(self, idle: bool) -> None:
        """Apply ``CONN_MAX_AGE`` to the loop's connection (decision 66).

        The loop's connection is the worker's own (claims, lease renewal,
        reclaim, sweep), not a task's: it is kept while jobs run or were just
        claimed. Only after an idle poll does Django's ``close_old_connections()``
        run, so with ``CONN_MAX_AGE=0`` a busy worker does not reconnect for every
        claim and an idle one still reconnects on each poll. A positive
        ``CONN_MAX_AGE`` is honoured while busy too, by the connection's age
        alone (no health-check query per claim), and a connection left unused
        for ``LOOP_RECHECK_AFTER`` seconds or more (the loop waited through long
        jobs) is tested with ``is_usable()`` first: a server or proxy idle timeout
        (``idle_session_timeout``, PgBouncer) may have closed it, and a failed claim
        would cost a logged error and a back-off. A connection broken by a
        database error is closed where the error is caught.
        """
        if idle:
            close_old_connections()
            return
        conn = connections[self.using]
        if (
            conn.connection is not None
            and not conn.in_atomic_block
            and time.monotonic() - self._loop_used_at >= LOOP_RECHECK_AFTER
            and not conn.is_usable()
        ):
            # Unused through a long job: a server or proxy idle timeout may have closed it.
            conn.close()
            return
        if (
            conn.connection is not None
            and conn.settings_dict["CONN_MAX_AGE"]  # 0 means: close when idle (above)
            and conn.close_at is not None
            and time.monotonic() >= conn.close_at
            and not conn.in_atomic_block
        ):
            conn.close()

    def _wait(self, timeout: float) -> None:
        """Sleep up to ``timeout`` seconds, waking early when a job finishes or on stop."""
        try:
            self._done.get(timeout=timeout)
        except queue_module.Empty:
            return
        while True:  # drain extra wake-ups
            try:
                self._done.get_nowait()
            except queue_module.Empty:
                return

    def _drain(self, threads: list[threading.Thread]) -> None:
        """Wait up to the grace period for running jobs, renewing their leases; stop the threads.

        After a second signal (``SystemExit`` on its way out of the loop) nothing is
        waited for: that signal means "exit now", wherever in the loop it landed.
        """
        deadline = time.monotonic() + self.shutdown_grace.total_seconds()
        next_renew = time.monotonic() + self.lease.total_seconds() / 3
        while self._in_flight and time.monotonic() < deadline and self._signals_seen < 2:
            try:
                self._done.get(timeout=0.1)
            except queue_module.Empty:
                pass
            if self._in_flight and time.monotonic() >= next_renew:
                try:
                    self._renew()
                except (DatabaseError, InterfaceError):
                    logger.exception("lease renewal failed during shutdown")
                    # A broken connection stays broken: close it so the next renewal reconnects
                    # (otherwise every renewal fails, the lease lapses and the job runs twice).
                    connections[self.using].close()
                next_renew = time.monotonic() + self.lease.total_seconds() / 3
        if self._in_flight:
            logger.warning(
                "%s with %d job(s) still running; their leases will lapse and "
                "another worker will run them again",
                "second signal" if self._signals_seen > 1 else "grace period over",
                len(self._in_flight),
                extra={"action": "shutdown_timeout"},
            )
        for _ in threads:
            self._work.put(None)
        for thread in threads:
            thread.join(timeout=0.5)

    def _renew(self) -> None:
        with self._lock:
            ids = list(self._in_flight)
        if ids:
            Job.objects.using(self.using).filter(
                pk__in=ids, status=Status.RUNNING, worker_id=self.worker_id
            ).update(lease_expires_at=timezone.now() + self.lease)

    def _thread_main(self) -> None:
        try:
            while True:
                job = self._work.get()
                if job is None:
                    return
                try:
                    close_old_connections()
                    _close_dropped_connections()
                    if self._may_start(job):
                        self._process(job)
                except Exception:
                    logger.exception("worker thread failed while handling job %s", job.pk)
                finally:
                    close_old_connections()
                    with self._lock:
                        self._in_flight.pop(job.pk, None)
                    self._done.put(job.pk)
        finally:
            connections.close_all()

    # -- one job -------------------------------------------------------------------
    def _process(self, job: Job) -> None:
        with self._lock:
            self.processed += 1
        task = registry.lookup(job.task_name)
        if task is None:
            self._bury_unknown(job)
            return
        logger.info(
            "running job %s (%s), attempt %d",
            job.pk,
            job.task_name,
            job.attempts,
            extra={"action": "start_job", "job_id": job.pk},
        )
        send_signal(job_started, job=job)
        try:
            args, kwargs = codec.decode_call(job.args, job.kwargs)
            if task.options.takes_context:  # Django's takes_context: the context comes first
                args = [JobContext.for_job(job), *args]
            # Inside a caller's transaction (an inline --burst in a test, say) the task runs
            # after a savepoint: a database error in the task rolls back to it, so the
            # caller's transaction stays usable and the outcome can be recorded; any other
            # exception keeps the task's writes, as they would be kept in autocommit.
            savepoint = (
                connections[self.using].savepoint()  # transaction.savepoint(): deprecated in 6.1
                if connections[self.using].in_atomic_block
                else None
            )
            try:
                if task.is_async:
                    result = async_to_sync(task.func)(*args, **kwargs)
                else:
                    result = task.func(*args, **kwargs)
            except DatabaseError:
                if savepoint:
                    # Django marked the transaction broken; clear the mark so that the
                    # ROLLBACK TO SAVEPOINT can run (the documented manual-savepoint dance).
                    transaction.set_rollback(False, using=self.using)
                    transaction.savepoint_rollback(savepoint, using=self.using)
                raise
            if savepoint:
                transaction.savepoint_commit(savepoint, using=self.using)
        except Exception as exc:
            logger.exception(
                "job %s (%s) raised",
                job.pk,
                job.task_name,
                extra={"action": "job_error", "job_id": job.pk},
            )
            self._retry_or_bury(job, task.options.min_backoff, task.options.max_backoff, exc)
        else:
            self._succeed(job, result)

    def _fenced(self, job: Job) -> Any:
        return Job.objects.using(self.using).filter(
            pk=job.pk, status=Status.RUNNING, worker_id=self.worker_id, attempts=job.attempts
        )

    def _persist(self, write: Any) -> Any:
        """Run a DB write, retrying through a lost connection for up to one lease.

        Only transient errors (:func:`_transient`: a dropped connection, a lock
        wait) are retried: a ``DataError``, an ``IntegrityError`` or a refusal of
        the data will fail again, so it is raised at once.
        Inside a caller's transaction (an inline ``--burst`` in a test) the write
        runs in a savepoint, so a refused write leaves that transaction usable
        for the fallback write that follows.
        """
        conn = connections[self.using]
        if conn.in_atomic_block:
            inner = write

            def write() -> Any:
                with transaction.atomic(using=self.using):
                    return inner()

        deadline = time.monotonic() + self.lease.total_seconds()
        delay = 0.2
        while True:
            try:
                return write()
            except (OperationalError, InterfaceError) as exc:
                if (
                    not _transient(exc)
                    or time.monotonic() + delay > deadline
                    or conn.in_atomic_block
                ):
                    raise
                logger.warning("database error recording a job outcome (%s); retrying", exc)
                conn.close()
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _late(self, job: Job) -> None:
        logger.warning(
            "job %s (%s): lease lapsed and the job was reclaimed; this run's outcome is discarded",
            job.pk,
            job.task_name,
            extra={"action": "late_result", "job_id": job.pk},
        )

    def _write_outcome(
        self, job: Job, write: Callable[[], int], *, succeeded: bool, now: datetime
    ) -> int:
        """Run the fenced outcome ``write`` and return its row count.

        For a task with a circuit breaker the run is counted in the breaker
        (:func:`admission.record_run`, §6) in the same transaction, only if the
        write hit (a late run whose job was reclaimed counts for nothing).
        """
        task = registry.lookup(job.task_name)
        if task is None or task.options.circuit_breaker is None:
            return write()
        with transaction.atomic(using=self.using):
            updated = write()
            if updated:
                admission.record_run(job, succeeded=succeeded, now=now, using=self.using)
            return updated

    def _succeed(self, job: Job, result: Any) -> None:
        """Record a successful run exactly once (§7, §11).

        The result is stored in a safe form (:func:`storable_result`). If the
        database still refuses that write for a reason a retry cannot fix, the
        result's short ``repr`` is stored instead; if that is refused too, the
        job ends FAILED with a dead letter naming the refusal. A run is never
        repeated because its outcome could not be written.
        """
        stored = storable_result(result)
        try:
            self._record_success(job, stored)
        except Exception as exc:
            if _transient(exc):
                raise  # the database stayed unreachable for a whole lease: an outage
            self._log_refused(job, "result", exc)
            fallback = _safe_repr(result)
            if fallback == stored:
                self._bury_unstorable(job, "result", exc)
                return
            try:
                self._record_success(job, fallback)
            except Exception as again:
                if _transient(again):
                    raise
                self._log_refused(job, "short repr of the result", again)
                self._bury_unstorable(job, "result", again)

    def _record_success(self, job: Job, stored: Any) -> None:
        now = timezone.now()
        updated = self._persist(
            lambda: self._write_outcome(
                job,
                lambda: _record_success(
                    job, worker_id=self.worker_id, result=stored, now=now, using=self.using
                ),
                succeeded=True,
                now=now,
            )
        )
        if not updated:
            self._late(job)
            return
        job.status, job.result, job.finished_at = Status.SUCCESSFUL, stored, now
        job.lease_expires_at = job.unique_lock = None
        logger.info(
            "job %s (%s) succeeded on attempt %d",
            job.pk,
            job.task_name,
            job.attempts,
            extra={"action": "job_succeeded", "job_id": job.pk},
        )
        send_signal(job_finished, job=job, status=job.status)

    def _log_refused(self, job: Job, what: str, exc: BaseException) -> None:
        logger.error(
            "job %s (%s): the database refused the %s of attempt %d (%s)",
            job.pk,
            job.task_name,
            what,
            job.attempts,
            format_error(exc),
            extra={"action": "outcome_refused", "job_id": job.pk},
        )

    def _retry_or_bury(
        self, job: Job, min_backoff: timedelta | None, max_backoff: timedelta | None, exc: Exception
    ) -> None:
        """Record a failed run: schedule its retry, or fail the job for good (§7).

        The error and traceback are made storable and cut (:func:`format_error`,
        :func:`format_traceback`). If the database refuses the write for a reason
        a retry cannot fix, the job ends FAILED with a dead letter naming the
        refusal (:meth:`_bury_unstorable`), so the run is never repeated for it.
        """
        error = format_error(exc)
        tb = format_traceback(exc)
        try:
            self._record_failure(job, min_backoff, max_backoff, error, tb)
        except Exception as refused:
            if _transient(refused):
                raise  # the database stayed unreachable for a whole lease: an outage
            self._log_refused(job, "error", refused)
            self._bury_unstorable(job, "error", refused, error=error)

    def _record_failure(
        self,
        job: Job,
        min_backoff: timedelta | None,
        max_backoff: timedelta | None,
        error: str,
        tb: str,
    ) -> None:
        now = timezone.now()
        if job.attempts <= job.max_retries:
            delay = backoff_delay(
                job.attempts,
                min_backoff or settings.min_backoff,
                max_backoff or settings.max_backoff,
                jitter=settings.backoff_jitter,
            )
            run_at = now + delay
            updated = self._persist(
                lambda: self._write_outcome(
                    job,
                    lambda: self._fenced(job).update(
                        status=Status.READY,
                        run_at=run_at,
                        worker_id="",
                        lease_expires_at=None,
                        error=error,
                        traceback=tb,
                    ),
                    succeeded=False,
                    now=now,
                )
            )
            if not updated:
                self._late(job)
                return
            job.status, job.run_at, job.error, job.traceback = Status.READY, run_at, error, tb
            logger.info(
                "job %s (%s) failed attempt %d of %d; retry at %s",
                job.pk,
                job.task_name,
                job.attempts,
                job.max_retries + 1,
                run_at.isoformat(),
                extra={"action": "job_retry", "job_id": job.pk},
            )
            send_signal(job_finished, job=job, status=job.status)
            return
        letter = self._persist(
            lambda: self._bury(
                job,
                reason=f"failed: {job.attempts} attempt(s); {error}"[:2000],
                error=error,
                tb=tb,
                metadata={"attempts": job.attempts},
            )
        )
        if letter is None:
            self._late(job)

    def _bury_unstorable(
        self, job: Job, what: str, refused: BaseException, *, error: str = ""
    ) -> None:
        """Fail ``job`` for good because the database refused its outcome (``what``).

        The dead letter's reason names the refusal; the texts are written as
        ASCII (``backslashreplace``), which every database stores. Metadata:
        ``{"attempts": N, "unstorable": what}``. If even this write is refused,
        the error is logged and the job is left to its lease.
        """
        cause = format_error(refused)
        run = "succeeded but its result" if what == "result" else "failed and its error"
        reason = _ascii(
            f"failed: {job.attempts} attempt(s); the run {run} could not be stored: {cause}"
        )
        try:
            letter = self._persist(
                lambda: self._bury(
                    job,
                    reason=reason[:2000],
                    error=_ascii(error or cause),
                    tb=_ascii(format_traceback(refused)),
                    metadata={"attempts": job.attempts, "unstorable": what},
                )
            )
        except Exception:
            logger.exception(
                "job %s (%s): the database refused its dead letter too; the job is left to "
                "its lease",
                job.pk,
                job.task_name,
                extra={"action": "outcome_refused", "job_id": job.pk},
            )
            return
        if letter is None:
            self._late(job)

    def _bury(
        self, job: Job, *, reason: str, error: str, tb: str, metadata: dict[str, Any]
    ) -> DeadLetter | None:
        """Fail ``job`` for good and write its dead letter, in one transaction (§8)."""
        with transaction.atomic(using=self.using):
            now = timezone.now()
            updated = self._fenced(job).update(
                status=Status.FAILED,
                finished_at=now,
                lease_expires_at=None,
                unique_lock=None,
                error=error,
                traceback=tb,
            )
            if not updated:
                return None
            letter = _dead_letter(
                job, reason=reason, error=error, tb=tb, metadata=metadata, using=self.using
            )
            letter.save(using=self.using)
            cancel_dependents([job.pk], now=now, using=self.using)
            # A failed run counts in the task's circuit breaker (§6); unknown tasks have none.
            admission.record_run(job, succeeded=False, now=now, using=self.using)
        job.status, job.finished_at, job.error, job.traceback = Status.FAILED, now, error, tb
        job.lease_expires_at = job.unique_lock = None
        logger.warning(
            "job %s (%s) failed for good; dead letter %s: %s",
            job.pk,
            job.task_name,
            letter.pk,
            reason[:200],
            extra={"action": "dead_letter", "job_id": job.pk},
        )
        send_signal(job_finished, job=job, status=job.status)
        send_signal(job_dead_lettered, job=job, dead_letter=letter)
        return letter

    def _bury_unknown(self, job: Job) -> None:
        exc = UnknownTaskError(
            f"no task named {job.task_name!r} is registered in this worker; the worker never "
            "imports a path taken from the database. If the task exists, restart the workers "
            "so they import it, then run `manage.py retry_dead_letters --reason-prefix "
            "unknown_task:`"
        )
        logger.error("%s (job %s)", exc, job.pk, extra={"action": "unknown_task", "job_id": job.pk})
        self._persist(
            lambda: self._bury(
                job,
                reason=f"unknown_task: {job.task_name}",
                error=format_error(exc),
                tb="",
                metadata={"attempts": job.attempts},
            )
        )
