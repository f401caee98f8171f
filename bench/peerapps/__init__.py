"""The peers of ``bench/peer_run.py``, imported only inside ``bench/.venv-peers``.

Each module holds one peer's no-op task and its ``stamp`` task (for the idle
latency), importable by module path so that the peer's own worker process
finds them: ``djtasks_settings``/``djtasks_tasks`` (django-tasks-db on
Django's ``django.tasks``), ``procrastinate_app`` (a plain procrastinate
``App`` on ``PsycopgConnector``) and ``celery_app`` (Celery on Redis). Every
no-op calls ``bench.peersapp.counter.hit`` (one Redis ``INCR``), as our side's
does, so one instrument times every worker. The project's package is never
imported here.
"""
