"""Job.cancel_requested_at and Job.timeout: cancelling a running job, time limits (decisions 186, 187)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_debounce", "0008_periodic_tick"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="cancel_requested_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="timeout",
            field=models.DurationField(blank=True, null=True),
        ),
    ]
