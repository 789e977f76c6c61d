"""An excluded model and its reason code (R-SEL-1): what selection, pools and status report for
every catalog model they leave out. A leaf beside `ledger.kinds`, so routing can name it without
importing selection.
"""

from __future__ import annotations

from dataclasses import dataclass

from ledger.clock import iso
from ledger.kinds import ExclusionReason


@dataclass(frozen=True)
class Exclusion:
    """A catalog model left out, with the first rule that excluded it.

    For cooldown reasons `until_ms` is when the model stops cooling (the latest end among the
    active provider and model cooldowns that cover it); otherwise None.
    """

    model: str
    reason: ExclusionReason
    until_ms: int | None = None

    def to_json(self) -> dict[str, object]:
        """Model and reason; `until` (ISO) only for the cooldown reasons that carry it."""
        doc: dict[str, object] = {"model": self.model, "reason": str(self.reason)}
        if self.until_ms is not None:
            doc["until"] = iso(self.until_ms)
        return doc
