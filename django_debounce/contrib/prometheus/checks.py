"""System checks of the Prometheus metrics' environment (E042, E043; E040, E041 are the settings').

Registered by :func:`django_debounce.checks.register_checks` with the rest; ids are
listed in docs/reference/checks.md and never renumbered.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from django.core.checks import CheckMessage, Error

from ...conf import settings
from ...exceptions import ConfigurationError


def check_metrics(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E042, E043: what the metrics need of the environment (docs/howto/metrics.md, issue #11).

    E042 ``DEBOUNCE_METRICS = True`` without prometheus_client; E043
    ``PROMETHEUS_MULTIPROC_DIR`` names no writable directory (every process
    would fail at its first metric update). The settings' own values are rows
    of the settings table (E040 ``DEBOUNCE_METRICS`` not None/True/False, E041
    a malformed bucket setting: :func:`django_debounce.checks.settings.check_settings`).
    """
    messages: list[CheckMessage] = []
    try:
        enabled = settings.metrics
    except ConfigurationError:  # E040, the row's own check, reports it
        enabled = None
    if enabled is False:
        return messages
    if enabled and importlib.util.find_spec("prometheus_client") is None:
        messages.append(
            Error(
                "DEBOUNCE_METRICS = True but prometheus_client is not installed.",
                hint="pip install 'django-debounce[prometheus]', or set DEBOUNCE_METRICS = None "
                "(metrics on only when it is installed) or False.",
                id="django_debounce.E042",
            )
        )
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory and not (os.path.isdir(directory) and os.access(directory, os.W_OK)):
        messages.append(
            Error(
                f"PROMETHEUS_MULTIPROC_DIR={directory!r} is not a writable directory.",
                hint="Create it (empty) before the processes start, and wipe it at every "
                "deployment; see docs/howto/metrics.md, 'Several processes on one host'.",
                id="django_debounce.E043",
            )
        )
    return messages
