"""Tasks of the admin tests (issue #4): a debounced refresh with a key, and a plain mailer."""

from __future__ import annotations

from django_debounce import debounced_task, task


@debounced_task(
    name="tests.admin.refresh",
    debounce="10s",
    debounce_max_wait="1m",
    debounce_key="page:{0}",
    queue="admin-search",
)
def refresh(page: int, **options: object) -> None:
    """Refresh one page; a burst of calls for the same page is one job."""


@task(name="tests.admin.mail", max_retries=0)
def mail(to: str) -> None:
    """Send a mail (never called for real: the tests seed its dead letters)."""
