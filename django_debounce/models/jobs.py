"""Job rows and what hangs off them: :class:`Job`, :class:`OpenWindow`, :class:`JobDependency` (contract §10).

The invariant "one open window per (task, key)" (§4.4) is kept by the database
itself: ``Job.window_key`` is a nullable unique column holding the hash of
(task name, debounce key) while the job is an open window and ``NULL`` from
its first claim on. NULLs never collide in a unique index on PostgreSQL,
SQLite or MariaDB, so the same constraint works on all three (a partial
unique index would not exist on MariaDB). ``Job.unique_lock`` does the same
for coalescing keys while a job is READY or RUNNING (§6).
"""

from __future__ import annotations

from typing import Any, Protocol, cast

from django.apps import apps
from django.db import DEFAULT_DB_ALIAS, models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _


class JobQuerySet(models.QuerySet["Job"]):
    """Named states of jobs (QuerySet methods name states, model methods transitions)."""

    def ready(self) -> JobQuerySet:
        """Return jobs waiting to be claimed."""
        return self.filter(status=Job.Status.READY)

    def due(self, now: Any = None) -> JobQuerySet:
        """Return READY jobs whose ``run_at`` has come (``run_at <= now``, §11)."""
        return self.ready().filter(run_at__lte=now or timezone.now())

    def open_windows(self) -> JobQuerySet:
        """Return jobs whose debounce window is open (§4.1)."""
        return self.filter(status=Job.Status.READY, window_key__isnull=False)

    def running(self) -> JobQuerySet:
        """Return claimed jobs."""
        return self.filter(status=Job.Status.RUNNING)

    def current_run(self, job_id: int, *, attempts: int, worker_id: str) -> JobQuerySet:
        """Return job ``job_id``'s row while it still runs attempt ``attempts`` for ``worker_id``.

        The fence of every outcome write (§7, §11): a run whose lease lapsed
        and whose job was reclaimed (or claimed again) matches no row.
        """
        return self.running().filter(pk=job_id, worker_id=worker_id, attempts=attempts)

    def finished(self) -> JobQuerySet:
        """Return jobs that will not run again on their own."""
        return self.exclude(status__in=[Job.Status.READY, Job.Status.RUNNING])


