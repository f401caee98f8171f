"""The dead-letter record: :class:`DeadLetter`, one row per job that will not run again on its own (§8)."""

from __future__ import annotations

from typing import Any, Protocol, cast

from django.apps import apps
from django.db import DEFAULT_DB_ALIAS, models
from django.utils import timezone

from ..dead_letter_kinds import DeadLetterKind
from .jobs import Job


class _DeadLetterRetrier(Protocol):
    """What :meth:`DeadLetter.retry` needs from the app config (see there)."""

    def retry_dead_letter(self, letter: DeadLetter, *, force: bool) -> Job | None: ...


class DeadLetterQuerySet(models.QuerySet["DeadLetter"]):
    """Dead letters; ``bulk_create`` fills a missing ``kind`` as ``save()`` does."""

    def bulk_create(self, objs: Any, *args: Any, **kwargs: Any) -> list[DeadLetter]:
        """Insert ``objs``, first deriving the ``kind`` of each that has none from its reason."""
        objs = list(objs)
        for letter in objs:
            if not letter.kind:
                letter.kind = DeadLetter.Kind.of_reason(letter.reason)
        return super().bulk_create(objs, *args, **kwargs)


class DeadLetter(models.Model):
    """The record of a job that will not run again on its own (§8)."""

    #: Why the entry exists (:class:`~django_debounce.dead_letter_kinds.DeadLetterKind`).
    Kind = DeadLetterKind

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(
        Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="dead_letters"
    )
    """The original job, kept (NULL only if it was deleted later)."""
    task_name = models.CharField(max_length=255)
    queue = models.CharField(max_length=100, default="default")
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    reason = models.TextField()
    """Why: ``failed: …``, or a reserved prefix ``shed:``, ``codel:``, ``unknown_task:``."""
    kind = models.CharField(max_length=16, choices=Kind.choices, editable=False)
    """:class:`Kind` of ``reason``, set from its prefix when the row is written (migration 0005
    filled older rows)."""
    metadata = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True, default="")
    traceback = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    retried_at = models.DateTimeField(null=True, blank=True)
    retry_job = models.ForeignKey(
        Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    retry_depth = models.PositiveIntegerField(default=0)
    """How many dead-letter retries led to this entry's job (0: its job was never a retry)."""

    objects = DeadLetterQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["created_at"], name="debounce_dl_created_at"),
            # The admin's task filter and exact task-name search, newest first (issue #4).
            models.Index(fields=["task_name", "-created_at"], name="debounce_dl_task"),
            # The admin's kind filter, newest first, and the sweep's reserved-kind exclusion.
            models.Index(fields=["kind", "-created_at"], name="debounce_dl_kind"),
        ]
        permissions = [("retry_deadletter", "Can retry dead letters")]

    def __str__(self) -> str:
        return f"{self.task_name} dead letter #{self.pk}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Save the row, deriving ``kind`` from ``reason`` when it was not set.

        The package builds entries with
        :func:`django_debounce.lifecycle.new_dead_letter`, which sets ``kind``;
        this (and ``DeadLetterQuerySet.bulk_create``) covers a row built
        any other way, so no row is ever stored without its kind.
        """
        if not self.kind:
            self.kind = self.Kind.of_reason(self.reason)
        super().save(*args, **kwargs)

    @staticmethod
    def retry_depth_for(job: Job, *, using: str = DEFAULT_DB_ALIAS) -> int:
        """Return the ``retry_depth`` of a dead letter about to be written for ``job``.

        0 for a job no retry went to; otherwise one more than the deepest
        entry whose ``retry_job`` is ``job`` (its parent in the chain of
        retries). The automatic sweep retries an entry only while its depth is
        below ``max_retries`` (§8, §11). One indexed query (``retry_job``).
        """
        parent = (
            DeadLetter.objects.using(using)
            .filter(retry_job=job.pk)
            .aggregate(depth=models.Max("retry_depth"))["depth"]
        )
        return 0 if parent is None else parent + 1

    def retry(self, force: bool = False) -> Job | None:
        """Enqueue this entry's task and arguments again through the normal path (§8).

        The call is made at retry time with the original's task, args, kwargs,
        queue, priority and metadata (no eta, no expiry), so a debounced task
        joins the key's open window if there is one.

        The work is done by :func:`django_debounce.ops.dead_letters.retry_dead_letter`.
        ``models`` sits below the enqueue path and imports nothing above it, so
        this method reaches that function through Django's app registry: the
        app config (``apps.py``, the package's top layer) provides
        ``retry_dead_letter`` (decision 69 in docs/decisions.md).

        Args:
            force: retry even if the entry was already retried.

        Returns:
            The job the retry went to (new, or the open window it joined), or
            ``None`` when the entry was already retried and ``force`` is False.
            Two callers racing on one entry retry it once: the row is locked.

        Raises:
            ConfigurationError: or another error of the enqueue, if the task's
                declaration changed so that the stored call is no longer valid.
        """
        config = cast(_DeadLetterRetrier, apps.get_app_config(self._meta.app_label))
        return config.retry_dead_letter(self, force=force)
