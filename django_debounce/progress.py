"""Progress a running task reports: validated, written to its job at a bounded rate, fenced (decisions 202-204).

A task declared with ``takes_context=True`` calls
:meth:`JobContext.set_progress(done, total, note) <django_debounce.context.JobContext.set_progress>`
as often as it likes. Each call is validated (:func:`validate_progress`), then
handed to the run's :class:`ProgressReporter`, which writes at most one
``UPDATE`` per :data:`MIN_INTERVAL` per run: the first call of a run is written
at once, a later call within the interval is kept pending (replacing any value
pending before it), and the pending value is written by the first call after
the interval, or by the next lease renewal once the interval has passed
(:func:`write_held`), or, at the latest, when the run ends
(:meth:`ProgressReporter.flush`, which :func:`django_debounce.run.execution.run_job`
calls before it records the outcome, on success and on failure alike). A worker that dies loses only the
pending value: the row keeps the last value written, at most ``MIN_INTERVAL`` old.

Every write is fenced like the outcome write (``Job.objects.current_run``:
this job, RUNNING, this attempt, this worker): a run whose lease lapsed and
whose job was claimed again writes nothing, so it never overwrites the newer
run's progress. The values live on the job row (``progress_done``,
``progress_total``, ``progress_note``, ``progress_at``); they belong to the
job's latest run when ``progress_at >= started_at`` (:func:`progress_of`).

The interval is measured on the package's clock (``django.utils.timezone.now``),
so tests move it with the ``clock`` fixture. Importing this module does not
import models (a write imports them when it runs).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError
from django.utils import timezone

from . import codec
from .exceptions import ProgressError
from .signals import job_progress, send_signal

if TYPE_CHECKING:
    from .models import Job

#: The shortest time between two progress writes of one run, in seconds (decision 203).
MIN_INTERVAL = 1.0
#: The largest ``done`` or ``total`` stored (a signed 64-bit column on every database).
MAX_COUNT = 2**63 - 1
#: The longest ``note`` ``JobContext.set_progress`` accepts, in characters (the column's length).
MAX_NOTE_LENGTH = 200

logger = logging.getLogger("django_debounce.worker")

#: The runs of this process holding a value back, by job id (written by :func:`write_held`).
_held: dict[int, ProgressReporter] = {}
_held_lock = threading.Lock()


def write_held(ids: list[int], *, using: str) -> int:
    """Write the values held back for the running jobs ``ids`` whose interval has passed.

    Called by every lease renewal (:func:`django_debounce.run.leases.renew_leases`, every
    third of the lease, from the renewing thread), so a value a task reported and then
    went silent on reaches the row within a renewal period, not only when the run ends
    (decision 203). Still at most one write per :data:`MIN_INTERVAL` per run, fenced.
    Returns how many were written; a database error is logged, not raised.
    """
    with _held_lock:
        reporters = [_held[i] for i in ids if i in _held]
    return sum(1 for reporter in reporters if reporter.using == using and reporter.write_held())


@dataclass(frozen=True)
class Progress:
    """One progress report: ``done`` units of ``total`` (``None``: unknown), with a ``note``."""

    done: int
    total: int | None = None
    note: str = ""

    @property
    def percent(self) -> int | None:
        """Whole per cent done (rounded down; 100 for an empty total), or ``None`` without a total."""
        if self.total is None:
            return None
        if self.total == 0:
            return 100
        return self.done * 100 // self.total

    def text(self) -> str:
        """The report as one line: ``"3 of 10 (30%)"``, ``"3 done"``, with ``" - note"`` when there is one."""
        line = (
            f"{self.done} done"
            if self.total is None
            else f"{self.done} of {self.total} ({self.percent}%)"
        )
        return f"{line} - {self.note}" if self.note else line

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready ``{"done", "total", "percent", "note"}``."""
        return {"done": self.done, "total": self.total, "percent": self.percent, "note": self.note}


