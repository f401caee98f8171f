"""A redis-server of one test alone (:func:`running`, a fixture's body): tests may stop and start it.

The shared Redis on 6379 is never stopped or flushed by a test (the common brief).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator

from tests.conftest import require_service
from tests.procs import wait_for


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateRedis:
    """A redis-server of this test alone, on a free port; ``stop()``/``start()`` it at will."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(self.answers, timeout=10, what="the private redis-server")

    def answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None


def running() -> Iterator[PrivateRedis]:
    """Body of a ``private_redis`` fixture: start a server, yield it, stop it."""
    require_service(shutil.which("redis-server") is not None, "needs redis-server on PATH")
    server = PrivateRedis()
    server.start()
    try:
        yield server
    finally:
        server.stop()
