"""``manage.py run_debounce_worker``: parse flags, hand them to :class:`~django_debounce.worker.loop.Worker`."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_debounce.exceptions import ConfigurationError
from django_debounce.management.arguments import positive_float, positive_int
from django_debounce.management.database_ready import require_tables
from django_debounce.validators import check_alias, check_queue

from ... import databases
from ...conf import settings
from ...contrib.celery.executor import Dispatcher
from ...worker.loop import Worker


def _log_to_console(verbosity: int) -> None:
    """Show the worker's log on stderr when the project has not configured any handler for it.

    Django's default logging leaves ``django_debounce`` without a handler, so a
    worker would print nothing but Python's bare last-resort lines. Verbosity 1
    shows INFO, 2 or more adds DEBUG, and 0 keeps warnings and errors only (a
    failed job or a lost lease is never silent).

    The same handler goes on the ``django.dispatch`` logger: Django's
    ``send_robust`` logs a signal receiver that raised there (ERROR, with its
    traceback; :func:`django_debounce.signals.send_signal`), and Django's own
    logging shows it on the console only with ``DEBUG = True``.
    """
    logger = logging.getLogger("django_debounce")
    if logger.hasHandlers():
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logging.getLogger("django.dispatch").addHandler(handler)
    levels = {0: logging.WARNING, 1: logging.INFO}
    logger.setLevel(levels.get(verbosity, logging.DEBUG))


def queue_name(value: str) -> str:
    """Parse one queue name: the rules of ``queue=`` on tasks, and no commas."""
    if isinstance(value, str) and "," in value:
        raise argparse.ArgumentTypeError(
            f"{value!r} looks like a list; repeat the flag instead: --queue a --queue b"
        )
    try:
        return check_queue(value)
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def port_number(value: str) -> int:
    """Parse a TCP port, 1-65535 (``--metrics-port``); 0 and larger numbers are refused."""
    port = positive_int(value)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not a TCP port (1-65535)")
    return port


def _serve_metrics(port: int | None, addr: str) -> Any:
    """Start the metrics server of ``--metrics-port`` (None: no port given, nothing started)."""
    if port is None:
        return None
    try:
        port = port_number(str(port))
        from ...contrib.prometheus import metrics
    except argparse.ArgumentTypeError as exc:
        raise CommandError(f"argument --metrics-port: {exc}") from None
    except ImportError:
        raise CommandError(
            "--metrics-port needs prometheus_client: pip install 'django-debounce[prometheus]'."
        ) from None
    try:
        enabled = settings.metrics
    except ConfigurationError as exc:  # --skip-checks let a malformed setting through (E040)
        raise CommandError(str(exc)) from None
    if enabled is False:
        raise CommandError("--metrics-port: metrics are off (DEBOUNCE_METRICS = False).")
    metrics.install()  # counts even if DjangoDebounceConfig.ready skipped it (idempotent)
    try:
        return metrics.serve(port, addr)
    except OSError as exc:
        raise CommandError(f"--metrics-port: cannot serve on {addr}:{port}: {exc}") from None


class Command(BaseCommand):
    help = "Run due django_debounce jobs (SIGTERM/SIGINT: finish running jobs, then exit)."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            type=queue_name,
            default=None,
            help="Serve this queue (repeatable). Default: every queue.",
        )
        parser.add_argument(
            "--concurrency", type=positive_int, default=1, help="Threads running jobs (default 1)."
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Run every job due and runnable now, then exit 0.",
        )
        parser.add_argument(
            "--max-jobs", type=positive_int, default=None, help="Exit after this many jobs."
        )
        parser.add_argument(
            "--poll-interval",
            type=positive_float,
            default=None,
            help="Seconds between polls when idle (default DEBOUNCE_POLL_INTERVAL, 1.0).",
        )
        parser.add_argument("--worker-id", default=None, help="Identity recorded on claimed jobs.")
        parser.add_argument(
            "--metrics-port",
            type=port_number,
            default=None,
            help="Serve Prometheus metrics over HTTP on this port (docs/howto/metrics.md).",
        )
        parser.add_argument(
            "--metrics-addr",
            default="0.0.0.0",
            help="Address the metrics server binds (default 0.0.0.0; 127.0.0.1: this host only).",
        )
        parser.add_argument(
            "--dispatch-only",
            action="store_true",
            help=(
                "Run no job here: hand due jobs of Celery-executor tasks to Celery "
                "(docs/howto/celery.md). Takes --queue, --burst, --poll-interval, --worker-id."
            ),
        )
        parser.add_argument(
            "--database",
            default=None,
            help=(
                "Serve the jobs of this database alias (default: the router's choice for Job; "
                "docs/howto/scale-out.md)."
            ),
        )
        parser.add_argument(
            "--no-periodic",
            action="store_false",
            dest="periodic",
            help="Defer no ticks of periodic tasks here (docs/howto/periodic-tasks.md).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # call_command() hands keyword options over without argparse's type= checks.
        for name, parse in (
            ("concurrency", positive_int),
            ("max_jobs", positive_int),
            ("poll_interval", positive_float),
        ):
            if options[name] is not None:
                try:
                    options[name] = parse(str(options[name]))
                except argparse.ArgumentTypeError as exc:
                    flag = "--" + name.replace("_", "-")
                    raise CommandError(f"argument {flag}: {exc}") from None
        _log_to_console(options.get("verbosity", 1))
        queues = options["queues"]
        if isinstance(queues, str):  # call_command("run_debounce_worker", queues="mail")
            queues = [queues]
        for queue in queues or ():
            try:
                queue_name(queue)
            except argparse.ArgumentTypeError as exc:
                raise CommandError(f"argument --queue: {exc}") from None
        # A daemon thread: it stops with the process (metrics.serve; docs/howto/metrics.md).
        _serve_metrics(options.get("metrics_port"), options.get("metrics_addr", "0.0.0.0"))
        using = options.get("database") or databases.default()
        try:
            check_alias(using, "--database")
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from None
        # One line, not a traceback, before migrate (decision 130); the alias the Worker uses.
        require_tables(using)
        try:
            settings.prune  # noqa: B018  # the sweep reads it; --skip-checks skipped E045
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from None
        if options.get("dispatch_only"):
            Dispatcher(
                queues=queues,
                poll_interval=options["poll_interval"],
                burst=options["burst"],
                scheduler_id=options["worker_id"],
                periodic=options.get("periodic", True),
                using=using,
            ).run()
            return
        worker = Worker(
            queues=queues,
            concurrency=options["concurrency"],
            burst=options["burst"],
            max_jobs=options["max_jobs"],
            poll_interval=options["poll_interval"],
            worker_id=options["worker_id"],
            periodic=options.get("periodic", True),
            using=using,
        )
        worker.run()
        if worker.exit_code:  # too many threads stuck past their hard time limit (decision 187)
            sys.exit(worker.exit_code)
