"""``manage.py retry_dead_letters`` (§8): filters, --dry-run, counts."""

from __future__ import annotations

import datetime as dt
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_debounce.models import DeadLetter, Job
from tests.conftest import T
from tests.factories import DeadLetterFactory

pytestmark = pytest.mark.django_db

HOUR = dt.timedelta(hours=1)


def letter(task: str = "dep.step", reason: str = "failed: 1 attempt(s); x", age=HOUR, **kw):
    kw.setdefault("job__args", [f"{task}:{reason[:6]}"])
    return DeadLetterFactory(job__task_name=task, reason=reason, created_at=T - age, **kw)


def run(*args: str, **options) -> str:
    out = StringIO()
    call_command("retry_dead_letters", *args, stdout=out, **options)
    return out.getvalue().strip()


def retried() -> set[int]:
    return set(DeadLetter.objects.filter(retried_at__isnull=False).values_list("pk", flat=True))


@pytest.fixture
def letters(clock):
    return {
        "step": letter(),
        "step_young": letter(age=dt.timedelta(minutes=1)),
        "refresh": letter(task="dep.refresh", job__args=[3]),
        "shed": letter(reason="shed: rate limit 1/s exceeded", metadata={"shed": True}),
        "codel": letter(reason="codel: waited 9.0s", metadata={"codel": True}),
        "unknown": letter(task="gone.task", reason="unknown_task: gone.task"),
        "done": letter(retried_at=T - HOUR),
    }


def test_default_retries_every_unretried_non_reserved_entry(letters):
    assert run() == (
        "retried 3, skipped 1 (already retried), "
        "skipped 3 (reserved prefix shed:/codel:/unknown_task:), failed 0"
    )
    assert retried() == {letters[k].pk for k in ("step", "step_young", "refresh", "done")}
    fresh = Job.objects.filter(status=Job.Status.READY).order_by("id")
    assert [j.task_name for j in fresh] == ["dep.step", "dep.refresh", "dep.step"]  # oldest first
    assert run().startswith("retried 0, skipped 4 (already retried)")


def test_dry_run_writes_nothing(letters):
    jobs = Job.objects.count()
    assert run("--dry-run").startswith("would retry 3, skipped 1 (already retried)")
    assert retried() == {letters["done"].pk}
    assert Job.objects.count() == jobs


def test_filter_by_task_repeatable(letters):
    assert run("--task", "dep.refresh", "--task", "nope").startswith("retried 1,")
    assert retried() - {letters["done"].pk} == {letters["refresh"].pk}
    assert run(tasks="dep.step").startswith("retried 2,")


def test_filter_older_than(letters):
    assert run("--older-than", "10m").startswith("retried 2,")
    assert letters["step_young"].pk not in retried()
    with pytest.raises(CommandError, match="--older-than='soon' is not a duration"):
        run("--older-than", "soon")


def test_include_shed_retries_shed_and_codel_but_not_unknown_tasks(letters):
    out = run("--include-shed", "--older-than", "10m")
    assert out.startswith("retried 4, skipped 1 (already retried), skipped 1 (reserved")
    assert {letters[k].pk for k in ("shed", "codel")} <= retried()
    assert letters["unknown"].pk not in retried()


def test_reason_prefix(letters):
    assert run("--reason-prefix", "failed:").startswith("retried 3,")
    assert run("--reason-prefix", "shed:").startswith("retried 1,")
    assert letters["codel"].pk not in retried()
    # A reserved prefix named explicitly selects those entries, e.g. after deploying the task.
    assert run("--reason-prefix", "unknown_task:").startswith("retried 1,")
    job = DeadLetter.objects.get(pk=letters["unknown"].pk).retry_job
    assert job is not None and job.task_name == "gone.task"


def test_limit_takes_the_oldest_first(clock):
    oldest = letter(age=3 * HOUR)
    letter(age=2 * HOUR)
    letter(age=HOUR)
    assert run("--limit", "1").startswith("retried 1,")
    assert retried() == {oldest.pk}
    with pytest.raises(CommandError, match="must be at least 0"):
        run(limit=-1)


def test_a_failing_retry_is_reported(clock):
    letter(task="dep.window", job__args=[{"not": "a key"}])
    letter()
    with pytest.raises(CommandError, match="1 dead letter\\(s\\) could not be retried"):
        out = StringIO()
        try:
            call_command("retry_dead_letters", stdout=out)
        finally:
            assert out.getvalue().startswith("retried 1, skipped 0 (already retried)")
            assert out.getvalue().strip().endswith("failed 1")


def test_an_unregistered_task_name_is_warned_about(letters):
    err = StringIO()
    out = StringIO()
    call_command("retry_dead_letters", "--task", "gone.task", stdout=out, stderr=err)
    assert "no task named 'gone.task' is registered in this process" in err.getvalue()
    # Still filtered by that name: its only entry is an unknown_task: one, skipped.
    assert out.getvalue().startswith("retried 0, skipped 0 (already retried), skipped 1 (reserved")
    err = StringIO()
    call_command("retry_dead_letters", "--task", "dep.step", "--dry-run", stdout=out, stderr=err)
    assert err.getvalue() == ""
