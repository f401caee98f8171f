"""The admin of issue #4 (test client): pages, filters, bounded queries, the guarded Retry (§8, §9).

Run now / Cancel and the races on PostgreSQL are in ``processes/test_admin_window_actions.py``; the real
browser in ``processes/test_admin_in_browser.py``.
"""

from __future__ import annotations

import datetime as dt
import re
import secrets
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_debounce.admin.helpers import CappedCountPaginator, format_countdown
from django_debounce.keys import window_hash
from django_debounce.models import DeadLetter, Job, JobDependency
from tests.conftest import T
from tests.factories import DeadLetterFactory, JobFactory
from tests.testapp.tasks_admin import refresh

pytestmark = pytest.mark.django_db

CHANGELISTS = ["job", "openwindow", "deadletter"]


def url(model: str, view: str = "changelist", *args: Any) -> str:
    return reverse(f"admin:django_debounce_{model}_{view}", args=args)


def window_job(key: str = "page:1", **fields: Any) -> Job:
    """An open window of ``tests.admin.refresh`` seeded directly (opened at now, window 10 s)."""
    opened = fields.pop("opened_at", timezone.now())
    marker = secrets.token_hex(16)
    defaults: dict[str, Any] = {
        "task_name": "tests.admin.refresh",
        "queue": "admin-search",
        "args": [1],
        "opened_at": opened,
        "run_at": opened + dt.timedelta(seconds=10),
        "max_run_at": opened + dt.timedelta(minutes=1),
        "debounce_key": key,
        "window_key": marker,
        "created_at": opened,
    }
    defaults.update(fields)
    # As an enqueue writes it: the admin's key search looks the key up by this hash.
    defaults.setdefault("key_hash", window_hash(defaults["task_name"], key))
    return JobFactory(**defaults)


def seed(model: str, rows: int) -> None:
    if model == "job":
        JobFactory.create_batch(rows)
    elif model == "openwindow":
        for n in range(rows):
            window_job(f"page:{n}")
    else:
        DeadLetterFactory.create_batch(rows)


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def staff(django_user_model: Any, *codenames: str) -> Any:
    user = django_user_model.objects.create_user(
        username=f"staff-{secrets.token_hex(4)}", password="pw", is_staff=True
    )
    user.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="django_debounce", codename__in=codenames
        )
    )
    return user


# -- pages and queries ------------------------------------------------------------------------


@pytest.mark.parametrize("model", CHANGELISTS)
def test_changelist_queries_do_not_grow_with_the_page_size(admin_client, model):
    """10 rows and 100 rows on one page: the same number of queries, and few (issue #4 item 4)."""
    counts = []
    for rows in (10, 90):  # 10, then 100 in all
        seed(model, rows)
        with CaptureQueriesContext(connection) as queries:
            response = admin_client.get(url(model), {"all": ""} if rows == 90 else {})
        assert response.status_code == 200
        assert len(response.context["cl"].result_list) == (10 if rows == 10 else 100)
        counts.append(len(queries))
        # No unbounded COUNT(*): every count is over a LIMITed subquery.
        for query in queries.captured_queries:
            if "COUNT(" in query["sql"].upper():
                assert "LIMIT" in query["sql"].upper(), query["sql"]
    assert counts[0] == counts[1], counts
    assert counts[1] <= 10, counts


@pytest.mark.parametrize("model", CHANGELISTS)
def test_changelist_queries_bounded_at_max_page_size(
    admin_client, model, django_assert_max_num_queries
):
    seed(model, 100)
    with django_assert_max_num_queries(10):
        response = admin_client.get(url(model))
    assert response.status_code == 200
    assert len(response.context["cl"].result_list) == 50  # list_per_page


