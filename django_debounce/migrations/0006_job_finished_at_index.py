"""Index ``Job.finished_at`` for retention and the status command (issue #11).

``prune_debounce_jobs`` (and the worker's automatic prune) picks finished jobs
by ``finished_at < cutoff`` one batch at a time, and ``debounce_status``
counts the runs of the last minute by ``finished_at >= now - 60 s``: both read
a range of this index instead of the whole job table. Reversible.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_debounce", "0005_deadletter_kind")]

    operations = [
        migrations.AddIndex(
            model_name="job",
            index=models.Index(fields=["finished_at"], name="debounce_job_finished_at"),
        ),
    ]
