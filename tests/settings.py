"""Test settings: a SQLite file by default, PostgreSQL or MariaDB when DATABASE_URL is set."""

from __future__ import annotations

import json
import os
from importlib.util import find_spec
from pathlib import Path

import dj_database_url
import django

BASE_DIR = Path(__file__).resolve().parent
SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# Tests that send mail capture it in django.core.mail.outbox. Django 6.1 configures mail
# with MAILERS (and warns without it) and refuses EMAIL_BACKEND beside it.
if django.VERSION >= (6, 1):
    MAILERS = {"default": {"BACKEND": "django.core.mail.backends.locmem.EmailBackend"}}
else:
    EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",  # the admin's CSS/JS under live_server (browser tests)
    "django_debounce",
    "tests.testapp",
    "example_project.docs",
]
# Django's tasks framework runs on DebounceBackend (tests/testapp/tasks_django.py):
# django.tasks on Django 6.0+, the django-tasks backport (test dependency group) on 5.2.
if django.VERSION < (6, 0) and find_spec("django_tasks") is not None:
    INSTALLED_APPS.append("django_tasks")
TASKS = {
    "default": {
        "BACKEND": os.environ.get(
            "DEBOUNCE_TEST_TASKS_BACKEND",
            "django_debounce.contrib.django_tasks.backend.DebounceBackend",
        ),
        "QUEUES": ["default", "django"],
        **json.loads(os.environ.get("DEBOUNCE_TEST_TASKS_EXTRA", "{}")),
    }
}
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
STATIC_URL = "static/"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
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

_url = os.environ.get("DATABASE_URL")
if _url:
    DATABASES = {"default": dj_database_url.parse(_url, conn_max_age=0)}
    # Parallel test runs on one server each need their own test database.
    DATABASES["default"]["TEST"] = {"NAME": os.environ.get("DEBOUNCE_TEST_DB_NAME")}
    if DATABASES["default"]["ENGINE"] == "django.db.backends.mysql":
        # MariaDB/MySQL as docs/howto/databases.md asks: READ COMMITTED (check W002), and
        # utf8mb4 (Django 5.2+'s default, spelled out) for the connection and the test
        # database, so any text a task stores fits (utf8mb3 holds no 4-byte characters).
        DATABASES["default"].setdefault("OPTIONS", {}).update(
            {"isolation_level": "read committed", "charset": "utf8mb4"}
        )
        DATABASES["default"]["TEST"]["CHARSET"] = "utf8mb4"
    else:
        # Reliability tests tag a worker subprocess's connections (pg_stat_activity).
        if os.environ.get("DEBOUNCE_TEST_APP_NAME"):
            DATABASES["default"].setdefault("OPTIONS", {})["application_name"] = os.environ[
                "DEBOUNCE_TEST_APP_NAME"
            ]
        # Connection-hygiene tests give a worker subprocess session settings of the server
        # (libpq options, e.g. "-c idle_session_timeout=1500"): per session, never ALTER SYSTEM.
        if os.environ.get("DEBOUNCE_TEST_PG_OPTIONS"):
            DATABASES["default"].setdefault("OPTIONS", {})["options"] = os.environ[
                "DEBOUNCE_TEST_PG_OPTIONS"
            ]
else:
    _name = os.environ.get(
        "DEBOUNCE_TEST_SQLITE", str(BASE_DIR.parent / ".artifacts" / "tests.sqlite3")
    )
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": _name,
            "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20},
            "TEST": {"NAME": _name.replace(".sqlite3", "-test.sqlite3")},
        }
    }

# Reliability tests run worker subprocesses with other values (env-driven).
if os.environ.get("DEBOUNCE_TEST_CONN_MAX_AGE"):
    _age = os.environ["DEBOUNCE_TEST_CONN_MAX_AGE"]
    DATABASES["default"]["CONN_MAX_AGE"] = None if _age == "None" else int(_age)
if os.environ.get("DEBOUNCE_TEST_CONN_HEALTH_CHECKS"):
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = (
        os.environ["DEBOUNCE_TEST_CONN_HEALTH_CHECKS"] == "1"
    )

DEBOUNCE_LEASE = os.environ.get("DEBOUNCE_TEST_LEASE", "60s")
if os.environ.get("DEBOUNCE_TEST_SHUTDOWN_GRACE"):
    DEBOUNCE_SHUTDOWN_GRACE = os.environ["DEBOUNCE_TEST_SHUTDOWN_GRACE"]
