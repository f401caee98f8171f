"""One row per run of ``rebuild_docs(directory)``."""

from __future__ import annotations

from datetime import timedelta

from django.db import models


class DocBuild(models.Model):
    """A rebuild of one folder's docs, written by the task when it runs."""

    class RunReason(models.TextChoices):
        QUIET = "quiet", "quiet (window elapsed)"
        MAX_WAIT = "max_wait", "forced by the max wait"
        INLINE = "inline", "called inline (no job)"

    directory = models.CharField(max_length=500)
    """The folder whose pages were rebuilt (``.`` for the repository's top level)."""
    job = models.ForeignKey(
        "django_debounce.Job",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    """The job that ran (None for an inline call)."""
    ran_at = models.DateTimeField()
    """When the task ran (the package's clock: the trace's time in a virtual replay)."""
    calls = models.PositiveIntegerField(default=1)
    """Rebuild requests this one run served: the job's ``enqueue_count``."""
    opened_at = models.DateTimeField(null=True, blank=True)
    """When the job's debounce window opened (the first of those calls)."""
    run_reason = models.CharField(max_length=10, choices=RunReason.choices)

    class Meta:
        ordering = ["ran_at", "id"]
        indexes = [models.Index(fields=["directory", "ran_at"], name="docs_build_dir_ran_at")]

    def __str__(self) -> str:
        return f"rebuild of {self.directory} at {self.ran_at:%Y-%m-%d %H:%M:%S}"

    @property
    def delay(self) -> timedelta | None:
        """From the window's opening to the run."""
        return None if self.opened_at is None else self.ran_at - self.opened_at
