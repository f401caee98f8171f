"""A process that inspects, flushes and cancels ``atk.all`` windows and cancels its jobs (attack).

``python -m tests.processes.every_feature_driver --keys K --seed N --ready F --go F --stop F --out F``:
until ``--stop`` appears, acts on a random key of ``k0``…``k{K-1}`` every few ms:
``inspect()``, ``flush()``, ``cancel()``, ``cancel_running()``, or ``Job.cancel()`` of a
random unfinished job of the task. Writes every result and every error to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.processes.every_feature_driver")
    for name in ("keys", "seed"):
        parser.add_argument(f"--{name}", type=int, required=True)
    for name in ("ready", "go", "stop", "out"):
        parser.add_argument(f"--{name}", required=True)
    options = parser.parse_args(argv)

    import django

    django.setup()
    from django.db import connection

    from django_debounce import registry
    from django_debounce.models import Job
    from tests.testapp import tasks_every_feature

    task = registry.lookup(tasks_every_feature.NAME)
    assert task is not None
    connection.ensure_connection()
    Path(options.ready).touch()
    deadline = time.monotonic() + 60
    while not Path(options.go).exists():
        if time.monotonic() > deadline:
            return 2
        time.sleep(0.001)
    rng = random.Random(options.seed)
    keys = [f"k{i}" for i in range(options.keys)]
    actions: list[dict[str, Any]] = []
    errors: list[str] = []
    contention: list[str] = []
    while not Path(options.stop).exists():
        key = rng.choice(keys)
        op = rng.choice(["inspect", "flush", "flush", "cancel", "cancel_running", "job_cancel"])
        at = time.time()
        try:
            handle = task.window(key)  # type: ignore[attr-defined]
            if op == "inspect":
                state = handle.inspect()
                actions.append({"op": op, "key": key, "at": at, "job_id": state and state.job_id})
            elif op in ("flush", "cancel"):
                result = getattr(handle, op)()
                actions.append(
                    {
                        "op": op,
                        "key": key,
                        "at": at,
                        "reason": result.reason,
                        "job_id": result.window.job_id if result.window else None,
                    }
                )
            elif op == "cancel_running":
                result = handle.cancel_running()
                actions.append({"op": op, "key": key, "at": at, "requested": result.requested})
            else:
                ids = list(
                    Job.objects.filter(
                        task_name=tasks_every_feature.NAME, status__in=["READY", "RUNNING"]
                    ).values_list("pk", flat=True)[:50]
                )
                if ids:
                    job = Job.objects.get(pk=rng.choice(ids))
                    result = job.cancel()
                    actions.append(
                        {
                            "op": op,
                            "at": at,
                            "job_id": job.pk,
                            "cancelled": result.cancelled,
                            "requested": result.requested,
                        }
                    )
        except Exception as exc:  # any error breaks the contract: report it
            line = f"{op}: {type(exc).__module__}.{type(exc).__qualname__}: {exc}"
            # Job.cancel()'s raw deadlock on MariaDB is a known defect with its own test
            # (tests/db/ops/test_cancel_contention.py); keep it apart.
            (
                contention if op in ("job_cancel", "cancel_running") and "1213" in line else errors
            ).append(line)
        time.sleep(rng.uniform(0.01, 0.06))
    Path(options.out).write_text(
        json.dumps({"actions": actions, "errors": errors, "contention": contention})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
