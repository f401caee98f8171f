# ruff: noqa: T201  (a benchmark prints its figures)
"""The benchmark suite of issue #12: every scenario, ours beside raw psycopg and the peers, in one run.

    python3 dev.py bench suite                       # everything, 3 rounds (~40 min)
    python3 dev.py bench suite -- --smoke            # a few hundred jobs, 1 round (CI)
    python3 dev.py bench suite -- --only peers drain --rounds 5
    python3 dev.py bench suite -- --no-peers

Runs each scenario script as a subprocess with ``--json`` into
``.artifacts/bench/<UTC time>/`` (its log beside it), the peers through
``bench/peer_run.py`` in their own venv (``bench/peers_env.py``), then prints one
table of medians with [min–max] over the rounds, and the issue's targets: each
ratio, its target, met or missed. Everything it read is written to
``.artifacts/bench/<UTC time>/suite.json`` and the report to ``suite.md``.

A scenario whose script is not in ``bench/`` (yet) is shown as "not available";
one whose script fails is shown as "failed (exit N)" and makes the suite exit 1
after the report (``--smoke`` in CI: the scripts must not rot; no figure is
asserted). See bench/README.md, "suite.py", for how to read every column.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import table  # noqa: E402

PEERS = {
    "djtasks": "django-tasks-db",
    "procrastinate": "procrastinate",
    "celery": "Celery solo on Redis",
}


@dataclass
class Scenario:
    """One script of the suite: its file, its arguments at full size and in smoke mode."""

    name: str
    script: str
    full: Callable[[argparse.Namespace], list[str]]
    smoke: list[str]
    what: str
    redis: int | None = None
    status: str = "not run"
    data: Any = None
    stdout: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def scenarios() -> list[Scenario]:
    return [
        Scenario(
            "enqueue",
            "enqueue_scenarios.py",
            lambda a: ["--rounds", str(a.rounds)],
            ["--smoke"],
            "enqueue: new jobs, hot key, 1,000 keys, 8 producers, bulk (+ raw psycopg)",
        ),
        Scenario(
            "drain",
            "drain.py",
            lambda a: ["--rounds", str(a.rounds)],
            ["--smoke"],
            "drain 10,000 no-op jobs: 1 process C=1 and C=4, 2 processes (+ Celery)",
            redis=11,
        ),
        Scenario(
            "drain_sleep",
            "drain.py",
            lambda a: ["--rounds", str(a.rounds), "--sleep-ms", "10", "--jobs", "1000"],
            ["--smoke", "--sleep-ms", "10"],
            "drain 1,000 jobs that sleep 10 ms: do threads add throughput? (+ Celery)",
            redis=12,
        ),
        Scenario(
            "raw_drain",
            "raw_drain.py",
            lambda a: ["--rounds", str(a.rounds)],
            ["--smoke"],
            "what the database allows: raw psycopg claim + finish, 1/10/100 per batch",
        ),
        Scenario(
            "celery_executor",
            "celery_drain.py",
            lambda a: ["--rounds", str(a.rounds), "--jobs", "10000"],
            ["--jobs", "200", "--concurrency", "1"],
            "drain through our Celery executor (+ the built-in worker)",
            redis=4,
        ),
        Scenario(
            "latency",
            "latency.py",
            lambda a: ["--samples", str(max(200, a.samples))],
            ["--samples", "10"],
            "idle enqueue→start, due now and due later, LISTEN/NOTIFY and polling",
            redis=13,
        ),
        Scenario(
            "claim",
            "claim_scale.py",
            lambda a: ["--rounds", str(a.rounds)],
            ["--smoke"],
            "claim at 10k vs 1M finished rows, with EXPLAIN",
        ),
        Scenario(
            "table_health",
            "table_health.py",
            lambda a: [],
            ["--smoke"],
            "job table under 200,000 slides at 1M finished rows: HOT, dead, sizes, claim",
        ),
        Scenario(
            "rss",
            "rss.py",
            lambda a: [],
            ["--smoke"],
            "worker peak RSS after 10k and 100k jobs",
            redis=8,
        ),
        Scenario(
            "replay",
            "replay_stream.py",
            lambda a: ["--rounds", str(a.rounds)],
            ["--smoke"],
            "the real commit stream, real-time mode at 1,000,000x",
        ),
    ]


# -- running -------------------------------------------------------------------------------


def database_url(name: str) -> str:
    """``DATABASE_URL`` (or the local server) with the database ``name``, as bench/common.py."""
    from urllib.parse import urlsplit, urlunsplit

    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    return urlunsplit(urlsplit(base)._replace(path="/" + name))


def run_logged(cmd: list[str], log: Path, timeout: float) -> tuple[int, str, float]:
    """Run ``cmd`` in the repository root; stderr to ``log``; return (exit, stdout, seconds)."""
    started = time.monotonic()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    with log.open("w") as err:
        try:
            proc = subprocess.run(
                cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, timeout=timeout
            )
        except subprocess.TimeoutExpired as exc:
            out = (exc.stdout or b"").decode(errors="replace")
            return -1, out, time.monotonic() - started
    return proc.returncode, proc.stdout.decode(errors="replace"), time.monotonic() - started


def db_prefix(args: argparse.Namespace) -> str:
    """Database name prefix: a smoke run never drops a full run's databases."""
    return "bench_smoke" if args.smoke else "bench_suite"


