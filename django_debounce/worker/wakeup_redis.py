"""The Redis wake-up, for databases without LISTEN/NOTIFY (issue #10 item 2; decision 82).

With ``DEBOUNCE_REDIS`` naming a django-redis cache alias and the wake-up
resolving to ``"redis"`` (:func:`django_debounce.worker.wakeup.wakeup_mode`: SQLite,
MariaDB/MySQL, or ``DEBOUNCE_WAKEUP = "redis"``):

* an enqueue that creates a job publishes its queue name on the channel
  :data:`CHANNEL` after the enqueue's transaction commits
  (:func:`publish_after_commit`, a ``job_enqueued`` receiver connected by
  ``AppConfig.ready``); several enqueues of one transaction publish each
  queue once;
* a worker subscribes (:class:`RedisListener`) and wakes when a job of its
  queues was published.

Redis is a hint, never the record: the job is in the database before its
message is sent. If Redis is unreachable, a publish is skipped (logged once;
no new attempt for :data:`PUBLISH_RETRY_AFTER` seconds, so enqueues never wait on a
dead server) and listeners reconnect with back-off; workers poll meanwhile,
so nothing is lost, and both recover when Redis is back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connections, transaction

from ..conf import settings
from .wakeup_listener import ListenerThread
from .wakeup_modes import wakeup_mode

logger = logging.getLogger("django_debounce.wakeup")

#: The pub/sub channel; the message is the job's queue name.
CHANNEL = "django_debounce:wakeup"
#: Seconds publishing is skipped after Redis failed, before the next attempt.
PUBLISH_RETRY_AFTER = 2.0


def redis_client(alias: str) -> Any:
    """Return the ``redis.Redis`` client of the django-redis cache ``alias``.

    Raises:
        ImportError: django-redis is not installed (checks E037, E039).
        NotImplementedError: the cache's client has no single connection
            (django-redis's ``ShardClient``; checks E037, E039).
    """
    from django_redis import get_redis_connection

    return get_redis_connection(alias)


def redis_errors() -> tuple[type[BaseException], ...]:
    """Return the exceptions that mean "Redis unreachable" (redis-py's, and OSError)."""
    from redis.exceptions import ConnectionError, TimeoutError

    return (ConnectionError, TimeoutError, OSError)


def config_errors() -> tuple[type[BaseException], ...]:
    """Return the exceptions :func:`redis_client` raises for a wrong ``DEBOUNCE_REDIS`` (E036–E039).

    A missing cache alias (Django's ``InvalidCacheBackendError``), a cache
    without a raw connection (``NotImplementedError``), django-redis missing
    (``ImportError``).
    """
    from django.core.cache.backends.base import InvalidCacheBackendError

    return (InvalidCacheBackendError, NotImplementedError, ImportError)


class _Publisher:
    """Publish queue names after commit, once per queue and transaction; skip while Redis is down."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.down_until = 0.0
        self.lock = threading.Lock()

    def add(self, alias: str, queue: str, using: str) -> None:
        """Publish ``queue`` on the Redis of cache ``alias`` when ``using``'s transaction commits."""
        conn = connections[using]
        if not conn.in_atomic_block:
            self.publish(alias, {queue})
            return
        pending: dict[str, tuple[Callable[[], None], set[str]]] = self.local.__dict__.setdefault(
            "pending", {}
        )
        entry = pending.get(using)
        # A rolled-back transaction or savepoint dropped the callback: register a new one.
        if entry is None or not any(hook[1] is entry[0] for hook in conn.run_on_commit):
            queues: set[str] = set()

            def flush(queues: set[str] = queues) -> None:
                pending.pop(using, None)
                self.publish(alias, queues)

            entry = (flush, queues)
            pending[using] = entry
            transaction.on_commit(flush, using=using, robust=True)
        entry[1].add(queue)

    def publish(self, alias: str, queues: set[str]) -> None:
        if time.monotonic() < self.down_until:
            return
        try:
            client = redis_client(alias)
            for queue in sorted(queues):
                client.publish(CHANNEL, queue)
        except redis_errors() as exc:
            self._skip("Redis wake-up: publish failed (%s); workers poll until Redis is back", exc)
            return
        except config_errors() as exc:
            # A wrong DEBOUNCE_REDIS is one line per interval like an outage, not a traceback
            # per enqueue (tester report item 5, decision 141).
            self._skip(
                "Redis wake-up: DEBOUNCE_REDIS=%r gives no Redis connection (%s: %s); workers "
                "poll meanwhile. Run `manage.py check` (django_debounce.E036-E039)",
                alias,
                type(exc).__name__,
                exc,
            )
            return
        if self.down_until:
            with self.lock:
                self.down_until = 0.0
            logger.info("Redis wake-up: publishing again", extra={"action": "wakeup_recovered"})

    def _skip(self, message: str, *args: Any) -> None:
        """Skip publishing for :data:`PUBLISH_RETRY_AFTER`; log ``message`` on the first failure."""
        with self.lock:
            first = self.down_until == 0.0
            self.down_until = time.monotonic() + PUBLISH_RETRY_AFTER
        if first:
            logger.warning(message, *args, extra={"action": "wakeup_publish_error"})


_publisher = _Publisher()


def publish_after_commit(sender: Any, job: Any, outcome: str, **kwargs: Any) -> None:
    """``job_enqueued`` receiver: publish a created job's queue after commit (decision 82).

    Only a ``"created"`` outcome publishes: a debounce slide moves ``run_at``
    later and a coalesced call changes nothing. Does nothing unless the
    wake-up of the job's database is ``"redis"``.
    """
    if outcome != "created" or not settings.redis:
        return
    using = job._state.db or "default"
    if wakeup_mode(using) != "redis":
        return
    _publisher.add(settings.redis or "", job.queue, using)


class RedisListener(ListenerThread):
    """Subscribe to :data:`CHANNEL` on the Redis of cache ``alias``; wake the worker on a message."""

    kind = "Redis"

    def __init__(self, event: threading.Event, *, queues: Sequence[str], alias: str) -> None:
        self.alias = alias
        self.pubsub: Any = None
        super().__init__(event, queues=queues)

    def listen(self) -> None:
        self.pubsub = redis_client(self.alias).pubsub()
        self.pubsub.subscribe(CHANNEL)
        # Listening only once Redis confirmed the subscription: a message published
        # before that would not reach this connection.
        confirmed = self.pubsub.get_message(timeout=5.0)
        if confirmed is None or confirmed.get("type") != "subscribe":
            raise ConnectionError(f"no confirmation of SUBSCRIBE {CHANNEL} (got {confirmed!r})")
        self.on_connected()
        while not self.stopping.is_set():
            message = self.pubsub.get_message(timeout=0.25)  # then check for a stop
            if message is not None and message.get("type") == "message":
                data = message["data"]
                self.wake(data.decode() if isinstance(data, bytes) else str(data))

    def close(self) -> None:
        if self.pubsub is not None:
            try:
                self.pubsub.close()
            except Exception:  # closing a broken connection: nothing left to do
                pass
            self.pubsub = None


__all__ = ["CHANNEL", "RedisListener", "config_errors", "publish_after_commit", "redis_client"]
