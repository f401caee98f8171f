"""Helpers of the Redis bucket-store tests: the shared local Redis, and private servers.

Tests never stop the shared Redis on 6379: a test that must stop Redis starts
its own ``redis-server`` on a free port (:class:`PrivateRedis`) and stops that.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from django.conf import settings

from tests.conftest import require_service


def redis_answers(url: str) -> bool:
    """True when a Redis server answers PING at ``url``."""
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5).ping())
    except redis.exceptions.RedisError:
        return False


def cache_url() -> str:
    """The URL of the tests' ``"redis"`` cache."""
    return str(settings.CACHES["redis"]["LOCATION"])


def key_prefix() -> str:
    """The ``KEY_PREFIX`` of the tests' ``"redis"`` cache (this test process's keys)."""
    return str(settings.CACHES["redis"]["KEY_PREFIX"])


def require_redis() -> None:
    """Skip (fail in CI) unless the test cache's Redis answers."""
    require_service(
        redis_answers(cache_url()),
        f"needs Redis at {cache_url()} (redis-server on 127.0.0.1:6379)",
    )


def delete_test_keys(url: str, prefix: str) -> None:
    """Delete every key under ``prefix`` (this test process's keys) at ``url``."""
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=500))
        if keys:
            client.delete(*keys)
    except redis.exceptions.RedisError:
        pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateRedis:
    """A ``redis-server`` of the test's own on a free port, nothing kept on disk."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        server = shutil.which("redis-server")
        require_service(server is not None, "needs redis-server on PATH")
        assert server is not None
        self.proc = subprocess.Popen(
            [
                server,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--daemonize", "no",
                "--dir", str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while not redis_answers(self.url):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                pytest.fail(f"private redis-server on port {self.port} did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        """Kill the server (SIGKILL: as abrupt as a crash) and wait for it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None


@contextmanager
def private_redis(workdir: Path) -> Iterator[PrivateRedis]:
    """Start a :class:`PrivateRedis`; kill it when the block ends."""
    server = PrivateRedis(workdir)
    server.start()
    try:
        yield server
    finally:
        server.stop()
