"""Settings of the example project.

SQLite by default (a file next to this module, ``example_project/db.sqlite3``,
ignored by git; ``DEBOUNCE_EXAMPLE_SQLITE`` moves it), PostgreSQL (or any
database dj-database-url understands) when ``DATABASE_URL`` is set, e.g.
``DATABASE_URL=postgres://postgres@127.0.0.1:5432/demo``.
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-project-only-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "[::1]"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_debounce",
    "example_project.docs",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

# SQLite waits for the write lock at BEGIN (IMMEDIATE) instead of failing with
# "database is locked" when a producer and a worker write at once (check W001).
SQLITE_OPTIONS = {"transaction_mode": "IMMEDIATE", "timeout": 20}

_url = os.environ.get("DATABASE_URL")
if _url:
    DATABASES = {"default": dj_database_url.parse(_url, conn_max_age=0)}
    if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
        DATABASES["default"].setdefault("OPTIONS", {}).update(SQLITE_OPTIONS)
    elif DATABASES["default"]["ENGINE"] == "django.db.backends.mysql":
        # MariaDB/MySQL as docs/howto/databases.md asks (check W002).
        DATABASES["default"].setdefault("OPTIONS", {}).update(
            {"isolation_level": "read committed", "charset": "utf8mb4"}
        )
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("DEBOUNCE_EXAMPLE_SQLITE", str(BASE_DIR / "db.sqlite3")),
            "OPTIONS": dict(SQLITE_OPTIONS),
        }
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
USE_I18N = True
STATIC_URL = "static/"

# The task's own defaults are 1h/2h; replay_events passes the window and max
# wait per call. Workers of this project poll every second when idle.
DEBOUNCE_POLL_INTERVAL = 1.0

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django_debounce": {
            "handlers": ["console"],
            "level": os.environ.get("DEBOUNCE_LOG_LEVEL", "WARNING"),
            "propagate": False,
        }
    },
}
