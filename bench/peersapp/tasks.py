"""The django_debounce tasks of ``bench/peers.py`` (autodiscovered by the package)."""

from __future__ import annotations

from django_debounce import debounced_task, task

from . import counter


@task(name="bench.peers.noop", max_retries=0)
def noop(n: int) -> None:
    """Do nothing but count: the drain's job."""
    counter.hit()


@debounced_task(
    name="bench.peers.debounced", debounce="10m", debounce_max_wait="1h", debounce_key="k:{0}"
)
def debounced(key: str) -> None:
    """Never run: the enqueue benchmark only writes its windows."""
