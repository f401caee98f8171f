"""Rate limits per debounce key: ``rate_limit_per_key="N/period"`` (decision 189, contract §6).

Each debounce key of such a task has its own token bucket, of the same shape
and math as the task-wide one (:mod:`django_debounce.flow.throttle`: capacity
N, refilled continuously at N per period), kept in a
:class:`~django_debounce.models.KeyBucket` row. The claim judges it with the
other rules of §6, at the moment the job starts (a gated task is never claimed
ahead, decision 146), after the task's own breaker, cap and bucket; beyond it
the job waits for the key's next token (``on_excess="defer"``) or is shed
(``"drop"``), as with the task-wide bucket.

* A job without a debounce key (a call whose key resolved to ``None``) is not
  limited per key.
* Rows are locked by the claim (``SELECT … FOR UPDATE SKIP LOCKED``; a key whose
  row another claim holds admits nothing in this claim) and created full
  where missing.
* A defer-mode bucket left without a whole token stores when the next comes
  (``blocked_until``); the claim's candidate query leaves the key's jobs out
  until then (:func:`not_blocked`), so many waiting keys never fill a claim's batch.
* A row whose bucket has refilled is deleted by the next claim that touched
  a key bucket (:func:`prune_full`): the table holds the keys that ran within
  the last refill time, not every key ever seen.
* With ``DEBOUNCE_REDIS`` the buckets are in Redis
  (:mod:`django_debounce.flow.redis_key_buckets`, decisions 193-194): a claim
  then locks no row, and only a defer-mode key left without a token writes
  its row (its ``blocked_until``, for the candidate query).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import connections
from django.db.models import Count, Exists, Min, OuterRef, Q
from django.db.models.expressions import Combinable

from ..models import Job, KeyBucket, TaskState
from .redis_key_buckets import KeyTokens, key_store, read_level
from .redis_tokens import TokenLedger
from .rules import Gate, Hold, next_token_at, when_text

#: Idle rows one claim deletes at most (the next claims delete the rest).
PRUNE_BATCH = 200

Pair = tuple[str, str]
_FIELDS = ("tokens", "tokens_at", "blocked_until", "full_at")


def key_hold(gate: Gate, row: KeyBucket | None, now: datetime) -> Hold | None:
    """Return why ``gate``'s per-key bucket (its row ``row``) admits no job at ``now``, or ``None``.

    Args:
        gate: a gate with ``key_bucket``.
        row: the key's bucket row, or ``None`` (no row: a full bucket).
        now: the instant to judge at (aware datetime).

    Returns:
        ``None`` when the bucket holds a whole token; else a :class:`Hold` with
        code ``"key_rate_limit"`` (defer: the job waits until ``until``) or
        ``"shed"`` (``on_excess="drop"``: the next claim before ``until`` sheds it).
    """
    bucket = gate.key_bucket
    assert bucket is not None
    level = bucket.level(row.tokens if row else None, row.tokens_at if row else None, now)
    token_at = next_token_at(bucket, level, now)
    if token_at is None:
        return None
    if gate.drop:
        text = (
            f"no token for its key (rate limit per key {bucket.text}, on_excess='drop'): "
            f"a claim before ~{when_text(token_at)} sheds it"
        )
        return Hold("shed", text, until=token_at)
    text = f"no token for its key until ~{when_text(token_at)} (rate limit per key {bucket.text})"
    return Hold("key_rate_limit", text, until=token_at)


def shed_reason_per_key(gate: Gate) -> tuple[str, dict[str, Any]]:
    """Return the dead letter's ``(reason, metadata)`` for a job shed by its key's bucket."""
    assert gate.key_bucket is not None
    text = gate.key_bucket.text
    return (
        f"shed: rate limit per key {text} exceeded",
        {"shed": True, "rate_limit_per_key": text, "capacity": gate.key_bucket.capacity},
    )


def not_blocked(now: datetime | Combinable) -> Q:
    """Return the filter of jobs whose key's defer-mode bucket is not waiting for a token at ``now``."""
    waiting = KeyBucket.objects.filter(
        task_name=OuterRef("task_name"), key_hash=OuterRef("key_hash"), blocked_until__gt=now
    )
    return Q(key_hash__isnull=True) | Q(~Exists(waiting))


