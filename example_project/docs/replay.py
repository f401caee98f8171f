"""Replay an event stream as ``rebuild_docs(directory)`` enqueues (``manage.py replay_events``).

Two clocks:

* **virtual** (exact; minutes for years of trace): the package's clock is moved
  with time-machine to each event's time; before each enqueue, the jobs due by
  then run through the real worker code path (``Worker(burst=True)``, what
  ``run_debounce_worker --burst`` runs), each at its exact deadline;
* **real time** (compressed): events are enqueued at ``trace seconds / speed``
  while a real ``run_debounce_worker`` subprocess runs beside the producer,
  and a monitor thread checks that no key ever holds two open windows.

The summary is computed from the ``Job`` rows of ``rebuild_docs``.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from importlib import import_module
from pathlib import Path
from urllib.parse import quote

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.models import Count, F, Q, Sum

from django_debounce.models import DeadLetter, Job
from django_debounce.worker.loop import Worker

from .events import Event
from .models import DocBuild
from .tasks import ping, rebuild_docs

Progress = Callable[[int], object]

#: In real time, a quiet gap is cut down to the window plus a pad of one more
#: window or this many real seconds (at least four worker polls), whichever is
#: longer: every deadline has passed by then (§4.2: a deadline is at most one
#: window after the last call) and the worker has had the pad to claim the
#: job, so cutting the rest changes nothing but the wall time.
IDLE_PAD = 0.04

#: The virtual replay commits every this many events. Inside a transaction each
#: enqueue and claim is a savepoint rather than a commit, and the burst worker
#: keeps its connection (it closes it after a burst only outside a transaction):
#: about a third less wall time, while other processes still see progress.
COMMIT_EVERY = 500

#: Seconds between two looks of the real-time monitor at the open windows.
MONITOR_INTERVAL = 0.02


class ReplayError(RuntimeError):
    """The replay could not go on (reported by the command as a CommandError)."""


@dataclass
class Summary:
    """What a replay did, read back from the ``Job`` rows of ``rebuild_docs``."""

    mode: str
    events: int
    window: float
    """Trace seconds."""
    max_wait: float
    """Trace seconds."""
    windows: int = 0
    """Jobs created: windows opened."""
    runs: int = 0
    """Jobs that ran to success."""
    forced: int = 0
    """Runs whose deadline was the ceiling (``run_at == max_run_at``): forced by the max wait."""
    calls: int = 0
    """Sum of the jobs' ``enqueue_count`` (every event, if nothing was lost)."""
    unfinished: int = 0
    """Jobs of the replay not SUCCESSFUL at the end (READY, RUNNING, FAILED, ...)."""
    builds: int = 0
    """``DocBuild`` rows written by the task."""
    delays: list[float] = field(default_factory=list)
    """Window opened → run started, per run, in trace seconds."""
    wall_seconds: float = 0.0
    # Real-time mode only.
    speed: float | None = None
    trace_seconds_elided: float = 0.0
    worker_poll_interval: float | None = None
    max_lag: float = 0.0
    """Real seconds behind schedule an enqueue committed, at worst."""
    max_lateness: float = 0.0
    """Real seconds from a job's deadline to its claim (``started_at - run_at``), at worst."""
    call_times: list[tuple[float, float]] = field(default_factory=list)
    """Per event, in replay order: real seconds from the start to the enqueue call and to
    its return (committed)."""
    polls: int = 0
    max_open_windows_per_key: int = 0
    max_ready_per_key: int = 0
    max_running_per_key: int = 0
    violations: list[str] = field(default_factory=list)
    worker_exit: int | None = None

    @property
    def calls_collapsed(self) -> int:
        """Enqueues that joined an open window instead of opening one."""
        return self.events - self.windows

    @property
    def collapse_ratio(self) -> float:
        """Events per window opened."""
        return self.events / self.windows if self.windows else 0.0

    @property
    def delay_median(self) -> float | None:
        return statistics.median(self.delays) if self.delays else None

    @property
    def delay_max(self) -> float | None:
        return max(self.delays) if self.delays else None

    def lines(self) -> list[str]:
        """The summary as printed by the command."""

        def dur(seconds: float | None) -> str:
            if seconds is None:
                return "-"
            return str(timedelta(seconds=round(seconds)))

        def pct(part: int, whole: int) -> str:
            return f"{100 * part / whole:.1f}%" if whole else "-"

        out = [
            f"  events                        {self.events:>9,}",
            f"  windows opened (jobs)         {self.windows:>9,}",
            f"  runs                          {self.runs:>9,}",
            f"  calls collapsed               {self.calls_collapsed:>9,}"
            "   (events - windows opened)",
            f"  collapse ratio                {self.collapse_ratio:>9.2f}"
            f"   events per window ({pct(self.calls_collapsed, self.events)} of calls collapsed)",
            f"  runs forced by the max wait   {self.forced:>9,}"
            f"   ({pct(self.forced, self.runs)} of runs)",
            f"  delay, window opened -> run    median {dur(self.delay_median)},"
            f" max {dur(self.delay_max)} (window {dur(self.window)},"
            f" max wait {dur(self.max_wait)})",
            f"  DocBuild rows                 {self.builds:>9,}",
        ]
        if self.unfinished:
            out.append(f"  jobs not successful          {self.unfinished:>9,}   (see the admin)")
        if self.calls != self.events:
            out.append(f"  WARNING: the jobs count {self.calls:,} calls for {self.events:,} events")
        if self.mode == "real-time":
            assert self.speed is not None
            out += [
                f"  speed                         {self.speed:>9,g}x"
                f"   (window {self.window / self.speed * 1000:.1f} ms,"
                f" max wait {self.max_wait / self.speed * 1000:.1f} ms real time;"
                f" worker --poll-interval {self.worker_poll_interval} s)",
                f"  idle trace time skipped       {dur(self.trace_seconds_elided):>9}",
                f"  producer lag, worst           {self.max_lag * 1000:>9.1f} ms"
                "   (enqueue committed after its scheduled time)",
                f"  worker lateness, worst        {self.max_lateness * 1000:>9.1f} ms"
                "   (job claimed after its deadline)",
                f"  open windows per key, max     {self.max_open_windows_per_key:>9}"
                f"   (polled {self.polls:,} times; READY jobs per key, max"
                f" {self.max_ready_per_key}; running per key, max {self.max_running_per_key})",
                f"  worker exit status            {self.worker_exit!s:>9}",
            ]
            if self.violations:
                out.append("  VIOLATIONS: " + "; ".join(self.violations[:5]))
            else:
                out.append("  no key ever held two READY windows")
        return out


