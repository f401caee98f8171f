"""The one reader of ``django.conf.settings`` for ``DEBOUNCE_*`` names.

Every setting is a row of the table in :mod:`django_debounce.conf.table`
(decision 171): its name, default, parser, check id and hint, declared once.
The package reads a setting as an attribute of :data:`settings`
(``settings.lease``), parsed through its row at the first read and kept until
Django's ``setting_changed`` signal names it (``override_settings`` sends it);
``settings.codel`` is read on every claim and ``settings.use_tz`` on every
enqueue, so a kept value is a plain attribute. ``manage.py check`` parses every
row the same way (:mod:`django_debounce.checks.settings`).
"""

from __future__ import annotations

from typing import Any

from .auto_retry import AUTO_RETRY_DEFAULTS, AutoRetry, parse_auto_retry
from .metrics import parse_buckets, parse_metrics_enabled
from .numbers import MIN_PAYLOAD_BYTES, parse_max_payload_bytes
from .queues import CODEL_KEYS, QUEUE_KEYS, CodelSettings, parse_queues
from .redis import parse_redis_alias
from .retention import Prune, parse_prune
from .setting import Setting
from .table import ROWS, Settings, settings

#: Default of every ``DEBOUNCE_*`` setting, by its name without the prefix (``"LEASE"``):
#: read from the table's rows, not declared again.
DEFAULTS: dict[str, Any] = {row.key: row.default for row in ROWS}

__all__ = [
    "AUTO_RETRY_DEFAULTS",
    "CODEL_KEYS",
    "DEFAULTS",
    "MIN_PAYLOAD_BYTES",
    "QUEUE_KEYS",
    "ROWS",
    "AutoRetry",
    "CodelSettings",
    "Prune",
    "Setting",
    "Settings",
    "parse_auto_retry",
    "parse_buckets",
    "parse_max_payload_bytes",
    "parse_metrics_enabled",
    "parse_prune",
    "parse_queues",
    "parse_redis_alias",
    "settings",
]
