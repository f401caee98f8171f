"""What a traced process test checks of its spans (tests/otel_export.py's records; decisions 211-213).

Each run span names an outcome the docs list, links to at most ``MAX_LINKS`` enqueue spans
that some process really exported, and counts the calls it left out so that links plus
left out is the row's ``calls``; every SUCCESSFUL job has a ``succeeded`` run span; no
process logged that tracing failed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from django_debounce.models import Job
from django_debounce.tracing import MAX_LINKS

OUTCOMES = {
    "succeeded",
    "retried",
    "dead_lettered",
    "cancelled",
    "expired",
    "put_back",
    "discarded",
    "not_recorded",
}


def span_problems(spans: list[dict[str, Any]], jobs: Mapping[int, Job], stderr: str) -> list[str]:
    """Return what is wrong with ``spans`` for ``jobs`` (empty: nothing)."""
    problems: list[str] = []
    if "tracing failed" in stderr:
        at = stderr.index("tracing failed")
        problems.append(f"a process logged that tracing failed: {stderr[at : at + 1500]}")
    enqueues = {s["span_id"] for s in spans if s["kind"] == "PRODUCER"}
    runs: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for span in spans:
        if span["kind"] == "CONSUMER":
            runs[int(span["attributes"]["messaging.message.id"])].append(span)
    if not enqueues or not runs:
        problems.append(f"{len(enqueues)} enqueue spans and {len(runs)} jobs with run spans")
    for pk, job_runs in runs.items():
        job = jobs.get(pk)
        if job is None:
            continue
        stored = job.trace_links or {"calls": 0, "links": []}
        if stored["calls"] > job.enqueue_count or len(stored["links"]) > MAX_LINKS:
            problems.append(f"job {pk}: {stored['calls']} traced calls of {job.enqueue_count}")
        for run in job_runs:
            attributes = run["attributes"]
            if attributes.get("debounce.outcome") not in OUTCOMES:
                problems.append(f"job {pk}: run outcome {attributes.get('debounce.outcome')!r}")
            links = [link["span_id"] for link in run["links"]]
            if len(links) > MAX_LINKS or attributes["debounce.links"] != len(links):
                problems.append(f"job {pk}: {len(links)} links, {attributes['debounce.links']}")
            if not set(links) <= enqueues:
                problems.append(f"job {pk}: links to {set(links) - enqueues}, no enqueue span")
            left_out = attributes.get("debounce.links_left_out", 0)
            if len(links) + left_out != stored["calls"]:
                problems.append(
                    f"job {pk}: {len(links)} links + {left_out} left out, "
                    f"but {stored['calls']} traced calls joined it"
                )
    for job in jobs.values():
        outcomes = {r["attributes"].get("debounce.outcome") for r in runs.get(job.pk, [])}
        if job.status == Job.Status.SUCCESSFUL and "succeeded" not in outcomes:
            problems.append(f"job {job.pk} is SUCCESSFUL, its run spans say {outcomes}")
    return problems
