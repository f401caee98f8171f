"""Which exceptions a run's own code raised, and which stop the process hosting it (§7).

A task (or a value it returned, while it is stored) may raise anything,
``BaseException`` subclasses included: ``sys.exit()`` gives ``SystemExit``,
``asyncio.CancelledError`` and ``KeyboardInterrupt`` are ``BaseException`` too.
Those are the run's outcome, recorded like any error (decision 150 in
docs/decisions.md). What stops the process itself is not: the worker's second
SIGTERM/SIGINT (:class:`WorkerExit`) and Celery's cold shutdown
(``WorkerShutdown``/``WorkerTerminate``) are all subclasses of ``SystemExit``
raised by a signal handler into whatever code runs, and they must end the
process, not the job. :func:`is_host_stop` tells the two apart.
"""

from __future__ import annotations


class WorkerExit(SystemExit):
    """The worker's second SIGTERM/SIGINT: exit now, whatever runs (a ``SystemExit``)."""


def is_host_stop(exc: BaseException) -> bool:
    """Return True when ``exc`` stops the hosting process rather than being the run's own error.

    A subclass of ``SystemExit`` (:class:`WorkerExit`, Celery's ``WorkerShutdown`` and
    ``WorkerTerminate``) is raised by a signal handler to end the process; a plain
    ``SystemExit`` is what ``sys.exit()`` raises in a task: the run's error.
    """
    return isinstance(exc, SystemExit) and type(exc) is not SystemExit


__all__ = ["WorkerExit", "is_host_stop"]
