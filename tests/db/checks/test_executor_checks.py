"""System checks of the executor settings (E025–E029, E044, W013–W014; issues #10, #17): one test per id."""

from __future__ import annotations

import pytest
from django.core.checks import ERROR, WARNING

from django_debounce.checks.settings import check_settings
from django_debounce.contrib.celery import checks as celery_checks


def check_executor_settings():
    """The executor settings' own checks (E025-E027, E044: rows of the settings table), then W013."""
    return [*check_settings(), *celery_checks.check_handoff_lease()]


# Each case sets DEBOUNCE_* settings and expects exactly one message with this id.
CASES = [
    pytest.param({"EXECUTOR": "threads"}, "E025", ERROR, id="E025-unknown"),
    pytest.param({"EXECUTOR": None}, "E025", ERROR, id="E025-none"),
    pytest.param({"CELERY_QUEUES": ["default"]}, "E026", ERROR, id="E026-list"),
    pytest.param({"CELERY_QUEUES": {"default": ""}}, "E026", ERROR, id="E026-empty-target"),
    pytest.param({"CELERY_HANDOFF_LEASE": "soon"}, "E027", ERROR, id="E027-unparseable"),
    pytest.param({"CELERY_HANDOFF_LEASE": "2s"}, "W013", WARNING, id="W013-short"),
    pytest.param({"UNKNOWN_TASK_GRACE": "a while"}, "E044", ERROR, id="E044-unparseable"),
    pytest.param({"UNKNOWN_TASK_GRACE": -5}, "E044", ERROR, id="E044-negative"),
]


@pytest.mark.parametrize(("overrides", "code", "level"), CASES)
def test_executor_setting_messages(settings, overrides, code, level):
    for name, value in overrides.items():
        setattr(settings, f"DEBOUNCE_{name}", value)
    messages = check_executor_settings()
    assert [(m.id, m.level) for m in messages] == [(f"django_debounce.{code}", level)]
    assert messages[0].hint
    assert any(f"DEBOUNCE_{name}" in messages[0].msg for name in overrides)


def test_valid_executor_settings_pass(settings):
    settings.DEBOUNCE_EXECUTOR = "celery"
    settings.DEBOUNCE_CELERY_QUEUES = {"default": "celery", "mail": "mail-q"}
    settings.DEBOUNCE_CELERY_HANDOFF_LEASE = "10m"
    assert check_executor_settings() == []
    settings.DEBOUNCE_UNKNOWN_TASK_GRACE = 0  # dead-letter unknown tasks at once
    assert check_executor_settings() == []


def test_e028_celery_selected_but_not_installed(settings, monkeypatch):
    settings.DEBOUNCE_EXECUTOR = "celery"
    real = celery_checks.importlib.util.find_spec
    # This process has Celery; hide it from the check the way a project without the extra is.
    monkeypatch.setattr(
        celery_checks.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "celery" else real(name, *a),
    )
    (message,) = celery_checks.check_celery_available()
    assert (message.id, message.level) == ("django_debounce.E028", ERROR)
    assert "django-debounce[celery]" in message.hint


def test_e029_celery_app_does_not_import(settings):
    settings.DEBOUNCE_EXECUTOR = "celery"
    settings.DEBOUNCE_CELERY_APP = "proj.celery.nowhere"
    (message,) = celery_checks.check_celery_available()
    assert (message.id, message.level) == ("django_debounce.E029", ERROR)
    assert "proj.celery.nowhere" in message.msg


def test_w014_eager_celery_app(settings):
    from tests.celery_app import app

    settings.DEBOUNCE_CELERY_APP = "tests.celery_app.app"
    app.conf.task_always_eager = True
    try:
        (message,) = celery_checks.check_celery_available()
    finally:
        app.conf.task_always_eager = False
    assert (message.id, message.level) == ("django_debounce.W014", WARNING)


def test_the_celery_checks_pass_with_a_working_app(settings):
    settings.DEBOUNCE_CELERY_APP = "tests.celery_app.app"
    # The test tasks (tests/testapp/tasks_celery.py) select the Celery executor.
    assert celery_checks.check_celery_available() == []


def test_every_executor_check_id_is_exercised():
    covered = {param.values[1] for param in CASES} | {"E028", "E029", "W014"}
    assert covered == {"E025", "E026", "E027", "E028", "E029", "E044", "W013", "W014"}
