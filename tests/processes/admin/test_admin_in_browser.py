"""The admin in a real browser (issue #4): Playwright for Python driving Debian's Chromium.

Never downloads a browser: Chromium is ``/usr/bin/chromium`` (Debian's ``chromium``
package; ``.ci/run`` installs it when missing), passed to Playwright as
``executable_path``. Without it (or without the ``playwright`` package) the tests
skip, or fail under ``DEBOUNCE_REQUIRE_SERVICES=1``.

The pages are served by pytest-django's ``live_server`` (a thread of this process
on its own database connection, so the tests use the transactional database and
see what the server committed). Screenshots of the pages go to
``.artifacts/screenshots/``; with ``DEBOUNCE_DOCS_SCREENSHOTS=1`` to ``docs/img/``
(how the pictures in ``docs/howto/operators.md`` are refreshed).
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections
from django.utils import timezone

from django_debounce.models import DeadLetter, Job
from tests.conftest import require_service
from tests.db.admin.test_admin import window_job
from tests.factories import DeadLetterFactory, JobFactory
from tests.procs import wait_for

CHROMIUM = os.environ.get("DEBOUNCE_CHROMIUM", "/usr/bin/chromium")
REPO = Path(__file__).resolve().parents[3]
SHOTS = (
    REPO / "docs" / "img"
    if os.environ.get("DEBOUNCE_DOCS_SCREENSHOTS") == "1"
    else REPO / ".artifacts" / "screenshots"
)
#: Generous: the machine is shared and slow at times (waits, not speed assertions).
WAIT_MS = 20_000

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # pragma: no cover - the test group installs it
    sync_playwright = None  # type: ignore[assignment]


@pytest.fixture(autouse=True)
def _allow_orm_beside_playwright(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let the test's own ORM calls run while Playwright's sync API is active.

    Playwright's sync API keeps an asyncio event loop running in the test's
    thread, and Django refuses ORM calls from a thread with a running loop
    (SynchronousOnlyOperation). Here the ORM calls are plain synchronous calls
    made by the test between browser steps, never from a coroutine, so the
    check is a false alarm; it is switched off for this module's tests only.
    """
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture
def browser() -> Iterator[Any]:
    require_service(sync_playwright is not None, "needs the playwright package (test group)")
    require_service(
        os.path.exists(CHROMIUM),
        f"needs Chromium at {CHROMIUM} (apt-get install chromium); never downloaded",
    )
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        try:
            yield launched
        finally:
            launched.close()
    _wait_for_server_threads_to_close_their_connections()


def _wait_for_server_threads_to_close_their_connections() -> None:
    """Wait until no other connection to the test database is left (PostgreSQL).

    The live server's request threads close theirs when the browser closes
    the keep-alive sockets, a moment after ``browser.close()``; a connection
    left open would make dropping the test database fail ("being accessed by
    other users") at the end of the session, far from its cause.
    """
    if connection.vendor != "postgresql":
        return

    def others() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return int(cursor.fetchone()[0])

    wait_for(lambda: others() == 0, timeout=30, what="the live server's connections to close")


@pytest.fixture
def page(browser: Any, live_server: Any, django_user_model: Any) -> Iterator[Any]:
    """A logged-in admin page (a superuser, through the real login form)."""
    django_user_model.objects.create_superuser("operator", "op@example.com", "correct horse")
    context = new_context(browser, live_server)
    tab = context.new_page()
    tab.goto("/admin/login/?next=/admin/")
    tab.fill("#id_username", "operator")
    tab.fill("#id_password", "correct horse")
    tab.click("input[type=submit]")
    expect(tab.locator("#site-name")).to_be_visible()
    expect(tab).to_have_url(re.compile(r"/admin/$"))
    try:
        yield tab
    finally:
        context.close()
        # The test's ORM calls ran while Playwright's loop was active, in a context
        # (asgiref.local + greenlet) whose connection the teardown would not see: close it.
        connections.close_all()


def new_context(browser: Any, live_server: Any, **options: Any) -> Any:
    """A browser context on the live server, the admin's navigation sidebar collapsed."""
    context = browser.new_context(
        viewport={"width": 1500, "height": 700}, base_url=live_server.url, **options
    )
    context.set_default_timeout(WAIT_MS)
    context.add_init_script("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")
    return context


