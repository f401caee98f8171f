"""The documented path of the admin's diagnostics: an alias of :mod:`django_debounce.hold_reasons`.

``django_debounce.holds.held_back(job)`` and ``flow_view(...)`` are public API
(docs/reference/api.md, "Diagnostics"); the code lives in
:mod:`django_debounce.hold_reasons`, and the rules it explains in
:mod:`django_debounce.claim_rules`.
"""

from __future__ import annotations

from .hold_reasons import FlowView, Hold, count_running, flow_control_notes, flow_view, held_back

__all__ = ["FlowView", "Hold", "count_running", "flow_control_notes", "flow_view", "held_back"]
