"""The SQL pieces of a batched success write: per-row values and the per-row fence (issue #12, #23).

:func:`~django_debounce.run.success_batches.write_successes` writes many runs'
successes in one ``UPDATE``. The values that differ per row go through a
``CASE`` on the id (:func:`per_job`); the fence on the run's worker id is one
``worker_id = %s`` when every run shares it (the built-in worker), else a
``CASE`` on the id too (:func:`worker_fence`: the Celery executor gives each run
its own worker id, decision 215), so each row is written only for its own run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connections, models
from django.db.models import Q, Value
from django.db.models.expressions import RawSQL

from ..models import Job


def per_job(
    ids: Sequence[int], values: Sequence[Any], field: models.Field[Any, Any], using: str
) -> Any:
    """Return the value of ``field`` to write for the rows ``ids``: one ``Value``, or a ``CASE`` on the id.

    ``values[i]`` is row ``ids[i]``'s. The ``CASE`` is written as SQL with the
    field's own adapted parameters: built through ``When(pk=…)`` it cost ~0.5 ms of
    Python per job (a ``Q`` resolved per branch), more than the statement saves.
    """
    first = values[0]
    if all(value == first and type(value) is type(first) for value in values):
        return Value(first, output_field=field)
    connection = connections[using]
    params: list[Any] = []
    for pk, value in zip(ids, values, strict=True):
        params += [pk, field.get_db_prep_save(value, connection)]
    column = connection.ops.quote_name(str(Job._meta.pk.column))  # type: ignore[union-attr]
    return RawSQL(f"CASE {column}{' WHEN %s THEN %s' * len(ids)} END", params, output_field=field)


def worker_fence(ids: Sequence[int], worker_ids: Sequence[str], using: str) -> Q:
    """Return the condition "each row is its own run's" for the rows ``ids`` (``worker_ids[i]``: row ``ids[i]``'s run).

    One shared id is a plain ``worker_id = %s``; distinct ids compare the column
    with a ``CASE`` on the id, so a row re-taken by another run (another worker
    id) is not written, whichever id of the batch that run has.
    """
    field = Job._meta.get_field("worker_id")
    return Q(worker_id=per_job(ids, worker_ids, field, using))  # type: ignore[arg-type]


__all__ = ["per_job", "worker_fence"]
