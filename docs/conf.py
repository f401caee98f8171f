"""Sphinx configuration of the django-debounce documentation (``python3 dev.py docs``).

MyST Markdown pages, the furo theme, built with ``-W --keep-going`` (every warning fails
the build) and ``nitpicky`` cross-references; nothing is fetched from the network
(no intersphinx). The reference pages are generated from the code: autodoc from the
docstrings, and ``docs/_ext/debounce_reference.py`` from the settings table, the system
checks, the management commands' parsers and the metrics' declarations (decision 174).
"""

from __future__ import annotations

import sys
from pathlib import Path

import django
from django.conf import settings as django_settings

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path[:0] = [str(ROOT), str(DOCS / "_ext")]

# autodoc imports the models and the admin: a minimal Django project, no database opened.
if not django_settings.configured:
    django_settings.configure(
        INSTALLED_APPS=[
            "django.contrib.admin",
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "django.contrib.messages",
            "django_debounce",
        ],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
    django.setup()

from django_debounce import __version__  # noqa: E402

project = "django-debounce"
author = "django-debounce developers"
copyright = "django-debounce developers"  # noqa: A001
release = __version__
version = ".".join(__version__.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",  # Google-style docstrings (set up through debounce_reference)
    "debounce_reference",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
# Options such as --queue and quotes in code-like help texts stay as written (no en dashes).
smartquotes = False

# -- MyST ---------------------------------------------------------------------------------
myst_enable_extensions = ["colon_fence", "deflist"]
# Anchors for headings up to ###, so `page.md#a-heading` links are checked at build time.
myst_heading_anchors = 4
suppress_warnings: list[str] = []

# -- cross-references -----------------------------------------------------------------------
nitpicky = True
# Names of libraries with no inventory offline (no intersphinx: CI has no network but the
# package registries). Only third-party names: every name of this package must resolve.
nitpick_ignore_regex = [
    # Third-party libraries and the standard library: no inventory offline.
    (
        "py:.*",
        r"(django|celery|kombu|prometheus_client|redis|django_redis|django_tasks|opentelemetry)(\..*)?",
    ),
    # OpenTelemetry's types as the tracing module's annotations name them (the `otel` extra).
    ("py:class", r"(Tracer|TracerProvider)"),
    (
        "py:.*",
        r"(datetime|collections|typing|enum|argparse|logging|threading|types|dataclasses|inspect|shutil|zoneinfo)(\..*)?",
    ),
    ("py:exc", r"(DatabaseError|OperationalError|InterfaceError|InvalidTask)"),
    ("py:.*", r"(BaseTaskBackend|TaskResult|TaskResultDoesNotExist)"),
    ("py:class", r"(~?P|R|T)(\.args|\.kwargs)?"),
    ("py:class", r"django_debounce\.tasks\.[PR]"),
]
# The package's internal modules are not in the reference (only its public faces are:
# reference_sources.PUBLIC_MODULES); public docstrings still name them for maintainers.
nitpick_ignore_regex += [
    (
        "py:class",
        r"(DurationLike|TaskState|RegisteredTask|django_debounce\.models(\.flow_state)?\.TaskState)",
    ),
    ("py:func", r"django_debounce\.ops\.dead_letters\..*"),
    (
        "py:.*",
        r"django_debounce\.(flow\.(rules|throttle|admission|codel|redis_buckets)|enqueueing|run|claim|worker|registry|lifecycle|options|conf|dead_letter_kinds|keys|codec|metrics_views|contrib\.celery\.(handoff|handoff_watch|routing|tasks)|contrib\.prometheus\.collector|contrib\.django_tasks\.results)(\..*)?",
    ),
]

# -- autodoc ----------------------------------------------------------------------------------
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# -- HTML -----------------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"django-debounce {release}"
html_static_path: list[str] = []
