"""The slide's trace links in SQL: :func:`~django_debounce.tracing.carriers.joined` in one expression.

The one-statement upsert (:mod:`django_debounce.enqueueing.upsert`, PostgreSQL
and SQLite) joins a traced call's carrier to the open window's
``trace_links`` inside its ``ON CONFLICT … DO UPDATE``, so tracing adds no
round trip: the same rule as :func:`~django_debounce.tracing.carriers.joined`
(the first link kept, the second dropped once :data:`MAX_LINKS` are held,
the call's appended, ``calls`` counted; a value not of the stored shape
replaced by the call's, as :func:`~django_debounce.tracing.carriers.joined` does). Only the traced statement has it;
with tracing off the upsert neither writes nor names the column's value.
"""

from __future__ import annotations

from .carriers import MAX_CALLS, MAX_LINKS

_MAX_CALLS = MAX_CALLS


def joined_sql(vendor: str, table: str, column: str) -> str:
    """Return the ``SET`` expression joining ``EXCLUDED.column`` (one call's) to the row's ``column``.

    Args:
        vendor: ``"postgresql"`` (``jsonb``) or ``"sqlite"`` (JSON1 text).
        table: the quoted-as-needed table name the ``DO UPDATE`` refers to.
        column: the column's name.

    Raises:
        ValueError: another vendor (MariaDB slides through the ORM, in Python).
    """
    old, new = f'"{table}"."{column}"', f'EXCLUDED."{column}"'
    if vendor == "postgresql":
        links = f"({old} -> 'links')"
        kept = f"CASE WHEN jsonb_array_length({links}) >= {MAX_LINKS} THEN {links} - 1 ELSE {links} END"
        calls = (
            f"CASE WHEN jsonb_typeof({old} -> 'calls') = 'number' "
            f"THEN LEAST(GREATEST(({old} ->> 'calls')::numeric, 0), {_MAX_CALLS})::bigint "
            f"ELSE jsonb_array_length({links}) END"
        )
        body = f"jsonb_build_object('calls', {calls} + 1, 'links', {kept} || ({new} -> 'links'))"
        usable = f"jsonb_typeof({links}) = 'array'"
    elif vendor == "sqlite":
        links = f"json_extract({old}, '$.links')"
        kept = (
            f"CASE WHEN json_array_length({old}, '$.links') >= {MAX_LINKS} "
            f"THEN json_remove({links}, '$[1]') ELSE json({links}) END"
        )
        calls = (
            f"CASE WHEN json_type({old}, '$.calls') IN ('integer', 'real') "
            f"THEN CAST(MIN(MAX(json_extract({old}, '$.calls'), 0), {_MAX_CALLS}) AS INTEGER) "
            f"ELSE json_array_length({old}, '$.links') END"
        )
        body = (
            f"json_object('calls', {calls} + 1, "
            f"'links', json_insert({kept}, '$[#]', json(json_extract({new}, '$.links[0]'))))"
        )
        usable = f"json_type({old}, '$.links') = 'array'"
    else:
        raise ValueError(f"no trace-links SQL for {vendor!r}")
    # A value not of the stored shape (edited by hand) is replaced by the call's (decision 228).
    return f"CASE WHEN {old} IS NOT NULL AND {usable} THEN {body} ELSE {new} END"
