# ruff: noqa: T201  (a benchmark prints its figures)
"""Profile the hot paths of issue #12: where the time goes and the SQL each one sends.

    python3 dev.py bench profile_paths                      # every path, ~1 min
    .venv/bin/python bench/profile_paths.py --paths enqueue --html /tmp/prof

PostgreSQL only (a database of its own, as every script here). Paths:

* ``enqueue``: ``--calls`` (1,500) plain ``noop.delay(n)``; as many debounced
  ``delay()`` calls sliding one hot key; ``delay_many`` of ``--bulk`` (1,000) calls.
* ``drain``: ``--jobs`` (3,000) due no-op jobs drained by an in-process
  ``Worker(burst=True)`` at concurrency 1 and 4.
* ``wakeup``: an idle worker (LISTEN/NOTIFY, poll interval 30 s so no poll
  interferes) gets ``--wakeups`` (100) due-now jobs one at a time.

For each it prints the SQL statements per call/job grouped by shape (verb,
table, clauses), transactions per job (``pg_stat_database``), and, when
pyinstrument is installed, the top frames by self time and the call tree's main
branches. Statements are recorded by a ``connection.execute_wrapper`` installed
on every connection of every thread (``connection_created``), so worker threads
count too; the enqueue paths are counted with ``CaptureQueriesContext``.
"""

from __future__ import annotations

import argparse
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import _admin_connection, add_db_arguments, setup, table, teardown  # noqa: E402

try:
    from pyinstrument import Profiler
    from pyinstrument.session import Session
except ImportError:  # statements are still counted
    Profiler = None  # type: ignore[assignment,misc]
    Session = None  # type: ignore[assignment,misc]

FLAGS = (
    "ON CONFLICT",
    "DO UPDATE",
    "FOR UPDATE",
    "SKIP LOCKED",
    "UNNEST",
    "ORDER BY",
    "LIMIT",
    "RETURNING",
)


def _columns(text: str, pattern: str) -> str:
    names = dict.fromkeys(re.findall(pattern, text))
    return ",".join(list(names)[:4])


def shape(sql: str) -> str:
    """Return a statement's shape: verb(s), first table, notable clauses, and for a plain
    SELECT the columns of its WHERE (``where=``), for an UPDATE the columns it sets (``set=``)."""
    text = " ".join(sql.split())
    upper = text.upper()
    verb = upper.split(" ", 1)[0]
    detail = ""
    if verb == "WITH":
        inner = [v for v in ("UPDATE", "DELETE", "INSERT") if re.search(rf"\b{v}\b", upper)]
        verb = "WITH … " + (inner[0] if inner else "SELECT")
    elif verb == "SELECT":
        where = text.split(" WHERE ", 1)[1] if " WHERE " in text else ""
        detail = "where=" + _columns(where, r'"django_debounce_job"\."(\w+)" *(?:<|>|=|IS|IN)')
        if re.search(r"\bMIN\(", upper):
            detail = "MIN " + detail
    elif verb == "UPDATE":
        detail = "set=" + _columns(text.split(" WHERE ", 1)[0], r'"(\w+)" = ')
    match = re.search(r'\b(?:FROM|INTO|UPDATE)\s+"?(\w+)"?', text, re.IGNORECASE)
    name = match.group(1).removeprefix("django_debounce_") if match else ""
    flags = [flag for flag in FLAGS if flag in upper]
    return " ".join(filter(None, [verb, name, "…" if flags else "", " ".join(flags), detail]))


class Recorder:
    """An execute wrapper for every connection: records (thread id, sql) while ``active``."""

    def __init__(self) -> None:
        self.active = False
        self.statements: list[tuple[int, str]] = []
        self._lock = threading.Lock()

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        if self.active:
            with self._lock:
                self.statements.append((threading.get_ident(), sql))
        return execute(sql, params, many, context)

    def install(self, connection: Any, **_: Any) -> None:
        if self not in connection.execute_wrappers:
            connection.execute_wrappers.append(self)

    @contextmanager
    def recording(self) -> Iterator[list[tuple[int, str]]]:
        self.statements = []
        self.active = True
        try:
            yield self.statements
        finally:
            self.active = False


def xacts(args: argparse.Namespace, name: str) -> int:
    """Committed plus rolled-back transactions of database ``name`` so far.

    A backend reports its statistics when it exits, or when idle at most once a
    second (PostgreSQL 15): this thread's connection is closed first (the worker's
    threads close theirs when they end, under ``CONN_MAX_AGE = 0``), then a short wait.
    """
    from django.db import connection

    connection.close()
    time.sleep(1.2)  # backends flush their stats at most once a second (PostgreSQL 15)
    with _admin_connection(args.url) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s", [name]
        ).fetchone()
    return int(row[0])


