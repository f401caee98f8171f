"""System checks of the Prometheus metrics (E040–E043).

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
    """E040–E043: the metrics settings and environment (docs/howto/metrics.md, issue #11).

    E040 ``DEBOUNCE_METRICS`` is not None/True/False; E041 a bucket setting is
    malformed; E042 ``DEBOUNCE_METRICS = True`` without prometheus_client;
    E043 ``PROMETHEUS_MULTIPROC_DIR`` names no writable directory (every
    process would fail at its first metric update).
    """
    messages: list[CheckMessage] = []
    try:
        enabled = settings.metrics
    except ConfigurationError as exc:
        messages.append(
            Error(
                str(exc),
                hint="None (the default: on when prometheus_client is installed), True or False.",
                id="django_debounce.E040",
            )
        )
        enabled = None
    for attr in ("metrics_delay_buckets", "metrics_duration_buckets"):
        try:
            getattr(settings, attr)
        except ConfigurationError as exc:
            messages.append(
                Error(
                    str(exc),
                    hint=(
                        "Finite upper bounds in seconds, increasing, e.g. [1, 5, 30, 60, 300]; "
                        "prometheus_client adds +Inf itself."
                    ),
                    id="django_debounce.E041",
                )
            )
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
