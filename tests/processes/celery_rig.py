"""A real Celery setup for one test: a broker, a Celery queue of its own, ``celery worker`` processes.

Used by the Celery executor's tests and the conformance suite's ``celery``
mode. The broker is a real server on this machine (Redis, or RabbitMQ);
each rig publishes to a fresh Celery queue name, so tests sharing a broker
never take each other's messages, and deletes the queue at the end.
"""

from __future__ import annotations

import socket
import uuid
from pathlib import Path
from urllib.parse import urlparse

from tests.celery_app import RABBITMQ, REDIS, make_app
from tests.conftest import child_env, require_service
from tests.procs import Proc, Processes, wait_for

BROKERS = {"redis": REDIS, "rabbitmq": RABBITMQ}


def broker_up(url: str) -> bool:
    """True when something listens on the broker's host and port."""
    parsed = urlparse(url)
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 0), 1):
            return True
    except OSError:
        return False


class CeleryRig:
    """A broker, a Celery queue and the subprocess environment of one test.

    Args:
        broker: ``"redis"`` or ``"rabbitmq"``.
        procs: the test's :class:`~tests.procs.Processes` (kills what it started).
        **env: more environment for the subprocesses (``DEBOUNCE_TEST_*`` settings).
    """

    def __init__(self, broker: str, procs: Processes, **env: str) -> None:
        self.url = BROKERS[broker]
        require_service(broker_up(self.url), f"needs the local {broker} broker at {self.url}")
        self.procs = procs
        self.queue = f"dbt-{uuid.uuid4().hex[:10]}"
        self.app = make_app(self.url)
        self.env = child_env(
            DJANGO_SETTINGS_MODULE="tests.settings_celery",
            DEBOUNCE_TEST_BROKER=self.url,
            DEBOUNCE_TEST_CELERY_QUEUE=self.queue,
            DEBOUNCE_TEST_LOG_STDERR="1",
            PYTHONUNBUFFERED="1",
            **env,
        )
        self._workers = 0
        self.mapped = True

    @property
    def workdir(self) -> Path:
        return self.procs.workdir

    def worker(
        self, *options: str, pool: str = "solo", wait: bool = True, queues: bool = True
    ) -> Proc:
        """Start ``celery -A tests.celery_app worker`` on this rig's queue; wait until ready.

        Args:
            options: more command-line options (e.g. ``--debounce-metrics-port``).
            pool: the Celery pool (``solo`` by default; ``prefork``, ``threads``).
            wait: wait until the worker logs "ready".
            queues: pass ``-Q <queue>``; ``False``: none, so the worker consumes its
                app's ``task_default_queue`` (see :meth:`as_default_queue`).
        """
        self._workers += 1
        name = f"celery-{self._workers}"
        proc = self.procs.start(
            name,
            [
                "-m",
                "celery",
                "-A",
                "tests.celery_app",
                "worker",
                *(["-Q", self.queue] if queues else []),
                f"--pool={pool}",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-n",
                f"{name}-{self.queue}@%h",
                "--loglevel=INFO",
                *options,
            ],
            self.env,
        )
        if wait:
            wait_for(
                lambda: self._ready(proc),
                timeout=60,
                what=lambda: f"{name} to be ready\n{proc.tail()}",
            )
        return proc

    @staticmethod
    def _ready(proc: Proc) -> bool:
        if not proc.alive():
            raise AssertionError(f"{proc.name} exited\n{proc.tail()}")
        return " ready." in proc.stderr()

    def dispatcher(self, *options: str) -> Proc:
        """Start ``run_debounce_worker --dispatch-only`` with this rig's settings."""
        return self.procs.worker("--dispatch-only", *options, name="dispatcher", env=self.env)

    def as_default_queue(self) -> None:
        """Make this rig's queue the Celery apps' ``task_default_queue``, with no queue mapping.

        A plain ``celery worker`` (no ``-Q``) then consumes it, as it consumes
        ``celery`` in a default setup; :meth:`settings` maps nothing.
        """
        del self.env["DEBOUNCE_TEST_CELERY_QUEUE"]
        self.env["DEBOUNCE_TEST_DEFAULT_QUEUE"] = self.queue
        self.app.conf.task_default_queue = self.queue
        self.mapped = False

    def settings(self) -> dict[str, object]:
        """The settings the test process needs to publish as the subprocesses do."""
        return {"DEBOUNCE_CELERY_QUEUES": {"default": self.queue} if self.mapped else {}}

    def waiting(self) -> int:
        """Return how many messages wait in this rig's Celery queue (0 if it does not exist)."""
        with self.app.connection_for_write() as conn:
            try:
                return int(
                    conn.default_channel.queue_declare(self.queue, passive=True).message_count
                )
            except Exception:
                return 0

    def purge(self) -> int:
        """Drop every message waiting in this rig's queue (a broker that lost them); return how many."""
        with self.app.connection_for_write() as conn:
            return int(conn.default_channel.queue_purge(self.queue) or 0)

    def close(self) -> None:
        """Delete this rig's queue from the broker."""
        try:
            with self.app.connection_for_write() as conn:
                conn.default_channel.queue_delete(self.queue)
        except Exception:  # pragma: no cover - the broker went away: nothing to clean
            pass