def key_counts(
    now: datetime, *, using: str, names: list[str] | None = None
) -> dict[str, tuple[int, int]]:
    """Return ``{task_name: (keys in use, keys waiting)}`` at ``now``: one query, no row per key.

    In use: a bucket not full again (``full_at > now``); waiting: a defer-mode
    bucket without a whole token (``blocked_until > now``). For the admin and
    ``debounce_status``, which show each task's rule and these counts, never the keys.
    ``names``: only these tasks (``None``: all).
    """
    qs = KeyBucket.objects.using(using).filter(full_at__gt=now)
    if names is not None:
        qs = qs.filter(task_name__in=names)
    rows = (
        qs.values("task_name")
        .annotate(used=Count("pk"), waiting=Count("pk", filter=Q(blocked_until__gt=now)))
        .order_by("task_name")
        .values_list("task_name", "used", "waiting")
    )
    return {name: (used, waiting) for name, used, waiting in rows}


def next_key_token_at(since: datetime, *, names: list[str], using: str) -> datetime | None:
    """Return the earliest next token after ``since`` of a waiting key of ``names``, or ``None``.

    For an idle worker's wake-up (:func:`~django_debounce.worker.deadlines.next_refill_at`):
    one indexed query of ``blocked_until``.
    """
    found: datetime | None = (
        KeyBucket.objects.using(using)
        .filter(task_name__in=names, blocked_until__gt=since)
        .aggregate(at=Min("blocked_until"))["at"]
    )
    return found


def bucket_row(task_name: str, key_hash: str | None, *, using: str) -> KeyBucket | None:
    """Return the bucket of one key (read without a lock), or ``None`` (a full bucket).

    With ``DEBOUNCE_REDIS`` answering, an unsaved row holding the Redis level
    (decision 193); else the database row.
    """
    if key_hash is None:
        return None
    level = read_level(task_name, key_hash)
    if level is not None:
        if level.tokens is None or level.tokens_at is None:
            return None
        return KeyBucket(
            task_name=task_name, key_hash=key_hash, tokens=level.tokens, tokens_at=level.tokens_at
        )
    return KeyBucket.objects.using(using).filter(task_name=task_name, key_hash=key_hash).first()


