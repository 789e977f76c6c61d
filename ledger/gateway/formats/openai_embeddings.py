"""OpenAI embeddings as a wire format (R-FMT-3): `POST /openai/v1/embeddings`, served only by
catalog models of `"kind": "embedding"` whose provider speaks the OpenAI API (`openai-chat`).

An embeddings request is reserved like any call: its estimate is R-RES-2's input bound at the
model's input price (an embedding model has no reply allowance, `Model.reply_reservation`), a
batch of inputs is one reservation, and the reply's `usage.prompt_tokens` settles it. It has no
internal (chat) form: it is never translated, so it never lands on a chat route, and a chat
request never lands on an embedding route (`kind`, `formats.translate.serves`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ledger.catalog import Model
from ledger.gateway.formats import internal as i
from ledger.gateway.formats.base import Limits, RouteParts, WireFormat
from ledger.gateway.formats.common import is_str
from ledger.gateway.formats.openai_chat import FORMAT as OPENAI_CHAT
from ledger.providers.base import HttpAdapter, ProviderResponse, token_count
from ledger.providers.bounded import JsonReply
from ledger.targets import Effort

MAX_INPUTS = 2048  # OpenAI's own bound on a batch
BAD_BODY = "the body must be a JSON object with a non-empty string `model`"
BAD_INPUT = (
    "`input` must be a non-empty string, a list of 1-2048 strings, or token arrays"
    " (a list of integers, or a list of such lists)"
)
NOT_CHAT = "an embeddings request (it has no chat form)"


def _tokens(value: object) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)
    )


def input_problem(value: object) -> bool:
    """The `input` is not one the API takes."""
    if isinstance(value, str):
        return not value
    if not isinstance(value, list) or not value or len(value) > MAX_INPUTS:
        return True
    if all(is_str(v) and v for v in value):
        return False
    return not (_tokens(value) or all(_tokens(v) for v in value))


class OpenAIEmbeddings(WireFormat):
    name = "openai-embeddings"
    kind = "embedding"
    prefix = "/openai/v1/embeddings"
    path = "/openai/v1/embeddings"

    # ----------------------------------------------------------------- the caller's side

    def check(self, body: object) -> str | None:
        if not isinstance(body, dict):
            return BAD_BODY
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return BAD_BODY
        if input_problem(body.get("input")):
            return BAD_INPUT
        return None

    def streams(self, body: Mapping[str, Any]) -> bool:
        return False

    def outside(self, body: dict[str, Any]) -> str | None:
        return NOT_CHAT

    def error_document(self, status: int, code: str, message: str) -> dict[str, Any]:
        return OPENAI_CHAT.error_document(status, code, message)

    def fits_allowance(self, body: Mapping[str, Any], allowance: int) -> bool:
        return True  # nothing is generated: the estimate is the input's alone

    # ----------------------------------------------------------------- the internal form
    # never used: `outside` keeps every request on routes of this format

    def to_internal(self, body: dict[str, Any]) -> i.Request:
        raise NotImplementedError(NOT_CHAT)

    def from_internal(self, request: i.Request) -> dict[str, Any]:
        raise NotImplementedError(NOT_CHAT)

    def answer_to_internal(self, document: dict[str, Any]) -> i.Answer:
        raise NotImplementedError(NOT_CHAT)

    def answer_from_internal(self, answer: i.Answer) -> dict[str, Any]:
        raise NotImplementedError(NOT_CHAT)

    # ----------------------------------------------------------------- the provider's side

    def spoken_by(self, api: str) -> bool:
        return api == OPENAI_CHAT.name  # OpenAI-compatible providers serve /embeddings

    def upstream_route(self, adapter: HttpAdapter, model: Model, allowance: int) -> RouteParts:
        return RouteParts(f"{adapter.base_url()}/embeddings", {}, "")

    def credential_header(self, credential: str) -> tuple[str, str]:
        return OPENAI_CHAT.credential_header(credential)

    def upstream_body(self, body: Mapping[str, Any], limits: Limits) -> dict[str, Any]:
        """The caller's body with the route's model id; nothing else changes (R-GW-3)."""
        out = dict(body)
        out["model"] = limits.upstream_id
        return out

    def effort_fields(self, level: Effort, body: Mapping[str, Any]) -> Mapping[str, Any]:
        return {}  # an embedding model does not reason

    def parse_reply(self, reply: JsonReply) -> ProviderResponse:
        """`data` must be a list; `usage.prompt_tokens` is the input billed (none: the
        reservation's estimate, marked `usage_estimated`)."""
        data = reply.data
        if not isinstance(data, dict) or not isinstance(data.get("data"), list):
            return reply.invalid()
        usage = data.get("usage")
        prompt = token_count(usage.get("prompt_tokens")) if isinstance(usage, dict) else None
        return ProviderResponse(
            ok=True,
            status=reply.status,
            text="",
            stop_reason="stop",
            input_tokens=prompt,
            output_tokens=None if prompt is None else 0,
            elapsed_ms=reply.elapsed_ms(),
        )


FORMAT = OpenAIEmbeddings()
