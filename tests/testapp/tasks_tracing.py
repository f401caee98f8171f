"""Tasks of the OpenTelemetry tests (names start with ``otl.``; decision 213).

No ``executor=``: ``DEBOUNCE_EXECUTOR`` picks the built-in worker or Celery
(tests/processes/contrib/celery/test_celery_tracing.py runs ``otl.window``
through a real ``celery worker``). They change no global behaviour, so they are
registered at app load like the other test tasks.
"""

from __future__ import annotations

from django_debounce import task

#: The span id current inside the last run of ``otl.window`` in this process.
INSIDE: list[int] = []


class TracedError(Exception):
    """Raised by ``otl.fails``."""


@task(name="otl.window", debounce="10s", debounce_max_wait="1h", debounce_key="w:{key}")
def window(key: str, n: int = 0) -> int:
    """A debounced task: a burst of calls with one key runs once; it notes its current span."""
    from opentelemetry import trace  # here: importing the test app needs no OpenTelemetry

    INSIDE.append(trace.get_current_span().get_span_context().span_id)
    return n


@task(name="otl.plain")
def plain(n: int) -> int:
    """A plain task."""
    return n


@task(name="otl.unique", unique_key="u:{key}")
def unique(key: str) -> str:
    """A coalescing task."""
    return key


@task(name="otl.fails", max_retries=1)
def fails(n: int) -> int:
    """Fail every run: retried once, then dead-lettered."""
    raise TracedError(f"run {n} failed")


@task(name="otl.quick", debounce="1s", debounce_max_wait="30s", debounce_key="q:{key}")
def quick(key: str, n: int = 0) -> int:
    """A debounced task with a short window, for the process test (either executor)."""
    return n


@task(
    name="otl.celery_window",
    executor="celery",
    debounce="10s",
    debounce_max_wait="1h",
    debounce_key="c:{key}",
)
def celery_window(key: str, n: int = 0) -> int:
    """A debounced task of the Celery executor (run in-process through ``run_handed_off``)."""
    return n


@task(name="otl.celery_fails", executor="celery", max_retries=0)
def celery_fails(n: int) -> int:
    """A Celery-executor task that fails once, for good."""
    raise TracedError(f"celery run {n} failed")
