"""Fitting text into terminal columns: display width, shortening, padding (decision 132).

A terminal draws East Asian wide and fullwidth characters (``unicodedata``
``east_asian_width`` W or F: CJK ideographs, kana, hangul, fullwidth forms)
two columns wide and combining marks in no column of their own, so lengths
here are display widths, not ``len()``. Names are shortened where they
differ: in the middle (keys, worker ids, queues: the start says which family,
the end which member) or, for a dotted task path, keeping the function name.
"""

from __future__ import annotations

import unicodedata

ELLIPSIS = "…"


def printable(text: str) -> str:
    """``text`` with each character a terminal would act on shown escaped (``\\n``, ``\\x1b``).

    A key, a task name or a progress note is data: a newline in it must not start a
    line of its own, nor an escape sequence reach the operator's terminal.
    """
    if text.isprintable():
        return text
    return "".join(
        char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
        for char in text
    )


def char_width(char: str) -> int:
    """Columns one character takes: 2 (East Asian W/F), 0 (combining mark), else 1."""
    if unicodedata.combining(char):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def display_width(text: str) -> int:
    """Columns ``text`` takes on a terminal (sum of :func:`char_width`)."""
    return sum(char_width(char) for char in text)


def _head(text: str, width: int) -> str:
    """The longest start of ``text`` at most ``width`` columns wide."""
    used = 0
    for index, char in enumerate(text):
        used += char_width(char)
        if used > width:
            return text[:index]
    return text


def _tail(text: str, width: int) -> str:
    """The longest end of ``text`` at most ``width`` columns wide."""
    return _head(text[::-1], width)[::-1]


def cut_end(text: str, width: int) -> str:
    """``text`` if it fits ``width`` columns, else its start and "…" (at most ``width``)."""
    if display_width(text) <= width:
        return text
    return _head(text, max(0, width - 1)) + ELLIPSIS


def cut_middle(text: str, width: int) -> str:
    """``text`` if it fits, else its start, "…" and its end (the end gets 3/5 of the room).

    ``cut_middle("docs:live/very/long/directory/name/number/3", 30)`` is
    ``"docs:live/ver…/name/number/3"``-like: rows that differ at the end stay apart.
    """
    if display_width(text) <= width:
        return text
    room = max(0, width - 1)
    head = _head(text, room * 2 // 5)
    return head + ELLIPSIS + _tail(text, room - display_width(head))


def cut_dotted(path: str, width: int) -> str:
    """A dotted task path fitted to ``width``, keeping the last part (the function name).

    ``cut_dotted("project.apps.docs.tasks.rebuild", 16)`` is ``"project…rebuild"``-like;
    a function name wider than ``width`` alone is cut in the middle.
    """
    if display_width(path) <= width:
        return path
    head, dot, name = path.rpartition(".")
    if not dot or display_width(name) + 2 > width:
        return cut_middle(name if dot else path, width)
    room = width - display_width(name) - 2  # "…" and the dot before the name
    return _head(head, room) + ELLIPSIS + "." + name


def pad(text: str, width: int) -> str:
    """``text`` followed by spaces up to ``width`` columns (``str.ljust`` by display width)."""
    return text + " " * max(0, width - display_width(text))
