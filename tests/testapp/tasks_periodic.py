"""A periodic task, declared only in a process started with ``DEBOUNCE_TEST_PERIODIC=1``.

Every test process imports the ``tasks_*`` modules; a schedule declared in all of
them would have every other test's worker defer its ticks.
"""

from __future__ import annotations

import datetime as dt
import os

from django_debounce import periodic_task

from .models import CallLog

if os.environ.get("DEBOUNCE_TEST_PERIODIC") == "1":

    @periodic_task("* * * * * *", name="per.every_second", tz="UTC", pass_tick=True)
    def every_second(tick: dt.datetime) -> None:
        """Log the tick (a six-field expression: every second)."""
        CallLog.objects.create(task="per.every_second", key=tick.isoformat(), pid=os.getpid())


if os.environ.get("DEBOUNCE_TEST_PERIODIC_EDGE") == "1":

    @periodic_task(
        "* * * * * *",
        name="per.both_every_second",
        tz="UTC",
        pass_tick=True,
        debounce="2s",
        debounce_max_wait="4s",
        debounce_key="per-both",
        debounce_edge="both",
        debounce_replace_payload=True,
    )
    def both_every_second(tick: dt.datetime) -> None:
        """Log the tick, with its start and end (a both-edge burst of ticks, attack)."""
        log = CallLog.objects.create(
            task="per.both_every_second",
            key=tick.isoformat(),
            pid=os.getpid(),
            started_at=dt.datetime.now(dt.UTC),
        )
        log.finished_at = dt.datetime.now(dt.UTC)
        log.save(update_fields=["finished_at"])
