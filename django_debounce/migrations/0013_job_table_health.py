"""The job table's health on PostgreSQL: autovacuum per table, a claim index of live rows (decisions 219, 220).

Autovacuum's default trigger is 20 % of the table dead (``autovacuum_vacuum_scale_factor
= 0.2``): on a job table of 1,000,000 finished rows and 1,000 open windows that is
200,000 dead tuples, so 200,000 debounce slides (each a non-HOT update, decision 221)
leave their dead tuples and index entries in place, and the claim walks them. This
table gets its own trigger: 1,000 dead tuples plus 1 % of the table, and after 1,000
inserts plus 5 % of the table (``bench/table_health.py`` measures it).

The claim index ``debounce_job_claim`` keeps its columns and its name but holds only READY
rows (``WHERE status = 'READY'``): the claim reads nothing else, and finished rows made
up all but a few thousand of its entries (89 MiB at 1,000,000 finished rows), each
finish writing one more. The model's state still says the full index: Django's partial
indexes would also be declared for MariaDB, which has none (``models.W037`` for every
project there), so this migration replaces it on PostgreSQL alone.

SQLite and MariaDB: nothing happens (no autovacuum; InnoDB purges by itself;
docs/howto/table-health.md). Reversible: going back resets the storage parameters and
builds the full index again. The index is rebuilt inside the migration's transaction,
which blocks writes to the job table while it reads the READY rows (seconds on a
large table; ``CREATE INDEX CONCURRENTLY`` cannot run in a transaction).
"""

from typing import Any

from django.db import migrations

TABLE = "django_debounce_job"

#: Autovacuum for this table: dead tuples over 1,000 + 1 %, inserts over 1,000 + 5 %.
STORAGE = (
    "autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000, "
    "autovacuum_vacuum_insert_scale_factor = 0.05, autovacuum_vacuum_insert_threshold = 1000, "
    "autovacuum_analyze_scale_factor = 0.02"
)
RESET = (
    "autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold, "
    "autovacuum_vacuum_insert_scale_factor, autovacuum_vacuum_insert_threshold, "
    "autovacuum_analyze_scale_factor"
)
COLUMNS = "(status, priority DESC, run_at, id)"

FORWARD = [
    f"ALTER TABLE {TABLE} SET ({STORAGE})",
    f"CREATE INDEX debounce_job_claim_ready ON {TABLE} {COLUMNS} WHERE status = 'READY'",
    "DROP INDEX debounce_job_claim",
    "ALTER INDEX debounce_job_claim_ready RENAME TO debounce_job_claim",
]

BACKWARD = [
    f"ALTER TABLE {TABLE} RESET ({RESET})",
    f"CREATE INDEX debounce_job_claim_all ON {TABLE} {COLUMNS}",
    "DROP INDEX debounce_job_claim",
    "ALTER INDEX debounce_job_claim_all RENAME TO debounce_job_claim",
]


def _run(statements: list[str]) -> Any:
    def run(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return
        for statement in statements:
            schema_editor.execute(statement)

    return run


class Migration(migrations.Migration):
    dependencies = [("django_debounce", "0012_job_trace_links")]

    operations = [migrations.RunPython(_run(FORWARD), _run(BACKWARD), elidable=False)]
