"""ORM queries compiled to SQL once per shape and run again with new values.

Building a claim's SQL through the ORM (``filter``/``Exists``/``as_sql``) costs
milliseconds of Python, far more than the database's own work, and a worker
runs the same few statements thousands of times with only a handful of values
changing (the clock, the claimed ids, its worker id, a result). The querysets
stay the source of truth (:func:`~django_debounce.flow.rules.claimable_jobs`, the
fenced ``update()`` calls): :func:`compiled` builds the ORM query with
sentinel values for its *slots*, compiles it, compiles it again with one
slot's sentinel changed at a time to find that slot's parameter positions, and
checks each is the sentinel exactly as the slot's field adapts it. A later run
substitutes the adapted values there and executes the SQL on the calling
thread's own connection (decision 65 in docs/decisions.md).

The cache key must name everything the SQL depends on except the slots:
callers pass the shape (queues, limit, number of ids, lock flavour, …) and the
alias and vendor are added here. Django inlines ``LIMIT`` and writes ``None``
as a literal ``NULL``, so limits belong in the key and a compared slot is
never ``None``. Entries are plain data (strings, tuples, fields), kept in
plain dicts by one rule (:func:`_remember`: shared by all threads, bounded by
:data:`MAX_ENTRIES`), both the compiled queries and the SQL written around
them (:func:`derived_sql`); dict reads and writes are atomic, and two threads
compiling the same shape at once store equal entries. Nothing at runtime changes an entry:
the SQL depends only on the model, the key and the database backend. Django
offers no cache of compiled queries itself.

Rows are turned into :class:`Job` instances with the same per-column
converters the ORM applies (``connection.ops.get_db_converters`` and the
field's own), computed once per connection.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import DateTimeField, Field, IntegerField, QuerySet
from django.db.models.sql.query import Query
from django.db.models.sql.subqueries import UpdateQuery

from .models import Job

#: Compiled shapes at most (a worker uses a handful; CoDel's busy-queue sets and claim sizes
#: add a few more). Past it the cache starts over rather than grow without bound.
MAX_ENTRIES = 512

#: The attnames of a full Job row, in the order the ORM selects and ``Job.from_db`` takes them.
JOB_ATTNAMES = tuple(field.attname for field in Job._meta.concrete_fields)

#: A slot's values are adapted by this field of Job (``get_db_prep_save``).
Slots = Mapping[str, "Field[Any, Any]"]


class NotCacheableError(RuntimeError):
    """The query uses a slot's value other than as one plain parameter: run it through the ORM."""


@dataclass(frozen=True)
class Compiled:
    """SQL compiled from an ORM query, with the positions of each slot among its parameters."""

    sql: str
    params: tuple[Any, ...]
    slots: tuple[tuple[str, Field[Any, Any], tuple[int, ...]], ...]
    """``(name, field, positions)`` of each slot."""
    job_rows: bool
    """True when each row is a full :class:`Job` (all concrete fields, in model order)."""

    def bind(self, connection: BaseDatabaseWrapper, values: Mapping[str, Any]) -> list[Any]:
        """Return the parameters with each slot's value (from ``values``) adapted for ``connection``.

        A slot may be ``None`` only where the query writes it (``SET col = %s`` stores NULL, as
        the ORM's ``col = NULL`` does); a compared value is never ``None``.
        """
        params = list(self.params)
        for name, field, positions in self.slots:
            value = field.get_db_prep_save(values[name], connection)
            for index in positions:
                params[index] = value
        return params


_V = TypeVar("_V")

#: Compiled queries by ``(key, alias, vendor)``.
_cache: dict[Hashable, Compiled] = {}
#: SQL text built around a compiled query (:func:`derived_sql`), by the caller's key.
_derived: dict[Hashable, str] = {}


def _remember(store: dict[Hashable, _V], key: Hashable, make: Callable[[], _V]) -> _V:
    """Return ``store[key]``, made by ``make()`` on a miss: the one caching rule of this module.

    A plain dict, shared by all threads (reads and writes are atomic; two threads
    missing at once store equal values). Past :data:`MAX_ENTRIES` it starts over
    rather than grow without bound.
    """
    found = store.get(key)
    if found is None:
        found = make()
        if len(store) >= MAX_ENTRIES:
            store.clear()
        store[key] = found
    return found