class Job(models.Model):
    """One row that will run a task once (with retries)."""

    class Status(models.TextChoices):
        """Stored status values; frozen (§10)."""

        READY = "READY", _("Ready")
        RUNNING = "RUNNING", _("Running")
        SUCCESSFUL = "SUCCESSFUL", _("Successful")
        FAILED = "FAILED", _("Failed")
        CANCELLED = "CANCELLED", _("Cancelled")
        EXPIRED = "EXPIRED", _("Expired")
        SHED = "SHED", _("Shed")

    id = models.BigAutoField(primary_key=True)
    task_name = models.CharField(max_length=255)
    """Registered name of the task (``"<module>.<qualname>"`` unless ``name=`` was given)."""
    queue = models.CharField(max_length=100, default="default")
    priority = models.SmallIntegerField(default=0)
    """-100..100, higher runs first (Django's tasks convention)."""
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.READY)
    args = models.JSONField(default=list, blank=True)
    """The codec's JSON form of the positional arguments (§5, §11)."""
    kwargs = models.JSONField(default=dict, blank=True)
    """The codec's JSON form of the keyword arguments (§5, §11)."""
    run_at = models.DateTimeField()
    """When the job becomes due; a debounced job's deadline slides until its ceiling."""
    opened_at = models.DateTimeField(null=True, blank=True)
    """When the window opened (debounced jobs only)."""
    max_run_at = models.DateTimeField(null=True, blank=True)
    """The window's ceiling, ``opened_at + max_wait``, fixed when it opened (§4.2)."""
    debounce_key = models.TextField(null=True, blank=True)
    """Resolved debounce key text, without the task name (§11)."""
    window_key = models.CharField(max_length=64, null=True, blank=True, unique=True, editable=False)
    """Hash of (task name, debounce key) while the window is open; NULL after the first claim."""
    key_hash = models.CharField(max_length=64, null=True, blank=True, editable=False)
    """Hash of (task name, debounce key), kept for life: runs of one key never overlap (§4.5)."""
    unique_key = models.TextField(null=True, blank=True)
    """Resolved coalescing key text (§6)."""
    unique_lock = models.CharField(
        max_length=64, null=True, blank=True, unique=True, editable=False
    )
    """Hash of (task name, unique key) while the job is READY or RUNNING."""
    enqueue_count = models.PositiveIntegerField(default=1)
    """Calls collapsed into this job (1 for the call that created it)."""
    last_enqueued_at = models.DateTimeField()
    attempts = models.PositiveIntegerField(default=0)
    """Runs started, including a run whose worker died (§11)."""
    max_retries = models.PositiveIntegerField(default=3)
    """Retries after the first attempt: up to ``max_retries + 1`` runs in all."""
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    """``"dotted.ExceptionClass: message"`` of the last failure."""
    traceback = models.TextField(blank=True, default="")
    metadata = models.JSONField(default=dict, blank=True)
    notes = models.TextField(blank=True, default="")
    expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    worker_id = models.CharField(max_length=255, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    """While RUNNING: the claim's lease; a worker renews it, another reclaims after it (§7)."""
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    """When ``cancel()`` asked the running job to stop (decision 186)."""
    timeout = models.DurationField(null=True, blank=True)
    """The call's soft time limit, else NULL (the task's, decision 187)."""
    progress_done = models.PositiveBigIntegerField(null=True, blank=True)
    """Units of work the run reported done (``JobContext.set_progress``, decision 202); NULL: none."""
    progress_total = models.PositiveBigIntegerField(null=True, blank=True)
    """Units of work in all, when the task knew them; NULL: unknown."""
    progress_note = models.CharField(max_length=200, blank=True, default="", db_default="")
    """The run's last note with its progress (at most 200 characters); the column defaults to
    ``''`` in the database too, so rows written outside the ORM need not name it."""
    progress_at = models.DateTimeField(null=True, blank=True)
    """When the progress was written; it belongs to the latest run when ``>= started_at``."""
    trace_links = models.JSONField(null=True, blank=True, editable=False)
    """The trace context of the traced calls that joined the job: ``{"calls": n, "links": [...]}``,
    the first and the latest 31 kept (decision 212); NULL while tracing is off."""
    depends_on = models.ManyToManyField(
        "self",
        through="JobDependency",
        through_fields=("job", "dependency"),
        symmetrical=False,
        related_name="dependents",
        blank=True,
    )
    """Jobs that must be SUCCESSFUL before this one runs (§6); ``job.dependents`` is the reverse."""

    objects = JobQuerySet.as_manager()

    #: Set on the job an enqueue returns: ``"created"``, ``"debounced"`` or ``"coalesced"`` (§2).
    outcome: str = ""

    class Meta:
        ordering = ["-id"]
        indexes = [
            # The claim (claim_rules.claimable_jobs): WHERE status='READY' AND run_at <= now
            # ORDER BY priority DESC, run_at, id LIMIT n walks this index in order and
            # stops after n rows; finished rows sit under other statuses and are never read.
            models.Index(fields=["status", "-priority", "run_at", "id"], name="debounce_job_claim"),
            # Reclaim: WHERE status='RUNNING' AND lease_expires_at <= now.
            models.Index(fields=["status", "lease_expires_at"], name="debounce_job_status_lease"),
            # Non-overlap per key (§4.5): other jobs of the same key in flight or due earlier.
            models.Index(fields=["key_hash", "status"], name="debounce_job_key_status"),
            # The admin's queue and task filters (issue #4): WHERE queue=… / task_name=…
            # ORDER BY id DESC LIMIT 50 reads only the matching rows, newest first; the
            # admin's exact task-name search uses the task index too.
            models.Index(fields=["queue", "-id"], name="debounce_job_queue"),
            models.Index(fields=["task_name", "-id"], name="debounce_job_task"),
            # Retention (retention.prune_jobs: WHERE finished_at < cutoff LIMIT n) and the
            # status command's runs in the last minute (finished_at >= now - 60 s) read a
            # range of this index; READY and RUNNING jobs have no finished_at (issue #11).
            models.Index(fields=["finished_at"], name="debounce_job_finished_at"),
        ]
        constraints = [
            # The claimed-job rule (§4.1, §4.5: a claimed job is never changed by an enqueue)
            # holds because an enqueue slides only the row holding the key's window_key, and a
            # coalescing call (§6) joins only the row holding its unique_lock. The database
            # refuses a row that keeps either past the states it belongs to, whatever wrote it
            # (a future code path, an operator's UPDATE): IntegrityError on every backend.
            models.CheckConstraint(
                condition=models.Q(window_key__isnull=True) | models.Q(status="READY"),
                name="debounce_job_window_only_ready",
                violation_error_message=_("Only a READY job can hold an open window_key."),
            ),
            models.CheckConstraint(
                condition=models.Q(unique_lock__isnull=True)
                | models.Q(status__in=["READY", "RUNNING"]),
                name="debounce_job_lock_only_live",
                violation_error_message=_("Only a READY or RUNNING job can hold a unique_lock."),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task_name} #{self.pk} ({self.status})"

    @property
    def is_open_window(self) -> bool:
        """True while the job's debounce window is open: READY and never claimed (§4.1)."""
        return self.status == self.Status.READY and self.window_key is not None

    @property
    def run_reason(self) -> str:
        """Why the job became due when it did.

        ``"retry"`` once an attempt has failed or been interrupted (its
        ``run_at`` is then a backoff's or its old place in line, no longer what
        the window decided); otherwise ``"max_wait"`` (the ceiling forced it),
        ``"quiet"`` (no call for one window length) or ``"not_debounced"``.
        """
        if self.attempts > 1 or (self.attempts == 1 and self.status == self.Status.READY):
            return "retry"
        if self.opened_at is None:
            return "not_debounced"
        if self.max_run_at is not None and self.run_at >= self.max_run_at:
            return "max_wait"
        return "quiet"

    def cancel(self, *, using: str | None = None) -> Any:
        """Cancel it: READY ends CANCELLED, RUNNING is asked to stop (decisions 69, 186).

        Returns :func:`django_debounce.ops.cancels.cancel_jobs`'s result; ``using`` defaults to the row's.
        """
        config = cast(_JobCanceller, apps.get_app_config(self._meta.app_label))
        return config.cancel_jobs([self.pk], using=using or self._state.db or DEFAULT_DB_ALIAS)


class _JobCanceller(Protocol):
    def cancel_jobs(self, job_ids: list[int], *, using: str) -> Any: ...


class OpenWindow(Job):
    """The open debounce windows (§4.1, §9): a proxy of :class:`Job` for the admin."""

    class Meta:
        proxy = True
        verbose_name = _("open window")
        verbose_name_plural = _("open windows")


class JobDependency(models.Model):
    """One edge of ``Job.depends_on``: ``job`` runs only after ``dependency`` succeeded (§6)."""

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="dependency_links")
    dependency = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="dependent_links")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "dependency"], name="debounce_dep_unique")
        ]
        # The FK indexes cover both directions: "what does job X wait for" (claim)
        # and "who waits for X" (cancelling dependents).

    def __str__(self) -> str:
        return f"job {self.job_id} after job {self.dependency_id}"
