"""The PeriodicTick row: one per (schedule, tick) deferred (decision 177).

Kept out of :mod:`django_debounce.models` (which re-exports it) so that module
stays one concept. The unique constraint on (``schedule``, ``tick``) is what
makes a tick run once however many schedulers run: each inserts the row in the
transaction that enqueues the tick's job, and a second insert fails on the
constraint (PostgreSQL, MariaDB and SQLite alike), so its job is never written.
"""

from __future__ import annotations

from django.db import models


class PeriodicTick(models.Model):
    """A tick of a periodic schedule that a scheduler deferred (or skipped).

    ``job_id`` is the job the tick enqueued (a plain id, not a foreign key:
    pruning jobs keeps the ticks); ``None`` with ``outcome="overlap"`` when the
    tick was skipped because the previous tick's job was still READY or RUNNING.
    """

    class Outcome(models.TextChoices):
        """What the tick did: an enqueue's outcome (§2), or skipped for an overlap."""

        CREATED = "created", "created"
        DEBOUNCED = "debounced", "debounced"
        COALESCED = "coalesced", "coalesced"
        OVERLAP = "overlap", "skipped: the previous run had not finished"

    schedule = models.CharField(max_length=200)
    """The schedule's name (``Schedule.name``; the task's name by default)."""
    tick = models.DateTimeField()
    """The tick's instant (stored in UTC)."""
    task_name = models.CharField(max_length=255)
    job_id = models.BigIntegerField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, blank=True)
    deferred_at = models.DateTimeField()
    """When the scheduler inserted the row (its lateness: ``deferred_at - tick``)."""
    deferred_by = models.CharField(max_length=255, blank=True)
    """The worker or dispatcher that won the tick."""

    class Meta:
        app_label = "django_debounce"
        ordering = ["-tick", "-id"]
        indexes = [
            # The admin's unfiltered page, newest first (a filtered one reads the unique index).
            models.Index(fields=["tick"], name="debounce_tick_at"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["schedule", "tick"], name="debounce_tick_once"),
        ]

    def __str__(self) -> str:
        return f"{self.schedule} @ {self.tick.isoformat()}"
