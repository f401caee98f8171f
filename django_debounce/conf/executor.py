"""Parsing the executor settings: ``DEBOUNCE_EXECUTOR`` and the Celery executor's (issue #10).

A leaf: the settings table (:mod:`django_debounce.conf.table`) reads the
settings through these parsers and the settings check reports what they raise
(ids E025–E027, E029, E044). Documented in docs/reference/settings.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Final

from ..exceptions import ConfigurationError
from .durations import parse_duration

#: The executors a job can run on: the built-in ``run_debounce_worker`` or Celery.
EXECUTORS: Final = ("worker", "celery")

#: What a Celery queue name may be (kombu accepts more; these are what AMQP and Redis share).
_MAX_CELERY_QUEUE = 255


def parse_executor(value: Any, *, where: str = "DEBOUNCE_EXECUTOR") -> str:
    """Validate an executor name and return it.

    Args:
        value: ``"worker"`` (the built-in ``run_debounce_worker`` runs the
            jobs) or ``"celery"`` (the scheduler hands them to Celery).
        where: the setting or option named in the error.

    Raises:
        ConfigurationError: anything else (decision 85).
    """
    if not isinstance(value, str) or value not in EXECUTORS:
        raise ConfigurationError(
            f"{where}={value!r} is not an executor; use 'worker' (run_debounce_worker runs "
            "the jobs) or 'celery' (Celery workers run them; docs/howto/celery.md)."
        )
    return value


def parse_celery_queues(value: Any) -> dict[str, str]:
    """Validate ``DEBOUNCE_CELERY_QUEUES`` and return it as a plain dict.

    Args:
        value: ``None`` or a dict mapping a django-debounce queue name to the
            Celery queue its jobs are published to, e.g. ``{"mail":
            "celery-mail"}``. A queue not listed publishes to the Celery queue
            of the same name (decision 89), except ``"default"``, which goes to
            the Celery app's ``task_default_queue`` (decision 153).

    Raises:
        ConfigurationError: not a dict, or a key or value that is not a
            non-empty string (keys at most 100 characters, values 255).
    """
    name = "DEBOUNCE_CELERY_QUEUES"
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"{name}={value!r} must be a dict of django-debounce queue -> Celery queue, "
            'e.g. {"default": "celery"}.'
        )
    result: dict[str, str] = {}
    for queue, target in value.items():
        if not isinstance(queue, str) or not queue or len(queue) > 100:
            raise ConfigurationError(
                f"{name}: the key {queue!r} must be a django-debounce queue name "
                "(a non-empty str of at most 100 characters)."
            )
        if not isinstance(target, str) or not target or len(target) > _MAX_CELERY_QUEUE:
            raise ConfigurationError(
                f"{name}[{queue!r}]={target!r} must be a Celery queue name "
                f"(a non-empty str of at most {_MAX_CELERY_QUEUE} characters)."
            )
        result[queue] = target
    return result


def parse_unknown_task_grace(value: Any) -> timedelta:
    """Validate ``DEBOUNCE_UNKNOWN_TASK_GRACE`` and return it (decision 154).

    Args:
        value: a duration (``"10m"``, seconds, a ``timedelta``): how long after
            its last enqueue a job naming a task this process does not know is
            put back for another executor or a newer worker instead of being
            dead-lettered; ``0`` dead-letters it at once.

    Raises:
        ConfigurationError: not a duration, or negative.
    """
    if value in (0, "0") or value == timedelta(0):
        return timedelta(0)
    return parse_duration(value, name="DEBOUNCE_UNKNOWN_TASK_GRACE")


def parse_celery_app(value: Any) -> str | None:
    """Validate ``DEBOUNCE_CELERY_APP`` and return it.

    Args:
        value: ``None`` (publish with Celery's current app) or the dotted
            path of a Celery app, e.g. ``"proj.celery.app"``. Whether the path
            imports is judged by check E029 when the Celery executor is in
            use (importing it here would import the project's Celery module).

    Raises:
        ConfigurationError: not ``None`` and not a non-empty ``str`` (check E029).
    """
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ConfigurationError(
            f"DEBOUNCE_CELERY_APP={value!r} must be None (Celery's current app) or the "
            "dotted path of a Celery app, e.g. 'proj.celery.app'."
        )
    return value


__all__ = [
    "EXECUTORS",
    "parse_celery_app",
    "parse_celery_queues",
    "parse_executor",
    "parse_unknown_task_grace",
]
