"""Django signals sent by django_debounce (contract §9).

All are sent with ``sender=Job`` and keyword arguments:

* ``job_enqueued(job, outcome)``: after an enqueue wrote its row (inside the
  caller's transaction, if any); ``outcome`` is ``created``, ``debounced`` or
  ``coalesced``.
* ``job_started(job)``: a worker is about to run the job.
* ``job_finished(job, status)``: a run ended; ``status`` is the job's status
  after it (``SUCCESSFUL``, ``READY`` for a scheduled retry, ``FAILED``).
* ``job_dead_lettered(job, dead_letter)``: a dead letter was written. Shed jobs
  send nothing (§6).
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger("django_debounce.signals")

job_enqueued = Signal()
job_started = Signal()
job_finished = Signal()
job_dead_lettered = Signal()


def send_signal(signal: Signal, **kwargs: Any) -> None:
    """Send ``signal`` with ``sender=Job``; a receiver that raises is logged, never propagated.

    A receiver's bug must not strand a claimed job in RUNNING or make a
    committed enqueue look failed to its caller (who might then enqueue twice).
    """
    from .models import Job

    for receiver, response in signal.send_robust(sender=Job, **kwargs):
        if isinstance(response, Exception):
            logger.error(
                "signal receiver %r raised",
                receiver,
                exc_info=response,
                extra={"action": "signal_error"},
            )
