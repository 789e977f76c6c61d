"""R-TOK-4, R-SEL-7: a model whose token window or learned limit has no room for the request's
estimate is left out (`token_budget`, `provider_tokens_exhausted`) until it has, so selection
prefers a backup with room; waiting for it is what `retry_at` says when none has."""

from __future__ import annotations

from typing import Any

from ledger.budgets.unit import Stage, Use, token_budgets, token_target
from ledger.config import Policy, TokenLimits
from ledger.kinds import ExclusionReason
from ledger.learned import LimitKind
from ledger.routing.room import LearnedRoom, TokenRoom
from ledger.routing.select import Selection, SelectionRequest, select
from tests.support.selection import CATALOG, MIN, NOW, snap

R = ExclusionReason


def _window(target: str, **limits: int) -> Any:
    (budget,) = token_budgets(token_target(target), TokenLimits.model_validate(limits),
                              Stage.TOKENS)  # fmt: skip
    return budget


def _run(room: TokenRoom, policy: dict[str, Any] | None = None, **request: Any) -> Selection:
    request.setdefault("default_model", "openai/gpt-a")
    return select(CATALOG, Policy.model_validate(policy or {}), snap(tokens=room),
                  SelectionRequest(**request))  # fmt: skip


def _why(selection: Selection) -> dict[str, tuple[ExclusionReason, int | None]]:
    return {e.model: (e.reason, e.until_ms) for e in selection.excluded}


def test_r_tok_4_a_primary_without_room_gives_way_to_a_backup_until_its_reset() -> None:
    room = TokenRoom(learned=(LearnedRoom("openai/gpt-a", LimitKind.TOKENS, 1200, NOW + 20_000),))
    selection = _run(room, input_bytes=4500)  # 1,500 input tokens + the reply: no fit
    assert selection.routes[0] == "anthropic/claude-h"
    assert _why(selection)["openai/gpt-a"] == (R.PROVIDER_TOKENS_EXHAUSTED, NOW + 20_000)
    doc: Any = selection.to_json()
    assert {"model": "openai/gpt-a", "reason": "provider_tokens_exhausted",
            "until": "2023-11-14T22:13:40.000Z"} in doc["excluded"]  # fmt: skip
    roomy = TokenRoom(learned=(LearnedRoom("openai/gpt-a", LimitKind.TOKENS, 10**6, NOW + 1),))
    assert _run(roomy, input_bytes=4500).routes[0] == "openai/gpt-a"  # it fits: kept first


def test_r_tok_4_each_kind_counts_its_own_part_of_the_estimate() -> None:
    # 300 input tokens; gpt-a's reply allowance is 4096 (replyTokens)
    gpt_a = "openai/gpt-a"
    output = TokenRoom(learned=(LearnedRoom(gpt_a, LimitKind.OUTPUT_TOKENS, 4095, NOW + 1),))
    assert _why(_run(output, input_bytes=900))[gpt_a][0] is R.PROVIDER_TOKENS_EXHAUSTED
    inputs = TokenRoom(learned=(LearnedRoom(gpt_a, LimitKind.INPUT_TOKENS, 300, NOW + 1),))
    assert _run(inputs, input_bytes=900).routes[0] == "openai/gpt-a"  # 300 fit 300 exactly
    assert _run(inputs, input_bytes=903).routes[0] != "openai/gpt-a"


def test_r_tok_4_a_full_window_leaves_out_only_the_models_it_counts() -> None:
    # replyTokens 10000: claude-s reserves 10,000 (its max output is 64k), claude-h 8,000
    window = _window("anthropic/*", tokensPerMinute=9000)
    room = TokenRoom(windows=((window, Use(0, ())),))
    selection = _run(room, {"replyTokens": 10_000})
    assert _why(selection)["anthropic/claude-s"] == (R.TOKEN_BUDGET, None)  # never fits alone
    assert "anthropic/claude-h" in selection.routes
    used = TokenRoom(windows=((window, Use(2000, ((NOW + 30_000, 1500), (NOW + 50_000, 500)))),))
    selection = _run(used, {"replyTokens": 10_000})
    # claude-h: 2,000 + 8,000 > 9,000 until 1,000 have left: the first part, at +30 s
    assert _why(selection)["anthropic/claude-h"] == (R.TOKEN_BUDGET, NOW + 30_000)
    assert selection.routes[0] == "openai/gpt-a"  # the other providers are not counted


def test_r_tok_4_with_no_route_left_retry_at_is_when_the_first_has_room() -> None:
    provider_wide = [_window(name, tokensPerMinute=4096) for name in ("openai", "anthropic")]
    room = TokenRoom(
        windows=tuple((w, Use(100, ((NOW + 40_000, 100),))) for w in provider_wide),
        learned=(LearnedRoom("local/llama", LimitKind.TOKENS, 0, NOW + 2 * MIN),
                 LearnedRoom("local/free", LimitKind.TOKENS, 0, NOW + 3 * MIN)),
    )  # fmt: skip
    selection = _run(room, {"fallbackModels": []})
    assert selection.routes == ()
    assert selection.retry_at_ms == NOW + 40_000
    assert selection.excluded_by_reason()["token_budget"] == 3


def test_r_tok_4_both_reasons_name_the_first_and_wait_for_the_last() -> None:
    window = _window("openai/gpt-a", tokensPerMinute=5000)
    room = TokenRoom(
        windows=((window, Use(4000, ((NOW + 10_000, 4000),))),),
        learned=(LearnedRoom("openai/gpt-a", LimitKind.TOKENS, 0, NOW + 25_000),),
    )
    assert _why(_run(room))["openai/gpt-a"] == (R.TOKEN_BUDGET, NOW + 25_000)
