"""Django signals sent by django_debounce (contract §9).

All are sent with ``sender=Job`` and keyword arguments:

* ``job_enqueued(job, outcome)``: after an enqueue wrote its row (inside the
  caller's transaction, if any); ``outcome`` is ``created``, ``debounced`` or
  ``coalesced``.
* ``job_started(job)``: a worker is about to run the job.
* ``job_finished(job, status)``: a run ended; ``status`` is the job's status
  after it (``SUCCESSFUL``, ``READY`` for a scheduled retry, ``FAILED``,
  ``CANCELLED`` for a running job stopped on request, decision 186).
* ``job_progress(job, progress)``: a running job's progress was written
  (:class:`~django_debounce.progress.Progress`; at most once a second per run,
  decision 203); the Celery executor turns it into Celery's ``PROGRESS`` state.
* ``job_dead_lettered(job, dead_letter)``: a dead letter was written. Shed jobs
  send nothing (§6).

A receiver that raises is logged by Django (``django.dispatch`` logger) and
does not stop the job's lifecycle (:func:`send_signal`).
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.dispatch import Signal

job_enqueued = Signal()
"""Sent after an enqueue wrote its row, with ``job`` and ``outcome`` (``created``, ``debounced``, ``coalesced``)."""
job_started = Signal()
"""Sent when a worker is about to run a job, with ``job``."""
job_finished = Signal()
"""Sent when a run ended, with ``job`` and ``status`` (``SUCCESSFUL``, ``READY`` for a retry, ``FAILED``)."""
job_dead_lettered = Signal()
"""Sent when a dead letter was written, with ``job`` and ``dead_letter`` (never for a shed, §6)."""
job_progress = Signal()
"""Sent after a running job's progress was written, with ``job`` and ``progress`` (decision 203)."""

# Internal, not a public signal: a shed gets no signal (§6, §9). The optional metrics
# (django_debounce/metrics.py) count sheds through this one; it is sent with
# ``job`` and ``dead_letter`` once the claim that shed the job committed (decision 106),
# and may change or go without notice.
_job_shed = Signal()


def send_signal(signal: Signal, **kwargs: Any) -> None:
    """Send ``signal`` with ``sender=Job``; a receiver that raises is logged, never propagated.

    A receiver's bug must not strand a claimed job in RUNNING or make a
    committed enqueue look failed to its caller (who might then enqueue twice).
    Django's ``send_robust`` catches the receiver's exception and logs it once,
    with its traceback, on the ``django.dispatch`` logger (ERROR); nothing is
    logged here again. ``Job`` is looked up in the app registry, not imported,
    so importing this module never imports the models (it is safe before the
    apps are ready, and the dependency points one way: models never import it).
    """
    signal.send_robust(sender=apps.get_model("django_debounce", "Job"), **kwargs)
