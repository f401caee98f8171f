"""What an enqueue writes: :class:`Plan`, a validated call (contract §2, §3).

:mod:`django_debounce.enqueueing.planning` makes a plan of a call (its options
merged and checked by :mod:`django_debounce.options`, which re-exports the
class); :mod:`django_debounce.enqueueing.call` writes it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

#: A stored call, decoded: ``(args, kwargs)`` (§5).
StoredCall = tuple[list[object], dict[str, object]]
#: ``debounce_merge``: ``(stored, new) -> (args, kwargs)`` of the call to keep (§4.8).
MergeFunction = Callable[[StoredCall, StoredCall], tuple[Sequence[object], Mapping[str, object]]]


@dataclass
class Plan:
    """A validated call, ready to be written (no SQL has run yet).

    ``args``, ``kwargs`` and ``metadata`` are already JSON-ready (the codec's
    form, §5); ``window_key``/``unique_lock`` are the hashed identities (§3).
    """

    task_name: str
    queue: str
    priority: int
    max_retries: int
    args: list[object]
    kwargs: dict[str, object]
    run_at: datetime
    expires_at: datetime | None
    metadata: dict[str, object]
    notes: str
    window: timedelta | None = None
    max_wait: timedelta | None = None
    debounce_key: str | None = None
    window_key: str | None = None
    replace_payload: bool = False
    merge: MergeFunction | None = None
    edge: str = "trailing"
    unique_key: str | None = None
    unique_lock: str | None = None
    depends_on: tuple[int, ...] = ()
    timeout: timedelta | None = None
    trace_links: dict[str, Any] | None = None
    """The call's trace context as ``Job.trace_links`` stores it; ``None`` while tracing is
    off, and then nothing of it is written (:mod:`django_debounce.tracing`, decision 212)."""
