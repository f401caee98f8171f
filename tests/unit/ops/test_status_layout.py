"""The text of ``debounce_status`` on real-world names: what tells rows apart stays (decision 132).

Snapshots are built by hand (the shape :func:`collect_status` returns); the
numbers from the database are tested in tests/db/ops/test_debounce_status.py.
"""

from __future__ import annotations

import datetime as dt

import pytest

from django_debounce.ops import status
from django_debounce.ops.status import render_status, screen_size
from django_debounce.ops.text_width import cut_dotted, cut_middle, display_width

NOW = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)


def at(seconds: float) -> str:
    return (NOW + dt.timedelta(seconds=seconds)).isoformat()


def snapshot(**lists) -> dict:
    base = {
        "now": NOW.isoformat(),
        "queues": [],
        "windows": [],
        "dead_letters": {"last_hour": {}, "last_day": {}},
        "breakers": [],
        "buckets": [],
        "workers": [],
    }
    return {**base, **lists}


def window(n: int, key: str, task: str = "docs.rebuild") -> dict:
    return {
        "id": n,
        "task_name": task,
        "key": key,
        "queue": "default",
        "calls": 3,
        "opened_at": at(-10),
        "deadline": at(30),
        "max_run_at": at(60),
    }


def widths(text: str) -> list[int]:
    return [display_width(line) for line in text.splitlines()]


def test_a_long_worker_id_is_shortened_and_the_lease_time_stays_whole():
    worker = "worker-" + "very-long-hostname.example.internal-" * 2 + "pid-4242-threads-8"
    text = render_status(
        snapshot(workers=[{"worker_id": worker, "running": 3, "lease_expires_at": at(-3725)}])
    )
    (line,) = [line for line in text.splitlines() if "running, lease" in line]
    assert line.endswith("3 running, lease 1h02m ago")
    assert "worker-very-long" in line and line.split()[0].endswith("pid-4242-threads-8")
    assert max(widths(text)) <= 80


def test_long_window_keys_keep_their_distinct_ends():
    keys = [f"docs:live/very/long/directory/name/number/{n}" for n in (1, 2, 3)]
    task = "project.apps.documentation.tasks.rebuild_the_whole_search_index_now"
    text = render_status(snapshot(windows=[window(n, k, task) for n, k in enumerate(keys)]))
    rows = [line for line in text.splitlines() if line.startswith("  #")]
    assert len(rows) == 3 and len(set(rows)) == 3
    for row, n in zip(rows, (1, 2, 3), strict=True):
        assert f"/number/{n} " in row and "docs:live/" in row
    assert max(widths(text)) <= 80


def test_dotted_task_paths_keep_the_function_name():
    got = cut_dotted("project.apps.docs.tasks.rebuild", 16)
    assert got.endswith("….rebuild") and got.startswith("proj") and display_width(got) == 16
    name = "company.platform.integrations.payments.tasks.charge_the_card_now"
    text = render_status(
        snapshot(
            breakers=[
                {
                    "task_name": name,
                    "state": "open",
                    "failures": 3,
                    "opened_at": at(-20),
                    "reset_due_at": at(40),
                }
            ]
        )
    )
    (line,) = [line for line in text.splitlines() if " probe " in line]
    assert ".charge_the_card_now open" in line and line.lstrip().startswith("company.")


def test_a_long_queue_name_is_cut_in_the_middle_and_the_columns_stay():
    queues = [
        {
            "queue": f"tenant-{n}-notifications-outbound-{n:03d}",
            "ready": 5,
            "due": 4,
            "running": 1,
            "oldest_due_age": 30.0,
            "runs_last_minute": 7,
        }
        for n in (1, 2)
    ]
    lines = render_status(snapshot(queues=queues)).splitlines()[3:5]
    assert [line.split()[0][-4:] for line in lines] == ["-001", "-002"]
    assert [line.split()[1:] for line in lines] == [["5", "4", "1", "30s", "7"]] * 2
    assert len(lines[0].split()[0]) == 27  # 80 columns: the queue column is 27 wide


def test_wide_characters_count_two_columns():
    key = "文書:" + "東京都千代田区丸の内一丁目" * 3
    text = render_status(
        snapshot(
            windows=[window(1, key), window(2, "plain:" + "x" * 60)],
            workers=[{"worker_id": "ワーカー" * 12, "running": 1, "lease_expires_at": at(50)}],
        )
    )
    assert max(widths(text)) <= 80
    rows = [line for line in text.splitlines() if line.startswith("  #")]
    assert display_width(rows[0]) == display_width(rows[1]) == len(rows[1])  # columns line up
    assert cut_middle("漢字" * 20, 11) == "漢字…" + "字漢字" and display_width("漢字") == 4


def test_a_wider_terminal_gives_names_the_room(monkeypatch):
    keys = [f"docs:live/very/long/directory/name/number/{n}" for n in (1, 2)]
    text = render_status(snapshot(windows=[window(n, k) for n, k in enumerate(keys)]), width=120)
    assert all(k in text for k in keys)
    assert max(widths(text)) <= 120


@pytest.mark.parametrize(
    "tty, columns, lines, expected",
    [
        (False, 200, 50, (160, None)),  # a pipe honours COLUMNS when the caller sets it
        (False, 100, 50, (100, None)),
        (False, "", 50, (80, None)),
        (True, 120, 40, (120, 40)),
        (True, 400, 40, (160, 40)),
        (True, 40, 5, (60, 10)),
    ],
)
def test_screen_size(monkeypatch, tty, columns, lines, expected):
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.setenv("LINES", str(lines))
    assert screen_size(tty) == expected


def test_a_short_terminal_keeps_the_heading_and_counts_what_it_left_out():
    workers = [
        {"worker_id": f"w{n:02d}", "running": 1, "lease_expires_at": at(50)} for n in range(30)
    ]
    breakers = [
        {
            "task_name": f"t.b{n}",
            "state": "open",
            "failures": 1,
            "opened_at": at(-1),
            "reset_due_at": at(9),
        }
        for n in range(8)
    ]
    full = render_status(snapshot(workers=workers, breakers=breakers)).splitlines()
    assert len(full) > 30
    text = render_status(snapshot(workers=workers, breakers=breakers), height=30).splitlines()
    assert len(text) == 30
    assert text[0].startswith("django-debounce status at")
    assert "  (none open)" in text  # an empty list keeps its line
    shown = [line for line in text if line.startswith("  w")]
    shown_breakers = [line for line in text if line.startswith("  t.b")]
    assert f"  … and {30 - len(shown)} more" in text
    assert f"  … and {8 - len(shown_breakers)} more" in text
    assert len(shown) >= 1 and len(shown_breakers) >= 1


def test_at_most_max_rows_without_a_height():
    workers = [
        {"worker_id": f"w{n:02d}", "running": 1, "lease_expires_at": at(50)} for n in range(13)
    ]
    text = render_status(snapshot(workers=workers)).splitlines()
    assert len([line for line in text if line.startswith("  w")]) == status.MAX_ROWS
    assert "  … and 3 more (--format json lists all)" in text
