# ruff: noqa: T201  (a benchmark prints its figures)
"""Benchmark: what tracing costs one enqueue, off and on (issue #22 item 5; decision 214).

    python3 dev.py bench enqueue_tracing                       # 2,000 calls per side, 5 rounds
    python3 dev.py bench enqueue_tracing -- --calls 300 --rounds 1   # a quick look

Three sides, interleaved call by call in an order that rotates, on one PostgreSQL
database of its own (``--url``, default ``bench_enqueue_tracing``):

* ``no API``: as without the ``otel`` extra (``django_debounce.tracing`` remembers a
  failed import): the baseline;
* ``API, no provider``: ``opentelemetry-api`` installed, no tracer provider set: what every
  project without tracing pays;
* ``on``: an SDK ``TracerProvider`` with a ``SimpleSpanProcessor`` into the in-memory
  exporter (cleared each round), given through ``use_tracer_provider``.

Each side makes ``noop.delay(n)`` (a plain insert) and ``debounced.delay(key)`` over
``--keys`` keys (mostly slides). Prints the median wall time of a call and the client
CPU of a call (``time.process_time()`` over blocks of 20 calls: the package's Python,
without the database's time), each as a ratio to ``no API`` in the same run. Target:
``API, no provider`` / ``no API`` within noise (≤ 1.02) on both.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import add_db_arguments, setup, table, teardown  # noqa: E402

SIDES = ("no API", "API, no provider", "on")
BLOCK = 20


def run(args: argparse.Namespace) -> list[str]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from bench.peersapp.tasks import debounced, noop
    from django_debounce.tracing import provider

    sdk = TracerProvider()
    exporter = InMemorySpanExporter()
    sdk.add_span_processor(SimpleSpanProcessor(exporter))

    def side(name: str) -> None:
        provider._api = False if name == "no API" else None  # as if never tried
        provider.use_tracer_provider(sdk if name == "on" else None)

    wall = {(s, k): [] for s in SIDES for k in ("plain", "slide")}
    cpu = {(s, k): [] for s in SIDES for k in ("plain", "slide")}
    calls = {
        "plain": lambda n: noop.delay(n),
        "slide": lambda n: debounced.delay(f"{n % args.keys}"),
    }
    for round_ in range(args.rounds):
        for block in range(args.calls // BLOCK):
            turn = (block + round_) % 3
            for name in SIDES[turn:] + SIDES[:turn]:
                side(name)
                for kind, call in calls.items():
                    began_cpu = time.process_time()
                    for n in range(BLOCK):
                        began = time.perf_counter()
                        call(block * BLOCK + n)
                        wall[name, kind].append(time.perf_counter() - began)
                    cpu[name, kind].append((time.process_time() - began_cpu) / BLOCK)
            exporter.clear()
        print(f"round {round_ + 1} done", flush=True)
    side("no API")
    rows = []
    for kind in ("plain", "slide"):
        base_wall = statistics.median(wall["no API", kind])
        base_cpu = statistics.mean(cpu["no API", kind])
        for name in SIDES:
            w, c = statistics.median(wall[name, kind]), statistics.mean(cpu[name, kind])
            rows.append(
                [
                    kind,
                    name,
                    f"{w * 1e6:.0f}",
                    f"{w / base_wall:.3f}",
                    f"{c * 1e6:.1f}",
                    f"{c / base_cpu:.3f}",
                ]
            )
    header = f"enqueue_tracing: {args.calls} calls per side, kind and round, {args.rounds} rounds"
    return [
        header,
        "",
        table(["call", "side", "µs median", "/ no API", "client CPU µs", "/ no API"], rows),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=2_000, help="calls per side, kind and round")
    parser.add_argument("--keys", type=int, default=200, help="debounce keys of the slides")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (the order rotates)")
    add_db_arguments(parser, "bench_enqueue_tracing")
    args = parser.parse_args()
    setup(args)
    try:
        report = run(args)
    finally:
        teardown(args)
    print()
    print("\n".join(report))


if __name__ == "__main__":
    main()