def clear() -> None:
    """Forget every compiled query and derived SQL (tests; nothing at runtime needs it)."""
    _cache.clear()
    _derived.clear()


def cache_keys() -> list[Hashable]:
    """Return the keys of the compiled shapes, as ``(key, alias, vendor)``."""
    return list(_cache)


def derived_sql(key: Hashable, make: Callable[[], str]) -> str:
    """Return SQL text written around a compiled query, built by ``make()`` once per ``key``.

    For statements the ORM cannot express (the one-statement claim wraps the
    compiled claim query in a ``WITH … UPDATE … RETURNING``): ``key`` must name
    everything the text depends on, e.g. the compiled query's own SQL. Kept by
    the same rule as the compiled queries (:func:`_remember`).
    """
    return _remember(_derived, key, make)


def compiled(
    key: Hashable, build: Callable[[Mapping[str, Any]], Query], slots: Slots, using: str
) -> Compiled:
    """Return the compiled form of the query ``build(values)`` for the database alias ``using``.

    Args:
        key: everything the SQL depends on besides the slots' values and the
            database (queues, limit, number of ids, lock flavour …); hashable.
        build: returns the ORM ``Query`` (select, ``exists()`` or update) for
            a mapping of slot name to value; each value must appear in the
            query only as a parameter (a compared or written value).
        slots: slot name to the Job field whose type the value has and which
            adapts it for the database.
        using: database alias.

    Raises:
        NotCacheableError: a slot's value changes the SQL itself or a
            parameter other than its own.
    """
    connection = connections[using]
    entry = _cache.get((key, using, connection.vendor))
    if entry is not None:  # the hot path: one dict lookup
        return entry

    def make() -> Compiled:
        if connection.get_autocommit():
            # Django refuses to compile ``select_for_update()`` outside a transaction even
            # when nothing runs; compiling sends no query, so the block is empty on the wire.
            with transaction.atomic(using=using):
                return _compile(build, slots, using)
        return _compile(build, slots, using)

    return _remember(_cache, (key, using, connection.vendor), make)


def _sentinel(field: Field[Any, Any], index: int, variant: int) -> Any:
    """Return a value of ``field``'s type that no real query uses, distinct per slot and variant."""
    if isinstance(field, DateTimeField):
        return datetime(1971 + variant, 2, 3, 4, 5, 6, 123457, tzinfo=UTC) + timedelta(
            seconds=index
        )
    if isinstance(field, IntegerField):
        return 1_000_000_007 + 1000 * variant + index
    return f"\x1fdebounce-slot-{index}-{variant}"  # CharField, TextField, JSONField (a JSON str)


def _comparable(param: Any) -> Any:
    """Return ``param`` in a form ``==`` compares by value (database adapters wrap JSON)."""
    if param is None or isinstance(param, str | int | float | datetime | bytes):
        return param
    return (type(param), repr(getattr(param, "obj", param)))


def _compile(build: Callable[[Mapping[str, Any]], Query], slots: Slots, using: str) -> Compiled:
    """Compile ``build`` once with base sentinels and once per slot with that slot's changed.

    The parameters that change when one slot's sentinel changes are that slot's
    positions; each must equal the slot's sentinel as its field adapts it (so
    :meth:`Compiled.bind` reproduces what the ORM would send).
    """
    connection = connections[using]
    names = list(slots)
    base = {name: _sentinel(slots[name], i, 0) for i, name in enumerate(names)}
    compiler = build(base).get_compiler(using=using)
    sql, params = compiler.as_sql()
    params = tuple(params)
    found: list[tuple[str, Field[Any, Any], tuple[int, ...]]] = []
    taken: set[int] = set()
    for i, name in enumerate(names):
        field = slots[name]
        varied = dict(base, **{name: _sentinel(field, i, 1)})
        other_sql, other_params = build(varied).get_compiler(using=using).as_sql()
        if other_sql != sql or len(other_params) != len(params):
            raise NotCacheableError(f"the SQL depends on the value of slot {name!r}")
        positions = tuple(
            index
            for index, (first, second) in enumerate(zip(params, other_params, strict=True))
            if _comparable(first) != _comparable(second)
        )
        expected = [
            _comparable(field.get_db_prep_save(value[name], connection)) for value in (base, varied)
        ]
        for index in positions:
            seen = [_comparable(params[index]), _comparable(other_params[index])]
            if index in taken or seen != expected:
                raise NotCacheableError(f"parameter {index} is not slot {name!r} itself")
        taken.update(positions)
        found.append((name, field, positions))
    selected = [col for col, _sql, _alias in compiler.select or ()]
    job_rows = getattr(compiler, "klass_info", None) is not None and [
        getattr(getattr(col, "target", None), "attname", None) for col in selected
    ] == list(JOB_ATTNAMES)
    return Compiled(sql=sql, params=params, slots=tuple(found), job_rows=bool(job_rows))


