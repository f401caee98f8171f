"""Real processes for the reliability suite: worker and producer subprocesses.

Tests start them through :class:`Processes`, a context manager that kills
every process it started when the block ends (also when the test fails), and
keeps each one's stderr in a file whose tail goes into assertion messages.

Run as a module (``python -m tests.procs produce …``) this file is also the
producer: it enqueues calls as fast as it can once a barrier file appears,
and writes what every call returned to a JSON file.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def wait_for(
    predicate: Callable[[], Any],
    *,
    timeout: float,
    interval: float = 0.05,
    what: str | Callable[[], str] = "",
) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds.

    ``what`` names the awaited condition in the failure; pass a callable (e.g. one that
    returns the workers' log tails) to have it evaluated at the timeout, not before the wait.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            described = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout}s waiting for {described or predicate}")
        time.sleep(interval)


class Proc:
    """One subprocess with its stderr captured to a file."""

    def __init__(self, name: str, popen: subprocess.Popen[bytes], stderr_path: Path) -> None:
        self.name = name
        self.popen = popen
        self.stderr_path = stderr_path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def send(self, signum: int) -> None:
        self.popen.send_signal(signum)

    def wait(self, timeout: float) -> int:
        """Wait for the exit status; fail (with the stderr tail) after ``timeout`` seconds."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.name} (pid {self.pid}) still running after {timeout}s\n{self.tail()}"
            ) from None

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, lines: int = 40) -> str:
        text = self.stderr().splitlines()[-lines:]
        return f"--- stderr of {self.name} (pid {self.pid}) ---\n" + "\n".join(text)


class Processes:
    """Start worker/producer subprocesses for one test; kill leftovers on exit.

    Args:
        workdir: a per-test directory for stderr files, barrier files and
            producer output.
        env: base environment (``child_env()`` of the calling test).
    """

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.env = env
        self.procs: list[Proc] = []

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill_all()

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.alive():
                try:
                    os.kill(proc.pid, signal.SIGCONT)  # a stopped process cannot die otherwise
                    proc.popen.kill()
                except ProcessLookupError:
                    pass
            try:
                proc.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - the kernel failed us
                pass

    def tails(self) -> str:
        return "\n".join(proc.tail() for proc in self.procs)

    def start(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> Proc:
        full_env = dict(self.env)
        full_env.update(env or {})
        stderr_path = self.workdir / f"{name}.stderr"
        with stderr_path.open("wb") as err:
            popen = subprocess.Popen(
                [sys.executable, *argv],
                cwd=REPO,
                env=full_env,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
                start_new_session=True,  # a Ctrl-C in the test run does not reach it
            )
        proc = Proc(name, popen, stderr_path)
        self.procs.append(proc)
        return proc

    def worker(
        self, *options: str, name: str = "worker", env: dict[str, str] | None = None
    ) -> Proc:
        """Start ``python -m django run_debounce_worker <options>`` (logging to its stderr)."""
        worker_env = {"DEBOUNCE_TEST_LOG_STDERR": "1", "PYTHONUNBUFFERED": "1"}
        worker_env.update(env or {})
        return self.start(name, ["-m", "django", "run_debounce_worker", *options], worker_env)

    def producers(
        self,
        count: int,
        *,
        task: str,
        keys: int,
        calls: int,
        plain: bool = False,
        pause_every: int = 0,
        pause: float = 0.0,
        timeout: float = 60,
    ) -> list[Proc]:
        """Start ``count`` producers and release them together once all are connected.

        Each waits for a barrier file after Django setup and a first query, so
        the calls of all producers really overlap.
        """
        go = self.workdir / "go"
        procs = [
            self.start(
                f"producer-{i}",
                [
                    "-m",
                    "tests.procs",
                    "produce",
                    f"--task={task}",
                    f"--producer={i}",
                    f"--keys={keys}",
                    f"--calls={calls}",
                    f"--pause-every={pause_every}",
                    f"--pause={pause}",
                    f"--ready={self.workdir / f'ready-{i}'}",
                    f"--go={go}",
                    f"--out={self.workdir / f'producer-{i}.json'}",
                    *(["--plain"] if plain else []),
                ],
            )
            for i in range(count)
        ]

        def all_ready() -> bool:
            for proc in procs:
                if not proc.alive():
                    raise AssertionError(f"{proc.name} died before the barrier\n{proc.tail()}")
            return all((self.workdir / f"ready-{i}").exists() for i in range(count))

        wait_for(all_ready, timeout=timeout, what="producers to connect")
        go.touch()
        return procs

    def producer_results(self, procs: Sequence[Proc], *, timeout: float) -> list[dict[str, Any]]:
        """Wait for the producers, check they exited 0, and return their JSON reports."""
        deadline = time.monotonic() + timeout
        reports = []
        for proc in procs:
            code = proc.wait(max(1.0, deadline - time.monotonic()))
            assert code == 0, f"{proc.name} exited {code}\n{proc.tail()}"
            index = proc.name.rsplit("-", 1)[1]
            reports.append(json.loads((self.workdir / f"producer-{index}.json").read_text()))
        return reports


@contextmanager
def processes(workdir: Path, env: dict[str, str]) -> Iterator[Processes]:
    """``with processes(tmp_path, child_env()) as procs:`` — the same as :class:`Processes`."""
    with Processes(workdir, env) as group:
        yield group


def app_name(prefix: str) -> str:
    """A unique PostgreSQL ``application_name`` for one worker subprocess."""
    return f"rel-{prefix}-{uuid.uuid4().hex[:8]}"


def pg_backends(name: str) -> list[tuple[int, str]]:
    """Return (pid, state) of every server backend whose application_name is ``name``."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid, coalesce(state, '') FROM pg_stat_activity WHERE application_name = %s",
            [name],
        )
        return [(int(pid), str(state)) for pid, state in cursor.fetchall()]


def pg_terminate(name: str) -> list[int]:
    """Terminate every backend of ``application_name`` ``name``; return their pids."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            # In the select list, not the WHERE clause: the planner may evaluate
            # WHERE conditions in any order, and must never terminate other backends.
            "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = %s",
            [name],
        )
        return [int(pid) for pid, terminated in cursor.fetchall() if terminated]


