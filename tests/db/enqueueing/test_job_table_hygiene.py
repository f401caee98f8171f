"""The job table under debounce slides on PostgreSQL: dead tuples, HOT updates, size (issue #18 item 5).

A slide (§4.2) is one ``UPDATE`` of the window's row: ``run_at``, ``enqueue_count``,
``last_enqueued_at`` (and the payload with ``debounce_replace_payload``). ``run_at``
is a column of the claim index (``debounce_job_claim``), so a slide that moves the
deadline is never a HOT update: each one leaves a dead heap tuple and a new entry in
every index (PostgreSQL's bottom-up deletion keeps the indexes whose key did not change
from growing much). A slide at the window's ceiling leaves ``run_at`` as it was and can
be HOT. VACUUM removes the dead tuples but does not give the file back: the space is
reused, so the table stays at its high-water mark, and with a VACUUM every 10,000
slides (autovacuum's job on a real server) that mark is low.

Autovacuum is switched off for the job table during these tests (a storage parameter
of the test database's table, reset afterwards), so the figures before each explicit
``VACUUM`` do not depend on when the server's autovacuum would have run. The figures
are printed, and written down in docs/howto/databases.md.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from django_debounce import debounced_task, enqueue
from django_debounce.enqueueing.bulk import Call, enqueue_many
from django_debounce.enqueueing.upsert import _sql
from django_debounce.models import Job
from tests.procs import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

TABLE = Job._meta.db_table
KEYS = [f"k{i}" for i in range(1000)]
MIB = 1024 * 1024


@debounced_task(name="hygiene.slide", debounce="1h", debounce_max_wait="1d", debounce_key="{0}")
def slide(key: str) -> None:
    """A window an hour long: every call within the day slides it."""


@debounced_task(name="hygiene.ceiling", debounce="1h", debounce_max_wait="1h", debounce_key="{0}")
def at_ceiling(key: str) -> None:
    """A window already at its ceiling when it opens: a slide leaves ``run_at`` alone."""


def _sql_rows(sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def _stats() -> dict[str, int]:
    """The job table's counters (pg_stat_user_tables) and sizes, flushed and read afresh."""
    _sql_rows("SELECT pg_stat_force_next_flush()")  # flushed once this backend is idle
    _sql_rows("SELECT pg_stat_clear_snapshot()")
    ((upd, hot, live, dead, autovacuums),) = _sql_rows(
        "SELECT n_tup_upd, n_tup_hot_upd, n_live_tup, n_dead_tup, autovacuum_count "
        "FROM pg_stat_user_tables WHERE relid = %s::regclass",
        (TABLE,),
    )
    ((heap, indexes, total),) = _sql_rows(
        "SELECT pg_relation_size(%s), pg_indexes_size(%s), pg_total_relation_size(%s)",
        (TABLE,) * 3,
    )
    return {
        "upd": upd,
        "hot": hot,
        "live": live,
        "dead": dead,
        "autovacuums": autovacuums,
        "heap": heap,
        "indexes": indexes,
        "total": total,
    }


def _after(updates: int, base: dict[str, int]) -> dict[str, int]:
    """Wait until the statistics show ``updates`` more row updates than ``base``; return them."""
    return wait_for(
        lambda: stats if (stats := _stats())["upd"] - base["upd"] >= updates else None,
        timeout=10,
        what=f"{updates} updates in pg_stat_user_tables",
    )


def _vacuum(analyze: bool = False) -> dict[str, int]:
    """VACUUM the job table once the statistics of this connection's writes are in."""
    _sql_rows("SELECT pg_stat_force_next_flush()")  # else a later flush adds them after it
    _sql_rows(f'VACUUM {"(ANALYZE) " if analyze else ""}"{TABLE}"')
    return _stats()


def _slide_all(task: str, rounds: int, *, vacuum_every: int = 0) -> list[dict[str, int]]:
    """``rounds`` bulk enqueues of one call per key; VACUUM every ``vacuum_every`` rounds.

    Returns the figures after each VACUUM.
    """
    figures = []
    for done in range(1, rounds + 1):
        jobs = enqueue_many([Call(task, (key,)) for key in KEYS])
        assert {job.outcome for job in jobs} == {"debounced"}
        if vacuum_every and done % vacuum_every == 0:
            figures.append(_vacuum())
    return figures


