"""Models the tests' tasks write to, so runs can be counted across processes."""

from __future__ import annotations

from django.db import models


class CallLog(models.Model):
    """One row per task run: which task, with what, when, in which process."""

    task = models.CharField(max_length=200)
    key = models.CharField(max_length=200, blank=True, default="")
    payload = models.JSONField(default=dict)
    job_id = models.BigIntegerField(null=True)
    pid = models.IntegerField(default=0)
    started_at = models.DateTimeField(null=True)
    finished_at = models.DateTimeField(null=True)


class Order(models.Model):
    """A thing a view or signal creates before enqueueing work about it."""

    name = models.CharField(max_length=100, unique=True)
