"""Tasks for the worker, retry and dead-letter tests (names start with ``wrk.``).

They record what they receive in two ways: a ``CallLog`` row (visible across
threads and processes, ordered by id) and, for in-process tests that need
the exact Python types, the module-level ``RECEIVED`` list.
"""

from __future__ import annotations

import asyncio
import os
import threading
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from asgiref.sync import sync_to_async
from django.db import transaction
from django.utils import timezone

from django_debounce import debounced_task, task
from django_debounce.run.interrupts import WorkerExit

from .models import CallLog, Order

#: ``(task name, args, kwargs)`` of every run of the tasks that record it, in-process.
RECEIVED: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

#: ``GATES[tag]``: an Event a gated run waits on; ``ENTERED[tag]`` is set when it starts waiting.
GATES: dict[str, threading.Event] = {}
ENTERED: dict[str, threading.Event] = {}

RESULT_REF = UUID("0f0e0d0c-0b0a-0908-0706-050403020100")
RESULT_WHEN = datetime(2026, 3, 1, 12, 30, tzinfo=UTC)


class FlakyError(Exception):
    """Raised by the tasks below that fail on purpose."""


def log(task_name: str, key: str = "", payload: dict[str, Any] | None = None) -> CallLog:
    now = timezone.now()
    return CallLog.objects.create(
        task=task_name,
        key=key,
        payload=payload or {},
        pid=os.getpid(),
        started_at=now,
        finished_at=now,
    )


def wait_gate(tag: str) -> None:
    """Block while a test holds ``GATES[tag]`` closed (no-op when no gate is set)."""
    gate = GATES.get(tag)
    if gate is None:
        return
    ENTERED.setdefault(tag, threading.Event()).set()
    if not gate.wait(30):
        raise RuntimeError(f"gate {tag!r} was never opened")


@task(name="wrk.tag")
def record_tag(tag: str) -> str:
    """Write one CallLog row keyed ``tag``; return ``tag``."""
    log("wrk.tag", key=tag)
    return tag


@task(name="wrk.slow_tag")
def slow_tag(tag: str, seconds: float = 0.01) -> str:
    """Like ``wrk.tag`` but hold the job ``seconds`` of real time first."""
    import time

    time.sleep(seconds)
    log("wrk.slow_tag", key=tag)
    return tag


@task(name="wrk.gated")
def gated(tag: str) -> str:
    """Log ``start``, wait for the test to open ``GATES[tag]``, log ``end``."""
    log("wrk.gated", key=f"start:{tag}")
    wait_gate(tag)
    log("wrk.gated", key=f"end:{tag}")
    return tag


@task(name="wrk.result")
def result(kind: str) -> Any:
    """Return a value of the requested ``kind`` for the result tests."""
    if kind == "json":
        return {"n": 1, "ok": True, "items": [1, "a", None], "ratio": 0.5}
    if kind == "codec":
        return {"amount": Decimal("1.50"), "ref": RESULT_REF, "when": RESULT_WHEN, "pair": (1, 2)}
    if kind == "set":
        return {3}
    if kind == "none":
        return None
    raise ValueError(f"unknown kind {kind!r}")


@task(name="wrk.async_result")
async def async_result(tag: str) -> dict[str, Any]:
    """An ``async def`` task that awaits and uses the async ORM."""
    await asyncio.sleep(0)
    row = await CallLog.objects.acreate(task="wrk.async_result", key=tag, pid=os.getpid())
    count = await CallLog.objects.filter(task="wrk.async_result").acount()
    return {"log_id": row.pk, "count": count, "amount": Decimal("2.50")}


@task(name="wrk.fail_times", max_retries=3)
def fail_times(tag: str, failures: int) -> str:
    """Fail the first ``failures`` runs for ``tag`` (counted in CallLog), then succeed."""
    run = CallLog.objects.filter(task="wrk.fail_times", key=tag).count() + 1
    log("wrk.fail_times", key=tag, payload={"run": run})
    if run <= failures:
        raise FlakyError(f"{tag} failed run {run}")
    return f"{tag} ok on run {run}"


@task(name="wrk.value_error", max_retries=0)
def value_error() -> None:
    """Always raise a builtin exception."""
    log("wrk.value_error")
    raise ValueError("boom")


@task(name="wrk.flaky", max_retries=3)
def flaky(n: int) -> None:
    """Always raise (B39): the downstream service is down."""
    log("wrk.flaky", key=str(n))
    raise FlakyError("downstream unavailable")


