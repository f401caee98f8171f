"""Settings of the django-tasks-db peer: Django's ``django.tasks`` on the database backend.

The database is ``DEBOUNCE_PEER_URL`` (a database of its own, made by
``bench/peer_run.py``); ``CONN_MAX_AGE = 0`` as in ``bench/settings.py``.
"""

from __future__ import annotations

import os

import dj_database_url

SECRET_KEY = "bench-only-not-secret"
DEBUG = False
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django_tasks_db"]
DATABASES = {"default": dj_database_url.parse(os.environ["DEBOUNCE_PEER_URL"], conn_max_age=0)}
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "loggers": {"django.tasks": {"level": "WARNING"}, "django_tasks_db": {"level": "WARNING"}},
}