def validate_progress(done: object, total: object = None, note: object = "") -> Progress:
    """Return ``(done, total, note)`` as a :class:`Progress`, or raise before anything is written.

    Args:
        done: units of work done, an ``int`` from 0 to :data:`MAX_COUNT`.
        total: units of work in all, an ``int >= done``, or ``None`` when unknown.
        note: a ``str`` of at most :data:`MAX_NOTE_LENGTH` characters (``""``: none).

    Raises:
        ProgressError: a value of the wrong type (a bool is not an int), a negative
            count, ``done > total``, a note too long or one no database can store (a NUL,
            a lone surrogate: :func:`~django_debounce.codec.is_storable_text`); the
            message names the argument.
    """
    if not _is_count(done):
        raise ProgressError(
            f"set_progress: done must be an int from 0 to {MAX_COUNT}, got {done!r}"
            + (" (a bool is not a count)" if isinstance(done, bool) else "")
        )
    if total is not None and not _is_count(total):
        raise ProgressError(
            f"set_progress: total must be an int from 0 to {MAX_COUNT} or None (unknown), "
            f"got {total!r}" + (" (a bool is not a count)" if isinstance(total, bool) else "")
        )
    if total is not None and done > total:  # type: ignore[operator]
        raise ProgressError(
            f"set_progress: done ({done}) exceeds total ({total}); pass a larger total or total=None"
        )
    if not isinstance(note, str):
        raise ProgressError(f"set_progress: note must be a str, got {type(note).__name__}")
    if not codec.is_storable_text(note):
        raise ProgressError(
            "set_progress: note holds a NUL character or a lone surrogate, which no supported "
            f"database can store; got {note!r}"
        )
    if len(note) > MAX_NOTE_LENGTH:
        raise ProgressError(
            f"set_progress: note is {len(note)} characters, at most {MAX_NOTE_LENGTH} are kept; "
            "shorten it"
        )
    return Progress(done=int(done), total=None if total is None else int(total), note=note)  # type: ignore[call-overload]


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def progress_of(job: Job) -> Progress | None:
    """Return the progress ``job``'s latest run reported, or ``None`` (none, or an earlier run's).

    An earlier attempt's values stay on the row until the new run writes its own;
    they are not this run's once ``started_at`` (set by each claim) is past ``progress_at``.
    """
    if job.progress_done is None or job.progress_at is None:
        return None
    if job.started_at is not None and job.progress_at < job.started_at:
        return None
    return Progress(job.progress_done, job.progress_total, job.progress_note)


class ProgressReporter:
    """The progress writes of one run of ``job``, fenced on its attempt and worker.

    Args:
        job: the claimed job (``pk``, ``attempts`` and ``worker_id`` as the claim set
            them; ``None`` for an inline call: values are validated, never written).
        using: the database alias of its row.
        interval: the shortest time between two writes, seconds (default :data:`MIN_INTERVAL`).

    ``writes`` counts the ``UPDATE`` statements issued; ``pending`` is the value held back.
    Writes from the task's thread and from a lease renewal's are serialised, and each
    writes the newest value held, so a row never goes back to an older value.
    """

    def __init__(self, job: Job | None, *, using: str = "default", interval: float = MIN_INTERVAL):
        self.job = job
        self.using = using
        self.interval = dt.timedelta(seconds=interval)
        self.pending: Progress | None = None
        self.writes = 0
        self._written_at: dt.datetime | None = None
        self._lock = threading.Lock()  # guards pending and _written_at
        self._write_lock = threading.Lock()  # one UPDATE at a time, the newest value

    def _due(self, now: dt.datetime) -> bool:
        last = self._written_at
        # A clock that stepped back (now < last) writes rather than holding values forever.
        return last is None or not last <= now < last + self.interval

    def set(self, progress: Progress) -> bool:
        """Write ``progress`` now if the interval since the last write has passed, else hold it.

        Returns True when it was written; False when it was held back, or the run is
        no longer current (fenced out: nothing written). A database error is logged, not
        raised (progress never fails a run): the value stays held for the next write.
        """
        if self.job is None:
            return False
        with self._lock:
            self.pending = progress
            due = self._due(timezone.now())
        if not due:
            with _held_lock:
                _held[self.job.pk] = self
            return False
        return self._write_pending(check_due=False)

    def write_held(self) -> bool:
        """Write the value held back if the interval since the last write has passed."""
        return self._write_pending(check_due=True)

    def flush(self) -> bool:
        """Write the value held back, if any (the run ends); return True if one was written."""
        self._forget()
        return self._write_pending(check_due=False)

    def _forget(self) -> None:
        if self.job is not None:
            with _held_lock:
                if _held.get(self.job.pk) is self:
                    del _held[self.job.pk]

    def _write_pending(self, *, check_due: bool) -> bool:
        job = self.job
        if job is None:
            return False
        try:
            with self._write_lock:
                now = timezone.now()
                with self._lock:
                    progress = self.pending
                    if progress is None or (check_due and not self._due(now)):
                        return False
                    self._written_at = now
                written = self._update(job, progress, now)
                with self._lock:
                    if self.pending == progress:
                        self.pending = None
                        self._forget()
        except (DatabaseError, UnicodeError):  # never the run's outcome: only its report
            logger.warning("could not write the progress of job %s", job.pk, exc_info=True)
            return False
        if written:
            send_signal(job_progress, job=job, progress=progress)
        return written

    def _update(self, job: Job, progress: Progress, now: dt.datetime) -> bool:
        from .models import Job  # noqa: PLC0415 (lazy: importable before the app registry)

        self.writes += 1
        updated = (
            Job.objects.using(self.using)
            .current_run(job.pk, attempts=job.attempts, worker_id=job.worker_id)
            .update(
                progress_done=progress.done,
                progress_total=progress.total,
                progress_note=progress.note,
                progress_at=now,
            )
        )
        if not updated:
            return False  # the run is no longer current (lease lost, job reclaimed): fenced out
        job.progress_done, job.progress_total = progress.done, progress.total
        job.progress_note, job.progress_at = progress.note, now
        return True


__all__ = [
    "MAX_COUNT",
    "MAX_NOTE_LENGTH",
    "MIN_INTERVAL",
    "Progress",
    "ProgressReporter",
    "progress_of",
    "validate_progress",
    "write_held",
]
