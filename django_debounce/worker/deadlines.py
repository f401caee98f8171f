"""The next deadline an idle worker waits for (issue #12 item 4; decisions 83 and 167).

:func:`next_run_at` answers "when does the next READY job of these queues
become due?", so a worker with nothing claimable sleeps until then (capped by
its poll interval) instead of a fixed poll, and a job due later starts at its
``run_at``. Jobs already due are left out on purpose: a due job the claim did
not take is held back (a rate limit, a concurrency cap, an open breaker, a
dependency, a run of its key), and counting it would wake the worker at once,
again and again; those are seen at the next poll, except one held by a rate
limit: :func:`next_refill_at` says when its bucket holds tokens again, so the
worker claims then and the bucket never sits full while jobs wait (decision 170).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from django.db import DEFAULT_DB_ALIAS

from ..flow import redis_buckets
from ..flow.key_rates import next_key_token_at
from ..flow.rules import current_gates
from ..models import Job, TaskState

#: Rows read at most when the worker serves only some queues: the query walks READY
#: rows in ``run_at`` order and keeps the first of a served queue.
SCAN_LIMIT = 50


def next_run_at(
    now: datetime,
    *,
    within: timedelta,
    queues: Sequence[str] | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> datetime | None:
    """Return the earliest ``run_at`` after ``now`` and up to ``now + within`` of a READY job.

    Args:
        now: the instant (aware datetime).
        within: how far ahead to look (the caller's longest sleep, e.g. the
            poll interval): the query reads only READY rows due in
            ``(now, now + within]``.
        queues: queue names served; ``None`` or empty: every queue.
        using: database alias.

    Returns:
        That ``run_at``, or ``None`` when no READY job falls in the span.
        With ``queues``, at most :data:`SCAN_LIMIT` rows are read: when none
        of them is of a served queue, the last one's ``run_at`` is returned
        (no served job is due before it, so waking then is never late).

    One query, served by the claim index (``status``, ``-priority``, ``run_at``):
    its ``status = 'READY'`` prefix, the span filtered inside the index.
    """
    rows = (
        Job.objects.using(using)
        .filter(status=Job.Status.READY, run_at__gt=now, run_at__lte=now + within)
        .order_by("run_at")
    )
    if not queues:
        return rows.values_list("run_at", flat=True).first()
    served = set(queues)
    seen: list[tuple[datetime, str]] = list(rows.values_list("run_at", "queue")[:SCAN_LIMIT])
    for run_at, queue in seen:
        if queue in served:
            return run_at
    return seen[-1][0] if len(seen) == SCAN_LIMIT else None


def next_refill_at(
    now: datetime, *, free: int, since: datetime | None = None, using: str = DEFAULT_DB_ALIAS
) -> datetime | None:
    """Return when a rate-limit bucket the last claim found short next holds tokens for ``free`` jobs.

    For each task of this process with ``rate_limit=`` (``on_excess="defer"``),
    the instant its bucket, as last stored (``tokens`` at ``tokens_at``: just
    after its last take), reaches
    :meth:`~django_debounce.throttle.TokenBucket.refill_target` tokens. An
    instant after ``since`` (when the sleeper's last claim began; default
    ``now``) is one that claim could not see: the earliest of those, or
    ``now`` if it has passed already, is returned. One at or before ``since``
    is not: that claim saw the tokens, so no job of the task was waiting for
    them, and waking for it again would spin. ``None``: no such instant, or no
    rate-limited task (then no query).

    A worker that slept its poll interval instead let a bucket that fills
    faster (a ``rate_limit_burst`` below the rate, or a rate of less than one
    job per poll) sit full while jobs waited, and the refill was lost:
    ``"5/s"`` with a burst of 2 ran at 1.9/s (decision 170). The stored level,
    not the level at ``now``, decides, so a token that arrives between the
    claim and this read still wakes the worker at once.

    A key waiting for its own bucket's next token (``rate_limit_per_key=``) counts too.
    One query of the TaskState rows (and one of the waiting keys), or one Redis round trip with
    ``DEBOUNCE_REDIS`` (Redis failing: the database rows, as a claim does).
    """
    every = current_gates()
    since = now if since is None else since
    keyed = sorted(n for n, g in every.items() if g.key_bucket is not None and not g.drop)
    # A key waiting for its bucket's token (rate_limit_per_key=, decision 189): one query.
    key_at = next_key_token_at(since, names=keyed, using=using) if keyed else None
    gates = {name: g.bucket for name, g in every.items() if g.bucket is not None and not g.drop}
    if not gates:
        return None if key_at is None else max(now, key_at)
    levels: dict[str, tuple[float | None, datetime | None]] = {}
    store = redis_buckets.store()
    if store is not None:
        try:
            levels = {n: (v.tokens, v.tokens_at) for n, v in store.levels(gates).items()}
        except redis_buckets.RedisUnavailable:
            store = None
    if store is None:
        rows = TaskState.objects.using(using).filter(task_name__in=sorted(gates))
        levels = {
            name: (tokens, at)
            for name, tokens, at in rows.values_list("task_name", "tokens", "tokens_at")
        }
    soonest: datetime | None = None
    for name, (tokens, tokens_at) in levels.items():
        if tokens is None or tokens_at is None:
            continue  # never used: full
        bucket = gates[name]
        wait = bucket.seconds_until(tokens, bucket.refill_target(free))
        when = tokens_at + timedelta(seconds=wait)
        if when > since and (soonest is None or when < soonest):
            soonest = when
    if key_at is not None and (soonest is None or key_at < soonest):
        soonest = key_at
    return None if soonest is None else max(now, soonest)


__all__ = ["SCAN_LIMIT", "next_refill_at", "next_run_at"]