def reset() -> tuple[int, int]:
    """Delete the ``rebuild_docs``/``ping`` jobs, their dead letters and every ``DocBuild``.

    Returns:
        ``(jobs deleted, doc builds deleted)``.
    """
    names = [rebuild_docs.name, ping.name]
    builds = DocBuild.objects.all().delete()[0]
    DeadLetter.objects.filter(task_name__in=names).delete()
    jobs = Job.objects.filter(task_name__in=names).delete()[0]
    return jobs, builds


def summarize(summary: Summary, scale: float = 1.0) -> Summary:
    """Fill ``summary`` from the ``Job`` rows; ``scale`` converts real seconds to trace seconds."""
    jobs = Job.objects.filter(task_name=rebuild_docs.name)
    done = jobs.filter(status=Job.Status.SUCCESSFUL)
    summary.windows = jobs.count()
    summary.runs = done.count()
    summary.forced = done.filter(run_at=F("max_run_at")).count()
    summary.calls = jobs.aggregate(total=Sum("enqueue_count"))["total"] or 0
    summary.unfinished = summary.windows - summary.runs
    summary.builds = DocBuild.objects.count()
    summary.delays = [
        (started - opened).total_seconds() * scale
        for started, opened in done.values_list("started_at", "opened_at")
        if started is not None and opened is not None
    ]
    return summary


# -- virtual clock -----------------------------------------------------------------


def replay_virtual(
    events: Sequence[Event], *, window: float, max_wait: float, progress: Progress
) -> Summary:
    """Replay ``events`` on a virtual clock; every run happens at its exact deadline.

    Before the enqueue at time ``t``: while the earliest READY job is due by
    ``t``, move the clock to its ``run_at`` and run a burst (so a job due at
    the same instant as an enqueue runs first). After the last event, drain
    the remaining windows the same way.
    """
    import time_machine  # the demo's dependency, not the package's

    summary = Summary(mode="virtual", events=len(events), window=window, max_wait=max_wait)
    started = time.perf_counter()
    if events:
        with time_machine.travel(events[0].when, tick=False) as traveller:
            due = _DueJobs(traveller.move_to)
            call_window = timedelta(seconds=window)
            call_max_wait = timedelta(seconds=max_wait)
            for first in range(0, len(events), COMMIT_EVERY):
                with transaction.atomic():
                    for event in events[first : first + COMMIT_EVERY]:
                        when = event.when
                        due.run_until(when)
                        traveller.move_to(when)
                        job = rebuild_docs.apply_async(
                            args=(event.directory,),
                            debounce=call_window,
                            debounce_max_wait=call_max_wait,
                        )
                        due.deadline(job.run_at)
                        progress(1)
            with transaction.atomic():
                due.run_until(None)
    summary.wall_seconds = time.perf_counter() - started
    return summarize(summary)


