"""System checks E035-E039 of ``DEBOUNCE_REDIS`` (docs/reference/checks.md), and its parsing."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from django_debounce.checks.redis import check_redis
from django_debounce.checks.settings import check_settings
from django_debounce.conf import parse_redis_alias
from django_debounce.conf import settings as debounce_settings
from django_debounce.exceptions import ConfigurationError

REDIS = {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://127.0.0.1:6379/15"}


def ids(settings: Any) -> list[str]:
    """The ids of the setting's own check (E035, a row of the table) and of E036-E039."""
    return [message.id for message in [*check_settings(), *check_redis()]]


def test_off_by_default_and_a_django_redis_alias_passes(settings):
    assert debounce_settings.redis is None
    assert check_redis() == []
    settings.DEBOUNCE_REDIS = "redis"  # tests/settings.py: django-redis on the local Redis
    assert check_redis() == []
    assert debounce_settings.redis == "redis"


@pytest.mark.parametrize("value", ["", "  ", 6379, ["redis"], True])
def test_e035_not_an_alias(settings, value):
    settings.DEBOUNCE_REDIS = value
    assert ids(settings) == ["django_debounce.E035"]
    with pytest.raises(ConfigurationError, match="DEBOUNCE_REDIS=.* must be None .*alias"):
        parse_redis_alias(value)


def test_e036_an_alias_missing_from_caches(settings):
    settings.DEBOUNCE_REDIS = "buckets"
    [message] = check_redis()
    assert message.id == "django_debounce.E036"
    assert "CACHES has ['default', 'redis']" in message.msg
    assert "django_redis.cache.RedisCache" in message.hint


def test_e037_django_redis_not_installed(settings, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "django_redis.cache", None)  # import fails, as uninstalled
    settings.DEBOUNCE_REDIS = "redis"
    [message] = check_redis()
    assert message.id == "django_debounce.E037"
    assert 'pip install "django-debounce[redis]"' in message.hint


@pytest.mark.parametrize(
    "backend",
    [
        "django.core.cache.backends.redis.RedisCache",  # Django's own: no raw connection
        "django.core.cache.backends.locmem.LocMemCache",
        "no.such.Backend",
    ],
)
def test_e038_a_cache_that_is_not_django_redis(settings, backend):
    settings.CACHES = {**settings.CACHES, "other": {"BACKEND": backend}}
    settings.DEBOUNCE_REDIS = "other"
    [message] = check_redis()
    assert message.id == "django_debounce.E038"
    assert backend in message.msg


def test_e039_the_shard_client(settings):
    sharded = {**REDIS, "OPTIONS": {"CLIENT_CLASS": "django_redis.client.ShardClient"}}
    settings.CACHES = {**settings.CACHES, "sharded": sharded}
    settings.DEBOUNCE_REDIS = "sharded"
    assert ids(settings) == ["django_debounce.E039"]
    herd = {**REDIS, "OPTIONS": {"CLIENT_CLASS": "django_redis.client.HerdClient"}}
    settings.CACHES = {**settings.CACHES, "herd": herd}
    settings.DEBOUNCE_REDIS = "herd"
    assert check_redis() == []


def test_manage_py_check_fails_on_a_bad_alias(settings):
    settings.DEBOUNCE_REDIS = "nope"
    with pytest.raises(SystemCheckError, match="django_debounce.E036"):
        call_command("check")
