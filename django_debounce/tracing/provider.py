"""Whether tracing is on, and the tracer when it is (docs/howto/opentelemetry.md, decision 211).

Tracing is on when ``opentelemetry-api`` is installed (the ``otel`` extra) and
a tracer provider is set: the global one (``trace.set_tracer_provider``, or
``opentelemetry-instrument``) or the one given to :func:`use_tracer_provider`.
Otherwise :func:`tracer` returns ``None`` and every traced path runs exactly
as without tracing: no span, no trace context written, no extra SQL. The API
is imported on the first call, not when the package is imported, and a failed
import is remembered, so the cost of a call while tracing is off is a global
read (no API) or the provider lookup and a type check (API, no provider).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from ..exceptions import ConfigurationError

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer, TracerProvider

    from ..models import Job

#: The instrumentation scope of every span (the tracer's name).
SCOPE = "django_debounce"

#: The ``opentelemetry.trace`` module once imported; ``False``: not installed; ``None``: not tried.
_api: Any = None
#: The provider :func:`use_tracer_provider` set, if any (it wins over the global one).
_override: TracerProvider | None = None
#: ``(provider, tracer)`` of the last provider seen, so a tracer is made once per provider.
_cached: tuple[object, Tracer] | None = None
#: The providers that trace nothing (the API's proxy before one is set, and its no-op).
_idle_types: tuple[type, ...] = ()


def _load() -> Any:
    """Import ``opentelemetry.trace`` once; remember ``False`` when it is not installed."""
    global _api, _idle_types
    try:
        from opentelemetry import trace
    except ImportError:
        _api = False
        return False
    _idle_types = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
    _api = trace
    return trace


def tracer() -> Tracer | None:
    """Return django_debounce's tracer while tracing is on, else ``None`` (cheap: hot paths call it).

    On: ``opentelemetry-api`` importable and a tracer provider set (see the
    module's docstring). A provider set later (in a Celery worker's
    ``worker_process_init``, say) is picked up by the next call.
    """
    api = _api
    if api is False:
        return None
    if api is None:
        api = _load()
        if api is False:
            return None
    provider = _override if _override is not None else api.get_tracer_provider()
    cached = _cached
    if cached is not None and cached[0] is provider:
        return cached[1]
    if isinstance(provider, _idle_types):
        return None
    return _remember(provider)


def _remember(provider: TracerProvider) -> Tracer:
    global _cached
    try:
        found = version("django-debounce")
    except PackageNotFoundError:  # a checkout on sys.path, not installed
        found = None
    made = provider.get_tracer(SCOPE, found)
    _cached = (provider, made)
    return made


def use_tracer_provider(provider: TracerProvider | None) -> None:
    """Trace django_debounce's spans with ``provider`` rather than the global one (``None``: the global one again).

    For a process that keeps its own provider rather than setting the global
    one, and for tests, which cannot set the global provider more than once.
    Applies to the whole process, from the next enqueue, claim or run on.

    Args:
        provider: an ``opentelemetry.trace.TracerProvider`` (the SDK's, say), or ``None``.

    Raises:
        ConfigurationError: ``opentelemetry-api`` is not installed (the ``otel`` extra).
    """
    global _override, _cached
    if provider is not None and (_load() if _api is None else _api) is False:
        raise ConfigurationError(
            "use_tracer_provider() needs opentelemetry-api: pip install 'django-debounce[otel]'."
        )
    _override = provider
    _cached = None


def expired_unrun(job: Job) -> None:
    """Record, while tracing is on, that the claimed ``job`` ended EXPIRED without running.

    Its run span has no length and the outcome ``expired`` (decision 213).
    """
    found = tracer()
    if found is not None:
        from .spans import record_expired

        record_expired(found, job)
