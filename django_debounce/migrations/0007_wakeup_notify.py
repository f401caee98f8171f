"""Wake idle workers with LISTEN/NOTIFY on PostgreSQL (issue #10 item 3; decision 81).

Two row triggers on ``django_debounce_job`` call ``pg_notify('django_debounce_wakeup',
queue)`` when a row becomes claimable sooner than a worker may know: a READY row
is inserted, a row turns READY (a retry, a dead-letter retry, a put-back job),
or a READY row's ``run_at`` moves earlier (the admin's "run now"). A debounce
slide moves ``run_at`` later and notifies nothing. NOTIFY is transactional:
PostgreSQL delivers it at commit (never for a rolled-back write) and sends
identical notifications of one transaction once, so a bulk enqueue wakes
workers once per queue. Workers ``LISTEN`` (``django_debounce.wakeup``).

Other databases have no LISTEN/NOTIFY: the migration does nothing there.
Reversible: going back drops the triggers and the function.
"""

from typing import Any

from django.db import migrations

#: The channel (``django_debounce.worker.wakeup.CHANNEL`` must match it).
CHANNEL = "django_debounce_wakeup"

FORWARD = [
    f"""
    CREATE OR REPLACE FUNCTION django_debounce_wakeup_notify() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_notify('{CHANNEL}', NEW.queue);
        RETURN NULL;
    END
    $$
    """,
    """
    CREATE TRIGGER django_debounce_wakeup_insert
    AFTER INSERT ON django_debounce_job
    FOR EACH ROW WHEN (NEW.status = 'READY')
    EXECUTE FUNCTION django_debounce_wakeup_notify()
    """,
    """
    CREATE TRIGGER django_debounce_wakeup_update
    AFTER UPDATE OF run_at, status ON django_debounce_job
    FOR EACH ROW WHEN (
        NEW.status = 'READY' AND (OLD.status <> 'READY' OR NEW.run_at < OLD.run_at)
    )
    EXECUTE FUNCTION django_debounce_wakeup_notify()
    """,
]

BACKWARD = [
    "DROP TRIGGER IF EXISTS django_debounce_wakeup_update ON django_debounce_job",
    "DROP TRIGGER IF EXISTS django_debounce_wakeup_insert ON django_debounce_job",
    "DROP FUNCTION IF EXISTS django_debounce_wakeup_notify()",
]


def _run(statements: list[str]) -> Any:
    def run(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return
        for statement in statements:
            schema_editor.execute(statement)

    return run


class Migration(migrations.Migration):
    dependencies = [("django_debounce", "0006_job_finished_at_index")]

    operations = [migrations.RunPython(_run(FORWARD), _run(BACKWARD), elidable=False)]
