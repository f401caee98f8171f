"""The rows of an enqueue, in memory: a new job, and a slide of an open window (§4.2, §4.3).

No SQL: :mod:`django_debounce.enqueueing.call`, :mod:`~django_debounce.enqueueing.bulk`
and :mod:`~django_debounce.enqueueing.edges` write what these return.
"""

from __future__ import annotations

from datetime import datetime

from .. import codec
from ..exceptions import ConfigurationError
from ..models import Job
from ..options import Plan
from ..tracing import carriers


def new_job(plan: Plan, now: datetime) -> Job:
    """Return the unsaved READY job a call opens at ``now`` (§4.3): a new window, or a plain job."""
    debounced = plan.window is not None
    assert plan.max_wait is not None or not debounced
    return Job(
        task_name=plan.task_name,
        queue=plan.queue,
        priority=plan.priority,
        status=Job.Status.READY,
        args=plan.args,
        kwargs=plan.kwargs,
        run_at=now + plan.window if debounced else plan.run_at,  # type: ignore[operator]
        opened_at=now if debounced else None,
        max_run_at=now + plan.max_wait if debounced else None,  # type: ignore[operator]
        debounce_key=plan.debounce_key if debounced else None,
        window_key=plan.window_key,
        key_hash=plan.window_key,
        unique_key=plan.unique_key,
        unique_lock=plan.unique_lock,
        enqueue_count=1,
        last_enqueued_at=now,
        max_retries=plan.max_retries,
        timeout=plan.timeout,
        metadata=plan.metadata,
        notes=plan.notes,
        expires_at=plan.expires_at,
        created_at=now,
        trace_links=plan.trace_links,
    )


def apply_slide(job: Job, plan: Plan, now: datetime) -> list[str]:
    """Slide ``job`` in memory (§4.2): later deadline, capped by the ceiling fixed at opening.

    Counts the call and, with ``replace_payload`` or a ``merge`` (§4.8), stores
    the call's payload. Returns the attnames that changed; saves nothing.

    Raises:
        ConfigurationError: the ``debounce_merge`` function returned no ``(args, kwargs)``.
    """
    assert plan.window is not None and job.max_run_at is not None
    job.run_at = min(now + plan.window, job.max_run_at)
    job.enqueue_count += 1
    job.last_enqueued_at = now
    fields = ["run_at", "enqueue_count", "last_enqueued_at"]
    if plan.trace_links is not None:  # a traced call joins its context to the job (decision 212)
        job.trace_links = carriers.joined(job.trace_links, plan.trace_links)
        fields.append("trace_links")
    if plan.replace_payload:
        job.args, job.kwargs = plan.args, plan.kwargs
        fields += ["args", "kwargs"]
    elif plan.merge is not None:
        stored = codec.decode_call(job.args, job.kwargs)
        new = codec.decode_call(plan.args, plan.kwargs)
        merged = plan.merge(stored, new)
        try:
            merged_args, merged_kwargs = merged
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"debounce_merge of {plan.task_name!r} returned {merged!r}; it must return "
                "(args, kwargs)."
            ) from exc
        job.args, job.kwargs = codec.encode_call(list(merged_args), dict(merged_kwargs))
        fields += ["args", "kwargs"]
    return fields
