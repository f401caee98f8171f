"""Let the database keep the claimed-job rule (issue #8, item 7).

``window_key`` may be set only on a READY job and ``unique_lock`` only on a
READY or RUNNING one (models.Job.Meta.constraints). Rows written before these
constraints that break them (a claimed job still holding its window key would
let an enqueue slide it) are repaired first, so the constraints can be added.
"""

from typing import Any

from django.db import migrations, models

LIVE = ["READY", "RUNNING"]


def release_stale_keys(apps: Any, schema_editor: Any) -> None:
    """Clear ``window_key`` off non-READY jobs and ``unique_lock`` off finished ones.

    Both columns mean "an enqueue may still join this job"; a job past those
    states takes no calls (§4.1, §6), so clearing them only restores what the
    rest of the package already assumes.
    """
    Job = apps.get_model("django_debounce", "Job")
    jobs = Job.objects.using(schema_editor.connection.alias)
    jobs.exclude(status="READY").filter(window_key__isnull=False).update(window_key=None)
    jobs.exclude(status__in=LIVE).filter(unique_lock__isnull=False).update(unique_lock=None)


class Migration(migrations.Migration):
    dependencies = [
        ("django_debounce", "0003_admin_indexes"),
    ]

    operations = [
        # Reversing keeps the repaired rows as they are: a stale key was the defect.
        migrations.RunPython(release_stale_keys, migrations.RunPython.noop, elidable=True),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("window_key__isnull", True), ("status", "READY"), _connector="OR"
                ),
                name="debounce_job_window_only_ready",
                violation_error_message="Only a READY job can hold an open window_key.",
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("unique_lock__isnull", True), ("status__in", LIVE), _connector="OR"
                ),
                name="debounce_job_lock_only_live",
                violation_error_message="Only a READY or RUNNING job can hold a unique_lock.",
            ),
        ),
    ]