@task(name="wrk.custom_backoff", max_retries=4, min_backoff="1m", max_backoff="3m")
def custom_backoff() -> None:
    """Always raise, with its own backoff bounds."""
    log("wrk.custom_backoff")
    raise FlakyError("still down")


@debounced_task(
    name="wrk.debounced_fail",
    debounce="1m",
    debounce_max_wait="10m",
    debounce_key="df:{0}",
    max_retries=2,
)
def debounced_fail(key: str, version: str) -> None:
    """A debounced task that always fails (its retries are not open windows)."""
    log("wrk.debounced_fail", key=key, payload={"version": version})
    raise FlakyError(f"{key} {version}")


@debounced_task(
    name="wrk.sync_profile",
    debounce="5m",
    debounce_max_wait="30m",
    debounce_key="profile:{user_id}",
)
def sync_profile(user_id: int, version: str) -> str:
    """B02: log ``start:<version>``, wait on ``GATES[version]`` if set, log ``end:<version>``."""
    log("wrk.sync_profile", key=f"start:{version}", payload={"user_id": user_id})
    wait_gate(version)
    log("wrk.sync_profile", key=f"end:{version}", payload={"user_id": user_id})
    return version


def _bill(name: str, account: str, kw: dict[str, Any]) -> None:
    RECEIVED.append((name, (account,), dict(kw)))
    raise FlakyError(f"card declined for {account}")


@debounced_task(
    name="wrk.bill",
    debounce="1m",
    debounce_max_wait="10m",
    debounce_key="bill:{account}",
    max_retries=0,
)
def bill(account: str, **kw: Any) -> None:
    """B43: always raises; records what it received in ``RECEIVED``."""
    _bill("wrk.bill", account, kw)


@debounced_task(
    name="wrk.bill_replace",
    debounce="1m",
    debounce_max_wait="10m",
    debounce_key="bill:{account}",
    debounce_replace_payload=True,
    max_retries=0,
)
def bill_replace(account: str, **kw: Any) -> None:
    """B43 with ``debounce_replace_payload``."""
    _bill("wrk.bill_replace", account, kw)


@debounced_task(
    name="wrk.bill_atomic",
    debounce="1m",
    debounce_max_wait="10m",
    debounce_key="bill:{account}",
    max_retries=0,
)
def bill_atomic(account: str, **kw: Any) -> None:
    """B43: writes inside its own ``atomic()``, which rolls back, then raises."""
    RECEIVED.append(("wrk.bill_atomic", (account,), dict(kw)))
    try:
        with transaction.atomic():
            Order.objects.create(name=f"bill-{account}")
            log("wrk.bill_atomic", key=account)
            Order.objects.create(name=f"bill-{account}")  # IntegrityError: rolls the block back
    except Exception as exc:
        raise FlakyError(f"could not bill {account}") from exc


def _base_exception(kind: str) -> BaseException:
    """What ``wrk.raises_base`` raises: ``sys.exit(3)``, a Ctrl-C, a cancelled coroutine."""
    return {
        "exit": SystemExit(3),
        "interrupt": KeyboardInterrupt("pressed"),
        "cancelled": asyncio.CancelledError("cancelled"),
        "worker_exit": WorkerExit(1),  # the worker's second signal landing in the task
    }[kind]


@task(name="wrk.raises_base", max_retries=0)
def raises_base(kind: str) -> None:
    """Log the run, then raise a ``BaseException`` that is not an ``Exception`` (by ``kind``)."""
    log("wrk.raises_base", key=kind)
    raise _base_exception(kind)


@task(name="wrk.async_raises_base", max_retries=0)
async def async_raises_base(kind: str) -> None:
    """``wrk.raises_base`` as an ``async def`` task (``self_cancel``: it cancels its own coroutine)."""
    await sync_to_async(log)("wrk.async_raises_base", key=kind)
    if kind == "self_cancel":
        current = asyncio.current_task()
        assert current is not None
        current.cancel()
        await asyncio.sleep(1)
    raise _base_exception(kind)


@task(name="wrk.hangs", timeout=0.2, max_retries=0)
def hangs(seconds: float) -> str:
    """Sleep ``seconds`` in small steps without a checkpoint: only the hard limit bounds it."""
    import time

    log("wrk.hangs", key="start")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.01)
    return "late"


@task(name="wrk.steps", takes_context=True, max_retries=3)
def steps(context: Any, seconds: float) -> str:
    """Sleep ``seconds`` in steps of 10 ms with a checkpoint before each (a cancel stops it)."""
    import time

    log("wrk.steps", key="start")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        context.checkpoint()
        time.sleep(0.01)
    return "done"
