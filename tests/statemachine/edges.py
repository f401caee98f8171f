"""The model's rules for edges (``debounce_edge="leading" | "both"``, decision 180).

A mixin of :class:`~.model.Model` (it reads ``jobs``, ``specs`` and ``now``):
which burst a call meets, and what the call does to it.
"""

from __future__ import annotations

from typing import Any

from .records import CANCELLED, EXPIRED, FAILED, SHED, MJob, Spec, ViolationError


class EdgeRules:
    """Predict and apply calls of the edge tasks (mixed into :class:`~.model.Model`)."""

    jobs: dict[int, MJob]
    specs: dict[str, Spec]
    now: float

    def _burst(self, spec: Spec, key: str) -> list[MJob]:
        """The rows of the key's burst open at :attr:`now`, newest first, else ``[]``."""
        rows = sorted(
            (
                job
                for job in self.jobs.values()
                if job.task == spec.name
                and job.key == key
                and job.max_run_at is not None
                and job.max_run_at > self.now
            ),
            key=lambda job: -job.id,
        )
        if not rows:
            return []
        newest = rows[0]
        assert newest.last_call is not None and newest.max_run_at is not None
        closes = min(newest.last_call + spec.window, newest.max_run_at)
        if newest.status in (FAILED, CANCELLED, EXPIRED, SHED) or self.now >= closes:
            return []
        same = [
            job
            for job in rows[1:]
            if (job.opened_at, job.max_run_at) == (newest.opened_at, newest.max_run_at)
        ]
        return [newest, *same]

    def _predict_edge(self, spec: Spec, key: str) -> tuple[str, int | None]:
        burst = self._burst(spec, key)
        if not burst:
            return "created", None  # a new burst: its leading job
        newest = burst[0]
        if spec.edge == "leading" or (len(burst) > 1 and newest.open):
            return "debounced", newest.id  # swallowed, or gathered by the trailing job
        return "created", None  # the burst's trailing job

    def _apply_edge(
        self, spec: Spec, key: str, args: list[Any], now: float, outcome: str, job_id: int
    ) -> MJob:
        burst = self._burst(spec, key)
        if outcome == "debounced":
            job = self.jobs[job_id]
            job.enqueue_count += 1
            job.last_call = now
            if spec.edge == "both":  # the trailing job slides (§4.2)
                assert job.max_run_at is not None
                job.run_at = min(now + spec.window, job.max_run_at)
                if spec.payload == "replace":
                    job.payload = args
            return job
        for other in self.jobs.values():  # the new job takes the key's window
            if other.task == spec.name and other.key == key:
                other.open = False
        if burst:  # the trailing job: the burst's opening and ceiling
            lead = burst[0]
            assert lead.opened_at is not None and lead.max_run_at is not None
            opened, ceiling = lead.opened_at, lead.max_run_at
            run_at = min(now + spec.window, ceiling)
        else:
            opened, ceiling, run_at = now, now + spec.max_wait, now
        if job_id in self.jobs:
            raise ViolationError(
                f"enqueue {spec.name}[{key}] created #{job_id}, an id already used"
            )
        job = MJob(
            id=job_id,
            task=spec.name,
            key=key,
            payload=args,
            run_at=run_at,
            open=True,
            opened_at=opened,
            max_run_at=ceiling,
            last_call=now,
            max_retries=spec.max_retries,
        )
        self.jobs[job_id] = job
        return job