def update_query(qs: QuerySet[Job], **values: Any) -> Query:
    """Return the ``UPDATE`` query ``qs.update(**values)`` would run, without running it."""
    query: UpdateQuery = qs.query.chain(UpdateQuery)  # type: ignore[assignment]
    query.add_update_values(values)
    query.clear_select_clause()
    return query


def execute_update(entry: Compiled, values: Mapping[str, Any], using: str) -> int:
    """Run the compiled ``UPDATE`` ``entry`` with the slots' ``values``; return the rows changed.

    As ``QuerySet.update()``: an error inside a transaction marks it for rollback.
    """
    connection = connections[using]
    with transaction.mark_for_rollback_on_error(using=using), connection.cursor() as cursor:
        cursor.execute(entry.sql, entry.bind(connection, values))
        return int(cursor.rowcount)


def fetch_jobs(entry: Compiled, values: Mapping[str, Any], using: str) -> list[Job]:
    """Run the compiled job query ``entry`` with the slots' ``values``; return its jobs, in order."""
    assert entry.job_rows, "fetch_jobs needs a query selecting whole Job rows"
    connection = connections[using]
    with connection.cursor() as cursor:
        cursor.execute(entry.sql, entry.bind(connection, values))
        rows = cursor.fetchall()
    return [job_from_row(row, using) for row in rows]


def has_rows(entry: Compiled, values: Mapping[str, Any], using: str) -> bool:
    """Run the compiled query ``entry`` with the slots' ``values``; return True if it has a row."""
    connection = connections[using]
    with connection.cursor() as cursor:
        cursor.execute(entry.sql, entry.bind(connection, values))
        return cursor.fetchone() is not None


#: Per connection (each thread has its own): the converters of a full Job row, as
#: ``(index, functions, column)`` for the columns that have any.
_converters: weakref.WeakKeyDictionary[
    BaseDatabaseWrapper, tuple[tuple[int, tuple[Callable[..., Any], ...], Any], ...]
] = weakref.WeakKeyDictionary()


def _row_converters(
    connection: BaseDatabaseWrapper,
) -> tuple[tuple[int, tuple[Callable[..., Any], ...], Any], ...]:
    found = _converters.get(connection)
    if found is None:
        table = Job._meta.db_table
        items = []
        for index, field in enumerate(Job._meta.concrete_fields):
            col = field.get_col(table)
            functions = tuple(
                connection.ops.get_db_converters(col) + field.get_db_converters(connection)
            )
            if functions:
                items.append((index, functions, col))
        found = tuple(items)
        _converters[connection] = found
    return found


def job_from_row(row: Sequence[Any], using: str) -> Job:
    """Return the :class:`Job` of a database row holding every concrete field in model order.

    The values pass the converters the ORM would apply (JSON decoding, SQLite
    datetimes …), so the instance equals one loaded through a queryset.
    """
    connection = connections[using]
    values = list(row)
    for index, functions, col in _row_converters(connection):
        value = values[index]
        for function in functions:
            value = function(value, col, connection)
        values[index] = value
    return Job.from_db(using, JOB_ATTNAMES, values)
