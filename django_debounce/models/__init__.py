"""The package's models (contract §10), one module per concept, all re-exported here.

``from django_debounce.models import Job`` (and every other model) keeps working:

* :mod:`~django_debounce.models.jobs`: :class:`Job`, its admin proxy
  :class:`OpenWindow` and :class:`JobDependency`;
* :mod:`~django_debounce.models.flow_state`: :class:`TaskState`, :class:`QueueState`;
* :mod:`~django_debounce.models.dead_letters`: :class:`DeadLetter`;
* :class:`KeyBucket` and :class:`PeriodicTick` live in their own root modules
  (``key_buckets``, ``periodic_ticks``), re-exported here (decision 201).

Models only import ``exceptions``, ``dead_letter_kinds`` and durations from the package
(tests/unit/test_package_layout.py).
"""

from __future__ import annotations

from ..key_buckets import KeyBucket
from ..periodic_ticks import PeriodicTick
from .dead_letters import DeadLetter, DeadLetterQuerySet
from .flow_state import QueueState, TaskState
from .jobs import Job, JobDependency, JobQuerySet, OpenWindow

__all__ = [
    "DeadLetter",
    "DeadLetterQuerySet",
    "Job",
    "JobDependency",
    "JobQuerySet",
    "KeyBucket",
    "OpenWindow",
    "PeriodicTick",
    "QueueState",
    "TaskState",
]
