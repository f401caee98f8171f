"""The tasks of ``manage.py plot_rules`` (decision 176), registered only while it runs.

A rate-limited task sends every claim of its process through the gate (the task-state
read of flow/rules), so declaring ``rule_throttle`` at import, in an app every test
process installs, would change what every other claim in those processes does. The
plot registers the three tasks for its run (:func:`register`) and unregisters them
after (:func:`unregister`), as the soak's tasks are (tests/testapp/tasks_soak.py).
"""

from __future__ import annotations

from typing import Any

from django_debounce import debounced_task, registry, task
from django_debounce.tasks import Task

#: The tasks' names (kept from when they were declared in example_project/docs/tasks.py).
NAMES = {
    "throttle": "example_project.docs.tasks.rule_throttle",
    "coalesce": "example_project.docs.tasks.rule_coalesce",
    "debounce": "example_project.docs.tasks.rule_debounce",
}


def rule_throttle(doc: str, t: float) -> float:
    """Throttle: every call runs; runs start at most one per 5 s."""
    return t


def rule_coalesce(doc: str, t: float) -> float:
    """Coalesce: a call while the key's job is pending returns that job (called with a countdown)."""
    return t


def rule_debounce(doc: str, t: float) -> float:
    """Debounce: one run when the calls have been quiet 10 s, or 30 s after the first."""
    return t


def register() -> dict[str, Task[Any, Any]]:
    """Register the three tasks (idempotent); return them by rule name, in plot order."""
    return {
        "throttle": task(name=NAMES["throttle"], rate_limit="1/5s", rate_limit_burst=1)(
            rule_throttle
        ),
        "coalesce": task(name=NAMES["coalesce"], unique_key="rule:{doc}")(rule_coalesce),
        "debounce": debounced_task(
            name=NAMES["debounce"],
            debounce="10s",
            debounce_max_wait="30s",
            debounce_key="rule:{doc}",
        )(rule_debounce),
    }


def unregister() -> None:
    """Forget the three tasks (a later claim of this process is ungated again)."""
    for name in NAMES.values():
        registry.unregister(name)