def waiting_on_a_lock() -> bool:
    """True while a connection to the test database waits for a lock another one holds.

    PostgreSQL or MariaDB/MySQL. MariaDB refreshes ``innodb_trx`` only when it
    was not read for 0.1 s: poll this every 0.25 s (``wait_for(…, interval=0.25)``).
    """
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(
                "SELECT count(*) FROM information_schema.innodb_trx AS trx "
                "JOIN information_schema.processlist AS p ON p.id = trx.trx_mysql_thread_id "
                "WHERE trx.trx_state = 'LOCK WAIT' AND p.db = DATABASE()"
            )
        else:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            )
        return int(cursor.fetchone()[0]) > 0


def mysql_open_transactions() -> int:
    """Return how many other connections to the test database are inside a transaction
    (MariaDB/MySQL: InnoDB's open transactions, this connection's left out)."""
    from django.db import connection

    # MariaDB refreshes innodb_trx only when it was not read for 0.1 s: never read it stale.
    time.sleep(0.15)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM information_schema.innodb_trx AS trx "
            "JOIN information_schema.processlist AS p ON p.id = trx.trx_mysql_thread_id "
            "WHERE p.db = DATABASE() AND p.id <> CONNECTION_ID()"
        )
        return int(cursor.fetchone()[0])


def freeze_outside_transaction(proc: Proc, *, pg_app_name: str | None, tries: int = 100) -> None:
    """SIGSTOP ``proc`` at a moment it holds no database lock or open transaction.

    A worker frozen inside a claim or a lease renewal would keep its row (or,
    on SQLite, the whole file) locked and block the test; so stop it, look,
    and if it is inside a transaction let it run a little and try again.
    """
    from django.db import connection

    for _ in range(tries):
        proc.send(signal.SIGSTOP)
        time.sleep(0.05)
        if pg_app_name is not None:
            quiet = all(state == "idle" for _, state in pg_backends(pg_app_name))
        elif connection.vendor == "mysql":
            quiet = mysql_open_transactions() == 0
        else:
            probe = sqlite3.connect(str(connection.settings_dict["NAME"]), timeout=0.2)
            try:
                probe.execute("BEGIN IMMEDIATE")
                probe.execute("ROLLBACK")
                quiet = True
            except sqlite3.OperationalError:
                quiet = False
            finally:
                probe.close()
        if quiet:
            return
        proc.send(signal.SIGCONT)
        time.sleep(random.uniform(0.01, 0.08))
    raise AssertionError(f"could not freeze {proc.name} outside a transaction\n{proc.tail()}")