EXAMPLES: dict[str, str] = {}


def per_unit(statements: list[str], units: int) -> list[list[Any]]:
    """Rows of (shape, count, count per unit); remembers one statement per shape for ``--sql``."""
    for sql in statements:
        EXAMPLES.setdefault(shape(sql), sql)
    counts = Counter(shape(sql) for sql in statements)
    rows = [[s, n, f"{n / units:.3f}"] for s, n in counts.most_common()]
    rows.append(["**all**", len(statements), f"{len(statements) / units:.3f}"])
    return rows


# -- the profile ---------------------------------------------------------------
SELF = "[self]"


def _where(frame: Any) -> str:
    """``function (file:first line)``: one key for every call of one function."""
    path = frame.file_path_short or frame.file_path or ""
    return f"{frame.function} ({path}:{frame.line_no})"


#: Self time in these is a thread waiting (for work, the wake event, a lock), not working.
IDLE = ("lock.acquire (<built-in>:0)",)


class Node:
    """A call-tree node with the children of one function (any call line) merged."""

    def __init__(self, where: str, frames: list[Any]) -> None:
        self.where = where
        self.time = sum(f.time for f in frames)
        self.own = 0.0
        groups: dict[str, list[Any]] = {}
        for frame in frames:
            kids = list(frame.children)
            self.own += frame.time - sum(k.time for k in kids)
            for kid in kids:
                if kid.identifier.startswith(SELF):
                    self.own += kid.time
                else:
                    groups.setdefault(_where(kid), []).append(kid)
        self.children = [Node(w, fs) for w, fs in groups.items()]


def tree(session: Any) -> Node | None:
    root = session.root_frame()
    return None if root is None else Node(_where(root), [root])


def self_times(root: Node) -> Counter[str]:
    """Return each function's self seconds over the whole tree."""
    totals: Counter[str] = Counter()
    stack = [root]
    while stack:
        node = stack.pop()
        totals[node.where] += node.own
        stack.extend(node.children)
    return totals


def branches(root: Node, threshold: float, depth: int = 40) -> list[str]:
    """Return the call tree as lines: frames ≥ ``threshold`` of the total; chains of
    third-party frames with one significant child are folded into ``…``."""
    total = root.time or 1.0
    lines: list[str] = []

    def ours(node: Node) -> bool:
        return "django_debounce/" in node.where or "profile_paths" in node.where

    def walk(node: Node, level: int, folded: bool) -> None:
        kids = [c for c in node.children if c.time / total >= threshold]
        show = ours(node) or len(kids) != 1 or level == 0
        if show:
            mark = "… " if folded else ""
            lines.append(f"{'  ' * level}{node.time / total:5.1%} {mark}{node.where}")
        if level >= depth:
            return
        for kid in sorted(kids, key=lambda c: -c.time):
            walk(kid, level + 1 if show else level, not show)

    walk(root, 0, False)
    return lines


def report_profile(label: str, session: Any, args: argparse.Namespace) -> None:
    root = None if session is None else tree(session)
    if root is None:
        return
    total = root.time or 1.0
    selfs = self_times(root)
    idle = sum(selfs.pop(where, 0.0) for where in IDLE)
    print(f"\n#### {label}: top frames by self time ({total:.2f} s sampled)\n")
    if idle:
        print(
            f"Waiting in `lock.acquire` (idle threads, the wake event, locks): {idle / total:.1%}\n"
        )
    rows = [
        [f"{s / total:.1%}", f"{s * 1000:.0f}", where] for where, s in selfs.most_common(args.top)
    ]
    print(table(["share", "ms", "function (file:line)"], rows))
    print(f"\n#### {label}: main branches (frames ≥ {args.threshold:.0%})\n")
    print("```")
    print("\n".join(branches(root, args.threshold)))
    print("```")
    if args.html:
        out = Path(args.html)
        out.mkdir(parents=True, exist_ok=True)
        from pyinstrument.renderers import HTMLRenderer

        slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")
        (out / f"{slug}.html").write_text(HTMLRenderer().render(session))


@contextmanager
def profiled(args: argparse.Namespace) -> Iterator[list[Any]]:
    """Profile this thread (when pyinstrument is there); the session lands in the list."""
    out: list[Any] = []
    if Profiler is None:
        yield out
        return
    profiler = Profiler(interval=args.interval)
    profiler.start()
    try:
        yield out
    finally:
        profiler.stop()
        out.append(profiler.last_session)


