"""Prometheus metrics from ``celery worker`` processes (issue #11 item 1, decisions 135–137).

:func:`add_worker_metrics` adds two options to a Celery app's ``worker``
command, the way Celery documents for extensions (``app.user_options`` and a
worker bootstep)::

    # proj/celery.py
    from django_debounce.celery_metrics import add_worker_metrics

    app = Celery("proj")
    add_worker_metrics(app)

    $ celery -A proj worker --debounce-metrics-port 9108 [--debounce-metrics-addr 127.0.0.1]

The worker's main process serves :func:`django_debounce.contrib.prometheus.metrics.serve` (the
counters and the database gauges) from a daemon thread. With the ``solo``,
``threads``, ``gevent`` or ``eventlet`` pool the jobs run in that process, so it
serves its own counts. With ``prefork`` they run in child processes: the
worker needs ``PROMETHEUS_MULTIPROC_DIR`` (each child writes its counts
there; prometheus_client notices the fork by itself) and serves their sum;
without it the option is a usage error, since the page would show zeros.

This module imports neither Django models nor prometheus_client at import
time, so ``proj/celery.py`` can call it before Django is set up.
"""

from __future__ import annotations

from typing import Any

import click
from celery import bootsteps

#: The ``celery worker`` option :func:`add_worker_metrics` adds: the port to serve metrics on.
PORT_OPTION = "--debounce-metrics-port"
#: The ``celery worker`` option :func:`add_worker_metrics` adds: the address to bind.
ADDR_OPTION = "--debounce-metrics-addr"


def _check_serving(worker: Any) -> None:
    """Raise ``click.UsageError`` when this worker cannot serve the metrics; install the receivers."""
    from celery.concurrency.prefork import TaskPool as PreforkPool

    from ...conf import settings
    from ...exceptions import ConfigurationError

    try:
        from ..prometheus import metrics
    except ImportError:
        raise click.UsageError(
            f"{PORT_OPTION} needs prometheus_client: pip install 'django-debounce[prometheus]'."
        ) from None
    try:
        off = settings.metrics is False
    except ConfigurationError as exc:  # a malformed DEBOUNCE_METRICS (check E040)
        raise click.UsageError(f"{PORT_OPTION}: {exc}") from None
    if off:
        raise click.UsageError(f"{PORT_OPTION}: metrics are off (DEBOUNCE_METRICS = False).")
    pool = worker.pool_cls
    if isinstance(pool, type) and issubclass(pool, PreforkPool) and not metrics.multiprocess_dir():
        raise click.UsageError(
            f"{PORT_OPTION} with the prefork pool needs PROMETHEUS_MULTIPROC_DIR: jobs run in "
            "child processes, whose counts reach the worker only through that directory. Export "
            "PROMETHEUS_MULTIPROC_DIR=<an empty directory> before starting the worker "
            "(docs/howto/metrics.md), or use --pool=threads or --pool=solo."
        )
    try:
        metrics.install()  # before the pool forks: the children inherit the receivers
    except ConfigurationError as exc:  # a malformed bucket setting (E041)
        raise click.UsageError(f"{PORT_OPTION}: {exc}") from None


class MetricsServer(bootsteps.StartStopStep):
    """The worker bootstep serving ``--debounce-metrics-port`` (enabled only when it is given).

    Checks run when the worker is built (before the pool starts or any
    message is consumed): a bad combination is a ``click.UsageError``, the
    command exits 2. The server starts after the pool and before the
    consumer; a port already taken makes the worker exit with Celery's
    "Unrecoverable error" before it takes a message.
    """

    requires = ("celery.worker.components:Pool",)

    def __init__(
        self,
        worker: Any,
        debounce_metrics_port: int | None = None,
        debounce_metrics_addr: str = "0.0.0.0",
        **options: Any,
    ) -> None:
        self.port = debounce_metrics_port
        self.addr = debounce_metrics_addr or "0.0.0.0"
        self.enabled = self.port is not None
        self.server: Any = None
        if self.enabled:
            _check_serving(worker)

    def start(self, worker: Any) -> None:
        from ..prometheus import metrics

        assert self.port is not None
        try:
            self.server = metrics.serve(self.port, self.addr)
        except OSError as exc:
            raise OSError(f"{PORT_OPTION}: cannot serve on {self.addr}:{self.port}: {exc}") from exc

    def stop(self, worker: Any) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def add_worker_metrics(app: Any) -> None:
    """Add ``--debounce-metrics-port``/``--debounce-metrics-addr`` to ``app``'s ``celery worker``.

    Call it where the Celery app is created (``proj/celery.py``), before
    Celery parses the command line; calling it twice changes nothing.

    Args:
        app: the ``celery.Celery`` app the workers run (``celery -A proj``).
    """
    if MetricsServer in app.steps["worker"]:
        return
    app.user_options["worker"].add(
        click.Option(
            [PORT_OPTION],
            type=click.IntRange(1, 65535),
            default=None,
            help="Serve django-debounce's Prometheus metrics over HTTP on this port.",
        )
    )
    app.user_options["worker"].add(
        click.Option(
            [ADDR_OPTION],
            default="0.0.0.0",
            show_default=True,
            help="Address the metrics server binds (127.0.0.1: this host only).",
        )
    )
    app.steps["worker"].add(MetricsServer)


__all__ = ["ADDR_OPTION", "PORT_OPTION", "MetricsServer", "add_worker_metrics"]