class _DueJobs:
    """Runs the READY jobs due by a time, each burst at the exact ``run_at`` of the earliest.

    ``bound`` is never later than the earliest READY ``run_at`` (an enqueue
    lowers it to its job's deadline; after a burst it is read again, since a
    run may have left a retry behind), so an event before ``bound`` needs no
    query at all.
    """

    def __init__(self, move_to: Callable[[datetime], object]) -> None:
        self.move_to = move_to
        self.ready = Job.objects.filter(status=Job.Status.READY, task_name=rebuild_docs.name)
        self.bound: datetime | None = None  # None: nothing READY

    def deadline(self, run_at: datetime) -> None:
        if self.bound is None or run_at < self.bound:
            self.bound = run_at

    def _earliest(self) -> datetime | None:
        return self.ready.order_by("run_at").values_list("run_at", flat=True).first()

    def run_until(self, until: datetime | None) -> None:
        """Run every job due by ``until`` (``None``: every job), in deadline order."""
        while self.bound is not None and (until is None or self.bound <= until):
            earliest = self._earliest()
            self.bound = earliest
            if earliest is None or (until is not None and earliest > until):
                return
            self.move_to(earliest)
            if not Worker(burst=True, concurrency=1, handle_signals=False).run():
                raise ReplayError(
                    f"a rebuild_docs job due at {earliest.isoformat()} did not run: is another "
                    "worker running on this database? Stop it during a virtual replay."
                )


# -- real time ---------------------------------------------------------------------


def schedule(
    events: Sequence[Event],
    *,
    window: float,
    speed: float,
    skip_idle: bool,
    pad: float = IDLE_PAD,
) -> tuple[list[float], float]:
    """Return each event's offset in real seconds from the start, and the trace seconds skipped.

    With ``skip_idle``, a gap longer than ``window + max(window, pad * speed)``
    (``pad`` in real seconds) is cut to that length: every window has run
    before its end, so the outcome is the same, only sooner.
    """
    keep = window + max(window, pad * speed)
    offsets: list[float] = []
    trace = skipped = 0.0
    for index, event in enumerate(events):
        if index:
            gap = event.timestamp - events[index - 1].timestamp
            if skip_idle and gap > keep:
                skipped += gap - keep
                gap = keep
            trace += gap
        offsets.append(trace / speed)
    return offsets, skipped


