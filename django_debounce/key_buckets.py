"""The KeyBucket row: the token bucket of one debounce key of a task (``rate_limit_per_key=``, decision 189).

Kept out of :mod:`django_debounce.models` (which re-exports it) so that module
stays one concept. One row per (task name, key hash) whose bucket is not full:
a row whose bucket has refilled (``full_at <= now``) says nothing a missing
row does not (a missing row is a full bucket), so the claim deletes such rows
(:func:`django_debounce.flow.key_rates.prune_full`) and the table holds only
the keys that ran within the last refill time (capacity / rate), however many
keys a task ever saw.
"""

from __future__ import annotations

from django.db import models


class KeyBucket(models.Model):
    """The token bucket of one debounce key of one task (§6, ``rate_limit_per_key=``).

    Written only by a claim transaction, under the row's lock, like the
    task-wide bucket of :class:`~django_debounce.models.TaskState`.
    """

    id = models.BigAutoField(primary_key=True)
    task_name = models.CharField(max_length=255)
    key_hash = models.CharField(max_length=64)
    """The job's ``key_hash`` (the hash of its debounce key)."""
    tokens = models.FloatField()
    """Bucket level at ``tokens_at``."""
    tokens_at = models.DateTimeField()
    blocked_until = models.DateTimeField(null=True, blank=True)
    """``on_excess="defer"``: when the next whole token comes, while the bucket holds none
    (the claim's candidate query leaves the key's jobs out until then); else NULL."""
    full_at = models.DateTimeField()
    """When the bucket is full again; from then on the row may be deleted."""

    class Meta:
        app_label = "django_debounce"
        constraints = [
            models.UniqueConstraint(fields=["task_name", "key_hash"], name="debounce_keybucket_key")
        ]
        indexes = [models.Index(fields=["full_at"], name="debounce_keybucket_full")]

    def __str__(self) -> str:
        return f"{self.task_name} bucket of key {self.key_hash[:12]}"
