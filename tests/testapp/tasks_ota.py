"""Tasks of the OpenTelemetry attack tests (names start with ``ota.``).

They change no global behaviour, so they are registered at app load.
"""

from __future__ import annotations

from django_debounce import task

#: The ``n`` of each run of ``ota.window`` in this process.
RAN: list[int] = []


@task(name="ota.window", debounce="10s", debounce_max_wait="1h", debounce_key="w:{key}")
def window(key: str, n: int = 0) -> int:
    """A debounced task: a burst of calls with one key runs once."""
    RAN.append(n)
    return n


@task(name="ota.plain")
def plain(n: int) -> int:
    """A plain task."""
    RAN.append(n)
    return n


class OtaError(Exception):
    """Raised by ``ota.fails``."""


@task(name="ota.fails", max_retries=0)
def fails(n: int) -> int:
    """Fail every run, for good: a dead letter at once."""
    raise OtaError(f"run {n} failed")


@task(
    name="ota.lead",
    debounce="10s",
    debounce_max_wait="1h",
    debounce_key="l:{key}",
    debounce_edge="both",
)
def lead(key: str, n: int = 0) -> int:
    """Both edges: the first call runs at once, a later call of the window at its end."""
    RAN.append(n)
    return n


@task(name="ota.slow", timeout="0.2s", max_retries=0, takes_context=True)
def slow(context, seconds: float) -> None:  # noqa: ANN001  (JobContext; a test task)
    """Work past its 0.2 s timeout, checking for it (the soft limit) every 10 ms."""
    import time

    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        context.checkpoint()
        time.sleep(0.01)


@task(name="ota.progress", takes_context=True)
def progress(context, n: int) -> int:  # noqa: ANN001  (JobContext; a test task)
    """Report progress twice."""
    context.set_progress(1, 2, "half")
    context.set_progress(2, 2, "done")
    return n
