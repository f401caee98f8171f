"""Every "§n" and "§n.m" the repository cites resolves in ``docs/reference/contract.md``.

"§n" names the section headed ``## §n …``; "§n.m" names item ``m.`` of the numbered list
in section n. The citations are collected from the package, the docs and the tests (this
file included), in every text file they hold.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONTRACT = REPO / "docs" / "reference" / "contract.md"
CITING = ("django_debounce", "docs", "tests")
TEXT = {".py", ".md", ".html", ".txt", ".js", ".css", ".rst"}
#: "§4", "§ 4", "§4.5"; a trailing full stop ("§4.5.") is not an item number.
CITATION = re.compile(r"§\s?(\d+)(?:\.(\d+))?")
SECTION = re.compile(r"^## §(\d+)\b")
ITEM = re.compile(r"^(\d+)\.\s")


def contract_outline() -> dict[int, set[int]]:
    """Return ``{section: {numbered items}}`` read from the contract's headings and lists."""
    outline: dict[int, set[int]] = {}
    section: int | None = None
    for line in CONTRACT.read_text(encoding="utf-8").splitlines():
        if heading := SECTION.match(line):
            section = int(heading.group(1))
            outline[section] = set()
        elif section is not None and (item := ITEM.match(line)):
            outline[section].add(int(item.group(1)))
    return outline


def citations() -> dict[tuple[int, int | None], list[str]]:
    """Return every citation found, with the places (``path:line``) that make it."""
    found: dict[tuple[int, int | None], list[str]] = defaultdict(list)
    for top in CITING:
        for path in sorted((REPO / top).rglob("*")):
            if path.suffix not in TEXT or not path.is_file():
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            for number, line in enumerate(text.splitlines(), start=1):
                for match in CITATION.finditer(line):
                    item = int(match.group(2)) if match.group(2) else None
                    where = f"{path.relative_to(REPO)}:{number}"
                    found[(int(match.group(1)), item)].append(where)
    return found


def test_the_contract_has_its_eleven_sections_and_the_numbered_steps_of_section_4():
    outline = contract_outline()
    assert sorted(outline) == list(range(1, 12))
    assert outline[4] == set(range(1, 9))


def test_every_cited_section_and_item_exists_in_the_contract():
    outline = contract_outline()
    found = citations()
    package = [where for places in found.values() for where in places]
    assert any(where.startswith("django_debounce/") for where in package)
    missing = {
        (f"§{section}" if item is None else f"§{section}.{item}"): places[:5]
        for (section, item), places in found.items()
        if section not in outline or (item is not None and item not in outline[section])
    }
    assert missing == {}, f"cited but not in {CONTRACT.relative_to(REPO)}: {missing}"
