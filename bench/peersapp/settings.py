"""``bench.settings`` plus this app, for the worker subprocesses of ``bench/peers.py``.

``DEBOUNCE_PEERS_CONN_MAX_AGE`` (set by ``peers.py --conn-max-age``) overrides the
database's ``CONN_MAX_AGE`` (``bench.settings``: 0, Django's default): seconds, or
``None`` for persistent connections.
"""

from __future__ import annotations

import os

from bench.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "bench.peersapp"]  # noqa: F405
if os.environ.get("DEBOUNCE_PEERS_CONN_MAX_AGE"):
    _age = os.environ["DEBOUNCE_PEERS_CONN_MAX_AGE"]
    DATABASES["default"]["CONN_MAX_AGE"] = None if _age == "None" else int(_age)  # noqa: F405
# bench/drain.py --prefetch: the worker's DEBOUNCE_PREFETCH (issue #12).
if os.environ.get("DEBOUNCE_PEERS_PREFETCH"):
    DEBOUNCE_PREFETCH = int(os.environ["DEBOUNCE_PEERS_PREFETCH"])
