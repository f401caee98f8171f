"""Enqueueing calls: a window slides or opens, in one statement per call.

Entry points: :func:`django_debounce.enqueueing.call.enqueue` (one call) and
:func:`django_debounce.enqueueing.bulk.enqueue_many` (many, in one transaction);
the package face :mod:`django_debounce` offers both. How a call is planned is
:mod:`.planning`; the slide-or-insert statement :mod:`.upsert`; retries under
contention :mod:`.contention`.

Nothing is imported here: importing this package imports no models.
"""
