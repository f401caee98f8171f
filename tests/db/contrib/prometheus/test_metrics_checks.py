"""System checks E040–E043: the metrics settings and environment (docs/reference/checks.md)."""

from __future__ import annotations

import argparse
import importlib.util
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError

from django_debounce.checks.settings import check_settings
from django_debounce.contrib.prometheus import checks as prometheus_checks


def check_metrics():
    """The metrics settings' own checks (E040, E041: rows of the settings table), then E042, E043."""
    return [*check_settings(), *prometheus_checks.check_metrics()]


def test_defaults_pass(settings):
    assert check_metrics() == []


@pytest.mark.parametrize("value", ["yes", 1, {"enabled": True}])
def test_e040_metrics_must_be_none_true_or_false(settings, value):
    settings.DEBOUNCE_METRICS = value
    (message,) = check_metrics()
    assert message.id == "django_debounce.E040"
    assert "DEBOUNCE_METRICS" in message.msg and repr(value) in message.msg


@pytest.mark.parametrize("value", [None, True, False])
def test_e040_accepts_none_true_false(settings, value):
    settings.DEBOUNCE_METRICS = value
    assert check_metrics() == []


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("METRICS_DELAY_BUCKETS", []),
        ("METRICS_DELAY_BUCKETS", [5, 1]),
        ("METRICS_DURATION_BUCKETS", [0, 1]),
        ("METRICS_DURATION_BUCKETS", "1,2"),
        ("METRICS_DURATION_BUCKETS", [1, True]),
    ],
)
def test_e041_buckets_are_increasing_positive_seconds(settings, name, value):
    setattr(settings, f"DEBOUNCE_{name}", value)
    (message,) = check_metrics()
    assert message.id == "django_debounce.E041"
    assert f"DEBOUNCE_{name}" in message.msg


def test_e042_metrics_on_without_prometheus_client(settings, monkeypatch):
    settings.DEBOUNCE_METRICS = True
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "prometheus_client" else real(name, *a),
    )
    (message,) = check_metrics()
    assert message.id == "django_debounce.E042"
    assert "django-debounce[prometheus]" in message.hint
    settings.DEBOUNCE_METRICS = None  # on only when it is installed: no error
    assert check_metrics() == []


def test_e043_multiproc_dir_must_be_a_writable_directory(settings, monkeypatch, tmp_path):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "missing"))
    (message,) = check_metrics()
    assert message.id == "django_debounce.E043"
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    assert check_metrics() == []
    settings.DEBOUNCE_METRICS = False  # metrics off: the directory does not matter
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "missing"))
    assert check_metrics() == []


@pytest.mark.django_db
def test_check_command_fails_on_a_metrics_error(settings):
    settings.DEBOUNCE_METRICS_DELAY_BUCKETS = [3, 2, 1]
    with pytest.raises(SystemCheckError, match="django_debounce.E041"):
        call_command("check", stdout=StringIO(), stderr=StringIO())


def test_worker_refuses_a_metrics_port_when_metrics_are_off(settings):
    settings.DEBOUNCE_METRICS = False
    with pytest.raises(CommandError, match="DEBOUNCE_METRICS = False"):
        call_command("run_debounce_worker", burst=True, metrics_port=9)
    with pytest.raises(CommandError, match="--metrics-port"):
        call_command("run_debounce_worker", burst=True, metrics_port=0)


@pytest.mark.parametrize("port", ["0", "65536", "99999", "-1", "http"])
def test_metrics_port_outside_1_to_65535_is_a_usage_error(port):
    """``--metrics-port 99999`` was an OverflowError traceback from the HTTP server."""
    from django_debounce.management.commands.run_debounce_worker import port_number

    with pytest.raises(argparse.ArgumentTypeError) as caught:
        port_number(port)
    assert repr(port) in str(caught.value)
    with pytest.raises(CommandError, match=r"argument --metrics-port: .*"):
        call_command("run_debounce_worker", burst=True, metrics_port=port)
    assert port_number("65535") == 65535


@pytest.mark.django_db
def test_skip_checks_turns_a_malformed_setting_into_a_command_error(settings):
    """``--skip-checks`` lets E040/E045 through: the worker still says what is wrong in one line."""
    settings.DEBOUNCE_METRICS = "yes"
    with pytest.raises(CommandError, match=r"^DEBOUNCE_METRICS='yes' must be None"):
        call_command("run_debounce_worker", burst=True, metrics_port=9, skip_checks=True)
    settings.DEBOUNCE_METRICS = None
    settings.DEBOUNCE_PRUNE = {"older_than": "nope"}
    with pytest.raises(CommandError, match=r"^DEBOUNCE_PRUNE\["):
        call_command("run_debounce_worker", burst=True, skip_checks=True)
    # The manual commands do not read DEBOUNCE_PRUNE: they run (decision 134).
    out = StringIO()
    call_command("prune_debounce_jobs", older_than="7d", skip_checks=True, stdout=out)
    assert out.getvalue().startswith("deleted 0 job(s) that finished before ")
    call_command("debounce_status", skip_checks=True, stdout=StringIO())
    with pytest.raises(SystemCheckError, match="django_debounce.E045"):
        call_command("prune_debounce_jobs", older_than="7d", skip_checks=False)