# -- the paths -------------------------------------------------------------------
def enqueue_path(args: argparse.Namespace, tasks: Any) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_debounce.models import Job

    print("\n## enqueue\n")
    scenarios: list[tuple[str, int, Callable[[], None]]] = [
        ("plain delay()", args.calls, lambda: [tasks.noop.delay(n) for n in range(args.calls)]),
        (
            "debounced delay(), one hot key",
            args.calls,
            lambda: [tasks.slide.delay("hot") for _ in range(args.calls)],
        ),
        (
            f"delay_many of {args.bulk}",
            args.bulk,
            lambda: tasks.noop.delay_many([(n,) for n in range(args.bulk)]),
        ),
    ]
    for label, calls, run in scenarios:
        Job.objects.all().delete()
        tasks.noop.delay(-1)  # warm up: the compiled statement, the connection
        tasks.slide.delay("warm")
        with CaptureQueriesContext(connection) as captured, profiled(args) as session:
            started = time.perf_counter()
            run()
            elapsed = time.perf_counter() - started
        print(f"\n### {label}: {calls} calls, {calls / elapsed:,.0f} calls/s under the profiler\n")
        print(
            table(["statement", "count", "per call"], per_unit([q["sql"] for q in captured], calls))
        )
        report_profile(label, session[0] if session else None, args)


def fill(n: int) -> None:
    """Replace the jobs with ``n`` due no-op jobs (``bulk_create``, 1,000 rows a statement)."""
    from django.utils import timezone

    from django_debounce.models import Job

    Job.objects.all().delete()
    now = timezone.now()
    Job.objects.bulk_create(
        [
            Job(
                task_name="bench.profile.noop",
                args=[i],
                run_at=now,
                created_at=now,
                last_enqueued_at=now,
                max_retries=0,
            )
            for i in range(n)
        ],
        batch_size=1000,
    )


def drain_path(args: argparse.Namespace, name: str, recorder: Recorder) -> None:
    from django_debounce.models import Job
    from django_debounce.worker.loop import Worker

    sessions: list[Any] = []
    lock = threading.Lock()

    class ProfiledWorker(Worker):
        """Each job thread profiled by its own pyinstrument profiler (bench only)."""

        def _thread_main(self) -> None:
            if Profiler is None:
                super()._thread_main()
                return
            profiler = Profiler(interval=args.interval)
            profiler.start()
            try:
                super()._thread_main()
            finally:
                profiler.stop()
                with lock:
                    sessions.append(profiler.last_session)

    print("\n## drain\n")
    for concurrency in args.concurrency:
        fill(args.jobs)
        sessions.clear()
        before = xacts(args, name)
        worker = ProfiledWorker(concurrency=concurrency, burst=True, handle_signals=False)
        with recorder.recording() as statements, profiled(args) as session:
            started = time.perf_counter()
            ran = worker.run()
            elapsed = time.perf_counter() - started
        after = xacts(args, name)
        left = Job.objects.exclude(status=Job.Status.SUCCESSFUL).count()
        print(
            f"\n### drain, concurrency {concurrency}: {ran} jobs, {ran / elapsed:,.0f} jobs/s "
            f"under the profiler, {left} not SUCCESSFUL afterwards\n"
        )
        rows = per_unit([sql for _, sql in statements], ran)
        # two stats reads (before/after) are transactions of their own, not the worker's
        rows.append(
            [
                "transactions (pg_stat_database)",
                after - before - 2,
                f"{(after - before - 2) / ran:.3f}",
            ]
        )
        print(table(["statement", "count", "per job"], rows))
        label = f"drain C={concurrency}"
        report_profile(
            label + (" (loop thread)" if concurrency > 1 else ""),
            session[0] if session else None,
            args,
        )
        if sessions and Session is not None:
            combined = sessions[0]
            for other in sessions[1:]:
                combined = Session.combine(combined, other)
            report_profile(f"{label} (job threads, combined)", combined, args)


