"""Deployment-wide flow-control state: :class:`TaskState` (per task) and :class:`QueueState` (per queue), §6."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class TaskState(models.Model):
    """Deployment-wide flow-control state of one task name (§6).

    One row per task name that has a rate limit, a concurrency cap or a
    circuit breaker. Workers lock the row (``SELECT … FOR UPDATE``) in the
    claim transaction, so every worker process on every machine sees and
    updates one token bucket and one breaker.
    """

    class BreakerState(models.TextChoices):
        """Circuit-breaker states (closed: runs; open: deferred; half-open: one probe)."""

        CLOSED = "closed", _("Closed")
        OPEN = "open", _("Open")
        HALF_OPEN = "half_open", _("Half-open")

    task_name = models.CharField(max_length=255, primary_key=True)
    tokens = models.FloatField(null=True, blank=True)
    """Token bucket level at ``tokens_at`` (NULL: never used, i.e. full)."""
    tokens_at = models.DateTimeField(null=True, blank=True)
    breaker_state = models.CharField(
        max_length=10, choices=BreakerState.choices, default=BreakerState.CLOSED
    )
    failures = models.PositiveIntegerField(default=0)
    """Consecutive failed runs (a success resets it)."""
    opened_at = models.DateTimeField(null=True, blank=True)
    """When the breaker last opened; ``reset`` counts from here."""
    probe_job_id = models.BigIntegerField(null=True, blank=True)
    """While half-open: the job running as the probe."""

    #: The columns a claim or an outcome writes back after changing the state in memory.
    STATE_FIELDS = ["tokens", "tokens_at", "breaker_state", "failures", "opened_at", "probe_job_id"]

    def __str__(self) -> str:
        return f"{self.task_name} flow state"


class QueueState(models.Model):
    """Deployment-wide CoDel state of one queue (§6, RFC 8289 §5), shared by its workers."""

    queue = models.CharField(max_length=100, primary_key=True)
    first_above_at = models.DateTimeField(null=True, blank=True)
    """When the sojourn time will have stayed above target for a full interval (RFC ``first_above_time``)."""
    dropping = models.BooleanField(default=False)
    drop_next_at = models.DateTimeField(null=True, blank=True)
    drop_count = models.PositiveIntegerField(default=0)
    """Drops in the current dropping state (RFC ``count``)."""
    last_drop_count = models.PositiveIntegerField(default=0)
    """``drop_count`` when the last dropping state ended (RFC ``lastcount``)."""

    def __str__(self) -> str:
        return f"{self.queue} CoDel state"