def run_scenario(s: Scenario, args: argparse.Namespace, out: Path) -> None:
    script = ROOT / "bench" / s.script
    if not script.exists():
        s.status = "not available"
        return
    cmd = [sys.executable, str(script), *(s.smoke if args.smoke else s.full(args))]
    target = out / f"{s.name}.json"
    text = script.read_text(encoding="utf-8")
    if "--json" in text:
        cmd += ["--json", str(target)]
    if "add_db_arguments" in text:  # a database of the suite's own: never a developer's run's
        cmd += ["--url", database_url(f"{db_prefix(args)}_{s.name}")]
    if s.redis is not None and '"--redis"' in text:
        cmd += ["--redis", f"redis://127.0.0.1:6379/{s.redis}"]
    print(f"suite: {s.name}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    code, s.stdout, s.seconds = run_logged(cmd, out / f"{s.name}.log", args.timeout)
    (out / f"{s.name}.out").write_text(s.stdout)
    if code != 0:
        s.status = "timed out" if code == -1 else f"failed (exit {code})"
        return
    s.status = "ok"
    if target.exists():
        s.data = json.loads(target.read_text())
    else:
        s.notes.append("no JSON: its printed report is in the log")


def run_peers(args: argparse.Namespace, out: Path) -> Scenario:
    s = Scenario("peers", "peer_run.py", lambda a: [], [], "django-tasks-db, procrastinate, Celery")
    if args.no_peers:
        s.status = "skipped (--no-peers)"
        return s
    from bench import peers_env

    started = time.monotonic()
    try:
        python = peers_env.ensure()
    except (SystemExit, subprocess.CalledProcessError) as exc:
        s.status = f"failed (peers venv: {exc})"
        return s
    s.data, failures = {}, []
    for peer in PEERS:
        cmd = [str(python), str(ROOT / "bench" / "peer_run.py"), "--peer", peer]
        cmd += ["--url", database_url(f"{db_prefix(args)}_peer_{peer}")]
        if args.smoke:
            cmd.append("--smoke")
        else:
            cmd += ["--rounds", str(args.rounds), "--jobs", str(args.peer_jobs)]
            cmd += ["--samples", str(math.ceil(args.samples / args.rounds))]
        print(f"suite: peers: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
        code, stdout, _ = run_logged(cmd, out / f"peer-{peer}.log", args.timeout)
        if code != 0:
            failures.append(f"{peer}: exit {code}")
            continue
        s.data[peer] = json.loads(stdout.strip().splitlines()[-1])
    (out / "peers.json").write_text(json.dumps(s.data, indent=1))
    s.seconds = time.monotonic() - started
    s.status = "ok" if not failures else "failed (" + "; ".join(failures) + ")"
    return s


# -- reading the figures ----------------------------------------------------------------------


def percentile(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


class Figures:
    """The figures of one suite run: name -> per-round values (and a unit)."""

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {}
        self.units: dict[str, str] = {}
        self.groups: dict[str, str] = {}
        self.order: list[str] = []

    def add(self, group: str, name: str, values: list[float], unit: str) -> None:
        if not values:
            return
        self.values[name] = [float(v) for v in values]
        self.units[name] = unit
        self.groups[name] = group
        self.order.append(name)

    def median(self, name: str) -> float | None:
        values = self.values.get(name)
        return statistics.median(values) if values else None


def read_enqueue(f: Figures, data: Any) -> None:
    results = data["results"]
    names = {
        ("new jobs", "raw"): "raw psycopg, one-statement insert",
        ("hot key", "raw"): "raw psycopg, one-statement upsert (hot key)",
        ("1,000 keys", "raw"): "raw psycopg, one-statement upsert (1,000 keys)",
        ("new jobs", "ours"): "ours, plain delay()",
        ("hot key", "ours"): "ours, debounced, one hot key (slide)",
        ("1,000 keys", "ours"): "ours, debounced, 1,000 keys round-robin",
        ("8 producers, hot key", "ours"): "ours, 8 producers, hot key",
        ("8 producers, 1,000 keys", "ours"): "ours, 8 producers, 1,000 keys",
        ("bulk, new jobs", "ours"): "ours, bulk 1,000 new jobs",
        ("bulk, 1,000 keys", "ours"): "ours, bulk 1,000 debounced keys",
        ("bulk, new jobs", "raw"): "raw psycopg, multi-row insert of 1,000",
        ("bulk, 1,000 keys", "raw"): "raw psycopg, multi-row upsert of 1,000",
    }
    for (scenario, side), label in names.items():
        rounds = results.get(scenario, {}).get(side, [])
        f.add("enqueue", label, [m["rate"] for m in rounds], "calls/s")


def read_drain(f: Figures, data: Any) -> None:
    for label, sides in data["figures"].items():
        ours = next((v for k, v in sides.items() if k.startswith("ours")), [])
        f.add("drain", f"ours, {label}", [w for w, _s in ours], "jobs/s")
        f.add("drain", f"Celery (drain.py), {label}", [w for w, _s in sides["celery"]], "jobs/s")
        f.add("drain", f"ours, {label}, steady", [s for _w, s in ours], "jobs/s")


def read_drain_sleep(f: Figures, data: Any) -> None:
    for label, sides in data["figures"].items():
        ours = next((v for k, v in sides.items() if k.startswith("ours")), [])
        f.add("drain", f"ours, 10 ms jobs, {label}", [w for w, _s in ours], "jobs/s")
        f.add("drain", f"ours, 10 ms jobs, {label}, steady", [s for _w, s in ours], "jobs/s")
        f.add(
            "drain",
            f"Celery (drain.py), 10 ms jobs, {label}",
            [w for w, _s in sides["celery"]],
            "jobs/s",
        )


def read_raw_drain(f: Figures, data: Any) -> None:
    for batch, rates in data["results"].items():
        what = "2 commits per job" if batch == "1" else f"{batch} per claim and finish"
        f.add("drain", f"raw psycopg, {what}", rates, "jobs/s")


def read_latency(f: Figures, data: Any) -> None:
    for mode, scenarios in data.items():
        for scenario, samples in scenarios.items():
            for q in (50, 95, 99):
                f.add(
                    "latency",
                    f"ours, {mode}, {scenario}, p{q}",
                    [percentile(samples, q)],
                    "ms",
                )


def read_claim(f: Figures, data: Any) -> None:
    for r in data["results"]:
        f.add("claim", f"claim at {r['finished_rows']:,} finished rows", r["ms_per_claim"], "ms")
        f.add(
            "claim",
            f"claim EXPLAIN ANALYZE at {r['finished_rows']:,}",
            [r["execution_ms"]],
            "ms",
        )


def read_table_health(f: Figures, data: Any) -> None:
    phases = {p["phase"]: p for p in data["phases"]}
    slid = phases["slides"]
    share = 100 * slid["phase_hot"] / max(1, slid["phase_updates"])
    f.add("table health", "slides that were HOT updates", [share], "%")
    for name in ("start", "slides", "again"):
        f.add("table health", f"idle claim after {name}", [phases[name]["idle_ms"]], "ms")
        f.add("table health", f"table size after {name}", [phases[name]["total"] / 2**20], "MiB")


def read_rss(f: Figures, data: Any) -> None:
    marks = sorted({m for run in data["runs"] for m in run["vmhwm_kib_at"]}, key=int)
    for m in marks:
        values = [run["vmhwm_kib_at"][m] / 1024 for run in data["runs"]]
        f.add("rss", f"worker peak RSS after {int(m):,} jobs", values, "MiB")


def read_replay(f: Figures, data: Any) -> None:
    rounds = data["rounds"]
    f.add("replay", "replay: events/s sustained", [r["events_per_s"] for r in rounds], "events/s")
    f.add("replay", "replay: producer lag, worst", [r["producer_max_lag_ms"] for r in rounds], "ms")
    for key in ("delay_p50_ms", "delay_p99_ms"):
        f.add(
            "replay",
            f"replay: deadline→start {key.split('_')[1]}",
            [r[key] for r in rounds],
            "ms",
        )


def read_peers(f: Figures, data: Any) -> None:
    for peer, result in data.items():
        label = PEERS[peer]
        rounds = result["rounds"]
        f.add(
            "enqueue",
            f"{label}",
            [r["enqueue_per_s"] for r in rounds if "enqueue_per_s" in r],
            "calls/s",
        )
        f.add(
            "drain",
            f"{label}, 1 process, C=1",
            [r["drain_whole_per_s"] for r in rounds if "drain_whole_per_s" in r],
            "jobs/s",
        )
        samples = [x for r in rounds for x in r.get("latency_samples_ms", [])]
        if samples:
            for q in (50, 95, 99):
                f.add("latency", f"{label}, due now, p{q}", [percentile(samples, q)], "ms")


READERS: dict[str, Callable[[Figures, Any], None]] = {
    "enqueue": read_enqueue,
    "drain": read_drain,
    "drain_sleep": read_drain_sleep,
    "raw_drain": read_raw_drain,
    "latency": read_latency,
    "claim": read_claim,
    "rss": read_rss,
    "table_health": read_table_health,
    "replay": read_replay,
    "peers": read_peers,
}


# -- targets -------------------------------------------------------------------------------


def targets(f: Figures) -> list[list[str]]:
    """The issue's Targets section: (target, ratio, needed, met/missed) rows."""
    peers_enqueue = [f.median(PEERS[p]) for p in PEERS if f.median(PEERS[p]) is not None]
    fastest = max(peers_enqueue) if peers_enqueue else None
    m = f.median

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    def scaled(prefix: str, suffix: str) -> tuple[float | None, str, str]:
        """The largest size's median over the smallest's (the sizes differ under --smoke)."""
        sizes = [n for n in f.order if n.startswith(prefix) and n.endswith(suffix)]
        if len(sizes) < 2:
            return None, "largest", "smallest"
        small, large = (n[len(prefix) : -len(suffix)] for n in (sizes[0], sizes[-1]))
        return ratio(m(sizes[-1]), m(sizes[0])), large, small

    c1, c4 = "1 process, C=1", "1 process, C=4"
    specs: list[
        tuple[str, float | None, str, float] | tuple[str, float | None, str, str, str, float]
    ] = [
        (
            "drain C=1 / Celery solo (drain.py, same run)",
            ratio(m(f"ours, {c1}"), m(f"Celery (drain.py), {c1}")),
            ">=",
            3,
        ),
        (
            "drain C=4 / Celery solo (drain.py, same run)",
            ratio(m(f"ours, {c4}"), m(f"Celery (drain.py), {c1}")),
            ">=",
            3,
        ),
        (
            "drain C=4 / C=1, no-op jobs (one process)",
            ratio(m(f"ours, {c4}"), m(f"ours, {c1}")),
            ">=",
            1,
        ),
        (
            "drain C=4 / C=1, 10 ms sleeping jobs (one process, steady)",
            ratio(m(f"ours, 10 ms jobs, {c4}, steady"), m(f"ours, 10 ms jobs, {c1}, steady")),
            ">=",
            3,
        ),
        (
            "drain C=1 / django-tasks-db",
            ratio(m(f"ours, {c1}"), m(f"django-tasks-db, {c1}")),
            ">=",
            10,
        ),
        (
            "drain C=4 / django-tasks-db",
            ratio(m(f"ours, {c4}"), m(f"django-tasks-db, {c1}")),
            ">=",
            10,
        ),
        (
            "plain enqueue / raw one-statement insert",
            ratio(m("ours, plain delay()"), m("raw psycopg, one-statement insert")),
            ">=",
            0.8,
        ),
        (
            "plain enqueue / fastest peer's enqueue",
            ratio(m("ours, plain delay()"), fastest),
            ">=",
            1.2,
        ),
        (
            "debounced enqueue (slide) / raw upsert",
            ratio(
                m("ours, debounced, one hot key (slide)"),
                m("raw psycopg, one-statement upsert (hot key)"),
            ),
            ">=",
            0.8,
        ),
        (
            "bulk 1,000 / single plain calls",
            ratio(m("ours, bulk 1,000 new jobs"), m("ours, plain delay()")),
            ">=",
            10,
        ),
        (
            "8 producers, hot key / 1 producer",
            ratio(m("ours, 8 producers, hot key"), m("ours, debounced, one hot key (slide)")),
            ">=",
            1,
        ),
        (
            "idle p50 (LISTEN/NOTIFY) / procrastinate's p50",
            ratio(m("ours, notify, due now, p50"), m("procrastinate, due now, p50")),
            "<=",
            1,
        ),
        ("idle p99 (LISTEN/NOTIFY), ms", m("ours, notify, due now, p99"), "<=", 50),
        (
            "due-later p50 after run_at (LISTEN/NOTIFY), ms",
            m("ours, notify, due later, p50"),
            "<=",
            10,
        ),
        ("due-later p50 after run_at (polling), ms", m("ours, poll, due later, p50"), "<=", 10),
        ("claim at {} / at {} finished rows", *scaled("claim at ", " finished rows"), "<=", 1.2),
        (
            "peak RSS after {} / after {} jobs",
            *scaled("worker peak RSS after ", " jobs"),
            "<=",
            1.1,
        ),
    ]
    rows = []
    for batch in ("10", "100"):  # not targets: the share of the raw batched loop we reach
        raw = m(f"raw psycopg, {batch} per claim and finish")
        for label in (c1, c4):
            share = ratio(m(f"ours, {label}"), raw)
            if share is not None:
                rows.append(
                    [
                        f"(share) drain {label[-3:]} / raw, {batch} per batch",
                        f"{share:.2f}",
                        "—",
                        "—",
                    ]
                )
    for spec in specs:
        if len(spec) == 6:  # a size-scaled target: its text names the sizes compared
            template, value, large, small, op, goal = spec
            text = template.format(large, small)
        else:
            text, value, op, goal = spec
        if value is None:
            rows.append([text, "not available", f"{op} {goal:g}", "—"])
            continue
        met = value >= goal if op == ">=" else value <= goal
        if met:
            verdict = "met"
        elif op == ">=":
            verdict = f"missed ({value / goal:.0%} of the target)"
        else:
            verdict = f"missed ({value / goal:.1f} × the limit)"
        rows.append([text, f"{value:.2f}", f"{op} {goal:g}", verdict])
    return rows


def markdown(headers: list[str], rows: list[list[str]]) -> str:
    """``bench.common.table``, or a line saying there is nothing (it needs one row)."""
    return table(headers, rows) if rows else "(nothing measured)"


def fmt(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def report(f: Figures, ran: list[Scenario], args: argparse.Namespace) -> list[str]:
    rows = []
    for name in f.order:
        values = f.values[name]
        spread = f"[{fmt(min(values))}–{fmt(max(values))}]" if len(values) > 1 else "(1 run)"
        rows.append([f.groups[name], name, fmt(statistics.median(values)), spread, f.units[name]])
    status = [[s.name, s.what, s.status, f"{s.seconds:.0f}", "; ".join(s.notes)] for s in ran]
    mode = "smoke" if args.smoke else f"{args.rounds} rounds"
    lines = [
        f"# Benchmark suite ({mode}), {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
        f"{os.cpu_count()} CPUs; median over rounds [min–max]",
        "",
        markdown(["scenario", "what", "status", "s", "notes"], status),
        "",
        markdown(["group", "figure", "median", "[min–max]", "unit"], rows),
        "",
        "## Targets (issue #12)",
        "",
        table(["target", "ratio / value", "needed", "verdict"], targets(f)),
    ]
    for s in ran:
        if s.status == "ok" and s.data is None and s.stdout.strip():
            lines += ["", f"## {s.name} (its own report)", "", s.stdout.strip()]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every scenario (>= 3)")
    parser.add_argument("--samples", type=int, default=210, help="latency samples in all")
    parser.add_argument("--peer-jobs", type=int, default=10_000, help="peers' enqueues/drain")
    parser.add_argument("--smoke", action="store_true", help="a few hundred jobs, 1 round (CI)")
    parser.add_argument("--no-peers", action="store_true", help="skip the peers' venv and runs")
    names = [s.name for s in scenarios()] + ["peers"]
    parser.add_argument("--only", nargs="+", choices=names, help="run only these scenarios")
    parser.add_argument("--skip", nargs="+", choices=names, default=[], help="leave these out")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per script")
    parser.add_argument("--out", type=Path, default=ROOT / ".artifacts" / "bench")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds = 1
        args.timeout = min(args.timeout, 600.0)
    out = args.out / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out.mkdir(parents=True, exist_ok=True)
    wanted = set(args.only or names) - set(args.skip)
    ran: list[Scenario] = []
    for s in scenarios():
        if s.name in wanted:
            run_scenario(s, args, out)
            ran.append(s)
    if "peers" in wanted:
        ran.append(run_peers(args, out))
    figures = Figures()
    for s in ran:
        if s.data is not None and s.name in READERS:
            try:
                READERS[s.name](figures, s.data)
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                s.notes.append(f"unreadable JSON ({exc!r}): see {s.name}.json")
    lines = report(figures, ran, args)
    text = "\n".join(lines)
    print(text)
    (out / "suite.md").write_text(text + "\n")
    (out / "suite.json").write_text(
        json.dumps(
            {
                "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                "status": {s.name: s.status for s in ran},
                "figures": figures.values,
                "units": figures.units,
                "raw": {s.name: s.data for s in ran},
            },
            indent=1,
        )
    )
    print(f"\nraw figures: {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}/")
    broken = [s.name for s in ran if s.status.startswith(("failed", "timed out"))]
    if broken:
        print(f"suite: FAILED scenarios: {', '.join(broken)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
