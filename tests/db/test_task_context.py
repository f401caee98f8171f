"""Task context (``takes_context=True``): what a run receives first, and how calls bind.

Mirrors Django's tasks framework (``@task(takes_context=True)`` passes a
``TaskContext`` with ``task_result`` and ``attempt``); this package passes a
:class:`~django_debounce.JobContext` with the job, the attempt, the calls the
window collapsed and why the run started. Windows here are 10 s with a 60 s
max wait, under the frozen clock of ``conftest.clock``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta

import pytest

import django_debounce
from django_debounce import JobContext, debounced_task, task
from django_debounce.exceptions import ConfigurationError
from django_debounce.models import Job
from tests.conftest import T

pytestmark = pytest.mark.django_db

#: (task, context, args, kwargs) of every run, in order.
SEEN: list[tuple[str, JobContext, tuple, dict]] = []
FAIL_ONCE: set[str] = set()
#: (status, started_at, run_at) of ``context.job`` while ``ctx.digest`` runs.
DURING: list[tuple] = []


@pytest.fixture(autouse=True)
def _reset():
    SEEN.clear()
    FAIL_ONCE.clear()
    DURING.clear()
    yield
    SEEN.clear()
    FAIL_ONCE.clear()


def s(seconds: float):
    return T + timedelta(seconds=seconds)


WINDOW = {"debounce": "10s", "debounce_max_wait": "60s"}


@debounced_task(name="ctx.digest", debounce_key="digest:{0}", takes_context=True, **WINDOW)
def digest(context, user_id, note=""):
    SEEN.append(("digest", context, (user_id,), {"note": note}))
    if context.job is not None:
        DURING.append((context.job.status, context.job.started_at, context.job.run_at))
    return {"calls": context.calls_collapsed, "reason": context.run_reason}


@debounced_task(name="ctx.adigest", debounce_key="adigest:{user_id}", takes_context=True, **WINDOW)
async def adigest(context, user_id):
    await asyncio.sleep(0)
    SEEN.append(("adigest", context, (user_id,), {}))
    return context.attempt


@task(name="ctx.plain", takes_context=True, max_retries=2, min_backoff="10s", max_backoff="10s")
def plain(context, tag):
    SEEN.append(("plain", context, (tag,), {}))
    if tag in FAIL_ONCE:
        FAIL_ONCE.discard(tag)
        raise RuntimeError("first attempt fails")
    return context.attempt


@debounced_task(name="ctx.flaky", debounce_key="flaky:{0}", takes_context=True, **WINDOW)
def digest_flaky(context, user_id):
    SEEN.append(("flaky", context, (user_id,), {}))
    if user_id in FAIL_ONCE:
        FAIL_ONCE.discard(user_id)
        raise RuntimeError("first attempt fails")


@task(name="ctx.idem", idempotent=True, takes_context=True)
def idem(context, a, b=0):
    SEEN.append(("idem", context, (a, b), {}))


@task(name="ctx.varargs", takes_context=True, unique_key="v:{0}")
def varargs(*args):
    SEEN.append(("varargs", args[0], args[1:], {}))


def only(name: str) -> list[tuple[JobContext, tuple, dict]]:
    return [(ctx, args, kwargs) for task_name, ctx, args, kwargs in SEEN if task_name == name]


def test_job_context_is_a_public_frozen_dataclass():
    assert django_debounce.JobContext is JobContext
    assert "JobContext" in django_debounce.__all__
    assert [f.name for f in dataclasses.fields(JobContext)] == [
        "job",
        "attempt",
        "calls_collapsed",
        "run_reason",
        "control",
    ]
    ctx = JobContext.inline()
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.attempt = 2  # type: ignore[misc]


# -- what a worker passes (§4 worked scenarios, controlled clock) -----------------------------


def test_quiet_window_context(clock, burst):
    jobs = []
    for t in (0, 3, 7):
        clock(seconds=t)
        jobs.append(digest.delay("u1", note=f"t{t}"))
    assert {j.pk for j in jobs} == {jobs[0].pk}
    clock(seconds=16.999)
    burst()
    assert SEEN == []
    clock(seconds=17)
    burst()
    ((ctx, args, kwargs),) = only("digest")
    assert (args, kwargs) == (("u1",), {"note": "t0"})  # the first call's payload
    assert (ctx.job.pk, ctx.attempt, ctx.calls_collapsed, ctx.run_reason) == (
        jobs[0].pk,
        1,
        2,
        "quiet",
    )
    assert DURING == [(Job.Status.RUNNING, s(17), s(17))]
    job = Job.objects.get(pk=jobs[0].pk)
    assert (job.status, job.result) == (Job.Status.SUCCESSFUL, {"calls": 2, "reason": "quiet"})
    assert job.run_reason == "quiet"


def test_max_wait_context(clock, burst):
    for t in range(0, 60, 5):  # a call every 5 s: the window never goes quiet
        clock(seconds=t)
        burst()
        digest.delay("u2")
    clock(seconds=60)
    burst()
    ((ctx, _, _),) = only("digest")
    assert (ctx.attempt, ctx.calls_collapsed, ctx.run_reason) == (1, 11, "max_wait")
    assert ctx.job.run_at == ctx.job.max_run_at == s(60)
    assert ctx.job.run_reason == "max_wait"


def test_not_debounced_context_and_retry(clock, burst, settings):
    settings.DEBOUNCE_BACKOFF_JITTER = False  # the retry is due exactly min_backoff later
    FAIL_ONCE.add("t")
    job = plain.delay("t")
    burst()
    clock(seconds=9.999)
    burst()
    assert len(only("plain")) == 1
    clock(seconds=10)
    burst()
    (first, _), (second, _) = [(ctx, args) for ctx, args, _ in only("plain")]
    assert (first.job.pk, first.attempt, first.calls_collapsed, first.run_reason) == (
        job.pk,
        1,
        0,
        "not_debounced",
    )
    assert (second.job.pk, second.attempt, second.calls_collapsed, second.run_reason) == (
        job.pk,
        2,
        0,
        "retry",
    )
    assert second.job.run_at == s(10)
    done = Job.objects.get(pk=job.pk)
    assert (done.status, done.attempts, done.result) == (Job.Status.SUCCESSFUL, 2, 2)


def test_a_debounced_retry_reports_retry_and_the_same_calls(clock, burst):
    FAIL_ONCE.add("u3")
    digest_flaky.delay("u3")
    clock(seconds=5)
    job = digest_flaky.delay("u3")
    clock(seconds=15)
    burst()
    clock(hours=2)
    burst()
    assert [
        (c.attempt, c.calls_collapsed, c.run_reason, c.job.pk) for c, _, _ in only("flaky")
    ] == [
        (1, 1, "quiet", job.pk),
        (2, 1, "retry", job.pk),
    ]
    assert Job.objects.get(pk=job.pk).status == Job.Status.SUCCESSFUL


def test_async_task_receives_the_context(clock, burst):
    first = adigest.delay("a")
    adigest.delay(user_id="a")  # {user_id} binds by name either way
    clock(seconds=10)
    burst()
    ((ctx, args, _),) = only("adigest")
    assert args == ("a",)
    assert (ctx.job.pk, ctx.attempt, ctx.calls_collapsed, ctx.run_reason) == (
        first.pk,
        1,
        1,
        "quiet",
    )
    assert Job.objects.get(pk=first.pk).result == 1


# -- keys bind without the context parameter (§3) ---------------------------------------------


def test_key_templates_and_idempotent_hashes_skip_the_context(clock):
    job = digest.delay("u9")
    assert job.debounce_key == "digest:u9"
    assert digest.delay(user_id="u9").pk == job.pk
    assert adigest.delay("b").debounce_key == "adigest:b"
    first = idem.delay(1, 2)
    assert [idem.delay(1, b=2).pk, idem.delay(a=1, b=2).pk] == [first.pk] * 2
    assert idem.delay(1).pk == idem.delay(1, 0).pk != first.pk
    assert list(digest.signature.parameters) == ["user_id", "note"]


def test_a_varargs_function_gets_the_context_as_args_0(clock, burst):
    job = varargs.delay("x", 1)
    assert job.unique_key == "v:x"  # {0} is the caller's first argument
    burst()
    ((ctx, args, _),) = only("varargs")
    assert isinstance(ctx, JobContext) and ctx.job.pk == job.pk
    assert args == ("x", 1)


# -- inline calls (no job) --------------------------------------------------------------------


def test_inline_call_gets_an_inline_context():
    assert digest("u1", note="n") == {"calls": 0, "reason": "inline"}
    ((ctx, args, kwargs),) = only("digest")
    assert ctx == JobContext(job=None, attempt=1, calls_collapsed=0, run_reason="inline")
    assert (args, kwargs) == (("u1",), {"note": "n"})
    assert Job.objects.count() == 0


def test_inline_call_passes_a_given_context_through():
    given = JobContext(job=None, attempt=3, calls_collapsed=7, run_reason="max_wait")
    assert digest(given, "u1") == {"calls": 7, "reason": "max_wait"}
    assert only("digest")[0][0] is given


def test_inline_async_call_returns_the_coroutine():
    coroutine = adigest("a")
    assert asyncio.iscoroutine(coroutine)
    assert asyncio.run(coroutine) == 1
    ((ctx, _, _),) = only("adigest")
    assert ctx.run_reason == "inline" and ctx.job is None


# -- registration-time validation (§2) --------------------------------------------------------


@pytest.mark.parametrize(
    "define",
    [
        pytest.param(lambda: lambda: None, id="no-parameters"),
        pytest.param(lambda: lambda *, user_id: None, id="keyword-only"),
        pytest.param(lambda: lambda **kwargs: None, id="var-keyword-only"),
    ],
)
def test_takes_context_needs_a_positional_parameter(define):
    with pytest.raises(ConfigurationError, match="positional parameter"):
        task(name="ctx.bad", takes_context=True)(define())
    assert django_debounce.registry.lookup("ctx.bad") is None


def test_takes_context_must_be_a_bool():
    with pytest.raises(ConfigurationError, match="takes_context"):
        task(name="ctx.bad_flag", takes_context="yes")(lambda context: None)
    assert django_debounce.registry.lookup("ctx.bad_flag") is None


def test_takes_context_is_not_a_per_call_option(clock):
    with pytest.raises(ConfigurationError, match="takes_context"):
        digest.apply_async(("u1",), takes_context=False)
    assert Job.objects.count() == 0
