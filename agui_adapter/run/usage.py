"""The run's token usage, summed per provider and model for its terminal event (sans-I/O).

The kernel reports usage in pieces (``iac_code.usage`` on a frame, ``usage`` pipeline
envelopes), as floats when they travel through a protobuf Struct. ``RUN_FINISHED`` and
``RUN_ERROR`` carry the sum, one entry per (provider, model), in the order first seen. Its own
module because it is its own small state: the translator feeds it and asks it at the end.
"""

from __future__ import annotations

from typing import Any

USAGE_FIELDS = ("inputTokens", "outputTokens", "totalTokens", "cachedInputTokens")


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


class UsageTotals:
    """Token counts per (provider, model); anything that is not a count is ignored."""

    def __init__(self) -> None:
        self._totals: dict[tuple[str | None, str | None], dict[str, int]] = {}

    def add(self, usage: dict[str, Any]) -> None:
        key = (_str(usage.get("provider")), _str(usage.get("model")))
        totals = self._totals.setdefault(key, dict.fromkeys(USAGE_FIELDS, 0))
        for name in USAGE_FIELDS:
            value = usage.get(name)
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                totals[name] += value

    def entries(self) -> list[dict[str, Any]]:
        """The usage of a terminal event: provider and model when known, then the counts."""
        out = []
        for (provider, model), totals in self._totals.items():
            entry: dict[str, Any] = {}
            if provider:
                entry["provider"] = provider
            if model:
                entry["model"] = model
            entry.update(totals)
            out.append(entry)
        return out
