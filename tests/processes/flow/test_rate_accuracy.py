"""Rate accuracy under load (issue #18 item 3): the configured rate is what runs, never more.

Two ``run_debounce_worker`` processes with four threads each (prefetch on, the
default poll interval of 1 s) serve a backlog about three times larger than
what the rate lets run during the test, so that the bucket alone limits them.
Starts are the jobs' ``started_at``: the claim's instant, which is the
bucket's own clock (the token is taken in that claim, at that ``now``, in the
TaskState row or in Redis), and for a rate-limited job its start (such a job
is never claimed ahead of a free thread, decision 146). Each run also writes a
CallLog row at the start of its body; those instants are printed, not judged
(they trail the claim by a thread hand-over).

* **Never more**: for any two starts ``a <= b`` the starts in ``[a, b]`` are at
  most ``capacity + refill * (b - a)`` (the rule of the state machine's model),
  so no window of one period holds more than the rate plus its burst.
* **Not less**: over the steady part (from the first start after which the
  replayed bucket held no whole token: the burst is spent, every later start
  was paid by refill) the achieved rate is within 10 % of the configured one.

The second is a claim about throughput on a 2-core machine that other test
runs share, so the test tells a slow machine from a slow package. Replaying
the bucket from the starts gives the tokens it lost to its cap: refill that
came while it was full and jobs were due, i.e. runs no claim came for. An
idle worker wakes when a drained bucket holds tokens for its free threads
(at most half the capacity, decision 170), so a claim may come late by the
bucket's *headroom* (the time from that instant to a full bucket) before
refill is lost. Each worker's claim loop (its main thread) is timed by the
kernel (``/proc/<pid>/task/<pid>/schedstat``): its mean wait for a CPU per
wake-up. If the run is short of the band and that wait exceeded a quarter of
the headroom, the machine starved the workers and made their claims late:
the test prints the figures and skips the lower bound (the upper bound is
asserted before). Short of the band with the loops getting their CPU in
time, it fails: the package left tokens unused. (Before decision 170 a
``"5/s"`` bucket of 2 ran at 1.9/s here: the workers slept their 1 s poll
while it sat full.)
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from django_debounce.flow.throttle import bucket_for
from django_debounce.models import Job
from tests.conftest import child_env
from tests.procs import processes, wait_for
from tests.redis_support import cache_url, delete_test_keys, key_prefix, require_redis
from tests.soak_checks import (
    bucket_dry_at,
    count_between,
    most_in_window,
    run_queue_wait,
    wasted_refill,
    worst_rate_interval,
)
from tests.testapp import tasks_soak
from tests.testapp.models import CallLog

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WORKER = ("--concurrency", "4")  # the default poll interval and prefetch
#: Seconds the workers run against the backlog.
SECONDS = 8.0
#: A claim loop counts as starved when its mean wait for a CPU per wake-up is above this
#: share of the bucket's headroom.
STARVED = 0.25


@pytest.fixture
def soak_tasks() -> Iterator[dict[str, Any]]:
    tasks = tasks_soak.register()
    yield tasks
    tasks_soak.unregister()


def measure(tmp_path, tasks: dict[str, Any], name: str, *, store: str) -> None:
    options = tasks_soak.DECLARATIONS[name][1]
    bucket = bucket_for(options["rate_limit"], options.get("rate_limit_burst"))
    rate, capacity = bucket.per_second, bucket.capacity
    backlog = int(capacity + rate * SECONDS * 3)
    extra = {"DEBOUNCE_SOAK_TASKS": "1"}
    if store == "redis":
        extra.update(DEBOUNCE_TEST_REDIS="1", DEBOUNCE_TEST_REDIS_PREFIX=key_prefix())
    with processes(tmp_path, child_env(**extra)) as procs:
        workers = [procs.worker(*WORKER, name=f"worker-{i}") for i in range(2)]
        wait_for(
            lambda: all("starting" in w.stderr() for w in workers),
            timeout=60,
            what=lambda: f"both workers to start\n{procs.tails()}",
        )
        tasks[name].delay_many([(f"t{i:04}",) for i in range(backlog)])
        began = time.monotonic()
        before = [run_queue_wait(w.pid) for w in workers]
        time.sleep(SECONDS)
        after = [run_queue_wait(w.pid) for w in workers]
        wall = time.monotonic() - began
        for worker in workers:
            worker.send(signal.SIGTERM)
        for worker in workers:
            assert worker.wait(60) == 0, worker.tail()
        stderr = "".join(w.stderr() for w in workers)
    assert "Traceback" not in stderr and "redis_down" not in stderr, stderr[-3000:]
    starts = sorted(
        Job.objects.filter(task_name=name, started_at__isnull=False).values_list(
            "started_at", flat=True
        )
    )
    bodies = list(CallLog.objects.filter(task=name).values_list("started_at", flat=True))
    assert len(starts) < backlog, "the backlog ran out: the bucket was not the only limit"
    assert len(set(CallLog.objects.values_list("pid", flat=True))) == 2  # both took part
    dry, last = bucket_dry_at(starts, capacity, rate), starts[-1]
    span = (last - dry).total_seconds()
    # A steady part shorter than a quarter of the run: the workers took most of it to spend
    # the first burst, i.e. they, not the bucket, were the limit (judged as a shortfall).
    achieved = count_between(starts, dry, last) / span if span >= SECONDS / 4 else 0.0
    worst = worst_rate_interval(starts, capacity, rate)
    assert worst is not None
    window = most_in_window(starts, 1.0)
    allowed = capacity + rate * 1.0
    lost = wasted_refill(starts, capacity, rate, since=dry, until=last)
    # Each claim loop's mean wait for a CPU per wake-up, against the bucket's headroom: the
    # time from the instant an idle worker wakes for (its refill target) to a full bucket.
    delays = [(a[0] - b[0]) / max(1, a[1] - b[1]) for a, b in zip(after, before, strict=True)]
    shares = [(a[0] - b[0]) / wall for a, b in zip(after, before, strict=True)]
    headroom = (capacity - bucket.refill_target(4)) / rate
    starved = max(delays) > headroom * STARVED
    print(
        f"\n[rate {name}, {store} bucket] configured {bucket.text} (capacity {capacity}): "
        f"{len(starts)} starts of a backlog of {backlog}; achieved {achieved:.2f}/s over the "
        f"{span:.2f} s steady part; most starts in any 1 s window {window} (rate + burst "
        f"{allowed:.0f}); tightest interval: {worst}; most body starts in 1 s "
        f"{most_in_window(bodies, 1.0)}; tokens lost to the cap {lost:.1f}; claim loops "
        f"waited for a CPU {' and '.join(f'{w:.0%}' for w in shares)} of the run, "
        f"{' and '.join(f'{d * 1000:.1f}' for d in delays)} ms per wake-up (headroom "
        f"{headroom * 1000:.0f} ms)"
    )
    assert worst.excess <= 1e-9, f"rate exceeded: {worst}"
    assert window <= allowed
    if achieved < 0.9 * rate and starved:
        pytest.skip(
            f"the workers were starved of CPU (a claim loop waited {max(delays) * 1000:.0f} ms "
            f"per wake-up, the bucket's headroom is {headroom * 1000:.0f} ms): achieved "
            f"{achieved:.2f}/s of {rate:g}/s is not judged; the upper bound held"
        )
    assert 0.9 * rate <= achieved <= 1.1 * rate, (
        f"achieved {achieved:.2f}/s of {rate:g}/s over a steady part of {span:.2f} s; "
        f"{lost:.1f} tokens lost to the cap while jobs were due; claim loops waited "
        f"{max(delays) * 1000:.1f} ms per wake-up for a CPU"
    )


@pytest.mark.parametrize("name", ["ra.rate", "ra.small_burst", "ra.trickle"])
def test_database_bucket_rate_is_accurate_under_load(tmp_path, soak_tasks, name):
    measure(tmp_path, soak_tasks, name, store="database")


@pytest.mark.parametrize("name", ["ra.rate", "ra.small_burst", "ra.trickle"])
def test_redis_bucket_rate_is_accurate_under_load(tmp_path, soak_tasks, name):
    require_redis()
    delete_test_keys(cache_url(), key_prefix())
    try:
        measure(tmp_path, soak_tasks, name, store="redis")
    finally:
        delete_test_keys(cache_url(), key_prefix())
