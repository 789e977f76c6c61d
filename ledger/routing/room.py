"""Token room at selection (R-TOK-4, R-SEL-7): which models a request's token estimate does not fit.

Pure: the token windows of `tokenBudgets`' targets (a provider, a model key, a glob) with their use,
and what is left of the providers' learned limits, as the store read them (`TokenRoom`), in; per
catalog model that has no room, the reason (`token_budget`, `provider_tokens_exhausted`) and when it
will (None: waiting alone does not tell), out. Selection leaves those models out like cooling ones,
so a backup with room is preferred; a reservation checks the same again in its write transaction.

A scope's token windows are not here: they count every model of the request alike, so they never
make one route better than another.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ledger.budgets.learned import MEASURES
from ledger.budgets.unit import Budget, Dimension, Measure, Request, Use, frees_at, matches
from ledger.catalog import Catalog, Model
from ledger.kinds import ExclusionReason
from ledger.learned import LimitKind


@dataclass(frozen=True)
class LearnedRoom:
    """What is left of one kind of a model's learned limit (the reading minus the estimates
    granted since), until `reset_ms`."""

    model: str  # the model key: provider/upstream model id
    kind: LimitKind
    left: int
    reset_ms: int


@dataclass(frozen=True)
class TokenRoom:
    """The token windows of `tokenBudgets`' targets that could refuse some model (their use,
    with when its parts leave) and every live learned limit, read in one read transaction."""

    windows: tuple[tuple[Budget, Use], ...] = ()
    learned: tuple[LearnedRoom, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.windows or self.learned)


NOTHING_READ = TokenRoom()
"""No token window or learned limit read (selection then leaves no model out for tokens)."""

Exclusions = dict[str, "Refused"]
"""Model key -> the first token reason that leaves it out and when it has room (None: unknown)."""


def amounts(model: Model, input_tokens: int, reply_tokens: int) -> Mapping[Measure, int]:
    """What a reservation on `model` takes of each token measure (R-TOK-2)."""
    output = model.reply_reservation(reply_tokens)
    return {
        Measure.TOKENS: input_tokens + output,
        Measure.INPUT_TOKENS: input_tokens,
        Measure.OUTPUT_TOKENS: output,
    }


def exclusions(
    room: TokenRoom, catalog: Catalog, now_ms: int, input_tokens: int, reply_tokens: int
) -> Exclusions:
    """The catalog models the request's token estimate does not fit: a window of a target the
    model falls under (`token_budget`) first, then a learned limit (`provider_tokens_exhausted`);
    ready when every one that refuses it has room (None when one never will or cannot tell)."""
    found: dict[str, list[Refused]] = {}
    for budget, use in room.windows:
        for model in _under(budget, catalog):
            amount = amounts(model, input_tokens, reply_tokens)[budget.measure]
            if use.used + amount > budget.limit:
                at = frees_at(now_ms, budget, use, amount)
                found.setdefault(model.key, []).append((ExclusionReason.TOKEN_BUDGET, at))
    for learned in room.learned:
        found_model = catalog.model(learned.model)
        if found_model is None:
            continue
        amount = amounts(found_model, input_tokens, reply_tokens)[MEASURES[learned.kind]]
        if amount > learned.left:
            reason = ExclusionReason.PROVIDER_TOKENS_EXHAUSTED
            found.setdefault(learned.model, []).append((reason, learned.reset_ms))
    return {key: _first(refusals) for key, refusals in found.items()}


def _under(budget: Budget, catalog: Catalog) -> Iterable[Model]:
    """The catalog models a target's window counts (a model key's: that one model)."""
    if budget.applies_to.dimension is Dimension.MODEL:
        one = catalog.model(budget.applies_to.name or "")
        return () if one is None else (one,)
    return (m for m in catalog.models
            if matches(budget.applies_to, Request(0, "", m.provider, m.key)))  # fmt: skip


Refused = tuple[ExclusionReason, int | None]


def _first(refusals: list[Refused]) -> Refused:
    reason = min((r for r, _ in refusals), key=_ORDER.index)
    times = [at for _, at in refusals]
    return reason, None if None in times else max(t for t in times if t is not None)


_ORDER = (ExclusionReason.TOKEN_BUDGET, ExclusionReason.PROVIDER_TOKENS_EXHAUSTED)