def wakeup_path(args: argparse.Namespace, name: str, recorder: Recorder, tasks: Any) -> None:
    from django.db import connection

    from django_debounce.models import Job
    from django_debounce.worker.loop import Worker

    print("\n## wake-up (LISTEN/NOTIFY)\n")
    Job.objects.all().delete()
    worker = Worker(concurrency=1, poll_interval=30.0, handle_signals=False)
    thread = threading.Thread(target=worker.run, name="profiled-worker", daemon=True)
    thread.start()
    time.sleep(2.0)  # the listener connects, the worker goes idle
    main = threading.get_ident()
    latencies = []
    marks = (0, 0)  # where the last wake-up's statements begin, and where its job had started
    with recorder.recording() as statements:
        for i in range(args.wakeups):
            tasks.STARTED.clear()
            begin = len(statements)
            started = time.perf_counter()
            tasks.stamp.delay(i)
            if not tasks.STARTED.wait(10):
                sys.exit(f"wake-up job {i} did not start within 10 s")
            latencies.append((time.perf_counter() - started) * 1000)
            marks = (begin, len(statements))
            time.sleep(0.1)  # the worker records the success and goes idle again
    worker.stop()
    thread.join(30)
    connection.close()
    worker_sql = [sql for ident, sql in statements if ident != main]
    latencies.sort()
    print(
        f"{args.wakeups} wake-ups, enqueue→start p50 {latencies[len(latencies) // 2]:.1f} ms, "
        f"max {latencies[-1]:.1f} ms (in-process, with the recorder on)\n"
    )
    print(table(["worker statement", "count", "per wake-up"], per_unit(worker_sql, args.wakeups)))
    print("\nThe last wake-up, in order (the worker's statements; ▶ the job had started):\n")
    for index in range(marks[0], len(statements)):
        ident, sql = statements[index]
        if index == marks[1]:
            print("    ▶")
        if ident != main:
            print(f"    {shape(sql)}")


def define_tasks() -> Any:
    """Register the no-op tasks of this script (by name: the in-process worker finds them)."""
    import types

    from django_debounce import debounced_task, task

    started = threading.Event()

    @task(name="bench.profile.noop", max_retries=0)
    def noop(n: int) -> None:
        """Do nothing: the drain's job."""

    @task(name="bench.profile.stamp", max_retries=0)
    def stamp(n: int) -> None:
        """Tell the wake-up path the job started."""
        started.set()

    @debounced_task(
        name="bench.profile.slide", debounce="10m", debounce_max_wait="1h", debounce_key="k:{0}"
    )
    def slide(key: str) -> None:
        """Never run: the enqueue path only slides its window."""

    return types.SimpleNamespace(noop=noop, stamp=stamp, slide=slide, STARTED=started)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_db_arguments(parser, "debounce_bench_profile")
    parser.add_argument(
        "--paths",
        nargs="+",
        default=["enqueue", "drain", "wakeup"],
        choices=["enqueue", "drain", "wakeup"],
    )
    parser.add_argument("--calls", type=int, default=1500, help="single enqueue calls per scenario")
    parser.add_argument("--bulk", type=int, default=1000, help="calls of the delay_many scenario")
    parser.add_argument("--jobs", type=int, default=3000, help="jobs per drain")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--wakeups", type=int, default=100, help="wake-ups of the idle worker")
    parser.add_argument(
        "--conn-max-age", default="0", help="CONN_MAX_AGE: seconds or None (default 0)"
    )
    parser.add_argument(
        "--interval", type=float, default=0.0005, help="pyinstrument's sampling interval, s"
    )
    parser.add_argument("--top", type=int, default=8, help="frames in the self-time table")
    parser.add_argument(
        "--threshold", type=float, default=0.05, help="smallest share shown in the tree"
    )
    parser.add_argument(
        "--html", default=None, help="also write pyinstrument's HTML per profile here"
    )
    parser.add_argument(
        "--sql", type=int, default=0, metavar="CHARS", help="print one statement of each shape, cut"
    )
    args = parser.parse_args(argv)
    if Profiler is None:
        print(
            "pyinstrument is not installed: counting statements only "
            "(`.venv/bin/pip install pyinstrument` for the profiles)"
        )
    name = setup(args)
    try:
        from django.db import connections
        from django.db.backends.signals import connection_created

        connections.settings["default"]["CONN_MAX_AGE"] = (
            None if args.conn_max_age == "None" else int(args.conn_max_age)
        )
        recorder = Recorder()
        connection_created.connect(recorder.install)
        recorder.install(connections["default"])
        tasks = define_tasks()
        print(
            f"# profile_paths: CONN_MAX_AGE={args.conn_max_age}, pyinstrument interval {args.interval} s"
        )
        if "enqueue" in args.paths:
            enqueue_path(args, tasks)
        if "drain" in args.paths:
            drain_path(args, name, recorder)
        if "wakeup" in args.paths:
            wakeup_path(args, name, recorder, tasks)
        if args.sql:
            print("\n## one statement of each shape\n")
            for key, sql in EXAMPLES.items():
                print(f"* `{key}`:\n\n      {' '.join(sql.split())[: args.sql]}\n")
    finally:
        teardown(args)


if __name__ == "__main__":
    main()
