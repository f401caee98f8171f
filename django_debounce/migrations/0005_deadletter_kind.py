"""Store each dead letter's kind in a column (issue #9, item 4).

The kind (failure, shed, CoDel, unknown task) was parsed from the reason's
reserved prefix wherever it was needed; it is now written with the row
(``models.DeadLetter.kind``) and indexed for the admin's kind filter and the
sweep. Rows written before this migration get it from their reason here;
the reasons themselves are not changed. Reversible: going back drops the
column and its index.
"""

from typing import Any

from django.db import migrations, models

#: The reserved reason prefixes, as of this migration (models.REASON_PREFIXES).
PREFIXES = {
    "failure": "failed:",
    "shed": "shed:",
    "codel": "codel:",
    "unknown_task": "unknown_task:",
}


def fill_kind(apps: Any, schema_editor: Any) -> None:
    """Set ``kind`` of every existing row from its reason's prefix (``other`` when none).

    One ``UPDATE`` per prefix, the same prefix match the admin filter and the
    sweep made until now (``reason LIKE 'prefix%'``).
    """
    DeadLetter = apps.get_model("django_debounce", "DeadLetter")
    letters = DeadLetter.objects.using(schema_editor.connection.alias)
    letters.update(kind="other")
    for kind, prefix in PREFIXES.items():
        letters.filter(reason__startswith=prefix).update(kind=kind)


class Migration(migrations.Migration):
    dependencies = [
        ("django_debounce", "0004_job_window_lock_checks"),
    ]

    operations = [
        migrations.AddField(
            model_name="deadletter",
            name="kind",
            field=models.CharField(
                choices=[
                    ("failure", "failure"),
                    ("shed", "shed (rate limit)"),
                    ("codel", "shed (CoDel)"),
                    ("unknown_task", "unknown task"),
                    ("other", "other"),
                ],
                default="other",
                editable=False,
                max_length=16,
            ),
            preserve_default=False,
        ),
        migrations.RunPython(fill_kind, migrations.RunPython.noop, elidable=False),
        migrations.AddIndex(
            model_name="deadletter",
            index=models.Index(fields=["kind", "-created_at"], name="debounce_dl_kind"),
        ),
    ]
