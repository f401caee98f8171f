"""``bench.settings`` plus this app, for the worker subprocess of ``bench/latency.py``.

``DEBOUNCE_LATENCY_WAKEUP`` sets ``DEBOUNCE_WAKEUP`` (``notify`` or ``poll``);
``DEBOUNCE_LATENCY_POLL`` the poll interval in seconds; ``DEBOUNCE_LATENCY_CONN_MAX_AGE``
the database's ``CONN_MAX_AGE`` (default 0, Django's; ``None``: persistent).
"""

from __future__ import annotations

import os

from bench.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "bench.latencyapp"]  # noqa: F405
DEBOUNCE_WAKEUP = os.environ.get("DEBOUNCE_LATENCY_WAKEUP", "auto")
DEBOUNCE_POLL_INTERVAL = float(os.environ.get("DEBOUNCE_LATENCY_POLL", "1.0"))
if os.environ.get("DEBOUNCE_LATENCY_CONN_MAX_AGE"):
    _age = os.environ["DEBOUNCE_LATENCY_CONN_MAX_AGE"]
    DATABASES["default"]["CONN_MAX_AGE"] = None if _age == "None" else int(_age)  # noqa: F405
