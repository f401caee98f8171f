"""A tiny app for ``bench/peers.py``: the no-op tasks of both worker systems.

``tasks.py`` holds the django_debounce tasks (found by the package's
autodiscovery, so a ``run_debounce_worker`` subprocess run with
``--settings bench.peersapp.settings`` knows them); ``celery_bench.py`` holds the
Celery app and its no-op task. Both no-ops call :func:`counter.hit`, so the two
workers are timed by the same instrument.
"""