def test_count_is_capped_and_said_so(admin_client, monkeypatch):
    monkeypatch.setattr(CappedCountPaginator, "cap", 5)
    JobFactory.create_batch(8)
    response = admin_client.get(url("job"))
    assert response.context["cl"].result_count == 5
    assert response.context["cl"].paginator.capped is True
    assert re.search(r"more than 5\s+jobs", response.content.decode())
    small = admin_client.get(url("job"), {"status__exact": "FAILED"})
    assert small.context["cl"].paginator.capped is False
    assert small.context["cl"].result_count == 0


@pytest.mark.parametrize("model", CHANGELISTS)
def test_no_add_change_or_delete_anywhere(admin_client, model):
    assert admin_client.get(url(model, "add")).status_code == 403
    obj = (
        DeadLetterFactory()
        if model == "deadletter"
        else (window_job() if model == "openwindow" else JobFactory())
    )
    page = admin_client.get(url(model))
    for name in CHANGELISTS:
        assert url(name, "add").encode() not in page.content
    assert b'value="delete_selected"' not in page.content
    delete = url(model, "delete", obj.pk)
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert type(obj).objects.filter(pk=obj.pk).exists()
    detail = admin_client.get(url(model, "change", obj.pk))
    assert detail.status_code == 200
    assert b'name="_save"' not in detail.content


def test_format_countdown():
    assert format_countdown(252) == "in 4 m 12 s"
    assert format_countdown(10) == "in 10 s"
    assert format_countdown(10.9) == "in 10 s"
    assert format_countdown(3600 + 125) == "in 1 h 2 m"
    assert format_countdown(2 * 86400 + 3 * 3600 + 7) == "in 2 d 3 h"
    assert format_countdown(60) == "in 1 m 0 s"
    assert format_countdown(0.4) == "due now"
    assert format_countdown(-3) == "overdue by 3 s"


# -- open windows -----------------------------------------------------------------------------


def test_open_windows_page_shows_the_window_as_it_slides(admin_client, clock):
    first = refresh.delay(7)
    clock(seconds=3)
    assert refresh.delay(7).pk == first.pk  # slid to T+13s, 2 calls
    other = refresh.delay(8, note="x")
    JobFactory()  # a plain job: not a window
    closed = window_job("page:closed", status=Job.Status.RUNNING, window_key=None)
    response = admin_client.get(url("openwindow"))
    assert response.status_code == 200
    rows = list(response.context["cl"].result_list)
    assert [job.pk for job in rows] == [first.pk, other.pk]  # soonest deadline first
    assert closed.pk not in [job.pk for job in rows]
    html = response.content.decode()
    deadline = (T + dt.timedelta(seconds=13)).isoformat()
    assert f'datetime="{deadline}"' in html
    assert "in 10 s</time>" in html  # server-rendered countdown (works without JS)
    assert "django_debounce/countdown.js" in html
    assert "page:7" in html and "page:8" in html
    assert "<code>[7]</code>" in html  # payload preview
    assert "<code>[8] {&quot;note&quot;: &quot;x&quot;}</code>" in html
    cells = re.findall(r'<td class="field-calls">(\d+)</td>', html)
    assert cells == ["1", "0"]  # calls that joined the window: enqueue_count - 1
    ceiling = response.context["cl"].result_list[0].max_run_at
    assert ceiling == T + dt.timedelta(minutes=1)


def test_open_windows_filters_and_search(admin_client):
    a = window_job("page:a")
    b = window_job("page:b", queue="other", task_name="tests.noop")
    by_task = admin_client.get(url("openwindow"), {"task": "tests.admin.refresh"})
    assert [j.pk for j in by_task.context["cl"].result_list] == [a.pk]
    by_queue = admin_client.get(url("openwindow"), {"queue": "other"})
    assert [j.pk for j in by_queue.context["cl"].result_list] == [b.pk]
    found = admin_client.get(url("openwindow"), {"q": "ge:b"})
    assert [j.pk for j in found.context["cl"].result_list] == [b.pk]
    filters = by_task.content.decode()
    assert "tests.admin.refresh" in filters and "admin-search" in filters  # registry choices


