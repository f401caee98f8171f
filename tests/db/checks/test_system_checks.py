"""System checks: one test per id of docs/reference/checks.md, "defaults pass", and
``manage.py check`` failing when the project is misconfigured."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.checks import ERROR, WARNING
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db.utils import ConnectionHandler

from django_debounce.checks import settings as checks
from django_debounce.conf import DEFAULTS


@pytest.fixture
def unset(settings):
    """Delete ``DEBOUNCE_<name>`` settings for one test, as a project that never sets them.

    pytest-django's ``delattr(settings, ...)`` sends no ``setting_changed``, neither at the
    deletion nor when the test restores the value, so the values ``conf.settings`` kept
    while the setting was unset (a check reads every row) would outlive the test. They
    are dropped afterwards, as the signal would have.
    """
    from django_debounce.conf import settings as kept

    def delete(*names: str) -> None:
        for name in names:
            if hasattr(settings, f"DEBOUNCE_{name}"):
                delattr(settings, f"DEBOUNCE_{name}")

    yield delete
    kept.__dict__.clear()


#: ``manage.py check`` runs Django's model checks too; on Django 6.1 the JSONField check
#: asks the SQLite backend whether it supports JSON, which opens a connection.
CHECK_COMMAND = pytest.mark.django_db

# Each case sets DEBOUNCE_* settings (on top of tests/settings.py, which sets LEASE=60s,
# MIN_BACKOFF=5s, MAX_BACKOFF=5m) and expects exactly one error with this id.
SETTING_ERRORS = [
    pytest.param({"DEFAULT_WINDOW": "soon"}, "E001", id="E001-window-unparseable"),
    pytest.param({"DEFAULT_MAX_WAIT": 0}, "E002", id="E002-max-wait-zero"),
    pytest.param({"DEFAULT_WINDOW": "10m", "DEFAULT_MAX_WAIT": "5m"}, "E003", id="E003"),
    pytest.param({"LEASE": -5}, "E004", id="E004-lease-negative"),
    pytest.param({"MIN_BACKOFF": timedelta(0)}, "E005", id="E005-min-backoff-zero"),
    pytest.param({"MAX_BACKOFF": "1 hour"}, "E006", id="E006-max-backoff-unparseable"),
    pytest.param({"SHUTDOWN_GRACE": True}, "E007", id="E007-grace-bool"),
    pytest.param({"MIN_BACKOFF": "10m", "MAX_BACKOFF": "1m"}, "E008", id="E008"),
    pytest.param({"MAX_RETRIES": -1}, "E009", id="E009-negative"),
    pytest.param({"MAX_RETRIES": "3"}, "E009", id="E009-str"),
    pytest.param({"MAX_RETRIES": True}, "E009", id="E009-bool"),
    pytest.param({"POLL_INTERVAL": 0}, "E010", id="E010-zero"),
    pytest.param({"POLL_INTERVAL": "1"}, "E010", id="E010-str"),
]


@pytest.mark.parametrize(("overrides", "code"), SETTING_ERRORS)
def test_setting_error_has_id_and_hint(settings, overrides, code):
    for name, value in overrides.items():
        setattr(settings, f"DEBOUNCE_{name}", value)

    messages = checks.check_settings()

    assert [m.id for m in messages] == [f"django_debounce.{code}"]
    (message,) = messages
    assert message.level == ERROR
    assert message.hint
    # The message names the setting at fault.
    assert any(f"DEBOUNCE_{name}" in message.msg for name in overrides)


def test_every_setting_error_id_is_exercised():
    """The table above covers E001-E010: a new id without a test fails here."""
    covered = {param.values[1] for param in SETTING_ERRORS}
    assert covered == {f"E{n:03d}" for n in range(1, 11)}


def test_valid_non_default_settings_pass(settings):
    settings.DEBOUNCE_DEFAULT_WINDOW = "5m"
    settings.DEBOUNCE_DEFAULT_MAX_WAIT = timedelta(minutes=5)  # equal to the window: allowed
    settings.DEBOUNCE_LEASE = 30
    settings.DEBOUNCE_MIN_BACKOFF = "250ms"
    settings.DEBOUNCE_MAX_BACKOFF = "1h30m"
    settings.DEBOUNCE_SHUTDOWN_GRACE = 2.5
    settings.DEBOUNCE_MAX_RETRIES = 0
    settings.DEBOUNCE_POLL_INTERVAL = 0.25

    assert checks.check_settings() == []


@CHECK_COMMAND
def test_defaults_pass(unset):
    unset(*DEFAULTS)

    assert checks.check_settings() == []
    # The test databases are configured as the docs ask (SQLite IMMEDIATE, or PostgreSQL).
    assert checks.check_database_settings() == []
    out, err = StringIO(), StringIO()
    call_command("check", stdout=out, stderr=err)
    assert "django_debounce" not in out.getvalue() + err.getvalue()


@CHECK_COMMAND
def test_check_command_fails_when_misconfigured(settings):
    settings.DEBOUNCE_LEASE = "soon"
    settings.DEBOUNCE_MAX_RETRIES = -1

    with pytest.raises(SystemCheckError) as raised:
        call_command("check", stdout=StringIO(), stderr=StringIO())

    text = str(raised.value)
    assert "django_debounce.E004" in text
    assert "django_debounce.E009" in text
    assert "HINT:" in text


@pytest.mark.parametrize("value", [0, 1023, "1MB", 1048576.0, True, None])
def test_e014_max_payload_bytes_must_be_an_int_of_at_least_1024(settings, value):
    settings.DEBOUNCE_MAX_PAYLOAD_BYTES = value

    messages = checks.check_settings()

    assert [m.id for m in messages] == ["django_debounce.E014"]
    assert "DEBOUNCE_MAX_PAYLOAD_BYTES" in messages[0].msg
    assert "max_allowed_packet" in messages[0].hint


@pytest.mark.parametrize("value", [1024, 16 * 1024 * 1024])
def test_e014_accepts_byte_counts_from_1024(settings, value):
    settings.DEBOUNCE_MAX_PAYLOAD_BYTES = value
    assert checks.check_settings() == []


@pytest.mark.parametrize("value", ["20", 20.0, True, None])
def test_e015_enqueue_retries_must_be_an_int(settings, value):
    settings.DEBOUNCE_ENQUEUE_RETRIES = value

    messages = checks.check_settings()

    assert [m.id for m in messages] == ["django_debounce.E015"]
    assert messages[0].level == ERROR
    assert "DEBOUNCE_ENQUEUE_RETRIES" in messages[0].msg
    assert "EnqueueContentionError" in messages[0].hint


@pytest.mark.parametrize("value", [20, 1, 0, -3])
def test_e015_accepts_any_int_below_1_counting_as_1(settings, value):
    settings.DEBOUNCE_ENQUEUE_RETRIES = value
    assert checks.check_settings() == []


@pytest.mark.parametrize("value", [1, 0, "False", None])
def test_e016_backoff_jitter_must_be_a_bool(settings, value):
    settings.DEBOUNCE_BACKOFF_JITTER = value

    messages = checks.check_settings()

    assert [m.id for m in messages] == ["django_debounce.E016"]
    assert messages[0].level == ERROR
    assert "DEBOUNCE_BACKOFF_JITTER" in messages[0].msg
    assert "base / 2" in messages[0].hint


@pytest.mark.parametrize("value", [True, False])
def test_e016_accepts_true_and_false(settings, value):
    settings.DEBOUNCE_BACKOFF_JITTER = value
    assert checks.check_settings() == []


@CHECK_COMMAND
@pytest.mark.parametrize(
    ("name", "value", "code"),
    [("ENQUEUE_RETRIES", "20", "E015"), ("BACKOFF_JITTER", "yes", "E016")],
)
def test_check_command_fails_on_e015_and_e016(settings, name, value, code):
    setattr(settings, f"DEBOUNCE_{name}", value)

    with pytest.raises(SystemCheckError) as raised:
        call_command("check", stdout=StringIO(), stderr=StringIO())

    assert f"django_debounce.{code}" in str(raised.value)


def test_defaults_pass_e015_and_e016(unset):
    unset("ENQUEUE_RETRIES", "BACKOFF_JITTER")
    assert checks.check_settings() == []


def test_checks_are_registered_by_the_app_config_not_by_importing_the_module():
    from django.core.checks import registry

    from django_debounce.checks import ALL_CHECKS, check_notify_triggers

    assert {*ALL_CHECKS, check_notify_triggers} <= set(registry.registry.get_checks(True))
    # In a process where the app is not installed, importing the module registers nothing.
    code = (
        "import django; from django.conf import settings; settings.configure(); django.setup(); "
        "from django.core.checks import registry; from django_debounce import checks; "
        "print(len(set(checks.ALL_CHECKS) & set(registry.registry.get_checks())))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "0"


# -- database checks (W001, W002) ------------------------------------------------------
#
# These checks read each alias's ``vendor`` and ``OPTIONS`` without connecting. The test
# databases are configured correctly and ``override_settings(DATABASES=...)`` does not
# rebuild ``django.db.connections`` (Django warns against it), so each test builds its own
# real ``ConnectionHandler`` from a DATABASES dict and points the check module at it.
# W001 uses real SQLite wrappers. For W002 the MySQL backend cannot be loaded in every
# cell (only the MariaDB cell installs mysqlclient), so a SQLite wrapper is given
# ``vendor = "mysql"``: the check's inputs are exactly (vendor, OPTIONS), and those are
# what the test controls. The real test database of each cell must pass both checks.


@pytest.mark.django_db
def test_the_test_database_passes_the_database_checks():
    """SQLite IMMEDIATE; on MariaDB the server really runs the session at READ COMMITTED."""
    from django.db import connection

    assert checks.check_database_settings() == []
    if connection.vendor == "mysql":
        name = "tx_isolation" if connection.mysql_is_mariadb else "transaction_isolation"
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT @@SESSION.{name}, @@character_set_connection")
            assert cursor.fetchone() == ("READ-COMMITTED", "utf8mb4")


@pytest.fixture
def databases(monkeypatch, tmp_path) -> Iterator[Any]:
    """Return ``install(DATABASES, mysql=())``: make the checks see these aliases."""
    handlers: list[ConnectionHandler] = []

    def install(config: dict[str, dict[str, Any]], mysql: tuple[str, ...] = ()) -> None:
        full = {
            alias: {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / f"{alias}.db")}
            | entry
            for alias, entry in config.items()
        }
        handler = ConnectionHandler(full)
        for alias in mysql:
            handler[alias].vendor = "mysql"
        handlers.append(handler)
        monkeypatch.setattr(checks, "connections", handler)

    yield install
    for handler in handlers:
        handler.close_all()


def test_w001_sqlite_without_immediate_transactions(databases):
    databases(
        {
            "default": {},
            "deferred": {"OPTIONS": {"transaction_mode": "DEFERRED"}},
            "immediate": {"OPTIONS": {"transaction_mode": "IMMEDIATE"}},
            "lowercase": {"OPTIONS": {"transaction_mode": "immediate", "timeout": 20}},
        }
    )

    messages = checks.check_database_settings()

    assert [m.id for m in messages] == ["django_debounce.W001"] * 2
    assert ["'default'" in messages[0].msg, "'deferred'" in messages[1].msg] == [True, True]
    assert all(m.level == WARNING and "IMMEDIATE" in m.hint for m in messages)


def test_w002_mysql_without_read_committed(databases):
    databases(
        {
            "default": {"OPTIONS": {"transaction_mode": "IMMEDIATE"}},
            "mysql_default": {},
            "mysql_repeatable": {"OPTIONS": {"isolation_level": "repeatable read"}},
            "mysql_ok": {"OPTIONS": {"isolation_level": "READ COMMITTED"}},
        },
        mysql=("mysql_default", "mysql_repeatable", "mysql_ok"),
    )

    messages = checks.check_database_settings()

    assert [m.id for m in messages] == ["django_debounce.W002"] * 2
    assert "'mysql_default'" in messages[0].msg
    assert "'mysql_repeatable'" in messages[1].msg
    assert all(m.level == WARNING and "read committed" in m.hint for m in messages)


@CHECK_COMMAND
def test_check_command_reports_database_warning(databases):
    databases({"default": {}})

    out, err = StringIO(), StringIO()
    call_command("check", stdout=out, stderr=err)  # a warning alone does not fail
    assert "django_debounce.W001" in out.getvalue() + err.getvalue()

    with pytest.raises(SystemCheckError, match=r"django_debounce\.W001"):
        call_command("check", fail_level="WARNING", stdout=StringIO(), stderr=StringIO())


# -- W003: an unknown DEBOUNCE_* setting, and what it most likely meant --------------------

UNKNOWN_SETTINGS = [
    # Unrelated names get no suggestion (they used to get the nearest of any letters).
    pytest.param("DEBOUNCE_BROKER_URL", None, id="unrelated-broker-url"),
    pytest.param("DEBOUNCE_BACKEND", None, id="unrelated-backend"),
    pytest.param("DEBOUNCE_MAX_WORKERS", None, id="shares-a-word-only"),
    pytest.param("DEBOUNCE_DEFAULT_TIMEOUT", None, id="shares-a-prefix-word-only"),
    # Typos and near names do.
    pytest.param("DEBOUNCE_POLL_INTERVALL", "DEBOUNCE_POLL_INTERVAL", id="typo"),
    pytest.param("DEBOUNCE_MAXRETRIES", "DEBOUNCE_MAX_RETRIES", id="missing-underscore"),
    pytest.param(
        "DEBOUNCE_DEAD_LETTERS_AUTO_RETRY", "DEBOUNCE_DEAD_LETTER_AUTO_RETRY", id="plural"
    ),
    pytest.param("DEBOUNCE_WINDOW", "DEBOUNCE_DEFAULT_WINDOW", id="words-inside"),
    pytest.param("DEBOUNCE_SHUTDOWN_GRACE_PERIOD", "DEBOUNCE_SHUTDOWN_GRACE", id="words-around"),
]


@pytest.mark.parametrize(("name", "meant"), UNKNOWN_SETTINGS)
def test_w003_suggests_only_a_close_name(settings, name, meant):
    setattr(settings, name, "x")

    warnings = [m for m in checks.check_unknown_settings() if m.id == "django_debounce.W003"]

    assert [m.msg for m in warnings] == [f"{name} is not a django-debounce setting; it is ignored."]
    assert warnings[0].level == WARNING
    listed = "The settings are listed in docs/reference/settings.md."
    assert warnings[0].hint == (f"Did you mean {meant}? {listed}" if meant else listed)


# -- E055, E056: the drain's settings (issue #12) ------------------------------------


@pytest.mark.parametrize("value", [-1, 2.5, "20", None, True])
def test_e055_refuses_a_prefetch_that_is_not_an_int_of_at_least_0(settings, value):
    settings.DEBOUNCE_PREFETCH = value
    messages = checks.check_settings()
    assert [m.id for m in messages] == ["django_debounce.E055"]
    assert messages[0].level == ERROR
    assert f"DEBOUNCE_PREFETCH={value!r}" in messages[0].msg


@pytest.mark.parametrize("value", [-0.1, 61, "0.1s", None, False])
def test_e056_refuses_a_flush_interval_outside_0_to_60_seconds(settings, value):
    settings.DEBOUNCE_SUCCESS_FLUSH_INTERVAL = value
    messages = checks.check_settings()
    assert [m.id for m in messages] == ["django_debounce.E056"]
    assert messages[0].level == ERROR
    assert "DEBOUNCE_SUCCESS_FLUSH_INTERVAL" in messages[0].msg


@pytest.mark.parametrize(("prefetch", "interval"), [(0, 0), (20, 0.1), (500, 60), (1, 1)])
def test_e055_e056_accept_the_defaults_and_the_bounds(settings, prefetch, interval):
    settings.DEBOUNCE_PREFETCH = prefetch
    settings.DEBOUNCE_SUCCESS_FLUSH_INTERVAL = interval
    assert checks.check_settings() == []


@CHECK_COMMAND
def test_check_command_fails_on_e055(settings):
    settings.DEBOUNCE_PREFETCH = -5
    with pytest.raises(SystemCheckError) as raised:
        call_command("check", stdout=StringIO(), stderr=StringIO())
    assert "django_debounce.E055" in str(raised.value)