# Drain tests (issue #12) set the prefetch and the success flush interval of worker subprocesses.
if os.environ.get("DEBOUNCE_TEST_PREFETCH"):
    DEBOUNCE_PREFETCH = int(os.environ["DEBOUNCE_TEST_PREFETCH"])
if os.environ.get("DEBOUNCE_TEST_SUCCESS_FLUSH_INTERVAL"):
    DEBOUNCE_SUCCESS_FLUSH_INTERVAL = float(os.environ["DEBOUNCE_TEST_SUCCESS_FLUSH_INTERVAL"])
# Time-limit and cancel tests (decisions 186, 187) set these in worker subprocesses.
for _name in ("TIMEOUT_GRACE", "CANCEL_POLL_INTERVAL", "MAX_STUCK_THREADS"):
    if os.environ.get(f"DEBOUNCE_TEST_{_name}"):
        globals()[f"DEBOUNCE_{_name}"] = json.loads(os.environ[f"DEBOUNCE_TEST_{_name}"])
DEBOUNCE_MIN_BACKOFF = "5s"
DEBOUNCE_MAX_BACKOFF = "5m"
# The attack test gives worker subprocesses a DEBOUNCE_SCHEDULES (JSON in the environment).
if os.environ.get("DEBOUNCE_TEST_SCHEDULES"):
    DEBOUNCE_SCHEDULES = json.loads(os.environ["DEBOUNCE_TEST_SCHEDULES"])
# CoDel tests give worker subprocesses a DEBOUNCE_QUEUES (JSON in the environment).
if os.environ.get("DEBOUNCE_TEST_QUEUES"):
    DEBOUNCE_QUEUES = json.loads(os.environ["DEBOUNCE_TEST_QUEUES"])

# The Redis bucket store (DEBOUNCE_REDIS, docs/howto/redis.md): a django-redis cache on the
# local Redis (database 15), its keys under a prefix of this test process (worker subprocesses
# get their parent's through DEBOUNCE_TEST_REDIS_PREFIX). Tests switch the store on with
# DEBOUNCE_REDIS = "redis" (subprocesses: DEBOUNCE_TEST_REDIS=1); a private server's URL
# replaces the shared one through DEBOUNCE_TEST_REDIS_URL.
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "redis": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": os.environ.get("DEBOUNCE_TEST_REDIS_URL", "redis://127.0.0.1:6379/15"),
        "KEY_PREFIX": os.environ.get("DEBOUNCE_TEST_REDIS_PREFIX", f"dd-test-{os.getpid()}"),
        # A stopped server must fail a call at once, not hang a claim.
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.5, "SOCKET_TIMEOUT": 0.5},
    },
}
if os.environ.get("DEBOUNCE_TEST_REDIS") == "1":
    DEBOUNCE_REDIS = "redis"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"null": {"class": "logging.NullHandler"}},
    "loggers": {"django_debounce": {"handlers": ["null"], "level": "INFO", "propagate": True}},
}
if os.environ.get("DEBOUNCE_TEST_NO_LOGGING"):  # a project that configures no logging at all
    LOGGING = {"version": 1, "disable_existing_loggers": False}
elif os.environ.get("DEBOUNCE_TEST_LOG_STDERR"):  # subprocess workers: log to the captured stderr
    LOGGING["handlers"]["stderr"] = {"class": "logging.StreamHandler"}
    LOGGING["loggers"]["django_debounce"]["handlers"] = ["stderr"]

# Wake-up tests give worker subprocesses a wake-up and a private Redis (docs/howto/wakeup.md).
if os.environ.get("DEBOUNCE_TEST_WAKEUP"):
    DEBOUNCE_WAKEUP = os.environ["DEBOUNCE_TEST_WAKEUP"]
# (Its own variable: DEBOUNCE_TEST_REDIS_URL moves the bucket store's cache above.)
if os.environ.get("DEBOUNCE_TEST_WAKE_REDIS_URL"):
    CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "wake": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": os.environ["DEBOUNCE_TEST_WAKE_REDIS_URL"],
            "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 2},
        },
    }
    DEBOUNCE_REDIS = "wake"

# A tracing test reads this process's spans (tests/otel_export.py; any subprocess, either executor).
if os.environ.get("DEBOUNCE_TEST_OTEL_SPANS"):
    from tests.otel_export import install

    install(os.environ["DEBOUNCE_TEST_OTEL_SPANS"])
