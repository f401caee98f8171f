"""Tracing is off without a tracer provider: no tracer, so the hot paths take their plain branch."""

from __future__ import annotations

import sys

import pytest

from django_debounce import tracing
from django_debounce.exceptions import ConfigurationError
from django_debounce.tracing import provider


def test_without_a_provider_there_is_no_tracer():
    assert tracing.tracer() is None


def test_a_provider_given_turns_tracing_on_until_taken_back():
    from opentelemetry.sdk.trace import TracerProvider

    given = TracerProvider()
    tracing.use_tracer_provider(given)
    try:
        found = tracing.tracer()
        assert found is not None
        assert found is tracing.tracer()  # made once per provider
    finally:
        tracing.use_tracer_provider(None)
    assert tracing.tracer() is None


def test_without_the_api_installed_there_is_no_tracer_and_no_provider_to_give(monkeypatch):
    # An environment without the `otel` extra: importing opentelemetry fails (a None in
    # sys.modules makes the import raise ImportError), and the module has not tried yet.
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    monkeypatch.setattr(provider, "_api", None)
    assert tracing.tracer() is None
    with pytest.raises(ConfigurationError, match="otel"):
        tracing.use_tracer_provider(object())  # type: ignore[arg-type]
