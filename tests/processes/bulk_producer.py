"""A producer process that enqueues batches with ``Task.delay_many`` (issue #12 races).

Run as ``python -m tests.processes.bulk_producer --producer N --keys K --batches B
--size S --ready FILE --go FILE --out FILE``: it sets Django up, connects,
touches ``--ready``, waits for ``--go`` (so every producer starts at once), then
sends ``B`` batches of ``S`` calls of ``rel.hold`` (a 1 h window that never
becomes due) over ``K`` keys (``K=1``: one hot key), and writes what every
call returned, and any error, to ``--out`` as JSON.
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
    parser = argparse.ArgumentParser(prog="python -m tests.processes.bulk_producer")
    for name in ("producer", "keys", "batches", "size"):
        parser.add_argument(f"--{name}", type=int, required=True)
    for name in ("ready", "go", "out"):
        parser.add_argument(f"--{name}", required=True)
    options = parser.parse_args(argv)

    import django

    django.setup()
    from django.db import connection

    from django_debounce.exceptions import EnqueueContentionError
    from tests.testapp.tasks_reliability import hold

    connection.ensure_connection()
    Path(options.ready).touch()
    deadline = time.monotonic() + 60
    while not Path(options.go).exists():
        if time.monotonic() > deadline:
            print("barrier never opened", file=sys.stderr)
            return 2
        time.sleep(0.001)
    rng = random.Random(options.producer)
    calls: list[dict[str, Any]] = []
    errors: list[str] = []
    for batch_no in range(options.batches):
        batch = [
            (f"k{rng.randrange(options.keys)}", options.producer, batch_no * options.size + i)
            for i in range(options.size)
        ]
        try:
            jobs = hold.delay_many(batch)
        except EnqueueContentionError as exc:
            errors.append(f"EnqueueContentionError: {exc}")
            continue
        except Exception as exc:  # anything else breaks the contract: report it
            errors.append(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}")
            continue
        calls += [
            {"key": key, "job_id": job.pk, "outcome": job.outcome}
            for (key, _p, _s), job in zip(batch, jobs, strict=True)
        ]
    Path(options.out).write_text(json.dumps({"calls": calls, "errors": errors}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
