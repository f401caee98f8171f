"""The procrastinate peer: a plain ``App`` on ``PsycopgConnector`` (LISTEN/NOTIFY by default).

The database is ``DEBOUNCE_PEER_URL`` (libpq URL). Jobs are kept after they
finish (procrastinate's default), as ours are.
"""

from __future__ import annotations

import os

from procrastinate import App, PsycopgConnector

from bench.peersapp import counter

from . import stamps

app = App(connector=PsycopgConnector(conninfo=os.environ["DEBOUNCE_PEER_URL"]))


@app.task(name="noop")
def noop(n: int) -> None:
    """Do nothing but count: the drain's job."""
    counter.hit()


@app.task(name="stamp")
def stamp(tag: str) -> None:
    """Record the start time: the idle-latency job."""
    stamps.push(tag)