class KeyRows:
    """The per-key bucket rows one claim transaction holds (see :class:`~django_debounce.flow.admission.Admission`).

    Args:
        gates: the claim's gates; those with ``key_bucket`` are judged here.
        now: the claim's instant (aware datetime).
        using: database alias.
        ledger: the claim's Redis ledger; with it and ``DEBOUNCE_REDIS`` answering,
            the buckets are in Redis (:class:`~django_debounce.flow.redis_key_buckets.KeyTokens`,
            decision 193) and no row is locked.
    """

    def __init__(
        self,
        gates: dict[str, Gate],
        *,
        now: datetime,
        using: str,
        ledger: TokenLedger | None = None,
    ) -> None:
        self.names = {name for name, gate in gates.items() if gate.key_bucket is not None}
        where = key_store() if ledger is not None and self.names else None
        self.redis = KeyTokens(where, ledger) if where is not None and ledger is not None else None
        self.now = now
        self.using = using
        features = connections[using].features
        self._lock = features.has_select_for_update
        self._skip = features.has_select_for_update_skip_locked
        self.rows: dict[Pair, KeyBucket] = {}
        self.unavailable: set[Pair] = set()
        self.dirty: set[Pair] = set()

    def _select(self, pairs: list[Pair]) -> dict[Pair, KeyBucket]:
        qs = KeyBucket.objects.using(self.using).filter(
            task_name__in={name for name, _ in pairs}, key_hash__in={key for _, key in pairs}
        )
        if self._lock:
            qs = qs.select_for_update(skip_locked=self._skip)
        wanted = set(pairs)
        rows = qs.order_by("task_name", "key_hash")
        return {pair: row for row in rows if (pair := (row.task_name, row.key_hash)) in wanted}

    def hold(self, jobs: list[Job], gates: dict[str, Gate]) -> None:
        """Lock (creating them full where missing) the bucket rows of the keys of ``jobs``."""
        pairs = sorted(
            {
                (job.task_name, job.key_hash)
                for job in jobs
                if job.task_name in self.names and job.key_hash is not None
            }
            - set(self.rows)
            - self.unavailable
        )
        if not pairs:
            return
        if self.redis is not None:
            if self.redis.read(pairs) or self.redis.levels:
                return
            self.redis = None  # failed before any take: this claim uses the database buckets
        found = self._select(pairs)
        missing = [pair for pair in pairs if pair not in found]
        if missing:
            # Insert only the rows no one has (a plain read): a row another claim holds
            # locked is left to it, never waited for. An insert that waits for one on
            # MariaDB (INSERT IGNORE takes a shared lock on a duplicate) could deadlock
            # with a claim inserting a key this one holds, as TaskState rows avoid too.
            seen = set(
                KeyBucket.objects.using(self.using)
                .filter(
                    task_name__in={name for name, _ in missing},
                    key_hash__in={key for _, key in missing},
                )
                .values_list("task_name", "key_hash")
            )
            KeyBucket.objects.using(self.using).bulk_create(
                [
                    KeyBucket(
                        task_name=name,
                        key_hash=key,
                        tokens=float(gates[name].key_bucket.capacity),  # type: ignore[union-attr]
                        tokens_at=self.now,
                        full_at=self.now,
                    )
                    for name, key in missing
                    if (name, key) not in seen
                ],
                ignore_conflicts=True,
            )
            found.update(self._select(missing))
            # The task's own row (not locked: a per-key limit alone needs no lock), so the
            # admin's flow-control page lists the task and its rule (decision 189).
            names = {name for name, _ in missing}
            names -= set(
                TaskState.objects.using(self.using)
                .filter(task_name__in=names)
                .values_list("task_name", flat=True)
            )  # a plain read first, for the reason above
            if names:
                TaskState.objects.using(self.using).bulk_create(
                    [TaskState(task_name=name) for name in sorted(names)], ignore_conflicts=True
                )
        self.rows.update(found)
        self.unavailable.update(pair for pair in pairs if pair not in found)

    def judge(self, gate: Gate, job: Job, *, plan: bool = False) -> str | None:
        """Return ``None`` when ``job``'s key bucket admits it (or it has none), else ``"hold"``/``"shed"``.

        In Redis an admit takes the token at once (atomically; none with ``plan``);
        :meth:`give_back` returns it if a later rule refuses the job.
        """
        if gate.key_bucket is None or job.key_hash is None:
            return None
        pair = (job.task_name, job.key_hash)
        if self.redis is not None:
            return self._judge_redis(gate, pair, plan)
        if pair not in self.rows:
            return "hold"  # its row is locked by another claim right now
        hold = key_hold(gate, self.rows[pair], self.now)
        if hold is None:
            return None
        return "shed" if hold.code == "shed" else "hold"

    def _judge_redis(self, gate: Gate, pair: Pair, plan: bool) -> str | None:
        """The take decides (a level read earlier may be stale: a claim may have given tokens back)."""
        assert self.redis is not None and gate.key_bucket is not None
        if pair in self.redis.failed or pair not in self.redis.levels:
            return "hold"  # Redis failed in this claim: held, never shed
        if plan:  # a plan takes nothing: judged by the level read
            tokens, at = self.redis.levels[pair].tokens, self.redis.levels[pair].tokens_at
            view = KeyBucket(tokens=tokens, tokens_at=at) if tokens is not None and at else None
            hold = key_hold(gate, view, self.now)
            return None if hold is None else "shed" if hold.code == "shed" else "hold"
        took = self.redis.take(pair, gate.key_bucket, self.now)
        if took == "admit":
            return None
        return "shed" if took == "refused" and gate.drop else "hold"

    def give_back(self, gate: Gate, job: Job) -> None:
        """Give back the Redis token :meth:`judge` took for ``job`` (a later rule refused it)."""
        if self.redis is not None and gate.key_bucket is not None and job.key_hash is not None:
            self.redis.give_back((job.task_name, job.key_hash), gate.key_bucket)

    def take(self, gate: Gate, job: Job) -> None:
        """Take one token of ``job``'s key bucket (in memory; :meth:`save` writes it)."""
        bucket = gate.key_bucket
        if bucket is None or job.key_hash is None:
            return
        pair = (job.task_name, job.key_hash)
        if self.redis is not None:
            self._blocked_in_redis(gate, pair)
            return
        row = self.rows[pair]
        level = bucket.take(row.tokens, row.tokens_at, self.now, 1)
        row.tokens = level
        row.tokens_at = max(row.tokens_at, self.now)  # never back: see Admission._check
        row.full_at = self.now + timedelta(seconds=(bucket.capacity - level) / bucket.per_second)
        row.blocked_until = None if gate.drop else next_token_at(bucket, level, self.now)
        self.dirty.add(pair)

    def _blocked_in_redis(self, gate: Gate, pair: Pair) -> None:
        """After a Redis take: a defer-mode key left without a whole token gets its row (:meth:`save`)."""
        assert self.redis is not None and gate.key_bucket is not None
        self.redis.taken.discard(pair)  # admitted: the token is kept
        level = self.redis.levels[pair]
        bucket, tokens = gate.key_bucket, level.tokens
        blocked = None if gate.drop or tokens is None else next_token_at(bucket, tokens, self.now)
        if blocked is None:
            return
        assert tokens is not None
        self.rows[pair] = KeyBucket(
            task_name=pair[0],
            key_hash=pair[1],
            tokens=tokens,
            tokens_at=level.tokens_at or self.now,
            blocked_until=blocked,
            full_at=self.now + timedelta(seconds=(bucket.capacity - tokens) / bucket.per_second),
        )
        self.dirty.add(pair)

    def mark(self) -> tuple[Any, ...]:
        """Return the rows' state, for :meth:`restore`."""
        values = {
            pair: tuple(getattr(row, attr) for attr in _FIELDS) for pair, row in self.rows.items()
        }
        return values, frozenset(self.dirty), self.redis.mark() if self.redis else None

    def restore(self, mark: tuple[Any, ...]) -> None:
        """Take back the tokens taken since :meth:`mark` (Redis tokens: through the shared ledger)."""
        values, dirty, redis = mark
        for pair in set(self.rows) - set(values) if self.redis is not None else ():
            del self.rows[pair]  # blocked rows of takes taken back
        for pair, saved in values.items():
            for attr, value in zip(_FIELDS, saved, strict=True):
                setattr(self.rows[pair], attr, value)
        self.dirty = set(dirty)
        if self.redis is not None:
            self.redis.restore(redis)

    def save(self) -> None:
        """Write the rows this claim took tokens from, then :func:`prune_full` idle ones."""
        touched = bool(self.rows) or bool(self.redis and self.redis.levels)
        if self.redis is not None:  # the rows of keys left waiting (no lock: an upsert)
            target = connections[self.using].features.supports_update_conflicts_with_target
            KeyBucket.objects.using(self.using).bulk_create(
                [self.rows[pair] for pair in sorted(self.dirty)],
                update_conflicts=True,
                unique_fields=["task_name", "key_hash"] if target else None,
                update_fields=list(_FIELDS),
            )
            self.dirty.clear()
        for pair in sorted(self.dirty):
            self.rows[pair].save(using=self.using, update_fields=list(_FIELDS))
        self.dirty.clear()
        if touched:
            prune_full(self.now, using=self.using, names=sorted(self.names))


def prune_full(now: datetime, *, using: str, names: list[str] | None = None) -> int:
    """Delete up to :data:`PRUNE_BATCH` bucket rows full again at ``now``; return how many.

    A full bucket's row says what no row says, so deleting it changes no
    decision. Rows another claim holds locked are skipped (where the
    database can skip locked rows).

    Args:
        now: the instant (aware datetime).
        using: database alias.
        names: only these task names (``None``: all).
    """
    qs = KeyBucket.objects.using(using).filter(full_at__lte=now)
    if names is not None:
        qs = qs.filter(task_name__in=names)
    features = connections[using].features
    if features.has_select_for_update:
        qs = qs.select_for_update(skip_locked=features.has_select_for_update_skip_locked)
    pks = list(qs.order_by("full_at").values_list("pk", flat=True)[:PRUNE_BATCH])
    if not pks:
        return 0
    return KeyBucket.objects.using(using).filter(pk__in=pks).delete()[0]


__all__ = [
    "KeyRows",
    "bucket_row",
    "key_counts",
    "key_hold",
    "next_key_token_at",
    "not_blocked",
    "prune_full",
    "shed_reason_per_key",
]
