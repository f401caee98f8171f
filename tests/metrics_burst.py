"""The scripted burst of the metrics tests: ``python -m tests.metrics_burst OUT.json``.

Enqueues, in real time, a burst that the worker must collapse and force:

* ``met.fast`` key ``steady``: a call every 0.1 s for 2.5 s (window 300 ms, max
  wait 1 s): the calls never go quiet, so the max wait forces the runs;
* ``met.fast`` keys ``quiet-0``..``quiet-2``: three calls each at once, then quiet;
* ``met.plain``: ``--plain N`` plain jobs (sleeping ``--sleep`` seconds each).

Writes every call's outcome and job id to OUT.json. The process shares
``PROMETHEUS_MULTIPROC_DIR`` with the workers, so its counts reach their endpoints.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.metrics_burst")
    parser.add_argument("out")
    parser.add_argument("--plain", type=int, default=0)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--no-burst", action="store_true")
    options = parser.parse_args()

    import django

    django.setup()
    from tests.testapp.tasks_metrics import fast, plain

    calls: list[dict[str, object]] = []

    def record(task: str, key: str, job: object) -> None:
        calls.append({"task": task, "key": key, "id": job.pk, "outcome": job.outcome})  # type: ignore[attr-defined]

    for i in range(options.plain):
        record("met.plain", str(i), plain.delay(str(i), options.sleep))
    if not options.no_burst:
        for q in range(3):
            for n in range(3):
                record("met.fast", f"quiet-{q}", fast.delay(f"quiet-{q}", n))
        start = time.monotonic()
        for n in range(26):
            time.sleep(max(0.0, start + 0.1 * n - time.monotonic()))
            record("met.fast", "steady", fast.delay("steady", n))
    Path(options.out).write_text(json.dumps(calls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
