"""A process that flushes and cancels ``rel.race`` windows from code, over and over (issue #21).

Run as ``python -m tests.processes.ops.window_driver --keys K --seed N --ready FILE
--go FILE --stop FILE --out FILE [--task rel.edge_both]``: it sets Django up, connects, touches
``--ready``, waits for ``--go``, then until ``--stop`` appears acts on the
windows of keys ``k0``…``k{K-1}``: two flushes for every cancel, alternately
through one key's handle (``race.window(key)``) and through all keys at once
(``race.windows([...])``), a few milliseconds apart, each followed by an
``inspect()`` of one key (or all keys, in bulk). It writes every result,
any error, and every retry after lock contention (logged ``window_retry``) to
``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.processes.ops.window_driver")
    for name in ("keys", "seed"):
        parser.add_argument(f"--{name}", type=int, required=True)
    for name in ("ready", "go", "stop", "out"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--task", default="rel.race", choices=["rel.race", "rel.edge_both"])
    options = parser.parse_args(argv)

    import django

    django.setup()
    from django.db import connection

    from tests.testapp.tasks_reliability import edge_both
    from tests.testapp.tasks_reliability import race as trailing

    race = {"rel.race": trailing, "rel.edge_both": edge_both}[options.task]

    retries: list[str] = []

    class CountRetries(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if getattr(record, "action", None) == "window_retry":
                retries.append(record.getMessage())

    windows_log = logging.getLogger("django_debounce.windows")
    windows_log.addHandler(CountRetries(logging.DEBUG))
    windows_log.setLevel(logging.DEBUG)
    connection.ensure_connection()
    Path(options.ready).touch()
    deadline = time.monotonic() + 60
    while not Path(options.go).exists():
        if time.monotonic() > deadline:
            print("barrier never opened", file=sys.stderr)
            return 2
        time.sleep(0.001)
    rng = random.Random(options.seed)
    keys = [f"k{i}" for i in range(options.keys)]
    actions: list[dict[str, Any]] = []
    errors: list[str] = []
    turn = 0
    while not Path(options.stop).exists():
        op = "cancel" if turn % 3 == 2 else "flush"
        bulk = turn % 2 == 1
        turn += 1
        try:
            if bulk:
                windows = race.windows([(key,) for key in keys])
                results = windows.flush() if op == "flush" else windows.cancel()
            else:
                handle = race.window(rng.choice(keys))
                results = [handle.flush() if op == "flush" else handle.cancel()]
        except Exception as exc:  # any error breaks the contract: report it
            errors.append(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}")
            continue
        for result in results:
            state = result.window
            actions.append(
                {
                    "op": op,
                    "bulk": bulk,
                    "done": result.done,
                    "reason": result.reason,
                    "job_id": state.job_id if state else None,
                    "calls": state.calls if state else None,
                    "status": state.status if state else None,
                    "dependents": list(result.cancelled_dependents),
                }
            )
        try:  # and read one key's window (or all keys') while producers and the worker act
            inspected = (
                race.windows([(key,) for key in keys]).inspect()
                if bulk
                else [race.window(rng.choice(keys)).inspect()]
            )
        except Exception as exc:
            errors.append(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}")
            inspected = []
        for state in inspected:
            if state is None:
                continue
            actions.append(
                {
                    "op": "inspect",
                    "bulk": bulk,
                    "done": True,
                    "reason": "inspected",
                    "job_id": state.job_id,
                    "calls": state.calls,
                    "status": state.status,
                    "open": state.open,
                    "running": state.running,
                    "payload": state.kwargs,
                    "key": state.key,
                    "in_order": state.ceiling is not None and state.deadline <= state.ceiling,
                }
            )
        time.sleep(rng.uniform(0.005, 0.04))
    Path(options.out).write_text(
        json.dumps({"actions": actions, "errors": errors, "retries": retries})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
