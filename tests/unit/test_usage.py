"""``run.usage``: the token counts a run's terminal event carries, summed per provider and model."""

from __future__ import annotations

from agui_adapter.run.usage import UsageTotals


def test_counts_are_summed_per_provider_and_model_in_the_order_first_seen() -> None:
    totals = UsageTotals()
    totals.add({"provider": "openai", "model": "m", "inputTokens": 9.0, "outputTokens": 2})
    totals.add({"model": "other", "totalTokens": 5})
    totals.add({"provider": "openai", "model": "m", "inputTokens": 1, "cachedInputTokens": 4.0})
    assert totals.entries() == [
        {"provider": "openai", "model": "m", "inputTokens": 10, "outputTokens": 2, "totalTokens": 0,
         "cachedInputTokens": 4},
        {"model": "other", "inputTokens": 0, "outputTokens": 0, "totalTokens": 5, "cachedInputTokens": 0},
    ]  # fmt: skip


def test_what_is_not_a_count_is_ignored() -> None:
    totals = UsageTotals()
    totals.add({"inputTokens": True, "outputTokens": -3, "totalTokens": 2.5, "cachedInputTokens": "7", "x": 1})
    assert totals.entries() == [{"inputTokens": 0, "outputTokens": 0, "totalTokens": 0, "cachedInputTokens": 0}]
    assert UsageTotals().entries() == []
