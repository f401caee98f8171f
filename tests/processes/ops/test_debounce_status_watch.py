"""``debounce_status --watch`` on a real terminal (issue #11, item 2): redraws in place, Ctrl-C exits 0."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time

import pytest

from django_debounce.management.commands.debounce_status import CLEAR
from tests.conftest import child_env
from tests.factories import JobFactory


@pytest.mark.django_db(transaction=True)
def test_watch_redraws_on_a_terminal_and_ctrl_c_exits_0():
    JobFactory.create_batch(3, queue="watched")
    # Taller than the 20-line terminal: the lists shrink so the heading stays (decision 132).
    for n in range(12):
        JobFactory(queue=f"x{n:02d}")  # listed after "watched"
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "django", "debounce_status", "--watch", "0.5"],
        env=child_env(COLUMNS="80", LINES="20"),
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=subprocess.PIPE,
    )
    os.close(follower)
    seen = b""
    try:
        deadline = time.monotonic() + 60
        # A frame is whole once the next one began: wait for a fourth, check the first three.
        while seen.count(CLEAR.encode()) < 4 and time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 1)
            if ready:
                seen += os.read(leader, 65536)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0, proc.stderr.read().decode() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)
    frames = seen.decode().split(CLEAR)[1:]
    assert len(frames) >= 3
    for frame in frames[:3]:
        lines = frame.replace("\r", "").splitlines()
        assert max(len(line) for line in lines) <= 80
        assert len(lines) <= 19 and lines[0].startswith("django-debounce status at")
        assert any(line.startswith("  … and ") for line in lines)
        assert any(line.split()[:4] == ["watched", "3", "3", "0"] for line in lines)
