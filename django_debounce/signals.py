"""Django signals sent by django_debounce (contract §9).

All are sent with ``sender=Job`` (or ``DeadLetter``) and keyword arguments:

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

from django.dispatch import Signal

job_enqueued = Signal()
job_started = Signal()
job_finished = Signal()
job_dead_lettered = Signal()
