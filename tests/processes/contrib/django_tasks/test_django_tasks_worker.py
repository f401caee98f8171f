"""Django's ``@task`` under a real ``run_debounce_worker``, and ``TASKS`` typos (issue #10 item 4).

* A Django task enqueued here runs in a worker subprocess, which knows it by
  name because importing the app's ``tasks`` module declared it (decision 97).
* A mistyped ``TASKS`` leaves unrelated commands working (``help``) and is
  reported by ``check`` (decision 99).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from django_debounce.contrib.django_tasks.results import TaskResultStatus
from tests.conftest import child_env
from tests.procs import REPO, processes, wait_for
from tests.testapp.models import CallLog
from tests.testapp.tasks_django import add, with_context


def manage(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "django", *argv],
        cwd=REPO,
        env=child_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.django_db(transaction=True)
def test_a_django_task_runs_under_the_worker(tmp_path):
    result = add.enqueue(19, 23)
    context = with_context.enqueue("w")
    with processes(tmp_path, child_env()) as procs:
        procs.worker("--poll-interval", "0.1", "--worker-id", "dj-worker")
        wait_for(
            lambda: (
                add.get_result(result.id).status == TaskResultStatus.SUCCESSFUL
                and with_context.get_result(context.id).is_finished
            ),
            timeout=30,
            what=procs.tails,
        )
    done = add.get_result(result.id)
    assert done.return_value == 42
    assert done.worker_ids == ["dj-worker"]
    assert CallLog.objects.get(task="dj.add").pid != os.getpid()
    assert with_context.get_result(context.id).return_value == {
        "attempt": 1,
        "id": context.id,
        "status": "RUNNING",
        "context": "TaskContext",
    }


@pytest.mark.django_db(transaction=True)  # no open write transaction for the child to wait on
def test_a_mistyped_backend_path_leaves_help_working_and_check_says_what_is_wrong():
    bad = "django_debounce.backend.DebounceBackend"
    helped = manage("help", DEBOUNCE_TEST_TASKS_BACKEND=bad)
    assert helped.returncode == 0, helped.stderr
    assert "run_debounce_worker" in helped.stdout
    checked = manage("check", DEBOUNCE_TEST_TASKS_BACKEND=bad)
    assert checked.returncode != 0
    assert bad in checked.stderr
    assert "No module named 'django_debounce.backend'" in checked.stderr


@pytest.mark.django_db(transaction=True)  # no open write transaction for the child to wait on
def test_the_tasks_module_a_bad_path_kept_out_is_recorded_for_e033():
    code = (
        "import django, json; django.setup(); "
        "from django_debounce.contrib.django_tasks.checks import TASK_MODULE_ERRORS; "
        "print(json.dumps(TASK_MODULE_ERRORS))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=child_env(
            DEBOUNCE_TEST_TASKS_BACKEND="django_debounce.contrib.django_tasks.backend.NoSuchBackend"
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    [(module, error)] = json.loads(out.stdout)
    assert module == "tests.testapp.tasks"
    assert "NoSuchBackend" in error


@pytest.mark.django_db(transaction=True)  # no open write transaction for the child to wait on
def test_a_mistyped_option_is_a_system_check_error_and_help_still_runs():
    extra = json.dumps({"OPTIONS": {"debounse": "5s"}})
    helped = manage("help", DEBOUNCE_TEST_TASKS_EXTRA=extra)
    assert helped.returncode == 0, helped.stderr
    checked = manage("check", DEBOUNCE_TEST_TASKS_EXTRA=extra)
    assert checked.returncode == 1
    assert "django_debounce.E031" in checked.stderr
    assert "'debounse'" in checked.stderr
    assert "Traceback" not in checked.stderr
