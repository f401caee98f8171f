"""The built package: it builds, passes ``twine check``, and works installed on its own.

``python -m build`` makes the sdist and then the wheel from that sdist, so a file the
sdist leaves out is missing from the wheel too; ``twine check --strict`` reads both. The
wheel's file list must hold every migration, template and static file of the checkout.
Then the wheel is installed into a fresh virtual environment in a temporary directory,
with Django from the package index, and a minimal Django project written there (its own
settings, a SQLite file, one app with one debounced task) runs ``migrate``, ``check``,
``collectstatic``, two enqueues of one key and ``run_debounce_worker --burst``.

Every process of the installed project runs from the temporary directory with a clean
environment (no ``PYTHONPATH``, no ``DJANGO_SETTINGS_MODULE``, nothing of the checkout on
``PATH``), so only the installed wheel can be imported; one of them reports where
``django_debounce`` was imported from.

Two environments: this run's Python and Django (CI's last cell: Python 3.12 + Django 6.1),
and Python 3.13 + Django 6.0, which no other CI cell runs; the classifiers name both, and
this is their check (install, migrate, checks, one job), not the whole suite.
"""

from __future__ import annotations

import json
import os
import sys
import time
import zipfile
from pathlib import Path

import django
import pytest

from tests.built_wheel import REPO, VERSION, clean_env, run
from tests.conftest import require_service

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PACKAGE = REPO / "django_debounce"

#: (id, interpreter for dev.find_python or None for this one, Django requirement or None
#: for this run's Django).
ENVIRONMENTS = [
    ("this-python-this-django", None, None),
    ("python3.13-django6.0", "python3.13", "Django>=6.0,<6.1"),
]

SETTINGS = """\
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent
SECRET_KEY = "built-wheel-test"
DEBUG = False
ALLOWED_HOSTS = ["localhost"]
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_debounce",
    "shop",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "site_urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": BASE_DIR / "db.sqlite3",
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20},
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "static-root"
RUNS_FILE = BASE_DIR / "runs.jsonl"
"""

URLS = """\
from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
"""

TASKS = """\
import json

from django.conf import settings

from django_debounce import debounced_task


@debounced_task(
    debounce="200ms",
    debounce_max_wait="30s",
    debounce_key="doc:{doc_id}",
    debounce_replace_payload=True,
)
def reindex(doc_id, version):
    with open(settings.RUNS_FILE, "a", encoding="utf-8") as runs:
        runs.write(json.dumps({"doc_id": doc_id, "version": version}) + "\\n")
"""

ENQUEUE = """\
import json
from shop.tasks import reindex

first = reindex.delay(doc_id=7, version=1)
second = reindex.delay(doc_id=7, version=2)
print(json.dumps([first.pk, first.outcome, second.pk, second.outcome]))
"""

WHERE = """\
import json, django, django_debounce
from django.template.loader import get_template

get_template("admin/django_debounce/pagination.html")
print(json.dumps([django_debounce.__file__, django_debounce.__version__, django.__version__]))
"""

JOBS = """\
import json
from django_debounce.models import Job

print(json.dumps(list(Job.objects.values("task_name", "status", "enqueue_count"))))
"""


def checkout_files(folder: str, pattern: str) -> set[str]:
    return {
        path.relative_to(REPO).as_posix()
        for path in (PACKAGE / folder).rglob(pattern)
        if "__pycache__" not in path.parts
    }


