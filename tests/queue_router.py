"""A database router that sends the jobs of queue ``sco_b`` to the database ``queue_b``.

What a project writes to route queues to separate databases (docs/howto/scale-out.md,
decision 224): django_debounce tells ``db_for_write`` the job's ``queue`` and
``task_name``; reads without hints, and every other model, stay on ``default``.
"""

from __future__ import annotations

from typing import Any

SECOND = "queue_b"
QUEUES = {"sco_b": SECOND}


class QueueRouter:
    """Route django_debounce's writes by the ``queue`` hint; migrate only its tables on ``queue_b``."""

    def db_for_write(self, model: type[Any], **hints: Any) -> str | None:
        """Return ``queue_b`` for a job of queue ``sco_b``; no opinion otherwise."""
        if model._meta.app_label == "django_debounce":
            return QUEUES.get(hints.get("queue") or "")
        return None

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        """Keep ``queue_b`` to django_debounce's tables."""
        if db == SECOND:
            return app_label == "django_debounce"
        return None
