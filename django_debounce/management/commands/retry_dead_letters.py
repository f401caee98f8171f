"""``manage.py retry_dead_letters``: retry dead letters in bulk through the normal enqueue path (§8)."""

from __future__ import annotations

import argparse
import re
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DEFAULT_DB_ALIAS

from django_debounce import registry
from django_debounce.exceptions import ConfigurationError
from django_debounce.management.arguments import non_negative_int
from django_debounce.management.database_ready import require_tables
from django_debounce.validators import check_alias

from ...conf.durations import parse_duration
from ...ops.sweep import retry_dead_letters


class Command(BaseCommand):
    help = (
        "Retry dead letters that were never retried, oldest first, each as a fresh call of its "
        "task (DeadLetter.retry()). shed:, codel: and unknown_task: entries are skipped unless "
        "asked for."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--task",
            action="append",
            dest="tasks",
            default=None,
            help="Only entries of this task name (repeatable).",
        )
        parser.add_argument(
            "--reason-prefix",
            default=None,
            help=(
                "Only entries whose reason starts with this text, e.g. 'failed:'. A reserved "
                "prefix given here (e.g. 'unknown_task:') selects those entries."
            ),
        )
        parser.add_argument(
            "--older-than",
            default=None,
            help="Only entries at least this old: seconds or a duration such as '10m', '1h30m'.",
        )
        parser.add_argument(
            "--include-shed",
            action="store_true",
            help="Also retry shed: and codel: entries (skipped by default, never by the sweep).",
        )
        parser.add_argument(
            "--limit",
            type=non_negative_int,
            default=None,
            help="Retry at most this many entries (oldest first).",
        )
        parser.add_argument(
            "--database",
            default=DEFAULT_DB_ALIAS,
            help="Database alias whose dead letters to retry (default 'default').",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Only count what would be retried; write nothing.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        older_than = options["older_than"]
        if older_than is not None:
            if isinstance(older_than, str) and re.fullmatch(r"\s*\d+(\.\d+)?\s*", older_than):
                older_than = float(older_than)  # the help promises seconds: "--older-than 600"
            try:
                older_than = parse_duration(older_than, name="--older-than")
            except ConfigurationError as exc:
                raise CommandError(str(exc)) from None
        limit = options["limit"]
        if limit is not None:
            try:
                limit = non_negative_int(str(limit))
            except argparse.ArgumentTypeError as exc:
                raise CommandError(f"argument --limit: {exc}") from None
        tasks = options["tasks"]
        if isinstance(tasks, str):  # call_command("retry_dead_letters", tasks="a.b")
            tasks = [tasks]
        using = options.get("database") or DEFAULT_DB_ALIAS
        try:
            check_alias(using, "--database")
        except ConfigurationError as exc:
            raise CommandError(str(exc)) from None
        require_tables(using)  # the sweep's database: one line before migrate
        for name in tasks or ():
            if registry.lookup(name) is None:
                self.stderr.write(
                    f"warning: no task named {name!r} is registered in this process; "
                    "matching dead letters by that name anyway (check the spelling: the full "
                    "registered name, e.g. 'app.tasks.sync')."
                )
        dry_run = bool(options["dry_run"])
        result = retry_dead_letters(
            tasks=tasks,
            reason_prefix=options["reason_prefix"] or None,
            older_than=older_than,
            include_shed=bool(options["include_shed"]),
            limit=limit,
            dry_run=dry_run,
            using=using,
        )
        verb = "would retry" if dry_run else "retried"
        line = (
            f"{verb} {result.retried}, skipped {result.already_retried} (already retried), "
            f"skipped {result.reserved} (reserved prefix shed:/codel:/unknown_task:), "
            f"failed {result.failed}"
        )
        self.stdout.write(line)
        if result.failed:
            raise CommandError(
                f"{result.failed} dead letter(s) could not be retried; see the log for why."
            )
