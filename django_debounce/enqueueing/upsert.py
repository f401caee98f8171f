"""One-statement writes of an enqueue: the slide-or-insert, and the plain insert (§4.2–§4.4).

``INSERT … ON CONFLICT (window_key) DO UPDATE`` does the find, the guard and
the write of §4 in a single atomic statement: a racing second insert of the
same open window turns into the slide, and a window a worker is claiming at
that moment (the claim sets ``window_key`` to NULL) no longer conflicts once
the claim commits, so the statement inserts a fresh window behind it (§4.5).
One round trip instead of four, which is what keeps enqueue close to a raw
driver's speed. Payload merges (§4.8), coalescing and other databases use the
ORM path in :mod:`django_debounce.enqueueing.call`.

A plain job goes in with one ``INSERT … RETURNING id`` built once per
database vendor (:func:`insert`), not ``Model.save()``: the same row, without
the ORM's per-save compilation (a third of a plain enqueue's Python, issue #12).
Like the upsert, it sends no ``pre_save``/``post_save`` signals (decision 118).
Parameters whose Django adaptation leaves a value unchanged on this connection
(a ``str`` for a text column, an ``int``, an aware ``datetime`` on PostgreSQL)
are passed as they are; the rest go through ``Field.get_db_prep_save``.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field

from .. import compiled
from ..models import Job
from ..tracing.sql import joined_sql

if TYPE_CHECKING:
    from ..options import Plan

#: Vendors whose SQL has ``ON CONFLICT … DO UPDATE … RETURNING``.
VENDORS = frozenset({"postgresql", "sqlite"})
_LEAST = {"postgresql": "LEAST", "sqlite": "MIN"}


#: Per connection (each thread has its own): whether it runs the upsert.
_supported: weakref.WeakKeyDictionary[BaseDatabaseWrapper, bool] = weakref.WeakKeyDictionary()
#: Per connection: by statement (its parameters' attnames), how each parameter is adapted.
_Preparers = tuple[tuple[str, "Field[Any, Any]", type | None, bool], ...]
_preparers: weakref.WeakKeyDictionary[BaseDatabaseWrapper, dict[tuple[str, ...], _Preparers]] = (
    weakref.WeakKeyDictionary()
)
#: Values whose adaptation is tried once per field and connection (:func:`_passes_through`).
_SAMPLES: tuple[tuple[object, type], ...] = (
    ("x", str),
    (7, int),
    (datetime(2000, 1, 2, 3, 4, 5, 6, tzinfo=UTC), datetime),
)


def supported(using: str) -> bool:
    """Return True when the database alias can run the one-statement upsert."""
    connection = connections[using]
    found = _supported.get(connection)
    if found is None:
        found = connection.vendor in VENDORS and connection.features.can_return_columns_from_insert
        _supported[connection] = found
    return found


def _passes_through(field: Field[Any, Any], connection: BaseDatabaseWrapper) -> type | None:
    """Return the type whose values ``field`` adapts to themselves on ``connection``, if any."""
    for sample, kind in _SAMPLES:
        try:
            prepared = field.get_db_prep_save(sample, connection)
        except Exception:  # noqa: BLE001, S112  (not this field's type: try the next)
            continue
        if prepared is sample:
            return kind
    return None


def prepare(
    connection: BaseDatabaseWrapper, names: tuple[str, ...], values: Mapping[str, Any]
) -> list[Any]:
    """Return the parameters ``names`` of a statement, taken from ``values`` and adapted.

    As ``[field.get_db_prep_save(values[name], connection) …]``, skipping the
    call where it would return the value itself (``None`` for a field that
    stores it as NULL, decision 206; a naive ``datetime`` always goes through
    Django, which warns and makes it aware).
    """
    by_statement = _preparers.get(connection)
    if by_statement is None:
        by_statement = _preparers[connection] = {}
    preparers = by_statement.get(names)
    if preparers is None:
        preparers = tuple(
            (
                name,
                field,
                _passes_through(field, connection),
                field.get_db_prep_save(None, connection) is None,
            )
            for name, field in _param_fields(names)
        )
        by_statement[names] = preparers
    params: list[Any] = []
    for name, field, kind, none_is_null in preparers:
        value: Any = values[name]
        if value is None and none_is_null:
            params.append(None)  # half a call's columns are NULL: no adaptation to run
            continue
        naive = kind is datetime and getattr(value, "tzinfo", None) is None
        if kind is None or type(value) is not kind or naive:
            value = field.get_db_prep_save(value, connection)
        params.append(value)
    return params


def _fields() -> list[Field[Any, Any]]:
    return list(Job._meta.concrete_fields)


def _field(attname: str) -> Field[Any, Any]:
    return Job._meta.get_field(attname)  # type: ignore[return-value]


#: Columns whose value is the same in every new window: written as SQL literals, not
#: parameters (fewer parameters to adapt and send on every enqueue).
_CONSTANTS = {
    "status": "'READY'",
    "unique_key": "NULL",
    "unique_lock": "NULL",
    "enqueue_count": "1",
    "attempts": "0",
    "result": "NULL",
    "error": "''",
    "traceback": "''",
    "started_at": "NULL",
    "finished_at": "NULL",
    "worker_id": "''",
    "lease_expires_at": "NULL",
    "cancel_requested_at": "NULL",
    "progress_done": "NULL",
    "progress_total": "NULL",
    "progress_note": "''",
    "progress_at": "NULL",
}


@lru_cache(maxsize=64)
def _sql(
    vendor: str,
    replace_payload: bool,
    rows: int = 0,
    unnest: tuple[str, ...] = (),
    traced: bool = False,
) -> tuple[str, tuple[str, ...]]:
    """Return the upsert statement and the attnames of its parameters, in order (one row's).

    ``rows=0``: one call's statement. ``rows=N``: the bulk statement of N
    windows (:func:`slide_or_insert_many`), whose ``enqueue_count`` is a
    parameter, the number of calls of the batch on that key, added on a slide.
    ``unnest`` (PostgreSQL, with ``rows``): the parameters' array types; the
    rows come from ``UNNEST`` of one array per column, as Django's own
    ``bulk_create`` sends them there (one parameter per column, not per value).
    ``traced``: the call's trace context is a parameter, joined to the open
    window's on a slide (decision 212); untraced, the statement leaves the column out.
    """
    table = Job._meta.db_table
    fields = _fields()
    columns, values, params = [], [], []
    for f in fields:
        if f.primary_key or (f.attname == "trace_links" and not traced):
            continue
        columns.append(f'"{f.column}"')
        if f.attname in _CONSTANTS and not (rows and f.attname == "enqueue_count"):
            values.append(_CONSTANTS[f.attname])
        else:
            values.append(f'u."{f.column}"' if unnest else "%s")
            params.append(f.attname)
    added = 'EXCLUDED."enqueue_count"' if rows else "1"
    sets = [
        f'"run_at" = {_LEAST[vendor]}(EXCLUDED."run_at", "{table}"."max_run_at")',
        f'"enqueue_count" = "{table}"."enqueue_count" + {added}',
        '"last_enqueued_at" = EXCLUDED."last_enqueued_at"',
    ]
    if replace_payload:
        sets += ['"args" = EXCLUDED."args"', '"kwargs" = EXCLUDED."kwargs"']
    if traced:
        sets.append(f'"trace_links" = {joined_sql(vendor, table, "trace_links")}')
    returning = ", ".join(f'"{f.column}"' for f in fields)
    # An open window already past its expiry takes no calls: the update is skipped, the
    # statement returns no row, and the caller ends that window EXPIRED and tries again.
    live = f'"{table}"."expires_at" IS NULL OR "{table}"."expires_at" > EXCLUDED."last_enqueued_at"'
    row = f"({', '.join(values)})"
    source = f"VALUES {', '.join([row] * max(rows, 1))}"
    if unnest:
        arrays = ", ".join(f"(%s)::{kind}[]" for kind in unnest)
        names = ", ".join(f'"{_field(name).column}"' for name in params)
        # WITH ORDINALITY keeps the rows in the arrays' order (the key order: lock order).
        source = (
            f"SELECT {', '.join(values)} FROM UNNEST({arrays}) WITH ORDINALITY "
            f"AS u({names}, _n) ORDER BY u._n"
        )
    sql = (
        f'INSERT INTO "{table}" ({", ".join(columns)}) {source} '
        f'ON CONFLICT ("window_key") DO UPDATE SET {", ".join(sets)} WHERE {live} '
        f"RETURNING {returning}"
    )
    return sql, tuple(params)


def slide_or_insert(plan: Plan, now: datetime, using: str) -> Job | None:
    """Run the upsert for a debounced ``plan`` and return the job as it is after it.

    ``outcome`` is ``"created"`` when the statement inserted (``enqueue_count``
    is 1) and ``"debounced"`` when it slid an open window. Returns ``None``
    (nothing written) when the key's open window is already past its
    ``expires_at``: the caller must end it and try again (§6).
    """
    assert plan.window is not None and plan.max_wait is not None and plan.window_key is not None
    connection = connections[using]
    fields = _fields()
    values = {
        "task_name": plan.task_name,
        "queue": plan.queue,
        "priority": plan.priority,
        "args": plan.args,
        "kwargs": plan.kwargs,
        "run_at": now + plan.window,
        "opened_at": now,
        "max_run_at": now + plan.max_wait,
        "debounce_key": plan.debounce_key,
        "window_key": plan.window_key,
        "key_hash": plan.window_key,
        "last_enqueued_at": now,
        "max_retries": plan.max_retries,
        "timeout": plan.timeout,
        "metadata": plan.metadata,
        "notes": plan.notes,
        "expires_at": plan.expires_at,
        "created_at": now,
        "trace_links": plan.trace_links,
    }
    traced = plan.trace_links is not None
    sql, names = _sql(connection.vendor, plan.replace_payload, traced=traced)
    with connection.cursor() as cursor:
        cursor.execute(sql, prepare(connection, names, values))
        row = cursor.fetchone()
    if row is None:
        return None
    job = _from_row(using, fields, row)
    job.outcome = "created" if job.enqueue_count == 1 else "debounced"
    return job


@cache
def _param_fields(names: tuple[str, ...]) -> tuple[tuple[str, Field[Any, Any]], ...]:
    """Return ``(attname, field)`` of the statement's parameters (looked up once, not per call)."""
    return tuple((name, _field(name)) for name in names)


def _from_row(using: str, fields: list[Field[Any, Any]], row: Any) -> Job:
    """Return the job of a ``RETURNING`` row of every concrete field, converted as the ORM does."""
    assert len(fields) == len(compiled.JOB_ATTNAMES)
    return compiled.job_from_row(row, using)


def window_row(
    first: Plan, last_window: timedelta, calls: int, payload: Plan, now: datetime
) -> dict[str, Any]:
    """Return the row values of the bulk upsert for ``calls`` calls of one window key at ``now``.

    The row a sequence of those calls leaves when it opens the window: the
    first call's (the opener's) options and ceiling, ``run_at`` of the last
    call's window, the payload of ``payload`` (the last call that replaces it,
    else the first), ``enqueue_count = calls``. On a slide the statement adds
    ``calls`` to the count and caps ``run_at`` at the ceiling already fixed.
    """
    assert first.max_wait is not None and first.window_key is not None
    return {
        "task_name": first.task_name,
        "queue": first.queue,
        "priority": first.priority,
        "args": payload.args,
        "kwargs": payload.kwargs,
        "run_at": now + last_window,
        "opened_at": now,
        "max_run_at": now + first.max_wait,
        "debounce_key": first.debounce_key,
        "window_key": first.window_key,
        "key_hash": first.window_key,
        "enqueue_count": calls,
        "last_enqueued_at": now,
        "max_retries": first.max_retries,
        "timeout": first.timeout,
        "metadata": first.metadata,
        "notes": first.notes,
        "expires_at": first.expires_at,
        "created_at": now,
        "trace_links": first.trace_links,
    }


def slide_or_insert_many(
    rows: Sequence[Mapping[str, Any]], replace_payload: bool, using: str
) -> dict[str, Job]:
    """Slide or open the windows of ``rows`` (:func:`window_row`, one per key) in one statement.

    PostgreSQL refuses an ``INSERT … ON CONFLICT DO UPDATE`` that touches one
    row twice, so the calls of one key arrive here folded into one row. Rows
    are written in ``window_key`` order, so two batches racing on the same keys
    take their row locks in the same order (no deadlock between them). With
    ``replace_payload`` a slide stores the row's payload (§4.2).

    Returns:
        The job after the statement by ``window_key``; a key missing from it
        holds an open window already past its ``expires_at``, which took no
        call (the caller ends it and tries that key again).
    """
    connection = connections[using]
    ordered = sorted(rows, key=lambda row: row["window_key"])
    # A traced batch's rows all carry its span's context (decision 212).
    traced = ordered[0].get("trace_links") is not None
    if connection.vendor == "postgresql" and len(ordered) > 1:
        names = _sql(connection.vendor, replace_payload, 1, traced=traced)[1]
        kinds = tuple(_field(name).db_type(connection).split("(")[0] for name in names)  # type: ignore[union-attr]
        sql = _sql(connection.vendor, replace_payload, 1, kinds, traced)[0]
        columns = zip(*(prepare(connection, names, row) for row in ordered), strict=True)
        params: list[Any] = [list(column) for column in columns]
    else:
        sql, names = _sql(connection.vendor, replace_payload, len(ordered), traced=traced)
        params = [param for row in ordered for param in prepare(connection, names, row)]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        found = cursor.fetchall()
    jobs = [compiled.job_from_row(row, using) for row in found]
    return {job.window_key: job for job in jobs if job.window_key is not None}


def max_rows(using: str) -> int:
    """Return how many windows one bulk statement carries on ``using`` (its parameter limit)."""
    per_row = len(_sql("postgresql", False, 1)[1])
    limit = connections[using].features.max_query_params or 65535
    return max(1, min(1000, limit // per_row))


#: The plain insert by vendor and whether it writes a trace context (:func:`_insert_sql`).
_inserts: dict[tuple[str, bool], tuple[str, tuple[str, ...]]] = {}


def _insert_sql(connection: BaseDatabaseWrapper, traced: bool) -> tuple[str, tuple[str, ...]]:
    """Return the plain ``INSERT … RETURNING id`` of a job and its parameters' attnames.

    Untraced, ``trace_links`` is left out (it stays NULL; decision 212).
    """
    found = _inserts.get((connection.vendor, traced))
    if found is not None:
        return found
    quote = connection.ops.quote_name
    fields = [f for f in _fields() if not f.primary_key and (traced or f.attname != "trace_links")]
    columns = ", ".join(quote(f.column) for f in fields)  # type: ignore[arg-type]
    values = ", ".join(["%s"] * len(fields))
    pk = quote(Job._meta.pk.column)  # type: ignore[union-attr, arg-type]
    sql = f"INSERT INTO {quote(Job._meta.db_table)} ({columns}) VALUES ({values}) RETURNING {pk}"
    found = _inserts[connection.vendor, traced] = (sql, tuple(f.attname for f in fields))
    return found


def insert(job: Job, using: str) -> bool:
    """Insert the unsaved ``job`` in one statement and set its ``pk``, as ``save()`` would.

    Returns False, having done nothing, on a database that cannot return the
    new id from an ``INSERT`` (the caller then saves through the ORM).
    """
    connection = connections[using]
    if not connection.features.can_return_columns_from_insert:
        return False
    sql, names = _insert_sql(connection, job.trace_links is not None)
    with connection.cursor() as cursor:
        cursor.execute(sql, prepare(connection, names, job.__dict__))
        row = cursor.fetchone()
    assert row is not None
    job.pk = row[0]
    job._state.adding = False
    job._state.db = using
    return True
