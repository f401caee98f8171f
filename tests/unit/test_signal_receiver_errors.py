"""A signal receiver that raises is logged exactly once (by Django's ``send_robust``) and
never reaches the sender (decision 33)."""

from __future__ import annotations

import logging

from django_debounce.models import Job
from django_debounce.signals import job_started, send_signal


def test_a_raising_receiver_is_logged_once_and_not_propagated(caplog):
    def broken(sender, **kwargs):
        raise RuntimeError("receiver bug")

    job_started.connect(broken, sender=Job, weak=False, dispatch_uid="tests.broken")
    try:
        with caplog.at_level(logging.DEBUG):
            send_signal(job_started, job=Job(pk=1))
    finally:
        job_started.disconnect(sender=Job, dispatch_uid="tests.broken")

    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [(r.name, type(r.exc_info[1]).__name__) for r in errors] == [
        ("django.dispatch", "RuntimeError")
    ]