class WorkerThread:
    """A :class:`~django_debounce.worker.loop.Worker` in a thread of the test process.

    ``stop()`` asks it to stop, joins it and re-raises what it raised.
    """

    def __init__(self, worker_id: str, **options: Any) -> None:
        from django_debounce.worker.loop import Worker

        options.setdefault("poll_interval", 0.1)
        self.worker = Worker(handle_signals=False, worker_id=worker_id, **options)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name=worker_id, daemon=True)

    def _main(self) -> None:
        from django.db import connections

        try:
            self.worker.run()
        except BaseException as exc:  # surfaced by stop()
            self.error = exc
        finally:
            connections.close_all()

    def start(self) -> WorkerThread:
        self.thread.start()
        return self

    def alive(self) -> bool:
        return self.thread.is_alive()

    def stop(self, timeout: float = 15) -> None:
        self.worker.stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"{self.worker.worker_id} did not stop"
        if self.error is not None:
            raise AssertionError(f"{self.worker.worker_id} raised {self.error!r}") from self.error


def in_thread(func: Callable[[], Any], *, timeout: float = 30) -> Any:
    """Run ``func`` in a new thread (its own database connection); return its result."""
    from django.db import connections

    box: dict[str, Any] = {}

    def main() -> None:
        try:
            box["value"] = func()
        except BaseException as exc:
            box["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"{func} still running after {timeout}s"
    if "error" in box:
        raise box["error"]
    return box["value"]


# -- the producer program ---------------------------------------------------------------------


def _produce(options: argparse.Namespace) -> int:
    import django

    django.setup()
    from django.db import connection

    from django_debounce import enqueue
    from django_debounce.exceptions import EnqueueContentionError

    connection.ensure_connection()
    Path(options.ready).touch()
    deadline = time.monotonic() + 60
    while not Path(options.go).exists():
        if time.monotonic() > deadline:
            print("barrier never opened", file=sys.stderr)
            return 2
        time.sleep(0.001)

    rng = random.Random(options.producer)
    calls: list[dict[str, Any]] = []
    contention = 0
    other_errors: list[str] = []
    for seq in range(options.calls):
        key = f"k{rng.randrange(options.keys)}"
        before = time.time()
        record: dict[str, Any] = {"key": key, "seq": seq, "before": before}
        try:
            job = enqueue(
                options.task,
                args=(seq,) if options.plain else (key,),
                kwargs={} if options.plain else {"producer": options.producer, "seq": seq},
            )
        except EnqueueContentionError as exc:
            contention += 1
            record["error"] = f"EnqueueContentionError: {exc}"
        except Exception as exc:  # anything else is a contract violation; report it
            other_errors.append(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}")
            record["error"] = other_errors[-1]
        else:
            record.update(
                job_id=job.pk,
                outcome=job.outcome,
                enqueue_count=job.enqueue_count,
                run_at=job.run_at.isoformat(),
            )
        record["after"] = time.time()
        calls.append(record)
        if options.pause_every and (seq + 1) % options.pause_every == 0:
            time.sleep(options.pause)
    Path(options.out).write_text(
        json.dumps(
            {
                "producer": options.producer,
                "pid": os.getpid(),
                "calls": calls,
                "contention": contention,
                "other_errors": other_errors,
            }
        )
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.procs")
    sub = parser.add_subparsers(dest="command", required=True)
    produce = sub.add_parser("produce", help="enqueue calls once the barrier file appears")
    produce.add_argument("--task", required=True)
    produce.add_argument("--producer", type=int, required=True)
    produce.add_argument("--keys", type=int, required=True)
    produce.add_argument("--calls", type=int, required=True)
    produce.add_argument("--plain", action="store_true", help="args=(seq,), no key argument")
    produce.add_argument("--pause-every", type=int, default=0)
    produce.add_argument("--pause", type=float, default=0.0)
    produce.add_argument("--ready", required=True)
    produce.add_argument("--go", required=True)
    produce.add_argument("--out", required=True)
    options = parser.parse_args(argv)
    return _produce(options)


if __name__ == "__main__":
    sys.exit(main())
