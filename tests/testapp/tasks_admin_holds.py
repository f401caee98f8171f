"""Gated tasks of the admin's flow-control tests (issue #4 follow-ups), registered on demand.

A registered task with a rate limit, a cap or a breaker sends every claim of
the process through the flow-control gate, so these are registered only by
the ``holds_tasks`` fixture (:func:`register`), which unregisters them after
the test (see ``tasks_flow.py`` for the same pattern).
"""

from __future__ import annotations

from typing import Any

from django_debounce import CircuitBreaker, registry, task
from django_debounce.tasks import Task

#: name -> options
DECLARATIONS: dict[str, dict[str, Any]] = {
    "holds.guarded": {"circuit_breaker": CircuitBreaker(failures=2, reset="1m"), "max_retries": 0},
    "holds.capped": {"concurrency": 2},
    "holds.rated": {"rate_limit": "2/m"},
    "holds.dropped": {"rate_limit": "1/m", "on_excess": "drop"},
}


def _noop(*args: Any, **kwargs: Any) -> None:
    """Do nothing (the tests seed rows; nothing here runs for real)."""


def register() -> dict[str, Task[Any, Any]]:
    """Register the gated tasks; :func:`unregister` forgets them."""
    return {name: task(name=name, **options)(_noop) for name, options in DECLARATIONS.items()}


def unregister() -> None:
    for name in DECLARATIONS:
        registry.unregister(name)
