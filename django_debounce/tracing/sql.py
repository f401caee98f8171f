"""The slide's trace links in SQL: :func:`~django_debounce.tracing.carriers.joined` in one expression.

The one-statement upsert (:mod:`django_debounce.enqueueing.upsert`, PostgreSQL
and SQLite) joins a traced call's carrier to the open window's
``trace_links`` inside its ``ON CONFLICT … DO UPDATE``, so tracing adds no
round trip: the same rule as :func:`~django_debounce.tracing.carriers.joined`
(the first link kept, the second dropped once :data:`MAX_LINKS` are held,
the call's appended, ``calls`` counted). Only the traced statement has it;
with tracing off the upsert neither writes nor names the column's value.
"""

from __future__ import annotations

from .carriers import MAX_LINKS


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
        body = (
            f"jsonb_build_object('calls', COALESCE(({old} ->> 'calls')::bigint, 0) + 1, "
            f"'links', {kept} || ({new} -> 'links'))"
        )
    elif vendor == "sqlite":
        links = f"json_extract({old}, '$.links')"
        kept = (
            f"CASE WHEN json_array_length({old}, '$.links') >= {MAX_LINKS} "
            f"THEN json_remove({links}, '$[1]') ELSE json({links}) END"
        )
        body = (
            f"json_object('calls', COALESCE(json_extract({old}, '$.calls'), 0) + 1, "
            f"'links', json_insert({kept}, '$[#]', json(json_extract({new}, '$.links[0]'))))"
        )
    else:
        raise ValueError(f"no trace-links SQL for {vendor!r}")
    return f"CASE WHEN {old} IS NULL THEN {new} ELSE {body} END"
