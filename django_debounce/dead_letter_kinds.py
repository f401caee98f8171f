"""Why a dead letter exists: its kind and the reserved reason prefixes (contract §6, §7, §8).

A dead letter's ``reason`` starts with a reserved prefix that users and the
automatic retry sweep read (``failed:``, ``shed:``, ``codel:``,
``unknown_task:``; they never change). The row also stores the kind that
prefix names (``DeadLetter.kind``, indexed), so filters use a column instead
of ``reason LIKE 'prefix%'``. :mod:`django_debounce.models` imports this
module and nothing in it imports the package.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class DeadLetterKind(models.TextChoices):
    """Why the entry exists, stored in ``DeadLetter.kind`` (§6, §7, §8); also ``DeadLetter.Kind``.

    Each kind but ``OTHER`` has a reserved reason prefix
    (:data:`REASON_PREFIXES`), written by the package and read by users;
    ``kind`` is derived from it when the row is written, so filters use an
    indexed column instead of ``reason LIKE 'prefix%'``.
    """

    FAILURE = "failure", _("failure")
    SHED = "shed", _("shed (rate limit)")
    CODEL = "codel", _("shed (CoDel)")
    UNKNOWN_TASK = "unknown_task", _("unknown task")
    OTHER = "other", _("other")

    @classmethod
    def of_reason(cls, reason: str) -> DeadLetterKind:
        """Return the kind whose reserved prefix ``reason`` starts with, else ``OTHER``."""
        for kind, prefix in REASON_PREFIXES.items():
            if reason.startswith(prefix):
                return kind
        return cls.OTHER


#: The reserved reason prefix of each :class:`DeadLetterKind` but ``OTHER`` (§8). Users and
#: the sweep read these prefixes; they never change.
REASON_PREFIXES: dict[DeadLetterKind, str] = {
    DeadLetterKind.FAILURE: "failed:",
    DeadLetterKind.SHED: "shed:",
    DeadLetterKind.CODEL: "codel:",
    DeadLetterKind.UNKNOWN_TASK: "unknown_task:",
}

#: Kinds the automatic retry sweep never retries (§8); ``SHED`` and ``CODEL`` are the sheds.
RESERVED_KINDS = (DeadLetterKind.SHED, DeadLetterKind.CODEL, DeadLetterKind.UNKNOWN_TASK)

#: The kinds of a shed (§6): what ``include_shed`` selects, and all a SHED job's letter can be.
SHED_KINDS = frozenset({DeadLetterKind.SHED, DeadLetterKind.CODEL})

__all__ = ["REASON_PREFIXES", "RESERVED_KINDS", "SHED_KINDS", "DeadLetterKind"]