def worker_env() -> dict[str, str]:
    """Environment for a worker subprocess on this process's settings and database.

    The database follows the live connection (under a test runner that is the
    test database): PostgreSQL through ``DATABASE_URL``, the example's SQLite
    file through ``DEBOUNCE_EXAMPLE_SQLITE``.
    """
    env = dict(os.environ)
    module = settings.SETTINGS_MODULE
    env["DJANGO_SETTINGS_MODULE"] = module
    package = import_module(module.split(".")[0])
    root = str(Path(next(iter(package.__path__))).resolve().parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    conn = connections[DEFAULT_DB_ALIAS]
    db = conn.settings_dict
    if conn.vendor == "postgresql":
        user = quote(str(db.get("USER") or ""), safe="")
        password = db.get("PASSWORD")
        auth = f"{user}:{quote(str(password), safe='')}" if password else user
        host = str(db.get("HOST") or "")
        host = quote(host, safe="") if host.startswith("/") else host
        port = f":{db['PORT']}" if db.get("PORT") else ""
        env["DATABASE_URL"] = f"postgres://{auth}@{host}{port}/{quote(str(db['NAME']), safe='')}"
    elif conn.vendor == "sqlite":
        env["DEBOUNCE_EXAMPLE_SQLITE"] = str(db["NAME"])
    return env


class Monitor(threading.Thread):
    """Polls the ``rebuild_docs`` jobs: open windows, READY and RUNNING jobs per key."""

    def __init__(self, summary: Summary, interval: float) -> None:
        super().__init__(name="replay-monitor", daemon=True)
        self.summary = summary
        self.interval = interval
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.halt.wait(self.interval):
                self.poll()
            self.poll()
        except BaseException as exc:  # reported by the producer
            self.error = exc
        finally:
            connections.close_all()

    def poll(self) -> None:
        s = self.summary
        rows = (
            Job.objects.filter(
                task_name=rebuild_docs.name, status__in=[Job.Status.READY, Job.Status.RUNNING]
            )
            .values("debounce_key")
            .annotate(
                ready=Count("id", filter=Q(status=Job.Status.READY)),
                open=Count("id", filter=Q(status=Job.Status.READY, window_key__isnull=False)),
                running=Count("id", filter=Q(status=Job.Status.RUNNING)),
            )
        )
        s.polls += 1
        for row in rows:
            s.max_open_windows_per_key = max(s.max_open_windows_per_key, row["open"])
            s.max_ready_per_key = max(s.max_ready_per_key, row["ready"])
            s.max_running_per_key = max(s.max_running_per_key, row["running"])
            if row["ready"] > 1 or row["running"] > 1:
                s.violations.append(
                    f"{row['debounce_key']}: {row['ready']} READY ({row['open']} open), "
                    f"{row['running']} RUNNING"
                )


def replay_real_time(
    events: Sequence[Event],
    *,
    window: float,
    max_wait: float,
    speed: float,
    poll_interval: float,
    concurrency: int,
    skip_idle: bool,
    progress: Progress,
    say: Callable[[str], object] = lambda _: None,
) -> Summary:
    """Enqueue at compressed real times while a ``run_debounce_worker`` subprocess runs.

    The worker is started with this process's settings and database, stopped
    with SIGTERM once the last window has run. A monitor thread polls the
    jobs every ``MONITOR_INTERVAL`` for two READY windows of one key.
    """
    summary = Summary(
        mode="real-time",
        events=len(events),
        window=window,
        max_wait=max_wait,
        speed=speed,
        worker_poll_interval=poll_interval,
    )
    offsets, summary.trace_seconds_elided = schedule(
        events,
        window=window,
        speed=speed,
        skip_idle=skip_idle,
        pad=max(IDLE_PAD, 4 * poll_interval),
    )
    call_window, call_max_wait = window / speed, max_wait / speed
    command = [
        sys.executable,
        "-m",
        "django",
        "run_debounce_worker",
        "--poll-interval",
        repr(poll_interval),
        "--concurrency",
        str(concurrency),
    ]
    started = time.perf_counter()
    worker = subprocess.Popen(command, env=worker_env(), stdout=subprocess.DEVNULL)
    monitor = Monitor(summary, MONITOR_INTERVAL)
    try:
        _wait_for_worker(worker)
        say(f"worker pid {worker.pid} is up; replaying")
        monitor.start()
        begin = time.perf_counter()
        for event, offset in zip(events, offsets, strict=True):
            pause = begin + offset - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            called = time.perf_counter() - begin
            rebuild_docs.apply_async(
                args=(event.directory,), debounce=call_window, debounce_max_wait=call_max_wait
            )
            committed = time.perf_counter() - begin
            summary.call_times.append((called, committed))
            summary.max_lag = max(summary.max_lag, committed - offset)
            progress(1)
            if worker.poll() is not None:
                raise ReplayError(f"the worker exited early with status {worker.returncode}")
        _wait_until_drained(worker, timeout=call_max_wait + 60)
    finally:
        monitor.halt.set()
        if monitor.is_alive():
            monitor.join(timeout=30)
        summary.worker_exit = _stop(worker)
    if monitor.error is not None:
        raise ReplayError(f"the monitor failed: {monitor.error!r}") from monitor.error
    summary.wall_seconds = time.perf_counter() - started
    summarize(summary, scale=speed)
    late = [
        (started_at - run_at).total_seconds()
        for started_at, run_at in Job.objects.filter(
            task_name=rebuild_docs.name, started_at__isnull=False
        ).values_list("started_at", "run_at")
        if started_at is not None
    ]
    summary.max_lateness = max(late, default=0.0)
    return summary


def _wait_for_worker(worker: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    """Enqueue a ``ping`` job and wait until the worker has run it."""
    job = ping.delay()
    deadline = time.perf_counter() + timeout
    while not Job.objects.filter(pk=job.pk, status=Job.Status.SUCCESSFUL).exists():
        if worker.poll() is not None:
            raise ReplayError(f"the worker exited at start with status {worker.returncode}")
        if time.perf_counter() > deadline:
            raise ReplayError(f"the worker did not run a ping job within {timeout:.0f} s")
        time.sleep(0.02)


def _wait_until_drained(worker: subprocess.Popen[bytes], timeout: float) -> None:
    pending = Job.objects.filter(
        task_name=rebuild_docs.name, status__in=[Job.Status.READY, Job.Status.RUNNING]
    )
    deadline = time.perf_counter() + timeout
    while pending.exists():
        if worker.poll() is not None:
            raise ReplayError(f"the worker exited early with status {worker.returncode}")
        if time.perf_counter() > deadline:
            raise ReplayError(
                f"{pending.count()} rebuild_docs job(s) still pending {timeout:.0f} s after the "
                "last event"
            )
        time.sleep(0.05)


def _stop(worker: subprocess.Popen[bytes]) -> int:
    """SIGTERM the worker (it finishes running jobs, then exits); kill it after 30 s."""
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    return worker.returncode
