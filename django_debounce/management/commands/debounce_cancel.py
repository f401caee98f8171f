"""``manage.py debounce_cancel JOB_ID ...``: cancel jobs, asking running ones to stop (decision 186)."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DEFAULT_DB_ALIAS

from django_debounce.management.database_ready import require_tables

from ...ops.cancels import cancel_jobs


def _job_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a job id; pass the integer ids of Job rows, e.g. 42 43"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a job id; ids start at 1")
    return value


class Command(BaseCommand):
    help = (
        "Cancel jobs by id: a waiting (READY) job ends CANCELLED at once; a RUNNING job is asked "
        "to stop (its task sees context.cancel_requested, context.checkpoint() raises "
        "JobCancelled, an async task is cancelled) and ends CANCELLED when it does. A task that "
        "never checks runs to its end. Finished jobs are left alone."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "job_ids",
            nargs="+",
            type=_job_id,
            metavar="JOB_ID",
            help="Ids of the jobs to cancel (positive integers): READY ones end CANCELLED at "
            "once, RUNNING ones are asked to stop.",
        )
        parser.add_argument(
            "--database", default=DEFAULT_DB_ALIAS, help="Database alias (default: 'default')."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        ids = options["job_ids"]
        if isinstance(ids, int):  # call_command("debounce_cancel", job_ids=42)
            ids = [ids]
        try:
            ids = [_job_id(str(value)) for value in ids]
        except argparse.ArgumentTypeError as exc:
            raise CommandError(str(exc)) from None
        using = options["database"]
        require_tables(using)
        result = cancel_jobs(ids, using=using)
        self.stdout.write(
            f"cancelled {len(result.cancelled)} waiting job(s) {result.cancelled}"
            f" (+{len(result.cancelled_dependents)} dependent(s)), "
            f"requested the cancel of {len(result.requested)} running job(s) {result.requested}, "
            f"left {len(result.finished)} finished job(s) alone"
            + (f", no such job(s) {result.missing}" if result.missing else "")
        )
        if result.missing:
            raise CommandError(f"no job with id(s) {result.missing}")
