"""The django-tasks-db peer's tasks (``django.tasks.task``; run by ``manage.py db_worker``)."""

from __future__ import annotations

from django.tasks import task

from bench.peersapp import counter

from . import stamps


@task
def noop(n: int) -> None:
    """Do nothing but count: the drain's job."""
    counter.hit()


@task
def stamp(tag: str) -> None:
    """Record the start time: the idle-latency job."""
    stamps.push(tag)
