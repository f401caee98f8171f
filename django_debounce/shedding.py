"""Shedding (contract §6, §8): a job dropped by flow control ends SHED with a dead letter.

Two rules shed: a rate limit with ``on_excess="drop"`` (reason prefix
``shed:``, dead-letter kind ``shed``, metadata ``{"shed": True, ...}``) and
CoDel (prefix ``codel:``, kind ``codel``, metadata ``{"codel": True, ...}``).
A shed fires no signal, keeps the job row with its own metadata, and cancels
the job's dependents. The auto-retry sweep never retries a shed entry; a
manual retry may.

The transition itself is :func:`django_debounce.lifecycle.shed`;
:func:`shed_job` is its name for the flow-control code.
"""

from __future__ import annotations

from .lifecycle import shed as shed_job

__all__ = ["shed_job"]
