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
from django.db.models.functions import Substr

#: The reserved reason prefixes, as of this migration (models.REASON_PREFIXES).
PREFIXES = {
    "failure": "failed:",
    "shed": "shed:",
    "codel": "codel:",
    "unknown_task": "unknown_task:",
}


def fill_kind(apps: Any, schema_editor: Any) -> None:
    """Set ``kind`` of every existing row from its reason's prefix (``other`` when none).

    The same case-sensitive prefix rule as ``DeadLetter.Kind.of_reason``, which
    sets the kind of every row written from now on. One ``UPDATE`` per prefix
    (``reason LIKE 'prefix%'``, case-sensitive on PostgreSQL and MySQL/MariaDB);
    SQLite's ``LIKE`` ignores ASCII case, so there the rows it matched are
    checked again in Python and a ``Shed: …`` (not a reserved prefix) is put
    back to ``other``.
    """
    DeadLetter = apps.get_model("django_debounce", "DeadLetter")
    # The column was added with "other" for every row; each row is updated at most once
    # (the prefixes are disjoint): on PostgreSQL a second update of a row this transaction
    # wrote queues foreign-key trigger events, and the AddIndex below would then refuse to run.
    letters = DeadLetter.objects.using(schema_editor.connection.alias)
    for kind, prefix in PREFIXES.items():
        letters.filter(reason__startswith=prefix).update(kind=kind)
        if schema_editor.connection.vendor == "sqlite":
            heads = letters.filter(kind=kind).annotate(head=Substr("reason", 1, len(prefix)))
            wrong = [pk for pk, head in heads.values_list("pk", "head") if head != prefix]
            for start in range(0, len(wrong), 500):
                letters.filter(pk__in=wrong[start : start + 500]).update(kind="other")


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
