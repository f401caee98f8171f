"""The table of settings: every ``DEBOUNCE_*`` setting, declared once (decision 171).

Each row of :class:`Settings` names one setting, its default, its parser, the
system check id that reports a value the parser refuses, and that check's
hint; the row's attribute is how the package reads the setting
(``settings.lease``). docs/reference/settings.md documents every row with its
default, and docs/reference/checks.md every id (tests/unit/test_settings_table.py
holds both to the table). The system checks loop over :data:`ROWS`
(:func:`django_debounce.checks.settings.check_settings`); what a setting needs
of another setting, of the database or of the environment is a named check.
"""

from __future__ import annotations

from datetime import timedelta
from functools import partial
from typing import Any

from django.core.signals import setting_changed

from .auto_retry import parse_auto_retry
from .durations import parse_duration
from .executor import (
    parse_celery_app,
    parse_celery_queues,
    parse_executor,
    parse_unknown_task_grace,
)
from .metrics import parse_buckets, parse_metrics_enabled
from .numbers import (
    parse_backoff_jitter,
    parse_count,
    parse_enqueue_retries,
    parse_flush_interval,
    parse_max_payload_bytes,
    parse_max_retries,
    parse_poll_interval,
    parse_prefetch,
)
from .queues import parse_queues
from .redis import parse_redis_alias
from .retention import parse_prune
from .schedules import parse_schedules
from .setting import PREFIX, Setting, optional
from .wakeup import parse_wakeup


def _duration(name: str) -> partial[timedelta]:
    """The parser of the duration setting ``name`` (its message names the setting)."""
    return partial(parse_duration, name=name)


def _duration_hint(name: str) -> str:
    return f"Set {name} to seconds, a timedelta, or a string like '10s' or '5m'."


