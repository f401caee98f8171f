"""``manage.py prune_debounce_jobs``: delete finished jobs in batches (issue #11, item 3)."""

from __future__ import annotations

import argparse
import re
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from django_debounce.durations import parse_duration
from django_debounce.exceptions import ConfigurationError
from django_debounce.management.arguments import positive_int
from django_debounce.management.database_ready import require_tables
from django_debounce.retention import DEFAULT_BATCH_SIZE, prunable_jobs, prune_jobs


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
            help="Age of the finished_at cutoff: seconds or a duration such as '7d', '12h'.",
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
        older_than = options["older_than"]
        if isinstance(older_than, str) and re.fullmatch(r"\s*\d+(\.\d+)?\s*", older_than):
            older_than = float(older_than)  # the help promises seconds: "--older-than 600"
        try:
            older_than = parse_duration(older_than, name="--older-than")
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from None
        try:
            batch_size = positive_int(str(options["batch_size"]))
        except argparse.ArgumentTypeError as exc:
            raise CommandError(f"argument --batch-size: {exc}") from None
        using, dry_run = options["database"], bool(options["dry_run"])
        require_tables(using)
        now = timezone.now()
        progress = None
        if not dry_run and not options["no_progress"]:
            progress = self._progress(prunable_jobs(now - older_than, using=using).count())
        result = prune_jobs(
            older_than=older_than,
            batch_size=batch_size,
            dead_letters=bool(options["dead_letters"]),
            dry_run=dry_run,
            now=now,
            using=using,
            progress=progress,
        )
        if progress is not None and self.stderr.isatty():
            self.stderr.write("")  # end the line the progress redrew in place
        verb = "would delete" if dry_run else "deleted"
        line = f"{verb} {result.jobs:,} finished job(s) that finished before {now - older_than:%Y-%m-%d %H:%M:%S %Z}"
        if options["dead_letters"]:
            line += f" and {result.dead_letters:,} dead letter(s)"
        if not dry_run:
            line += f" in {result.batches:,} batch(es) of at most {batch_size:,}"
        self.stdout.write(line)
        if result.kept_dependencies:
            self.stdout.write(
                f"kept {result.kept_dependencies:,} finished job(s) that a READY or RUNNING "
                "job depends on"
            )

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
