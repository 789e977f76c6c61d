"""A third wire format that lives in the tests only (R-FMT-1, issue 43): `POST /toy/v1/complete`
`{"model", "prompt", "max_tokens"?}` -> `{"text", "usage": {"input", "output"}, "model"}`, errors
`{"error": code, "message": text}`. Nothing in `ledger/` names it: registering it (`TOY`) is all
the gateway needs to serve it, through the internal form, on any provider format's route."""

from __future__ import annotations

from typing import Any

from ledger.gateway.formats import internal as i
from ledger.gateway.formats.base import WireFormat

KEYS = frozenset({"model", "prompt", "max_tokens"})


class ToyComplete(WireFormat):
    name = "toy-complete"
    prefix = "/toy/"
    path = "/toy/v1/complete"

    def check(self, body: object) -> str | None:
        if not isinstance(body, dict):
            return "the body must be a JSON object"
        if not isinstance(body.get("model"), str) or not body["model"]:
            return "`model` must be a non-empty string"
        if not isinstance(body.get("prompt"), str):
            return "`prompt` must be a string"
        if not set(body) <= KEYS:
            return "only `model`, `prompt` and `max_tokens`"
        limit = body.get("max_tokens")
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)):
            return "`max_tokens` must be an integer"
        return None

    def outside(self, body: dict[str, Any]) -> str | None:
        return None  # all of it has an internal form

    def error_document(self, status: int, code: str, message: str) -> dict[str, Any]:
        return {"error": code, "message": message}

    def to_internal(self, body: dict[str, Any]) -> i.Request:
        prompt = i.Message("user", (i.Text(body["prompt"]),))
        return i.Request(body["model"], (prompt,), max_tokens=body.get("max_tokens"))

    def from_internal(self, request: i.Request) -> dict[str, Any]:
        texts = [p.text for m in request.messages for p in m.parts if isinstance(p, i.Text)]
        return {"model": request.model, "prompt": "\n".join(texts)}

    def answer_to_internal(self, document: dict[str, Any]) -> i.Answer:
        usage = document["usage"]
        counts = i.Usage(input=usage["input"], output=usage["output"])
        return i.Answer("toy", document["model"], (i.Text(document["text"]),), i.END, counts)

    def answer_from_internal(self, answer: i.Answer) -> dict[str, Any]:
        usage = answer.usage
        text = "".join(p.text for p in answer.parts if isinstance(p, i.Text))
        prompt = usage.input + usage.cache_write + usage.cache_read
        return {"text": text, "usage": {"input": prompt, "output": usage.output}}


TOY = ToyComplete()
