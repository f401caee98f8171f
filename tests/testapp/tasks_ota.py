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