# -- jobs -------------------------------------------------------------------------------------


def test_job_filters_and_search(admin_client):
    ready = JobFactory(task_name="tests.noop")
    failed = JobFactory(status=Job.Status.FAILED, queue="mail", task_name="tests.admin.mail")
    keyed = window_job("page:42")
    cases = [
        ({"status__exact": "FAILED"}, [failed.pk]),
        ({"queue": "mail"}, [failed.pk]),
        ({"task": "tests.noop"}, [ready.pk]),
        ({"q": str(ready.pk)}, [ready.pk]),
        ({"q": "page:42"}, [keyed.pk]),
        ({"q": "tests.admin.mail"}, [failed.pk]),
        ({"created_at__gte": "2000-01-01 00:00:00+00:00"}, [keyed.pk, failed.pk, ready.pk]),
    ]
    for params, expected in cases:
        response = admin_client.get(url("job"), params)
        assert [j.pk for j in response.context["cl"].result_list] == expected, params


def test_job_detail_explains_and_links(admin_client):
    opened = T
    job = JobFactory(
        task_name="tests.admin.refresh",
        status=Job.Status.FAILED,
        args=[1, {"deep": [1, 2]}],
        kwargs={"lang": "de"},
        opened_at=opened,
        run_at=opened + dt.timedelta(minutes=1),
        max_run_at=opened + dt.timedelta(minutes=1),
        debounce_key="page:1",
        error="ValueError: <boom>",
        traceback="Traceback (most recent call last):\n  x\nValueError: <boom>\n",
        attempts=1,  # its first attempt failed for good (max_retries=0)
        worker_id="host:123:w1",
        result=None,
    )
    letter = DeadLetterFactory(job=job)
    dependent = JobFactory()
    JobDependency.objects.create(job=dependent, dependency=job)
    html = admin_client.get(url("job", "change", job.pk)).content.decode()
    assert "max wait reached" in html
    assert '<pre class="debounce-pre">{\n  &quot;args&quot;: [\n    1,' in html  # pretty JSON
    assert "ValueError: &lt;boom&gt;\n</pre>" in html  # traceback preformatted, escaped
    assert "host:123:w1" in html
    assert url("deadletter", "change", letter.pk) in html
    assert url("job", "change", dependent.pk) in html
    dependent_html = admin_client.get(url("job", "change", dependent.pk)).content.decode()
    assert url("job", "change", job.pk) in dependent_html  # "depends on" link
    assert "has not run yet (due " in dependent_html  # READY, never started
    held = f'dependency not yet successful: <a href="{url("job", "change", job.pk)}">#{job.pk}</a>'
    assert held + " (FAILED)" in dependent_html  # "held back by", linked
    Job.objects.filter(pk=job.pk).update(attempts=4)
    retried_html = admin_client.get(url("job", "change", job.pk)).content.decode()
    assert "a retry: an earlier attempt failed" in retried_html


def test_job_detail_of_open_window_shows_countdown(admin_client, clock):
    job = refresh.delay(3)
    html = admin_client.get(url("job", "change", job.pk)).content.decode()
    assert "window still open" in html
    assert "in 10 s</time>" in html
    # Past its deadline and not claimed (held back, say): it is due, not "still open; if no
    # call comes" (a new user's trial read the two lines as contradicting "held back by").
    clock(seconds=11)
    html = admin_client.get(url("job", "change", job.pk)).content.decode()
    assert "window still open" not in html
    assert "and not started yet: see “held back by”; calls that come meanwhile" in html


# -- dead letters -----------------------------------------------------------------------------


def kinds() -> dict[str, DeadLetter]:
    return {
        "failure": DeadLetterFactory(reason="failed: 1 attempt(s); ValueError: boom"),
        "shed": DeadLetterFactory(reason="shed: rate 10/s exceeded", metadata={"shed": True}),
        "codel": DeadLetterFactory(reason="codel: sojourn 7s", metadata={"codel": True}),
        "unknown_task": DeadLetterFactory(
            reason="unknown_task: gone.task", task_name="gone.task", error=""
        ),
    }


