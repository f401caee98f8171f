"""The claim rules written once (``django_debounce.flow.rules``): the flow-control verdict
as a pure function, and the claim query built from the same predicates the admin explains.
"""

from __future__ import annotations

import datetime as dt
import importlib

import pytest

from django_debounce import CircuitBreaker
from django_debounce.flow import rules as claim_rules
from django_debounce.flow.rules import Gate, verdict
from django_debounce.flow.throttle import bucket_for
from django_debounce.models import TaskState

T = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)
S = dt.timedelta(seconds=1)


def gate(**options: object) -> Gate:
    return Gate(
        task_name="t",
        bucket=options.get("bucket"),  # type: ignore[arg-type]
        drop=bool(options.get("drop", False)),
        concurrency=options.get("concurrency"),  # type: ignore[arg-type]
        breaker=options.get("breaker"),  # type: ignore[arg-type]
    )


def test_no_row_admits_a_closed_breaker_and_a_full_bucket():
    judged = verdict(gate(bucket=bucket_for("2/s"), breaker=CircuitBreaker()), None, now=T)
    assert (judged.kind, judged.reasons, judged.probe, judged.level) == ("admit", (), False, 2.0)


def test_open_breaker_holds_until_reset_then_admits_the_probe():
    breaker = CircuitBreaker(failures=1, reset="30s")
    state = TaskState(task_name="t", breaker_state="open", failures=1, opened_at=T)
    held = verdict(gate(breaker=breaker), state, now=T + 10 * S)
    assert held.kind == "hold"
    assert [r.code for r in held.reasons] == ["breaker"]
    assert held.until == T + 30 * S
    probe = verdict(gate(breaker=breaker), state, now=T + 30 * S)
    assert (probe.kind, probe.probe) == ("admit", True)


def test_the_probe_is_due_reset_after_the_breaker_opened_and_only_while_open():
    breaker = CircuitBreaker(failures=1, reset="30s")

    def due(**fields: object) -> dt.datetime | None:
        return breaker.probe_due_at(TaskState(task_name="t", **fields))

    assert due(breaker_state="open", opened_at=T) == T + 30 * S
    assert due(breaker_state="open", opened_at=None) is None
    assert due(breaker_state="closed", opened_at=T) is None
    assert due(breaker_state="half_open", opened_at=T, probe_job_id=7) is None


def test_half_open_holds_while_the_probe_lives_but_never_the_probe_itself():
    state = TaskState(task_name="t", breaker_state="half_open", probe_job_id=7)
    g = gate(breaker=CircuitBreaker())
    assert verdict(g, state, now=T, probe_live=True).kind == "hold"
    assert verdict(g, state, now=T, probe_live=True, job_id=7).kind == "admit"
    assert verdict(g, state, now=T, probe_live=False).probe is True


def test_empty_bucket_holds_or_sheds_and_says_when_the_next_token_comes():
    state = TaskState(task_name="t", tokens=0.5, tokens_at=T)
    held = verdict(gate(bucket=bucket_for("1/s")), state, now=T)
    assert held.kind == "hold" and held.until == T + 0.5 * S
    shed = verdict(gate(bucket=bucket_for("1/s"), drop=True), state, now=T)
    assert shed.kind == "shed" and [r.code for r in shed.reasons] == ["shed"]


def test_the_claim_stops_at_the_first_reason_the_admin_lists_every_one():
    state = TaskState(task_name="t", tokens=0.0, tokens_at=T)
    g = gate(bucket=bucket_for("1/s"), drop=True, concurrency=1)
    first = verdict(g, state, now=T, in_use=1)
    assert first.kind == "hold"  # the full cap decides: a capped job is never shed
    assert [r.code for r in first.reasons] == ["concurrency"]
    every = verdict(g, state, now=T, in_use=1, every=True)
    assert every.kind == "hold"
    assert [r.code for r in every.reasons] == ["concurrency", "shed"]


@pytest.mark.parametrize("queues", [None, ("a", "b")])
def test_the_claim_query_is_the_one_built_from_the_rules(queues):
    # The claim's own ``claimable_jobs`` (worker or claim module) must be these rules.
    for name in ("django_debounce.claim.claiming", "django_debounce.worker.loop"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "claimable_jobs"):
            break
    theirs = module.claimable_jobs(T, queues)
    assert str(theirs.query) == str(claim_rules.claimable_jobs(T, queues).query)