def _show(label: str, stats: dict[str, int]) -> str:
    return (
        f"{label}: dead {stats['dead']}, live {stats['live']}, heap "
        f"{stats['heap'] / MIB:.2f} MiB, indexes {stats['indexes'] / MIB:.2f} MiB, "
        f"total {stats['total'] / MIB:.2f} MiB"
    )


def _snapshot_holders() -> list[tuple[Any, ...]]:
    """Other backends of this database holding a snapshot or a transaction id.

    While one does, neither VACUUM nor pruning may remove the row versions it might see.
    """
    return _sql_rows(
        "SELECT pid, application_name, state, backend_xid, backend_xmin FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid() "
        "AND (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL)"
    )


@pytest.fixture
def job_table() -> Iterator[dict[str, int]]:
    """1,000 open windows, vacuumed, autovacuum off for the table; yields their figures.

    First waits until no other connection to the test database holds a snapshot (an
    earlier test's worker still exiting): the figures are those of this test's writes.
    """
    wait_for(lambda: not _snapshot_holders(), timeout=30, what=_snapshot_holders)
    _sql_rows(f'ALTER TABLE "{TABLE}" SET (autovacuum_enabled = false)')
    try:
        jobs = enqueue_many([Call("hygiene.slide", (key,)) for key in KEYS])
        assert {job.outcome for job in jobs} == {"created"}
        yield _vacuum(analyze=True)
    finally:
        _sql_rows(f'ALTER TABLE "{TABLE}" RESET (autovacuum_enabled, fillfactor)')


def test_a_slide_writes_one_indexed_column_run_at_of_the_claim_index():
    """Which indexed columns the slide's ``ON CONFLICT DO UPDATE`` writes: only ``run_at``,
    and only ``debounce_job_claim`` has it (so only that index keeps slides from being HOT)."""
    sql, _ = _sql("postgresql", True, 1)
    assignments = sql.split(" DO UPDATE SET ", 1)[1].split(" WHERE ", 1)[0]
    written = set(re.findall(r'(?:^|, )"(\w+)" = ', assignments))
    assert written == {"run_at", "enqueue_count", "last_enqueued_at", "args", "kwargs"}
    indexed: dict[str, set[str]] = {}
    rows = _sql_rows(
        "SELECT i.relname, a.attname, x.indexprs IS NOT NULL, pg_get_expr(x.indpred, x.indrelid) "
        "FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
        "JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = ANY (x.indkey) "
        "WHERE x.indrelid = %s::regclass",
        (TABLE,),
    )
    for index, column, expression, predicate in rows:
        assert not expression, index  # else its expressions' columns count too
        # A predicate's columns count too: the claim index's (migration 0013) is status alone.
        assert predicate in (None, "((status)::text = 'READY'::text)"), (index, predicate)
        indexed.setdefault(column, set()).add(index)
    assert written & indexed.keys() == {"run_at"}
    assert indexed["run_at"] == {"debounce_job_claim"}


@pytest.mark.slow
def test_200000_slides_over_1000_keys_leave_no_dead_tuple_after_vacuum(job_table):
    """200,000 slides (200 per key, bulk enqueues of 1,000 keys), no VACUUM meanwhile: one
    non-HOT update per slide and one dead tuple each; VACUUM removes them all and leaves
    1,000 live rows. The file keeps its size (60–70× that of the 1,000 rows here), and
    20,000 more slides after the VACUUM reuse its space instead of growing it."""
    base = job_table
    started = time.monotonic()
    _slide_all("hygiene.slide", 200)
    took = time.monotonic() - started
    before = _after(200_000, base)
    after = _vacuum()
    more = _slide_all("hygiene.slide", 20)
    again = _vacuum()
    updates, hot = before["upd"] - base["upd"], before["hot"] - base["hot"]
    print(
        f"\n[200,000 slides over 1,000 keys in {took:.1f}s] n_tup_upd {updates}, "
        f"n_tup_hot_upd {hot} (HOT {hot / updates:.1%}), autovacuums "
        f"{before['autovacuums'] - base['autovacuums']}\n"
        + "\n".join(
            [
                _show("  1,000 windows", base),
                _show("  before VACUUM", before),
                _show("  after VACUUM", after),
                _show("  +20,000 slides, VACUUM", again),
            ]
        )
    )
    assert more == []
    assert updates == 200_000  # one row update per slide, nothing else written
    assert hot == 0  # run_at moves on every slide, and debounce_job_claim indexes it
    assert before["dead"] >= 199_000  # (an estimate: the statistics of 200,000 updates)
    assert after["dead"] == 0
    assert Job.objects.count() == 1000  # (n_live_tup is VACUUM's estimate: printed only)
    assert sum(Job.objects.values_list("enqueue_count", flat=True)) == 221_000
    # Bounded by the slides' tuple versions (~250 bytes each): at most 120× the 1,000 rows.
    assert after["total"] <= 120 * base["total"], after
    # VACUUM's free space is reused: 20,000 more slides do not grow the file.
    assert again["heap"] <= after["heap"] * 1.02, (after, again)
    assert again["total"] <= after["total"] * 1.05, (after, again)


