"""The trace context a job carries: the calls that joined its window, bounded (decision 212).

``Job.trace_links`` holds ``{"calls": n, "links": [carrier, ...]}``: ``n``
traced calls joined the job, and ``links`` keeps the W3C trace context
(``{"traceparent": ..., "tracestate": ...}``) of the first of them and of the
latest ones, :data:`MAX_LINKS` in all. A burst of 10,000 traced calls leaves
32 links and ``calls = 10000``; the run's span links to the 32 and says
``9968`` were left out. The upsert's SQL (:mod:`django_debounce.tracing.sql`)
applies the same rule inside the database; this module is the rule in Python
(the ORM's slides, MariaDB) and its reader. Pure: no database, no OpenTelemetry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Links a job keeps at most: the first call's and the latest ``MAX_LINKS - 1`` calls'.
MAX_LINKS = 32
#: The count ``calls`` is clamped to (a hand-edited row's huge number stays a bigint).
MAX_CALLS = 10**15

Carrier = dict[str, str]


def opening(carrier: Carrier) -> dict[str, Any]:
    """Return the stored form of one call's ``carrier``: what the call that opens a job writes."""
    return {"calls": 1, "links": [carrier]}


def joined(stored: Mapping[str, Any] | None, call: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``stored`` with the call ``call`` (an :func:`opening` value) joined to it.

    Keeps the first link and the latest ones, :data:`MAX_LINKS` in all: when
    ``stored`` is full, its second link (the oldest but the first) goes.
    ``stored`` ``None`` (a job opened while tracing was off) or not of the stored
    shape (a row edited by hand: not a mapping, ``links`` not a list): ``call``
    itself; a ``calls`` that is not a number counts the links, and is clamped
    to ``0 .. MAX_CALLS``.
    A call whose carrier is the latest link's (the calls of one key in one
    bulk enqueue share its span) adds nothing: one span, one link, one count.
    """
    if not isinstance(stored, Mapping) or not isinstance(stored.get("links"), list):
        return dict(
            call
        )  # None, or not of the stored shape (edited by hand): the call's (decision 228)
    links = list(stored["links"])
    if links and links[-1:] == list(call.get("links") or []):
        return dict(stored)  # the same span again (one bulk enqueue's calls of a key): one link
    if len(links) >= MAX_LINKS:
        links = [links[0], *links[len(links) - MAX_LINKS + 2 :]]
    counted = stored.get("calls")
    if isinstance(counted, bool) or not isinstance(counted, (int, float)):
        counted = len(links)
    return {
        "calls": int(min(max(counted, 0), MAX_CALLS)) + int(call.get("calls") or 1),
        "links": [*links, *(call.get("links") or [])],
    }


def links_of(stored: object) -> tuple[list[Carrier], int]:
    """Return the carriers of ``stored`` (a ``Job.trace_links`` value) and how many calls it left out.

    Anything not of the stored shape (``None``, a row edited by hand) reads as
    no links; a carrier that is not a mapping of strings is skipped.
    """
    if not isinstance(stored, Mapping):
        return [], 0
    found = stored.get("links")
    if not isinstance(found, list):
        return [], 0
    links = [
        {str(k): str(v) for k, v in link.items()} for link in found if isinstance(link, Mapping)
    ]
    calls = stored.get("calls")
    left_out = calls - len(links) if isinstance(calls, int) and calls > len(links) else 0
    return links, left_out
