"""One caching rule for compiled SQL (``django_debounce.compiled``): built once per key,
bounded, forgotten by ``clear()``."""

from __future__ import annotations

from django_debounce import compiled


def test_derived_sql_is_built_once_per_key_bounded_and_cleared(monkeypatch):
    compiled.clear()
    built: list[str] = []

    def make(text: str):
        def build() -> str:
            built.append(text)
            return text

        return build

    assert compiled.derived_sql(("x", "SELECT 1"), make("A")) == "A"
    assert compiled.derived_sql(("x", "SELECT 1"), make("B")) == "A"
    assert built == ["A"]

    monkeypatch.setattr(compiled, "MAX_ENTRIES", 2)
    compiled.derived_sql("k2", make("C"))
    compiled.derived_sql("k3", make("D"))  # full: starts over, keeps only this one
    compiled.derived_sql(("x", "SELECT 1"), make("E"))
    assert built == ["A", "C", "D", "E"]

    compiled.clear()
    compiled.derived_sql("k3", make("F"))
    assert built[-1] == "F"
    compiled.clear()