class Settings:
    """The typed, cached view of every ``DEBOUNCE_*`` setting: one row per attribute.

    Each attribute parses its setting at its first read and keeps the value
    (a plain attribute from then on) until Django's ``setting_changed`` signal
    names the setting (``override_settings`` and pytest-django's ``settings``
    fixture send it). A value that does not parse raises
    :class:`~django_debounce.exceptions.ConfigurationError` at every read;
    ``manage.py check`` reports it first, under the row's id.
    """

    # -- debouncing ---------------------------------------------------------------------
    #: Window of ``@debounced_task`` without ``debounce=``; None: ``debounce=`` is required.
    default_window = Setting(
        "DEBOUNCE_DEFAULT_WINDOW",
        None,
        optional(_duration("DEBOUNCE_DEFAULT_WINDOW")),
        "E001",
        _duration_hint("DEBOUNCE_DEFAULT_WINDOW"),
    )
    #: Max wait of a debounced task or call that gives none; None: each must give one.
    default_max_wait = Setting(
        "DEBOUNCE_DEFAULT_MAX_WAIT",
        None,
        optional(_duration("DEBOUNCE_DEFAULT_MAX_WAIT")),
        "E002",
        _duration_hint("DEBOUNCE_DEFAULT_MAX_WAIT"),
    )

    # -- the worker and its leases --------------------------------------------------------
    #: How long a claim holds a job before another worker may reclaim it (§7).
    lease = Setting(
        "DEBOUNCE_LEASE",
        "60s",
        _duration("DEBOUNCE_LEASE"),
        "E004",
        _duration_hint("DEBOUNCE_LEASE"),
    )
    #: Seconds between polls of an idle worker (finite, over 0, at most a day).
    poll_interval = Setting(
        "DEBOUNCE_POLL_INTERVAL",
        1.0,
        parse_poll_interval,
        "E010",
        "How long an idle worker sleeps between polls, e.g. DEBOUNCE_POLL_INTERVAL = 1.0.",
    )
    #: Jobs a busy worker claims beyond its free threads (issue #12; decision 121).
    prefetch = Setting(
        "DEBOUNCE_PREFETCH",
        100,
        parse_prefetch,
        "E055",
        "It counts the jobs a busy worker claims beyond its free threads, e.g. "
        "DEBOUNCE_PREFETCH = 100 (the default); 0 claims only for free threads.",
    )
    #: Longest a success waits for its batched write, in seconds (the built-in worker, and a Celery
    #: worker process whose run task stores no result, decision 215); 0: write each at once.
    success_flush_interval = Setting(
        "DEBOUNCE_SUCCESS_FLUSH_INTERVAL",
        0.1,
        parse_flush_interval,
        "E056",
        "It is the longest a finished job's success waits for its batched write, "
        "e.g. 0.1 (the default); 0 writes each success at once. Keep it well "
        "below DEBOUNCE_LEASE.",
    )
    #: How an idle worker learns of new work: auto, notify, redis or poll (decision 80).
    wakeup = Setting(
        "DEBOUNCE_WAKEUP",
        "auto",
        parse_wakeup,
        "E020",
        "Use one of 'auto', 'notify', 'redis', 'poll' (docs/howto/wakeup.md).",
    )
    #: Longest a running job's context trusts its last read of a cancel request (decision 186).
    cancel_poll_interval = Setting(
        "DEBOUNCE_CANCEL_POLL_INTERVAL",
        1.0,
        partial(parse_poll_interval, name="DEBOUNCE_CANCEL_POLL_INTERVAL"),
        "E060",
        "Seconds between a running job's reads of its cancel request, e.g. "
        "DEBOUNCE_CANCEL_POLL_INTERVAL = 1.0 (docs/howto/cancel-running-jobs.md).",
    )
    #: How long past its timeout a sync job may run before its thread is retired (decision 187).
    timeout_grace = Setting(
        "DEBOUNCE_TIMEOUT_GRACE",
        "10s",
        _duration("DEBOUNCE_TIMEOUT_GRACE"),
        "E061",
        _duration_hint("DEBOUNCE_TIMEOUT_GRACE"),
    )
    #: Retired (stuck) job threads a worker keeps before it exits to be restarted (decision 187).
    max_stuck_threads = Setting(
        "DEBOUNCE_MAX_STUCK_THREADS",
        2,
        partial(parse_count, name="DEBOUNCE_MAX_STUCK_THREADS", low=0),
        "E062",
        "An int >= 0, e.g. DEBOUNCE_MAX_STUCK_THREADS = 2 (the default): one more stuck "
        "thread and the worker exits with status 75 (docs/howto/time-limits.md).",
    )
    #: How long SIGTERM waits for running jobs.
    shutdown_grace = Setting(
        "DEBOUNCE_SHUTDOWN_GRACE",
        "30s",
        _duration("DEBOUNCE_SHUTDOWN_GRACE"),
        "E007",
        _duration_hint("DEBOUNCE_SHUTDOWN_GRACE"),
    )

    # -- retries (§7) ---------------------------------------------------------------------
    #: Retries after the first attempt, for tasks without ``max_retries=`` (0..10,000).
    max_retries = Setting(
        "DEBOUNCE_MAX_RETRIES",
        3,
        parse_max_retries,
        "E009",
        "It counts retries after the first attempt; 0 means run once. Every enqueue "
        "of a task without its own max_retries uses it, under the same rule.",
    )
    #: Delay before the first retry.
    min_backoff = Setting(
        "DEBOUNCE_MIN_BACKOFF",
        "1s",
        _duration("DEBOUNCE_MIN_BACKOFF"),
        "E005",
        _duration_hint("DEBOUNCE_MIN_BACKOFF"),
    )
    #: Cap on a retry's base delay.
    max_backoff = Setting(
        "DEBOUNCE_MAX_BACKOFF",
        "1h",
        _duration("DEBOUNCE_MAX_BACKOFF"),
        "E006",
        _duration_hint("DEBOUNCE_MAX_BACKOFF"),
    )
    #: Spread retries with equal jitter: a delay drawn from [base / 2, base].
    backoff_jitter = Setting(
        "DEBOUNCE_BACKOFF_JITTER",
        True,
        parse_backoff_jitter,
        "E016",
        "True (the default) draws each retry's delay from [base / 2, base] so jobs "
        "that failed together spread out; False waits exactly base.",
    )

    # -- enqueue ----------------------------------------------------------------------------
    #: Attempts of an enqueue that loses a race or waits on a lock (§4.4).
    enqueue_retries = Setting(
        "DEBOUNCE_ENQUEUE_RETRIES",
        20,
        parse_enqueue_retries,
        "E015",
        "It counts the attempts an enqueue makes when it loses a race or waits on "
        "a lock before it raises EnqueueContentionError, e.g. "
        "DEBOUNCE_ENQUEUE_RETRIES = 20 (the default; values below 1 count as 1).",
    )
    #: Largest JSON text of a job's args + kwargs (and of its metadata, and of a result), in
    #: bytes (decision 29).
    max_payload_bytes = Setting(
        "DEBOUNCE_MAX_PAYLOAD_BYTES",
        1024 * 1024,
        parse_max_payload_bytes,
        "E014",
        "It caps the JSON text of a job's arguments, metadata and result, in bytes. "
        "The default, 1048576 (1 MiB), leaves a wide margin under MariaDB's default "
        "max_allowed_packet of 16 MiB; keep it below your database's packet limit.",
    )

    # -- Redis ------------------------------------------------------------------------------
    #: The django-redis cache alias of the rate-limit buckets and the Redis wake-up; None: off.
    redis = Setting(
        "DEBOUNCE_REDIS",
        None,
        parse_redis_alias,
        "E035",
        'Name a CACHES alias served by django-redis, e.g. DEBOUNCE_REDIS = "default".',
    )

    # -- dead letters and retention ---------------------------------------------------------
    #: The automatic retry sweep of dead letters (§8, §11); None: off.
    dead_letter_auto_retry = Setting(
        "DEBOUNCE_DEAD_LETTER_AUTO_RETRY",
        None,
        parse_auto_retry,
        "E013",
        'Use None (off) or {"every": "10m", "min_age": "10m", "max_retries": 3}: '
        "every and min_age durations longer than zero, max_retries an int >= 1, "
        "no other keys.",
    )
    #: The worker's automatic prune of finished jobs (issue #11, decision 112); None: off.
    prune = Setting(
        "DEBOUNCE_PRUNE",
        None,
        parse_prune,
        "E045",
        'Use None (off) or {"older_than": "7d", "every": "1h", "batch_size": 1000, '
        '"dead_letters": False}: durations longer than zero, batch_size an int '
        ">= 1, dead_letters a bool, no other keys.",
    )

    # -- queues -----------------------------------------------------------------------------
    #: Queue name -> CoDel settings, for the queues with CoDel on (§6, §11). Read on every
    #: claim; the dict is shared: do not change it.
    codel = Setting(
        "DEBOUNCE_QUEUES",
        {},
        parse_queues,
        "E012",
        'Use {"queue": {"codel": {"target": "500ms", "interval": "5s"}}}: both '
        "durations longer than zero, the target shorter than the interval "
        "(RFC 8289 suggests 5-10% of it), no other keys.",
    )

    # -- metrics (docs/howto/metrics.md) ----------------------------------------------------
    #: None: metrics on when prometheus_client imports; True: on; False: off.
    metrics = Setting(
        "DEBOUNCE_METRICS",
        None,
        parse_metrics_enabled,
        "E040",
        "None (the default: on when prometheus_client is installed), True or False.",
    )
    _buckets_hint = (
        "Finite upper bounds in seconds, increasing, e.g. [1, 5, 30, 60, 300]; "
        "prometheus_client adds +Inf itself."
    )
    #: Bounds of the debounce delay histogram (window opened -> run started), seconds.
    metrics_delay_buckets = Setting(
        "DEBOUNCE_METRICS_DELAY_BUCKETS",
        (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600),
        partial(parse_buckets, name="DEBOUNCE_METRICS_DELAY_BUCKETS"),
        "E041",
        _buckets_hint,
    )
    #: Bounds of the attempt duration histogram, seconds.
    metrics_duration_buckets = Setting(
        "DEBOUNCE_METRICS_DURATION_BUCKETS",
        (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
        partial(parse_buckets, name="DEBOUNCE_METRICS_DURATION_BUCKETS"),
        "E041",
        _buckets_hint,
    )

    # -- executors (docs/howto/celery.md) ---------------------------------------------------
    #: Who runs the jobs of tasks that name no executor: "worker" or "celery" (decision 85).
    executor = Setting(
        "DEBOUNCE_EXECUTOR",
        "worker",
        parse_executor,
        "E025",
        "DEBOUNCE_EXECUTOR = 'worker' (the default) or 'celery'.",
    )
    #: Debounce queue -> Celery queue (an unlisted queue: the same name; decision 153).
    celery_queues = Setting(
        "DEBOUNCE_CELERY_QUEUES",
        {},
        parse_celery_queues,
        "E026",
        'For example DEBOUNCE_CELERY_QUEUES = {"default": "celery", "mail": "mail"}.',
    )
    #: How long a job handed to Celery may wait to be taken (short: W013).
    celery_handoff_lease = Setting(
        "DEBOUNCE_CELERY_HANDOFF_LEASE",
        "5m",
        _duration("DEBOUNCE_CELERY_HANDOFF_LEASE"),
        "E027",
        "A duration such as '5m': how long a job handed to Celery may wait to start.",
    )
    #: Dotted path of the Celery app to publish with; None: Celery's current app.
    celery_app = Setting(
        "DEBOUNCE_CELERY_APP",
        None,
        parse_celery_app,
        "E029",
        "Give the dotted path of your Celery app, e.g. 'proj.celery.app', "
        "or None to use Celery's current app.",
    )
    #: How long after its last enqueue a job of a task this process does not know is put back,
    #: not dead-lettered (a rolling deploy; decision 154). 0: dead-letter at once.
    unknown_task_grace = Setting(
        "DEBOUNCE_UNKNOWN_TASK_GRACE",
        "10m",
        parse_unknown_task_grace,
        "E044",
        "A duration such as '10m' (how long a job of a task this process does not "
        "know is put back before it is dead-lettered), or 0 to dead-letter it at once.",
    )
    #: How late a periodic tick may still be deferred; after a downtime only the latest
    #: missed tick within it runs (decision 178).
    periodic_max_lateness = Setting(
        "DEBOUNCE_PERIODIC_MAX_LATENESS",
        "10m",
        _duration("DEBOUNCE_PERIODIC_MAX_LATENESS"),
        "E046",
        _duration_hint("DEBOUNCE_PERIODIC_MAX_LATENESS"),
    )
    #: Periodic schedules declared in settings, by name (decision 209; the tasks they name
    #: are checked under E048, once registered).
    schedules = Setting(
        "DEBOUNCE_SCHEDULES",
        {},
        parse_schedules,
        "E047",
        'A dict of schedule name -> {"task": "app.tasks.fn", "cron": "*/5 * * * *", ...} '
        "(keys: task, cron, tz, args, kwargs, overlap, pass_tick, max_lateness).",
    )

    # -- Django's own -----------------------------------------------------------------------
    #: Django's ``USE_TZ``, which the package needs True (check E011, a named check; §4.7).
    #: Kept like the rows, so the check every enqueue makes costs an attribute read.
    use_tz = Setting("USE_TZ", True, bool)

    del _buckets_hint


#: Every ``DEBOUNCE_*`` row, in the order of the class body (and of ``manage.py check``).
ROWS: tuple[Setting[Any], ...] = tuple(
    row
    for row in vars(Settings).values()
    if isinstance(row, Setting) and row.name.startswith(PREFIX)
)
#: Row by setting name, ``USE_TZ`` included (what :func:`_forget` looks up).
_BY_NAME: dict[str, Setting[Any]] = {
    row.name: row for row in vars(Settings).values() if isinstance(row, Setting)
}

#: The typed settings object the package reads (``from django_debounce.conf import settings``).
settings = Settings()


def _forget(*, setting: str, **kwargs: Any) -> None:
    """Drop the kept value of ``setting`` when Django's ``setting_changed`` names a row."""
    row = _BY_NAME.get(setting)
    if row is not None:
        settings.__dict__.pop(row.attr, None)


setting_changed.connect(_forget, dispatch_uid="django_debounce.conf")

__all__ = ["ROWS", "Settings", "settings"]