def test_the_wheel_holds_the_migrations_templates_static_files_and_licence(dist):
    names = set(zipfile.ZipFile(dist["wheel"]).namelist())
    migrations = checkout_files("migrations", "*.py")
    templates = checkout_files("templates", "*.html")
    static = checkout_files("static", "*.*")
    assert len(migrations) > 5 and templates and static
    assert migrations | templates | static | {"django_debounce/py.typed"} <= names
    assert f"django_debounce-{VERSION}.dist-info/licenses/LICENSE" in names
    # Only the package: the tests, the example project and the benchmarks stay behind.
    assert {name.split("/")[0] for name in names} == {
        "django_debounce",
        f"django_debounce-{VERSION}.dist-info",
    }
    metadata = zipfile.ZipFile(dist["wheel"]).read(f"django_debounce-{VERSION}.dist-info/METADATA")
    assert b"License-Expression: MIT" in metadata
    assert f"Version: {VERSION}".encode() in metadata


@pytest.mark.parametrize(
    ("python", "django_req"), [e[1:] for e in ENVIRONMENTS], ids=[e[0] for e in ENVIRONMENTS]
)
def test_the_installed_wheel_migrates_checks_and_runs_one_debounced_job(
    dist, tmp_path, python, django_req
):
    if python is None:
        base_python = sys.executable
        django_req = f"Django=={django.get_version()}"
    else:
        import dev

        try:
            base_python, _ = dev.find_python(python)
        except SystemExit:
            require_service(False, f"{python} is not installed")
    venv = tmp_path / "venv"
    run([base_python, "-m", "venv", venv], tmp_path)
    py = venv / ("Scripts" if os.name == "nt" else "bin") / "python"
    run([py, "-m", "pip", "install", "--quiet", dist["wheel"], django_req], tmp_path)

    site = tmp_path / "site"
    (site / "shop").mkdir(parents=True)
    (site / "site_settings.py").write_text(SETTINGS, encoding="utf-8")
    (site / "site_urls.py").write_text(URLS, encoding="utf-8")
    (site / "shop" / "__init__.py").write_text("", encoding="utf-8")
    (site / "shop" / "tasks.py").write_text(TASKS, encoding="utf-8")
    env = {**clean_env(), "DJANGO_SETTINGS_MODULE": "site_settings"}
    django_admin = [py, "-m", "django"]

    def manage(*args: str) -> str:
        return run([*django_admin, *args], site, env)

    def shell(code: str):
        # The script's answer is its last line (`shell` may announce its automatic imports).
        return json.loads(manage("shell", "-c", code).strip().splitlines()[-1])

    where, version, django_version = shell(WHERE)
    assert Path(where).resolve().is_relative_to(venv.resolve())
    assert not Path(where).resolve().is_relative_to(REPO)
    assert version == VERSION
    if python is not None:
        assert django_version.startswith("6.0.") or django_version == "6.0"

    migrated = manage("migrate", "--no-input")
    assert "django_debounce.0001_initial... OK" in migrated.replace("Applying ", "")
    manage("makemigrations", "--check", "--dry-run", "django_debounce")
    manage("check", "--fail-level", "WARNING")
    manage("check", "--database", "default", "--fail-level", "WARNING")
    manage("collectstatic", "--no-input", "--verbosity", "0")
    static = {p.name for p in (site / "static-root" / "django_debounce").iterdir()}
    assert {p.name for p in (PACKAGE / "static" / "django_debounce").iterdir()} <= static

    first_id, first_outcome, second_id, second_outcome = shell(ENQUEUE)
    assert (first_outcome, second_outcome) == ("created", "debounced")
    assert first_id == second_id

    runs_file = site / "runs.jsonl"
    # The job is due 200 ms after the second call: run bursts until it has run (bounded).
    deadline = time.monotonic() + 120
    while not runs_file.exists() and time.monotonic() < deadline:
        manage("run_debounce_worker", "--burst", "--verbosity", "0")
    manage("run_debounce_worker", "--burst", "--verbosity", "0")  # nothing else is left
    runs = [json.loads(line) for line in runs_file.read_text(encoding="utf-8").splitlines()]
    assert runs == [{"doc_id": 7, "version": 2}]
    assert shell(JOBS) == [
        {"task_name": "shop.tasks.reindex", "status": "SUCCESSFUL", "enqueue_count": 2}
    ]