def test_dead_letters_newest_first_and_kind_filter(admin_client, clock):
    letters = {}
    for n, (kind, letter) in enumerate(kinds().items()):
        letter.created_at = T + dt.timedelta(seconds=n)
        letter.save(update_fields=["created_at"])
        letters[kind] = letter
    everything = admin_client.get(url("deadletter"))
    newest_first = [letters[k].pk for k in ("unknown_task", "codel", "shed", "failure")]
    assert [d.pk for d in everything.context["cl"].result_list] == newest_first
    html = everything.content.decode()
    for kind in letters:
        assert f"debounce-kind-{kind}" in html
    for kind, letter in letters.items():
        response = admin_client.get(url("deadletter"), {"kind": kind})
        assert [d.pk for d in response.context["cl"].result_list] == [letter.pk], kind


def test_dead_letter_task_error_type_and_retried_filters(admin_client):
    boom = DeadLetterFactory()
    key = DeadLetterFactory(
        task_name="tests.admin.mail",
        error="builtins.KeyError: 'x'",
        reason="failed: 1 attempt(s); KeyError",
    )
    done = DeadLetterFactory()
    done.retry()
    cases = [
        ({"task": "tests.admin.mail"}, [key.pk]),
        ({"error_type": "builtins.KeyError"}, [key.pk]),
        ({"error_type": "ValueError"}, [done.pk, boom.pk]),
        ({"retried": "yes"}, [done.pk]),
        ({"retried": "no"}, [key.pk, boom.pk]),
        ({"q": str(key.job_id)}, [key.pk]),
    ]
    for params, expected in cases:
        response = admin_client.get(url("deadletter"), params)
        assert [d.pk for d in response.context["cl"].result_list] == expected, params
    assert "builtins.KeyError" in response.content.decode()  # error-type choices


def test_dead_letter_detail(admin_client):
    letter = DeadLetterFactory(metadata={"attempts": 1, "why": "<x>"})
    retry_job = letter.retry()
    html = admin_client.get(url("deadletter", "change", letter.pk)).content.decode()
    assert '<pre class="debounce-pre">Traceback (most recent call last):' in html
    assert "&quot;why&quot;: &quot;&lt;x&gt;&quot;" in html
    assert url("job", "change", letter.job_id) in html
    assert url("job", "change", retry_job.pk) in html
    retried = admin_client.get(url("job", "change", retry_job.pk)).content.decode()
    assert url("deadletter", "change", letter.pk) in retried  # "retried as this job"


# -- the guarded Retry ------------------------------------------------------------------------


def retry_post(client: Client, *ids: int, **extra: str) -> Any:
    data = {"action": "retry_selected", "index": "0", "_selected_action": [str(i) for i in ids]}
    data.update(extra)
    return client.post(url("deadletter"), data, follow=True)


def test_staff_without_permission_sees_no_retry_and_forged_post_is_refused(
    client, django_user_model
):
    user = staff(django_user_model, "view_deadletter", "view_job")
    client.force_login(user)
    letter = DeadLetterFactory()
    page = client.get(url("deadletter"))
    assert page.status_code == 200
    assert b"retry_selected" not in page.content
    jobs_before = Job.objects.count()
    response = retry_post(client, letter.pk)
    assert response.status_code in (200, 403)
    letter.refresh_from_db()
    assert letter.retried_at is None and letter.retry_job is None
    assert Job.objects.count() == jobs_before
    assert not any("retried" in m for m in messages_of(response)) if response.context else True


def test_retry_action_itself_refuses_without_permission(rf, django_user_model):
    """Defence in depth: the action method checks the permission even if called directly."""
    from django.contrib.admin.sites import site
    from django.core.exceptions import PermissionDenied

    letter = DeadLetterFactory()
    request = rf.post("/")
    request.user = staff(django_user_model, "view_deadletter")
    with pytest.raises(PermissionDenied):
        site._registry[DeadLetter].retry_selected(request, DeadLetter.objects.all())
    letter.refresh_from_db()
    assert letter.retried_at is None


