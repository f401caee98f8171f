"""``manage.py prune_debounce_jobs``: delete finished jobs in batches (issue #11, item 3)."""

from __future__ import annotations

import argparse
import re
from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from django_debounce.exceptions import ConfigurationError
from django_debounce.management.arguments import positive_int
from django_debounce.management.database_ready import require_tables

from ...conf.durations import parse_duration
from ...ops.retention import DEFAULT_BATCH_SIZE, PruneResult, prunable_jobs, prune_jobs


def older_than_argument(value: Any) -> timedelta:
    """Parse ``--older-than``: a duration with a unit such as ``7d``, ``12h``, ``30m`` or ``90s``.

    A bare number typed on the command line (``--older-than 7``) is refused:
    it would be seven seconds, almost surely meant as days (decision 134).
    From Python (``call_command(..., older_than=600)``) an ``int``/``float``
    is seconds and a ``timedelta`` is taken as is.

    Raises:
        CommandError: not a duration, a bare number in a string, zero or
            negative, or over 100 years; the message echoes what was given.
    """
    if isinstance(value, str) and re.fullmatch(r"\s*[-+]?\d+(\.\d*)?\s*", value):
        n = value.strip()
        raise CommandError(
            f"argument --older-than: {value!r} needs a unit: {n}d, {n}h, {n}m or {n}s"
        )
    try:
        return parse_duration(value, name="--older-than")
    except ConfigurationError as exc:
        if "longer than zero" in str(exc):
            reason = "must be longer than zero (e.g. 7d)"
        elif "100 years" in str(exc):
            reason = "is over 100 years (36500d)"
        else:
            reason = "is not a duration (7d, 12h, 30m)"
        raise CommandError(f"argument --older-than: {value!r} {reason}") from None


class Command(BaseCommand):
    help = (
        "Delete finished jobs (SUCCESSFUL, FAILED, CANCELLED, EXPIRED, SHED) that finished "
        "before --older-than ago, one batch per transaction. READY and RUNNING jobs and the "
        "jobs a waiting job depends on are kept; so are dead letters, unless --dead-letters "
        "(their job link becomes empty; their Retry still works)."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--older-than",
            required=True,
            metavar="DURATION",
            help="Age of the finished_at cutoff: a number and a unit such as 7d, 12h, 30m, "
            "90s (a bare number is refused: give the unit).",
        )
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=DEFAULT_BATCH_SIZE,
            help=f"Rows per transaction and per statement (default {DEFAULT_BATCH_SIZE}).",
        )
        parser.add_argument(
            "--dead-letters",
            action="store_true",
            help="Also delete dead letters created before the cutoff.",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Only count what would be deleted."
        )
        parser.add_argument(
            "--database", default="default", help="Database alias (default 'default')."
        )
        parser.add_argument(
            "--no-progress", action="store_true", help="Do not draw the progress line."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        older_than = older_than_argument(options["older_than"])
        try:
            batch_size = positive_int(str(options["batch_size"]))
        except argparse.ArgumentTypeError as exc:
            raise CommandError(f"argument --batch-size: {exc}") from None
        using, dry_run = options["database"], bool(options["dry_run"])
        require_tables(using)
        now = timezone.now()
        cutoff = now - older_than
        counted = progress = None
        result = PruneResult()
        try:
            if not dry_run:
                counted = prunable_jobs(cutoff, now=now, using=using).count()
                if not options["no_progress"]:
                    progress = self._progress(counted)
            prune_jobs(
                older_than=older_than,
                batch_size=batch_size,
                dead_letters=bool(options["dead_letters"]),
                dry_run=dry_run,
                now=now,
                using=using,
                progress=progress,
                result=result,
            )
        except KeyboardInterrupt:  # the batch in flight rolled back; report what is done
            self._end_progress_line(progress)
            self._summary(result, options, cutoff, batch_size, counted=None)
            raise CommandError(
                "interrupted (Ctrl-C): the rest stays for the next prune", returncode=130
            ) from None
        self._end_progress_line(progress)
        self._summary(result, options, cutoff, batch_size, counted=counted)

    def _end_progress_line(self, progress: Any) -> None:
        if progress is not None and self.stderr.isatty():
            self.stderr.write("")  # end the line the progress redrew in place

    def _summary(
        self,
        result: PruneResult,
        options: dict[str, Any],
        cutoff: datetime,
        batch_size: int,
        *,
        counted: int | None,
    ) -> None:
        """Write what was (or would be) deleted, one fact a line, each within 80 columns."""
        dry_run = bool(options["dry_run"])
        verb = "would delete" if dry_run else "deleted"
        lines = [
            f"{verb} {result.jobs:,} job(s) that finished before {cutoff:%Y-%m-%d %H:%M:%S %Z}"
        ]
        if options["dead_letters"]:
            lines.append(f"{verb} {result.dead_letters:,} dead letter(s) created before then")
        if not dry_run:
            lines.append(f"in {result.batches:,} batch(es) of at most {batch_size:,} rows")
        if counted is not None and result.jobs < counted and not result.stopped:
            lines.append(
                f"{counted - result.jobs:,} of the {counted:,} job(s) counted at the start "
                "went to another prune"
            )
        if result.kept_dependencies:
            lines.append(
                f"kept {result.kept_dependencies:,} finished job(s) that a READY or RUNNING "
                "job depends on"
            )
        for line in lines:
            self.stdout.write(line)

    def _progress(self, total: int) -> Any:
        """A one-line progress count on stderr, redrawn in place (``\\r``) after each batch."""
        done = 0
        ending = "\r" if self.stderr.isatty() else "\n"

        def progress(deleted: int) -> bool:
            nonlocal done
            done += deleted
            if done <= total:
                text = f"pruned {done:,} of {total:,} jobs ({100 * done / total:.0f}%)"
            else:  # past the jobs counted at the start: the dead letters (--dead-letters)
                text = f"pruned {total:,} jobs and {done - total:,} dead letter(s)"
            self.stderr.write(text, ending=ending)
            return True

        return progress