def shot(tab: Any, name: str, *, full_page: bool = False) -> None:
    """Save a PNG of the page (the viewport: the changelists' long filter lists cut off)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(SHOTS / name), full_page=full_page)


def test_open_windows_page_shows_a_live_countdown(page, browser, live_server):
    now = timezone.now()
    window = window_job(
        "page:pricing",
        opened_at=now - dt.timedelta(seconds=48),
        run_at=now + dt.timedelta(minutes=4, seconds=12),
        max_run_at=now + dt.timedelta(minutes=9, seconds=12),
        enqueue_count=17,
        last_enqueued_at=now - dt.timedelta(seconds=3),
        args=[42],
        kwargs={"lang": "de"},
    )
    window_job(
        "page:home",
        opened_at=now - dt.timedelta(seconds=2),
        run_at=now + dt.timedelta(seconds=8),
        max_run_at=now + dt.timedelta(minutes=1),
        args=[1],
    )
    page.goto("/admin/django_debounce/openwindow/")
    countdown = page.locator(f'tr:has(a[href$="/job/{window.pk}/change/"]) time.debounce-countdown')
    expect(countdown).to_have_text(re.compile(r"^in 4 m \d+ s$"))
    first = countdown.inner_text()
    # The script ticks every second: the text changes without a reload.
    page.wait_for_function(
        "([el, text]) => el.textContent !== text",
        arg=[countdown.element_handle(), first],
        timeout=WAIT_MS,
    )
    expect(countdown).to_have_text(re.compile(r"^in 4 m \d+ s$"))
    row = page.locator(f'tr:has(a[href$="/job/{window.pk}/change/"])')
    expect(row).to_contain_text("page:pricing")
    expect(row.locator("td.field-calls")).to_have_text("16")  # calls that joined: 17 - 1
    expect(row).to_contain_text('[42] {"lang": "de"}')
    shot(page, "admin-open-windows.png")

    dark = new_context(
        browser, live_server, color_scheme="dark", storage_state=page.context.storage_state()
    )
    try:
        tab = dark.new_page()
        tab.goto("/admin/django_debounce/openwindow/")
        expect(tab.locator("time.debounce-countdown").first).to_be_visible()
        shot(tab, "admin-open-windows-dark.png")
    finally:
        dark.close()


def test_job_detail_says_why_it_ran(page):
    now = timezone.now()
    job = JobFactory(
        task_name="tests.admin.refresh",
        queue="admin-search",
        status=Job.Status.FAILED,
        args=[42],
        kwargs={"lang": "de"},
        opened_at=now - dt.timedelta(minutes=2),
        created_at=now - dt.timedelta(minutes=2),
        last_enqueued_at=now - dt.timedelta(minutes=1, seconds=2),
        run_at=now - dt.timedelta(minutes=1),
        max_run_at=now - dt.timedelta(minutes=1),
        debounce_key="page:42",
        enqueue_count=31,
        attempts=1,
        max_retries=0,
        started_at=now - dt.timedelta(seconds=59),
        finished_at=now - dt.timedelta(seconds=58),
        worker_id="web-1:4242:thread-0",
        error="ConnectionError: search index unreachable",
        traceback=(
            "Traceback (most recent call last):\n"
            '  File "shop/tasks.py", line 12, in refresh\n'
            "    index.push(page)\n"
            "ConnectionError: search index unreachable\n"
        ),
    )
    letter = DeadLetterFactory(
        job=job,
        task_name=job.task_name,
        queue=job.queue,
        reason="failed: 1 attempt(s); ConnectionError: search index unreachable",
        error=job.error,
        traceback=job.traceback,
    )
    page.goto("/admin/django_debounce/job/")
    page.click(f'a[href$="/job/{job.pk}/change/"]')
    expect(page.locator(".field-why_it_ran")).to_contain_text("max wait reached")
    expect(page.locator(".field-traceback_pre pre")).to_contain_text("index.push(page)")
    expect(page.locator(f'a[href$="/deadletter/{letter.pk}/change/"]')).to_be_visible()
    shot(page, "admin-job.png", full_page=True)


def test_retry_a_dead_letter_through_the_action_and_filter_by_kind(page):
    failed = DeadLetterFactory(
        task_name="tests.admin.mail",
        args=["ada@example.com"],
        reason="failed: 1 attempt(s); smtplib.SMTPServerDisconnected: Connection unexpectedly closed",
        error="smtplib.SMTPServerDisconnected: Connection unexpectedly closed",
    )
    shed = DeadLetterFactory(
        reason="shed: rate limit 10/s exceeded (on_excess='drop')", metadata={"shed": True}
    )
    codel = DeadLetterFactory(
        reason="codel: sojourn 7.2s above target 5s for 1m", metadata={"codel": True}
    )
    unknown = DeadLetterFactory(task_name="old.task", reason="unknown_task: old.task", error="")
    jobs_before = Job.objects.count()

    page.goto("/admin/django_debounce/deadletter/")
    expect(page.locator("#result_list tbody tr")).to_have_count(4)
    page.check(f'input[name="_selected_action"][value="{failed.pk}"]')
    page.select_option('select[name="action"]', "retry_selected")
    page.click('button[name="index"]')
    message = page.locator(".messagelist .success")
    expect(message).to_contain_text("1 dead letter retried, 0 skipped (already retried)")
    failed.refresh_from_db()
    assert failed.retry_job is not None and failed.retried_at is not None
    assert Job.objects.count() == jobs_before + 1
    shot(page, "admin-dead-letters.png")

    # The same entry again: skipped, and said so.
    page.check(f'input[name="_selected_action"][value="{failed.pk}"]')
    page.select_option('select[name="action"]', "retry_selected")
    page.click('button[name="index"]')
    expect(page.locator(".messagelist .warning")).to_contain_text(
        "0 dead letters retried, 1 skipped (already retried)"
    )
    assert Job.objects.count() == jobs_before + 1

    for label, letter in [
        ("shed (rate limit)", shed),
        ("shed (CoDel)", codel),
        ("unknown task", unknown),
        ("failure", failed),
    ]:
        page.locator("#changelist-filter").get_by_role("link", name=label, exact=True).click()
        expect(page).to_have_url(re.compile(r"kind="))
        rows = page.locator("#result_list tbody tr")
        expect(rows).to_have_count(1)
        expect(rows.first.locator("td.field-id, th.field-id")).to_have_text(str(letter.pk))
    page.locator("#changelist-filter").get_by_role("link", name="shed (rate limit)").click()
    shot(page, "admin-dead-letters-shed.png")
    assert DeadLetter.objects.filter(retried_at__isnull=False).count() == 1


def test_held_back_job_and_flow_control_state(page):
    """A READY job held back by an open circuit breaker: its page says so and until when;
    the Task states page shows the breaker, the token level now and running vs cap."""
    from django_debounce.models import TaskState
    from tests.testapp import tasks_admin_holds

    tasks_admin_holds.register()
    try:
        now = timezone.now()
        TaskState.objects.create(
            task_name="holds.guarded",
            breaker_state=TaskState.BreakerState.OPEN,
            failures=2,
            opened_at=now - dt.timedelta(seconds=20),
        )
        TaskState.objects.create(
            task_name="holds.rated", tokens=0.4, tokens_at=now - dt.timedelta(seconds=3)
        )
        TaskState.objects.create(task_name="holds.capped")
        for _ in range(2):
            JobFactory(
                task_name="holds.capped",
                status=Job.Status.RUNNING,
                started_at=now,
                lease_expires_at=now + dt.timedelta(minutes=5),
            )
        job = JobFactory(task_name="holds.guarded", args=["invoice-7"], created_at=now)
        page.goto(f"/admin/django_debounce/job/{job.pk}/change/")
        expect(page.locator(".field-held_back_by")).to_contain_text("circuit breaker open until")
        expect(page.locator(".field-why_it_ran")).to_contain_text("has not run yet (due ")
        shot(page, "admin-job-held-back.png")

        page.goto("/admin/django_debounce/taskstate/")
        expect(page.locator("#result_list tbody tr")).to_have_count(3)
        rated = page.locator("#result_list tbody tr", has_text="holds.rated")
        expect(rated.locator("td.field-tokens_now")).to_contain_text("/ 2 (2/m) · next token ~")
        capped = page.locator("#result_list tbody tr", has_text="holds.capped")
        expect(capped.locator("td.field-running_vs_cap")).to_have_text("2 / 2")
        shot(page, "admin-task-states.png")
    finally:
        tasks_admin_holds.unregister()


# -- the changelists on a laptop screen (issue #8) ------------------------------------------

LAPTOP = {"width": 1366, "height": 768}

#: For each header cell: the label, how far its text overflows the cell, and how far the
#: cell's right edge lies past what is visible (the viewport, or the results box, which
#: scrolls sideways and hides what does not fit). Both 0 when the column fits. Also how
#: far the results box and the page scroll sideways (0 when nothing is hidden to the right),
#: and the task names squeezed so narrow that a part of one breaks inside a word.
MEASURE_COLUMNS = """
() => {
  const results = document.querySelector('#changelist-form .results');
  const page = document.documentElement;
  const edge = Math.min(page.clientWidth, results.getBoundingClientRect().right);
  const columns = [...document.querySelectorAll('#result_list thead th')].map((th) => {
    const text = th.querySelector('.text') || th;
    return {
      header: th.innerText.replace(/\\s+/g, ' ').trim(),
      cut: Math.max(0, text.scrollWidth - text.clientWidth, th.scrollWidth - th.clientWidth),
      past: Math.max(0, Math.ceil(th.getBoundingClientRect().right - edge)),
    };
  });
  // Task names wrap after their dots and underscores (<wbr>): each part is its own text
  // node. A part laid out on more than one line was broken inside a word.
  const brokenTaskNames = [...document.querySelectorAll('#result_list .field-task')].filter(
    (cell) => [...cell.childNodes].some((node) => {
      if (node.nodeType !== Node.TEXT_NODE) return false;
      const range = document.createRange();
      range.selectNodeContents(node);
      return new Set([...range.getClientRects()].map((r) => Math.round(r.top))).size > 1;
    })
  ).map((cell) => cell.innerText);
  return {
    brokenTaskNames,
    columns,
    resultsScroll: Math.max(0, results.scrollWidth - results.clientWidth),
    pageScroll: Math.max(0, page.scrollWidth - page.clientWidth),
  };
}
"""


def seed_busy_changelists() -> None:
    """Rows as a busy site has them: long task names, keys, payloads, reasons and queues."""
    from django_debounce.models import QueueState, TaskState

    now = timezone.now()
    for n in range(3):
        window_job(
            f"customer:{40_000 + n}:invoice-summary",
            task_name="billing.tasks.rebuild_customer_invoice_summary",
            queue="billing-low",
            opened_at=now - dt.timedelta(seconds=40 + n),
            run_at=now + dt.timedelta(minutes=4, seconds=12),
            max_run_at=now + dt.timedelta(minutes=9, seconds=12),
            enqueue_count=1_234 + n,
            last_enqueued_at=now - dt.timedelta(seconds=3),
            args=[40_000 + n, "monthly"],
            kwargs={"currency": "EUR", "include_drafts": False},
        )
    for n in range(3):
        letter = DeadLetterFactory(
            task_name="notifications.tasks.send_weekly_digest_email",
            queue="notifications",
            reason=(
                "failed: 4 attempt(s); smtplib.SMTPServerDisconnected: Connection unexpectedly "
                "closed while sending the weekly digest to a long list of recipients"
            ),
        )
        if n:
            retry = JobFactory(task_name=letter.task_name, queue=letter.queue)
            DeadLetter.objects.filter(pk=letter.pk).update(retried_at=now, retry_job=retry)
    for name in ("billing.tasks.rebuild_customer_invoice_summary", "search.tasks.reindex_page"):
        TaskState.objects.create(
            task_name=name,
            breaker_state="open",
            failures=5,
            opened_at=now,
            tokens=0.5,
            tokens_at=now,
        )
    QueueState.objects.create(
        queue="notifications-weekly-digest",
        dropping=True,
        drop_count=12,
        drop_next_at=now,
        first_above_at=now,
    )


@pytest.mark.parametrize("sidebar", ["collapsed", "open"])
@pytest.mark.parametrize(
    ("changelist", "rows"),
    [("openwindow", 3), ("deadletter", 3), ("job", 8), ("taskstate", 2), ("queuestate", 1)],
)
def test_changelists_fit_a_laptop_screen(page, changelist, rows, sidebar):
    """At 1366x768 no header is cut, every column is in view (no sideways scrolling) and
    task names wrap only between their parts, with the navigation sidebar collapsed and
    open (Django's default for a new user)."""
    seed_busy_changelists()
    page.set_viewport_size(LAPTOP)
    is_open = "true" if sidebar == "open" else "false"
    # Runs after new_context's own script (collapsed), so it has the last word.
    page.context.add_init_script(
        f"localStorage.setItem('django.admin.navSidebarIsOpen', '{is_open}')"
    )
    page.goto(f"/admin/django_debounce/{changelist}/")
    expect(page.locator("#result_list tbody tr")).to_have_count(rows)
    shifted = re.compile(r"\bshifted\b")
    main = expect(page.locator("#main"))
    main.to_have_class(shifted) if sidebar == "open" else main.not_to_have_class(shifted)
    # Not a docs picture: always to .artifacts, even with DEBOUNCE_DOCS_SCREENSHOTS=1.
    artifacts = REPO / ".artifacts" / "screenshots"
    artifacts.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(artifacts / f"laptop-{changelist}-sidebar-{sidebar}.png"))
    measured = page.evaluate(MEASURE_COLUMNS)
    assert len(measured["columns"]) >= 6
    assert [c for c in measured["columns"] if c["cut"] or c["past"]] == []
    assert (measured["resultsScroll"], measured["pageScroll"]) == (0, 0)
    assert measured["brokenTaskNames"] == []