def test_retry_with_permission_creates_exactly_one_job_and_double_submit_none(
    client, django_user_model
):
    user = staff(django_user_model, "view_deadletter", "retry_deadletter")
    client.force_login(user)
    letter = DeadLetterFactory(args=[1, "a"], kwargs={"k": 2})
    page = client.get(url("deadletter"))
    assert b'value="retry_selected"' in page.content
    jobs_before = set(Job.objects.values_list("pk", flat=True))
    first = retry_post(client, letter.pk)
    new = Job.objects.exclude(pk__in=jobs_before)
    assert new.count() == 1
    job = new.get()
    assert (job.task_name, job.args, job.kwargs, job.status) == (
        "tests.noop",
        [1, "a"],
        {"k": 2},
        Job.Status.READY,
    )
    letter.refresh_from_db()
    assert letter.retry_job_id == job.pk and letter.retried_at is not None
    assert messages_of(first) == [
        f"1 dead letter retried, 0 skipped (already retried): #{letter.pk} → job #{job.pk}."
    ]
    second = retry_post(client, letter.pk)  # the same form submitted again
    assert Job.objects.exclude(pk__in=jobs_before).count() == 1
    assert messages_of(second) == ["0 dead letters retried, 1 skipped (already retried)."]


def test_retry_counts_retried_and_skipped(admin_client):
    fresh = DeadLetterFactory.create_batch(2)
    old = DeadLetterFactory()
    old.retry()
    response = retry_post(admin_client, *(d.pk for d in fresh), old.pk)
    text = messages_of(response)[0]
    assert text.startswith("2 dead letters retried, 1 skipped (already retried): ")
    assert DeadLetter.objects.filter(retried_at__isnull=False).count() == 3


def test_retry_of_a_call_no_longer_valid_reports_failure(admin_client):
    """The key template needs an argument the stored call lacks: KeyResolutionError, reported."""
    letter = DeadLetterFactory(task_name="tests.admin.refresh", args=[], kwargs={})
    response = retry_post(admin_client, letter.pk)
    texts = messages_of(response)
    assert texts[0] == "0 dead letters retried, 0 skipped (already retried)."
    assert texts[1].startswith(f"Dead letter #{letter.pk} could not be retried: ")
    letter.refresh_from_db()
    assert letter.retried_at is None


def test_retry_of_shed_entry_works(admin_client):
    letter = kinds()["shed"]
    retry_post(admin_client, letter.pk)
    letter.refresh_from_db()
    assert letter.retry_job is not None and letter.retry_job.status == Job.Status.READY


def test_csrf_is_enforced(django_user_model):
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff(django_user_model, "view_deadletter", "retry_deadletter"))
    letter = DeadLetterFactory()
    forged = client.post(
        url("deadletter"),
        {"action": "retry_selected", "index": "0", "_selected_action": [str(letter.pk)]},
    )
    assert forged.status_code == 403
    letter.refresh_from_db()
    assert letter.retried_at is None
    page = client.get(url("deadletter"))
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode())
    assert token
    ok = retry_post(client, letter.pk, csrfmiddlewaretoken=token.group(1))
    assert ok.status_code == 200
    letter.refresh_from_db()
    assert letter.retried_at is not None


def test_too_many_selected_is_refused(admin_client, monkeypatch):
    monkeypatch.setattr("django_debounce.admin.base.MAX_ACTION_ROWS", 2)
    letters = DeadLetterFactory.create_batch(3)
    response = retry_post(admin_client, *(d.pk for d in letters))
    assert messages_of(response) == ["Select at most 2 rows per action; nothing was done."]
    assert not DeadLetter.objects.filter(retried_at__isnull=False).exists()
