"""App configuration: label ``django_debounce`` (fixed forever)."""

from __future__ import annotations

import importlib.util
import logging
from importlib import import_module
from typing import TYPE_CHECKING

from django.apps import AppConfig, apps
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import module_has_submodule

from .checks import register_checks
from .conf import settings
from .contrib.django_tasks.checks import TASK_MODULE_ERRORS
from .exceptions import ConfigurationError
from .signals import job_enqueued
from .worker.wakeup_redis import publish_after_commit

if TYPE_CHECKING:
    from .models import DeadLetter, Job
    from .ops.cancels import CancelResult


class DjangoDebounceConfig(AppConfig):
    """Registers the checks and the Redis wake-up publisher, imports each app's ``tasks``, metrics,
    and the Celery executor's Celery tasks when Celery is installed."""

    name = "django_debounce"
    label = "django_debounce"
    verbose_name = "Debounced jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        register_checks()
        # Publishes nothing unless the wake-up is "redis" (decision 82).
        job_enqueued.connect(publish_after_commit, dispatch_uid="django_debounce.wakeup_redis")
        import_tasks_modules()
        if _metrics_wanted():
            from .contrib.prometheus.metrics import install

            install()
        if importlib.util.find_spec("celery") is not None:
            # The Celery executor's tasks (issue #10): registered with every Celery app of the
            # process, so `celery -A proj worker` runs handed-off jobs without more setup.
            from .contrib.celery import tasks as celery_tasks  # noqa: F401

    def retry_dead_letter(self, letter: DeadLetter, *, force: bool) -> Job | None:
        """Retry ``letter``: what :meth:`.DeadLetter.retry` delegates to (decision 69).

        The model sits below the enqueue path, so it reaches
        :func:`django_debounce.ops.dead_letters.retry_dead_letter` through the app
        registry instead of importing it; this top-layer module imports it.
        """
        from .ops.dead_letters import retry_dead_letter

        return retry_dead_letter(letter, force=force)

    def cancel_jobs(self, job_ids: list[int], *, using: str) -> CancelResult:
        """Cancel ``job_ids``: what :meth:`.Job.cancel` delegates to (decisions 69, 186)."""
        from .ops.cancels import cancel_jobs

        return cancel_jobs(job_ids, using=using)


def _metrics_wanted() -> bool:
    """True when prometheus_client imports and ``DEBOUNCE_METRICS`` is not False.

    A malformed metrics setting turns metrics off here; ``manage.py check``
    reports it (E040, E041), and so does the worker's ``--metrics-port``.
    """
    try:
        enabled = settings.metrics
        settings.metrics_delay_buckets, settings.metrics_duration_buckets  # noqa: B018
    except ConfigurationError:
        return False
    return enabled is not False and importlib.util.find_spec("prometheus_client") is not None


logger = logging.getLogger("django_debounce.apps")


def _is_bad_tasks_backend(exc: BaseException) -> bool:
    """True for Django's ``InvalidTaskBackend`` (or the backport's): ``TASKS`` names no backend."""
    module = type(exc).__module__
    return isinstance(exc, ImproperlyConfigured) and module.split(".")[:2] in (
        ["django", "tasks"],
        ["django_tasks", "exceptions"],
    )


def import_tasks_modules() -> None:
    """Import every installed app's ``tasks`` module, as ``autodiscover_modules("tasks")`` does.

    One difference (decision 99): a module whose ``@task`` (Django's) fails
    because ``TASKS`` names a backend that cannot be loaded is logged and
    recorded for system check E033 instead of stopping ``django.setup()``,
    so a typo in ``TASKS`` leaves ``manage.py help``, ``shell`` and the other
    commands working; Django's own check (and E033) report it. Any other
    error is raised as before.
    """
    TASK_MODULE_ERRORS.clear()
    for config in apps.get_app_configs():
        if not module_has_submodule(config.module, "tasks"):
            continue
        name = f"{config.name}.tasks"
        try:
            import_module(name)
        except ImproperlyConfigured as exc:
            if not _is_bad_tasks_backend(exc):
                raise
            TASK_MODULE_ERRORS.append((name, str(exc)))
            logger.error(
                "%s was not imported, so its tasks are not registered: %s",
                name,
                exc,
                extra={"action": "tasks_module_error"},
            )
