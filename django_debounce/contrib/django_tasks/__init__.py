"""Django's tasks framework (``django.tasks``): the ``DebounceBackend`` and its results.

Configured by path as ``"django_debounce.backends.DebounceBackend"`` in ``TASKS``.
"""
