"""Event streams for ``replay_events``: a CSV of ``timestamp,author,path`` rows, or a built-in one.

An event is one changed file at one instant; it becomes one
``rebuild_docs(directory)`` enqueue, ``directory`` being the file's folder
(``.`` for a file at the top level).
"""

from __future__ import annotations

import csv
import posixpath
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

COLUMNS = ("timestamp", "author", "path")

#: The built-in stream: deterministic (seeded), a few hundred events over about two weeks.
BUILTIN_SEED = 20240601
BUILTIN_SIZE = 400
BUILTIN_START = 1717200000  # 2024-06-01 00:00:00 UTC
#: Commits land on an 18-minute grid. With the default window (1 h = 3⅓ grid
#: steps) and max wait (2 h = 6⅔ steps) no call comes within 6 minutes of a
#: deadline, so a ``--real-time`` replay is exact too unless the speed squeezes
#: those 6 minutes below the worker's reaction time (about ``--speed 10000``).
BUILTIN_GRID = 18 * 60
BUILTIN_FOLDERS = (
    ("docs", 6),
    ("docs/api-guide", 5),
    ("docs/topics", 2),
    ("src/app", 6),
    ("src/app/utils", 2),
    ("tests", 4),
    (".", 1),
)


@dataclass(frozen=True)
class Event:
    timestamp: float
    """Unix seconds (UTC)."""
    author: str
    path: str

    @property
    def directory(self) -> str:
        """The changed file's folder, ``.`` for a top-level file."""
        return directory_of(self.path)

    @property
    def when(self) -> datetime:
        return datetime.fromtimestamp(self.timestamp, tz=UTC)


def directory_of(path: str) -> str:
    """Return the parent folder of a repository-relative path (``.`` at the top level)."""
    return posixpath.dirname(path.strip().strip("/")) or "."


def load_events(path: str | Path, limit: int | None = None) -> list[Event]:
    """Read a ``timestamp,author,path`` CSV (header row required), sorted by time.

    ``limit`` keeps the file's first ``limit`` rows. Rows with equal timestamps
    are grouped by folder, otherwise kept in file order.

    Raises:
        ValueError: a missing column or a timestamp that is not a number.
    """
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(
                f"{path}: missing column(s) {', '.join(missing)}; expected a header "
                f"row {','.join(COLUMNS)}"
            )
        events = []
        for line, row in enumerate(reader, start=2):
            try:
                timestamp = float(row["timestamp"])
            except (TypeError, ValueError):
                raise ValueError(
                    f"{path}:{line}: timestamp {row['timestamp']!r} is not Unix seconds"
                ) from None
            events.append(Event(timestamp, row["author"] or "", row["path"] or ""))
    return _finish(events, limit)


def builtin_events(limit: int | None = None) -> list[Event]:
    """A deterministic, bursty stream: working sessions of a few commits, quiet nights.

    Commits touch one to five files, mostly in one or two folders; gaps inside a
    session are 18 to 54 minutes, between sessions up to 18 hours. The same
    events on every machine and Python version (``random.Random`` with a fixed
    seed).
    """
    rng = random.Random(BUILTIN_SEED)
    folders = [name for name, _ in BUILTIN_FOLDERS]
    weights = [weight for _, weight in BUILTIN_FOLDERS]
    events: list[Event] = []
    now = BUILTIN_START
    while len(events) < BUILTIN_SIZE:
        now += rng.randint(3, 60) * BUILTIN_GRID  # quiet until the next session
        for _ in range(rng.randint(1, 8)):  # commits in this session
            now += rng.randint(1, 3) * BUILTIN_GRID
            author = f"author-{rng.randint(1, 9):04d}"
            touched = rng.choices(folders, weights=weights, k=rng.randint(1, 2))
            for _ in range(rng.randint(1, 5)):
                folder = rng.choice(touched)
                name = f"file{rng.randint(1, 12)}.md"
                path = name if folder == "." else f"{folder}/{name}"
                events.append(Event(float(now), author, path))
    return _finish(events[:BUILTIN_SIZE], limit)


def _finish(events: list[Event], limit: int | None) -> list[Event]:
    """The first ``limit`` events, sorted by time; events of one instant grouped by folder.

    Grouping keeps the same calls at the same instant, but lets a real-time
    replay make one folder's calls back to back.
    """
    kept = events if limit is None else events[:limit]
    return sorted(kept, key=lambda event: (event.timestamp, event.directory))
