"""The Celery dispatcher stops promptly while its broker is down (issue #17 item 12, decision 160).

A real ``run_debounce_worker --dispatch-only`` whose broker URL points at a
closed loopback port: every publish fails (each after Celery's publish retries,
about 0.6 s). SIGTERM must end it within a few seconds with status 0, not after
a whole batch of failing publishes (about a minute for 100 due jobs).
"""

from __future__ import annotations

import re
import signal
import socket
import time

import pytest

from django_debounce.models import Job
from tests.conftest import child_env
from tests.procs import processes, wait_for
from tests.testapp.tasks_celery import record

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("scheme", ["amqp", "redis"])
def test_sigterm_during_a_broker_outage_stops_the_dispatcher_within_seconds(tmp_path, scheme):
    port = _closed_port()
    url = (
        f"amqp://guest:guest@127.0.0.1:{port}//"
        if scheme == "amqp"
        else f"redis://127.0.0.1:{port}/0"
    )
    for i in range(100):
        record.delay(f"outage-{i}")
    env = child_env(
        DJANGO_SETTINGS_MODULE="tests.settings_celery",
        DEBOUNCE_TEST_BROKER=url,
        DEBOUNCE_TEST_LOG_STDERR="1",
        PYTHONUNBUFFERED="1",
    )
    with processes(tmp_path, env) as procs:
        dispatcher = procs.worker("--dispatch-only", "--poll-interval", "0.5", name="dispatcher")
        wait_for(
            lambda: "could not publish job" in dispatcher.stderr(),
            timeout=60,
            what=dispatcher.tail,
        )
        sent = time.monotonic()
        dispatcher.send(signal.SIGTERM)
        status = dispatcher.wait(timeout=30)
        took = time.monotonic() - sent
    assert status == 0, dispatcher.tail()
    assert took < 5, f"took {took:.1f} s to stop\n{dispatcher.tail()}"
    log = dispatcher.stderr()
    # The jobs no publish was tried for go back to READY at once (decision 169).
    assert re.search(r"stopping: \d+ handed-off job\(s\) not published; they go back", log), log
    assert re.search(r"put back \d+ claimed job\(s\)", log), log
    assert re.search(r"dispatcher \S+ stopped after \d+ hand-off\(s\)\n$", log), log
    # What it claimed but could not publish waits for its hand-off lease, as any failed publish.
    failed = len(re.findall(r"could not publish job \d+", log))
    assert Job.objects.filter(status=Job.Status.RUNNING).count() == failed >= 1
    assert Job.objects.filter(status=Job.Status.READY, attempts=0).count() == 100 - failed
