"""Each configured token window's use for status (R-TOK-5) and selection (R-TOK-4): the store's
reads of them.

Every token budget of the policy (`tokenBudgets` targets and scopes' token keys, R-TOK-1) is read
with the reserve's own usage read (`usage.plan`: the same columns a reserve checks, so status shows
exactly what the next reserve counts) plus when its first part leaves (`usage.first_leaving`).
Selection reads the windows of `tokenBudgets`' targets the same way, the rows of those that may
have no room for the request (`usage.leaving`), and the live learned limits (`learned.live`).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection

from ledger.budgets.unit import (
    GLOBAL,
    Budget,
    Dimension,
    Measure,
    Stage,
    UsageKey,
    Use,
    Window,
    budgets_of,
    token_budgets,
)
from ledger.config import Policy, TokenLimits
from ledger.learned import LimitKind
from ledger.routing.room import NOTHING_READ, LearnedRoom, TokenRoom
from ledger.store import learned, usage
from ledger.store.engine import Database

TOKEN_MEASURES = (Measure.TOKENS, Measure.INPUT_TOKENS, Measure.OUTPUT_TOKENS)


def _window_names() -> dict[tuple[Window, Measure], str]:
    """(window, measure) -> the policy key that sets it (`tokensPerMinute`, ...)."""
    names = {}
    for attr, spec in TokenLimits.model_fields.items():
        (budget,) = token_budgets(GLOBAL, TokenLimits(**{attr: 1}), Stage.TOKENS)
        names[(budget.window, budget.measure)] = str(spec.alias)
    return names


WINDOW_NAMES = _window_names()


@dataclass(frozen=True)
class TokenWindowUse:
    """One token window: what it applies to, its policy key, limit, use now and when its first
    part leaves (None: it holds nothing)."""

    kind: str  # provider, model, glob or scope
    name: str
    window: str  # tokensPerMinute, inputTokensPerMinute, outputTokensPerMinute, tokensPerDay
    limit: int
    used: int
    frees_at_ms: int | None


def _key(budget: Budget) -> UsageKey:
    to = budget.applies_to
    return (budget.window, budget.measure, to.dimension, to.name or "")


def token_uses(conn: Connection, now: int, policy: Policy) -> list[TokenWindowUse]:
    """Every token window the policy sets, targets first then scopes, each in name order."""
    found = [b for b in budgets_of(policy) if b.measure in TOKEN_MEASURES]
    found.sort(key=lambda b: (b.applies_to.dimension is Dimension.SCOPE, b.applies_to.name or ""))
    keys = [_key(b) for b in found]
    read = usage.plan(now, keys, conn.dialect.name)
    if read is None:
        return []
    used = usage.uses(keys, tuple(conn.execute(*read).one()))
    return [
        TokenWindowUse(
            b.applies_to.dimension.value,
            b.applies_to.name or "",
            WINDOW_NAMES[(b.window, b.measure)],
            b.limit,
            used[k].used,
            usage.first_leaving(conn, now, k) if used[k].used > 0 else None,
        )
        for b, k in zip(found, keys, strict=True)
    ]


def read_token_uses(db: Database, policy: Policy) -> list[TokenWindowUse]:
    """`token_uses` now, in a read transaction of its own (the worker's claiming round)."""
    with db.read() as conn:
        return token_uses(conn, db.read_now(conn), policy)


def token_room(conn: Connection, now: int, policy: Policy, input_tokens: int) -> TokenRoom:
    """What selection needs to leave out the models a request of `input_tokens` has no token
    room on (R-TOK-4, R-SEL-7): each window of a `tokenBudgets` target that the largest estimate
    (the input and the whole reply allowance) does not fit, with when its parts leave, and every
    live learned limit (under `learnLimits`). Nothing is read when neither is set."""
    targets = [b for b in budgets_of(policy)
               if b.stage is Stage.TOKENS and b.measure in TOKEN_MEASURES]  # fmt: skip
    windows = []
    read = usage.plan(now, [_key(b) for b in targets], conn.dialect.name) if targets else None
    if read is not None:
        values = tuple(conn.execute(*read).one())
        most = {Measure.TOKENS: input_tokens + policy.reply_tokens,
                Measure.INPUT_TOKENS: input_tokens, Measure.OUTPUT_TOKENS: policy.reply_tokens}
        for budget, value in zip(targets, values, strict=True):
            amount = most[budget.measure]
            if int(value) + amount > budget.limit:  # some model's estimate may not fit
                found = usage.leaving(conn, now, budget, _key(budget), Use(int(value)), amount)
                windows.append((budget, found))
    live = learned.live(conn, now) if policy.learn_limits else ()
    rooms = tuple(LearnedRoom(x.model_key, LimitKind(x.kind), x.left, x.reset_ms) for x in live)
    if not windows and not rooms:
        return NOTHING_READ
    return TokenRoom(tuple(windows), rooms)
