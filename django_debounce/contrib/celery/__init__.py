"""The Celery executor: the dispatcher, the hand-off, Celery's tasks, routing, checks, metrics.

:class:`django_debounce.contrib.celery.executor.Dispatcher` publishes due jobs
(:mod:`.handoff`); Celery workers run them through :mod:`.tasks`. Needs the
``celery`` extra.
"""
