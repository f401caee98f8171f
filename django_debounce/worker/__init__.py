"""The built-in worker (``manage.py run_debounce_worker``): its loop, stop, connections and wake-up.

Entry point: :class:`Worker` (:mod:`.loop`). Stopping is :mod:`.stop`; the loop's
connection upkeep :mod:`.connections`; waking on new work :mod:`.wakeup`
(PostgreSQL ``LISTEN`` in :mod:`.wakeup_listener`, Redis in :mod:`.wakeup_redis`).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .loop import Worker

__all__ = ["Worker"]


def __getattr__(name: str) -> Any:
    """Import the entry points on first use: importing this package imports no models."""
    if name in __all__:
        return getattr(import_module(f"{__name__}.loop"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
