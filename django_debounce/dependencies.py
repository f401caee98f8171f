"""Job dependencies (contract §6): a job runs only after every job it depends on succeeded.

A dependency that ends FAILED, SHED, CANCELLED or EXPIRED cancels its
dependents, transitively, in the same transaction. That cascade is part of
every terminal transition and lives with them in
:mod:`django_debounce.lifecycle`; the names below are kept for the code that
still imports them from here.
"""

from __future__ import annotations

from .lifecycle import CANCELLING_STATUSES, cancel_dependents

__all__ = ["CANCELLING_STATUSES", "cancel_dependents"]
