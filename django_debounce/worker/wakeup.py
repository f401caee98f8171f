"""Wake an idle worker when work arrives, and sleep it until its next deadline (issue #10, #12).

The worker calls two things here and nothing else:

* :func:`start_wakeup` when it starts: a listener thread that sets the
  worker's wake event when a job of its queues may have become claimable,
  so the worker claims at once instead of at its next poll. Which listener
  follows ``DEBOUNCE_WAKEUP`` (:func:`wakeup_mode`): PostgreSQL
  ``LISTEN/NOTIFY`` (:class:`PostgresListener`, fed by the triggers of
  migration ``0007_wakeup_notify``), Redis pub/sub
  (:mod:`django_debounce.worker.wakeup_redis`), or none (polling alone).
* :func:`idle_timeout` before it sleeps: how long to sleep, i.e. until the
  earliest ``run_at`` of a READY job it can see, or until a drained rate-limit
  bucket holds tokens again (:mod:`django_debounce.worker.deadlines`), capped by the
  poll interval.

Polling stays the backstop: a lost notification, a dropped listener
connection or a write that sent none costs at most one poll interval.
Decisions 80–84 in docs/decisions.md; how-to: docs/howto/wakeup.md.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from django.db import DatabaseError, InterfaceError, connections
from django.utils import timezone

from ..conf import settings
from .deadlines import next_refill_at, next_run_at
from .wakeup_listener import ListenerThread
from .wakeup_modes import has_notify_support, notify_triggers_missing, wakeup_mode
from .wakeup_redis import RedisListener

logger = logging.getLogger("django_debounce.wakeup")

#: The NOTIFY channel of migration 0007_wakeup_notify; the payload is the job's queue.
CHANNEL = "django_debounce_wakeup"
#: Seconds a listener waits for a message before it checks whether to stop.
STOP_CHECK = 0.25
#: The first PostgreSQL version (``server_version``) with ``idle_session_timeout``.
IDLE_SESSION_TIMEOUT_SINCE = 140000
#: Seconds added to a deadline sleep, so the worker claims just after ``run_at``, not just before.
DEADLINE_SLACK = 0.0005


class Waker(Protocol):
    """A running wake-up source; :meth:`stop` ends it (idempotent)."""

    #: True while a listener thread runs: the worker then keeps its loop connection
    #: open between polls, whatever ``CONN_MAX_AGE`` (decision 84).
    listens: bool

    def stop(self) -> None: ...


class _NoWaker:
    listens = False

    def stop(self) -> None:
        return None


def start_wakeup(
    event: threading.Event, *, queues: Sequence[str], using: str, listen: bool = True
) -> Waker:
    """Start the wake-up source of :func:`wakeup_mode` for a worker; return it (call ``stop()``).

    Args:
        event: the worker's wake event; set when a job of ``queues`` was
            enqueued, retried or moved earlier (and after a listener
            reconnects, since notifications may have been missed).
        queues: the queues the worker serves; empty: every queue.
        using: the worker's database alias.
        listen: False starts nothing (a ``--burst`` worker never sleeps for new work).

    LISTEN/NOTIFY on a database without the triggers of migration
    ``0007_wakeup_notify`` would never hear a thing: then one WARNING names the
    migration and the worker polls (one ``pg_trigger`` query at start).

    Raises:
        ConfigurationError: ``DEBOUNCE_WAKEUP`` or ``DEBOUNCE_REDIS`` is invalid.
    """
    mode = wakeup_mode(using) if listen else "poll"
    if mode == "notify" and notify_triggers_missing(using):
        logger.warning(
            "wake-up: polling, not LISTEN/NOTIFY: database %r lacks the triggers of migration "
            "django_debounce.0007_wakeup_notify (run manage.py migrate django_debounce)",
            using,
            extra={"action": "wakeup_no_triggers"},
        )
        mode = "poll"
    waker: Waker
    if mode == "notify":
        waker = PostgresListener(event, queues=queues, using=using)
    elif mode == "redis":
        waker = RedisListener(event, queues=queues, alias=settings.redis or "")
    else:
        waker = _NoWaker()
    if listen:
        logger.info("wake-up: %s", mode, extra={"action": "wakeup_mode"})
    return waker


def idle_timeout(
    cap: float,
    *,
    queues: Sequence[str],
    using: str,
    free: int = 1,
    since: datetime | None = None,
) -> float:
    """Return how long an idle worker sleeps: until the next deadline, at most ``cap`` seconds.

    Args:
        cap: the longest sleep (the poll interval), in seconds.
        queues: the queues served; empty: every queue.
        using: database alias.
        free: the sleeper's free threads (jobs it could start on waking).
        since: when the sleeper's last claim began (default: now).

    The next deadline is the earliest future ``run_at`` of a READY job
    (:func:`~django_debounce.deadlines.next_run_at`, decision 83) or the
    instant a rate-limit bucket that claim found short holds tokens for
    ``free`` jobs again (:func:`~django_debounce.deadlines.next_refill_at`,
    decision 170).
    A database error is logged at DEBUG and ``cap`` returned: the worker's
    next claim meets the same error and handles it (back-off, reconnect).
    """
    now = timezone.now()
    try:
        deadline = next_run_at(now, within=timedelta(seconds=cap), queues=queues, using=using)
        refill = next_refill_at(now, free=free, since=since, using=using)
    except (DatabaseError, InterfaceError) as exc:
        logger.debug("next deadline unknown (%s)", exc, extra={"action": "deadline_error"})
        return cap
    if refill is not None and (deadline is None or refill < deadline):
        deadline = refill
    if deadline is None:
        return cap
    return min(cap, max(0.0, (deadline - timezone.now()).total_seconds()) + DEADLINE_SLACK)


class PostgresListener(ListenerThread):
    """``LISTEN django_debounce_wakeup`` on a dedicated psycopg 3 connection (not Django's).

    Opened with the connection parameters of Django's alias ``using``
    (autocommit, no pool), so it never holds a transaction open and never
    takes a connection from the worker's threads. Idle by design (it only
    waits for notifications), its session turns ``idle_session_timeout`` off
    for itself (PostgreSQL 14+), else the server would end it every timeout
    (decision 173); a dead peer is still noticed through TCP keepalives.
    """

    kind = "LISTEN/NOTIFY"

    def __init__(self, event: threading.Event, *, queues: Sequence[str], using: str) -> None:
        self.params = _listen_params(using)
        self.conn: Any = None
        super().__init__(event, queues=queues)

    def listen(self) -> None:
        import psycopg

        self.conn = psycopg.Connection.connect(**self.params, autocommit=True)
        if self.conn.info.server_version >= IDLE_SESSION_TIMEOUT_SINCE:
            self.conn.execute("SET idle_session_timeout = 0")
        self.conn.execute(f"LISTEN {CHANNEL}")
        self.on_connected()
        while not self.stopping.is_set():
            for notify in self.conn.notifies(timeout=STOP_CHECK):
                self.wake(notify.payload)

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:  # closing a broken connection: nothing left to do
                pass
            self.conn = None


def _listen_params(using: str) -> dict[str, Any]:
    """Return ``psycopg.connect()`` keyword arguments for alias ``using`` (Django's, minus its hooks)."""
    params: dict[str, Any] = dict(connections[using].get_connection_params())
    for django_only in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(django_only, None)
    # Its own name in pg_stat_activity: the worker's listener, beside its other connections.
    params["application_name"] = f"{params.get('application_name') or 'django_debounce'}:wakeup"
    params.setdefault("connect_timeout", 5)
    # A silently dead server (a cut network) is noticed within about a minute.
    for name, value in (("keepalives", 1), ("keepalives_idle", 30), ("keepalives_interval", 10)):
        params.setdefault(name, value)
    return params


__all__ = [
    "CHANNEL",
    "PostgresListener",
    "Waker",
    "has_notify_support",
    "idle_timeout",
    "start_wakeup",
    "wakeup_mode",
]
