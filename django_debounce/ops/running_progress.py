"""The running jobs that reported progress, for ``debounce_status`` (decision 202).

:func:`progress_rows` reads RUNNING jobs whose progress belongs to their current
run (``progress_at >= started_at``): rows under ``status='RUNNING'`` only (the
lease index leads with ``status``), longest-running first, at most ``limit``.
:func:`progress_lines` draws them for the text view.
"""

from __future__ import annotations

from typing import Any

from django.db.models import F

from ..progress import Progress
from .text_width import cut_dotted, pad

#: Running jobs with progress that the snapshot lists at most.
MAX_PROGRESS_ROWS = 100


def progress_rows(jobs: Any, *, limit: int = MAX_PROGRESS_ROWS) -> list[dict[str, Any]]:
    """Return ``[{"id", "task_name", "queue", "done", "total", "percent", "note", "at"}]``.

    Args:
        jobs: a ``Job`` queryset on the snapshot's database.
        limit: the most rows returned, longest-running (earliest ``started_at``) first.
    """
    running = (
        jobs.running()
        .filter(progress_at__isnull=False, progress_at__gte=F("started_at"))
        .order_by("started_at", "id")
        .only(
            "task_name", "queue", "progress_done", "progress_total", "progress_note", "progress_at"
        )
    )
    rows = []
    for job in running[:limit]:
        progress = Progress(job.progress_done, job.progress_total, job.progress_note)
        rows.append(
            {
                "id": job.pk,
                "task_name": job.task_name,
                "queue": job.queue,
                **progress.as_dict(),
                "at": job.progress_at.isoformat(),
            }
        )
    return rows


def progress_lines(rows: list[dict[str, Any]], *, width: int) -> list[str]:
    """One line per row: ``#id task  3 of 10 (30%) - note``, cut to ``width`` by the caller."""
    task_w = max(10, width // 3)
    return [
        f"  #{r['id']:<9} {pad(cut_dotted(r['task_name'], task_w), task_w)} "
        + Progress(r["done"], r["total"], r["note"]).text()
        for r in rows
    ]


__all__ = ["MAX_PROGRESS_ROWS", "progress_lines", "progress_rows"]