@pytest.mark.slow
def test_slides_with_a_vacuum_every_10000_keep_the_table_small(job_table):
    """100,000 slides with a VACUUM after every 10,000 (what autovacuum does on a busy
    table): the heap levels off after the second round (about 10× the 1,000 rows' heap
    here), and the table at about 6× the 1,000 rows.

    The indexes may creep a little further: the claim index takes each slide's new
    ``run_at`` at its right end, and the pages VACUUM empties at its left are reused only
    once no transaction anywhere on the server is older than their deletion."""
    base = job_table
    figures = _slide_all("hygiene.slide", 100, vacuum_every=10)
    sizes = [stats["total"] for stats in figures]
    final = _stats()
    print(
        "\n[100,000 slides, VACUUM every 10,000] heap + indexes after each VACUUM (MiB): "
        + ", ".join(f"{f['heap'] / MIB:.2f} + {f['indexes'] / MIB:.2f}" for f in figures)
        + "\n"
        + "\n".join([_show("  1,000 windows", base), _show("  at the end", final)])
    )
    assert final["dead"] == 0
    assert Job.objects.count() == 1000
    # Levelled off: the last eight rounds add nothing to the heap of the second.
    heaps = [stats["heap"] for stats in figures]
    assert heaps[-1] <= heaps[1] * 1.05, heaps
    # Without VACUUM, 80,000 slides add ~5 MiB to the indexes: here a fraction of it.
    assert figures[-1]["indexes"] <= figures[1]["indexes"] * 2, figures
    assert sizes[-1] <= 20 * base["total"], (sizes, base)


def test_a_slide_at_the_window_ceiling_can_be_a_hot_update(job_table):
    """A window whose max wait equals its length sits at its ceiling from the start: a slide
    leaves ``run_at`` unchanged and writes no indexed column, so PostgreSQL may make it HOT
    if the page has room. One call at a time through ``enqueue()`` writes the same row.

    Its rows go to pages filled to 10 % (``fillfactor``): room for the new versions
    without pruning, which another connection's snapshot may hold back (with the default
    fill, 8–40 % of them were HOT alone and 0 % once in a full run of the suite)."""
    _sql_rows(f'ALTER TABLE "{TABLE}" SET (fillfactor = 10)')  # for the pages added now
    jobs = enqueue_many([Call("hygiene.ceiling", (key,)) for key in KEYS])
    assert {job.outcome for job in jobs} == {"created"}
    base = _vacuum()
    _slide_all("hygiene.ceiling", 10)
    for key in KEYS:
        assert enqueue("hygiene.ceiling", args=(key,)).outcome == "debounced"
    stats = _after(11_000, base)
    updates, hot = stats["upd"] - base["upd"], stats["hot"] - base["hot"]
    print(f"\n[11,000 slides at the ceiling] n_tup_upd {updates}, HOT {hot} ({hot / updates:.1%})")
    assert updates == 11_000
    assert hot > 0
    run_at = set(
        Job.objects.filter(task_name="hygiene.ceiling").values_list("run_at", "max_run_at")
    )
    assert all(deadline == ceiling for deadline, ceiling in run_at)
