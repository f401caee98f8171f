"""An empty database beside the test database, on the same server (never migrated).

For the tests of what a user sees before ``migrate`` (decisions 130 and 158): a
fresh SQLite file, or on PostgreSQL and MariaDB/MySQL a database created next to
the test database (its name plus ``_bare``) and dropped afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from django.db import connections


@contextmanager
def empty_database(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Yield the ``DATABASES`` entry of an empty database on the default database's server.

    Needs database access (``django_db_blocker.unblock()``) and the test
    database set up (its name is the base of the new one's).
    """
    default = connections["default"]
    conf = {**default.settings_dict, "TEST": {}}
    if default.vendor == "sqlite":
        yield {**conf, "NAME": str(tmp_path / "bare.sqlite3")}
        return
    name = f"{default.settings_dict['NAME']}_bare"
    quoted = default.ops.quote_name(name)
    with default._nodb_cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {quoted}")
        cursor.execute(f"CREATE DATABASE {quoted}")
    try:
        yield {**conf, "NAME": name}
    finally:
        with default._nodb_cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {quoted}")


def database_url(conf: dict[str, Any]) -> str | None:
    """Return a ``DATABASE_URL`` for ``conf`` (tests.settings reads it); ``None`` for SQLite."""
    engine = conf["ENGINE"]
    if engine.endswith("sqlite3"):
        return None
    scheme, port = ("postgres", 5432) if "postgresql" in engine else ("mysql", 3306)
    user = conf.get("USER") or ("postgres" if scheme == "postgres" else "root")
    password = f":{quote(conf['PASSWORD'], safe='')}" if conf.get("PASSWORD") else ""
    host = conf.get("HOST") or "127.0.0.1"
    return f"{scheme}://{user}{password}@{host}:{conf.get('PORT') or port}/{conf['NAME']}"
