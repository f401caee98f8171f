"""The path Django's ``TASKS`` setting names: ``"django_debounce.backends.DebounceBackend"``.

A face kept for that setting; the backend lives in
:mod:`django_debounce.contrib.django_tasks.backend`.
"""

from __future__ import annotations

from .contrib.django_tasks.backend import DebounceBackend

__all__ = ["DebounceBackend"]
