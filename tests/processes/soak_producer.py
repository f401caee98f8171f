"""A soak producer (issue #18 item 4): a paced mix of every soak task for a fixed time.

Run as ``python -m tests.processes.soak_producer --producer N --seconds S --pace P
--ready FILE --go FILE --out FILE`` with ``DEBOUNCE_SOAK_TASKS=1``: it sets
Django up, connects, touches ``--ready``, waits for ``--go`` (so all producers
start together), then for ``S`` seconds makes about ``P`` calls a second, each
of a kind drawn from :data:`KINDS` (a bulk call is a ``delay_many`` batch of
:data:`BULK_SIZE` calls), and writes every call (kind, item id, key, job id,
outcome, or the error) to ``--out`` as JSON. Item ids are ``"<producer>:<seq>"``,
unique across producers.
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

#: kind -> weight. "failing" calls fail once then succeed, or fail every run (dead letter).
KINDS = {
    "debounced": 25,
    "merged": 25,
    "bulk": 5,
    "rated": 6,
    "capped": 8,
    "expiring": 8,
    "dropped": 8,
    "failing": 6,
    "guarded": 9,
}
KEYS = 16
BULK_SIZE = 6


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.processes.soak_producer")
    parser.add_argument("--producer", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--pace", type=float, required=True, help="calls a second, about")
    for name in ("ready", "go", "out"):
        parser.add_argument(f"--{name}", required=True)
    options = parser.parse_args(argv)

    import django

    django.setup()
    from django.db import connection

    from django_debounce.exceptions import EnqueueContentionError
    from tests.testapp.tasks_soak import FAILING_RUNS, register

    tasks = register()  # idempotent: DEBOUNCE_SOAK_TASKS=1 registered them already

    connection.ensure_connection()
    Path(options.ready).touch()
    deadline = time.monotonic() + 60
    while not Path(options.go).exists():
        if time.monotonic() > deadline:
            print("barrier never opened", file=sys.stderr)
            return 2
        time.sleep(0.001)

    def task(kind: str) -> Any:
        return tasks[f"soak.{kind}"]

    rng = random.Random(options.producer)
    kinds, weights = list(KINDS), list(KINDS.values())
    calls: list[dict[str, Any]] = []
    errors: list[str] = []
    contention = 0
    seq = 0
    began = time.monotonic()
    while (elapsed := time.monotonic() - began) < options.seconds:
        kind = rng.choices(kinds, weights)[0]
        key = f"k{rng.randrange(KEYS)}"
        batch: list[dict[str, Any]] = []
        for _ in range(BULK_SIZE if kind == "bulk" else 1):
            batch.append({"kind": kind, "item": f"{options.producer}:{seq}", "key": key})
            seq += 1
        try:
            if kind == "bulk":
                jobs = task(kind).delay_many([(c["key"], [c["item"]]) for c in batch])
            elif kind in ("debounced", "merged"):
                item = batch[0]["item"]
                jobs = [task(kind).delay(key, item if kind == "debounced" else [item])]
            elif kind == "failing":
                batch[0]["fail_runs"] = FAILING_RUNS if rng.random() < 0.5 else 1
                jobs = [task(kind).delay(batch[0]["item"], batch[0]["fail_runs"])]
            else:
                jobs = [task(kind).delay(batch[0]["item"])]
        except EnqueueContentionError as exc:  # the contract's only allowed failure (§4.4)
            contention += len(batch)
            for call in batch:
                call["error"] = f"EnqueueContentionError: {exc}"
        except Exception as exc:  # anything else breaks the contract: report it
            errors.append(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}")
            for call in batch:
                call["error"] = errors[-1]
        else:
            for call, job in zip(batch, jobs, strict=True):
                call.update(job_id=job.pk, outcome=job.outcome)
        calls += batch
        # Paced: call number n (of this producer) is made about n / pace seconds in.
        ahead = len(calls) / options.pace - elapsed
        if ahead > 0:
            time.sleep(min(ahead, 0.05) * rng.uniform(0.5, 1.5))
    Path(options.out).write_text(
        json.dumps({"calls": calls, "errors": errors, "contention": contention})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
