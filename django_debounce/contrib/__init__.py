"""Integrations: Celery, Django's tasks framework, Prometheus. Each is optional.

Only the package's edges (``apps.py``, the management commands, the faces kept
for typed paths) import them; each imports its library lazily.
"""
