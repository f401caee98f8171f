"""Claiming due jobs: one statement on the plain path, the flow gate where a task has one.

Entry points: :func:`claim_jobs` and :func:`claim_batch` (:mod:`.claiming`). The
statements are :mod:`.queries`; the gated claim :mod:`.gated`; expiring due jobs
:mod:`.expiry`; which executor a claim serves :mod:`.executors`.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .claiming import claim_batch, claim_jobs

__all__ = ["claim_batch", "claim_jobs"]


def __getattr__(name: str) -> Any:
    """Import the entry points on first use: importing this package imports no models."""
    if name in __all__:
        return getattr(import_module(f"{__name__}.claiming"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
