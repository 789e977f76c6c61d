"""The stand-in's embeddings and token-counting paths (R-FMT-5): `POST /v1/embeddings` (OpenAI
base URL `http://127.0.0.1:PORT/v1`) and `POST /v1/messages/count_tokens` (Anthropic's), as
strict as the real APIs about what they accept, with bodies the official SDKs parse.

Embeddings: one vector per input (`dimensions` long, 8 by default; base64 float32 when
`encoding_format` is `base64`, as the OpenAI SDK asks by default), `usage.prompt_tokens` the
scripted reply's `input_tokens`; a scripted error status is answered in OpenAI's error shape.
count_tokens: `input_tokens` is the body's JSON size // 4 (at least 1), a fixed function of the
request so a test can check it was not made up. Pure functions, no I/O.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Mapping
from typing import Any

from ledger.standin.formats import error_json

EMBEDDINGS_PATH = "/v1/embeddings"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
PATHS = frozenset({EMBEDDINGS_PATH, COUNT_TOKENS_PATH})
EMBEDDING_FIELDS = frozenset({"model", "input", "encoding_format", "dimensions", "user"})
COUNT_FIELDS = frozenset(
    {"model", "messages", "system", "tools", "tool_choice", "thinking", "mcp_servers",
     "context_management", "output_config"}
)  # fmt: skip
DEFAULT_DIMENSIONS = 8


def count_of(body: Mapping[str, Any]) -> int:
    """The stand-in's token count of a count_tokens body (its compact JSON size // 4)."""
    return max(1, len(json.dumps(body, separators=(",", ":"))) // 4)


def _inputs(value: object) -> list[object] | None:
    if isinstance(value, str) and value:
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(v, int) for v in value):
            return [value]
        if all(isinstance(v, str | list) and v for v in value):
            return list(value)
    return None


def _vector(n: int, dimensions: int, encoding: str) -> list[float] | str:
    values = [round((n + 1) / (d + 2), 6) for d in range(dimensions)]
    if encoding == "base64":
        return base64.b64encode(struct.pack(f"<{dimensions}f", *values)).decode()
    return values


def embeddings(body: object, status: int, input_tokens: int) -> tuple[int, dict[str, Any]]:
    """The answer to an embeddings body, given the scripted status and input tokens."""
    if not isinstance(body, dict) or not set(body) <= EMBEDDING_FIELDS:
        return 400, error_json(False, 400, None, message="rejected request")
    model, inputs = body.get("model"), _inputs(body.get("input"))
    dimensions = body.get("dimensions", DEFAULT_DIMENSIONS)
    encoding = body.get("encoding_format", "float")
    if (
        not isinstance(model, str)
        or not model
        or inputs is None
        or not isinstance(dimensions, int)
        or not 1 <= dimensions <= 4096
        or encoding not in ("float", "base64")
    ):
        return 400, error_json(False, 400, None, message="rejected request")
    if status >= 300:
        return status, error_json(False, status, None)
    data = [
        {"object": "embedding", "index": n, "embedding": _vector(n, dimensions, encoding)}
        for n in range(len(inputs))
    ]
    usage = {"prompt_tokens": input_tokens, "total_tokens": input_tokens}
    return 200, {"object": "list", "data": data, "model": model, "usage": usage}


def count_tokens(
    headers: Mapping[str, str], body: object, status: int
) -> tuple[int, dict[str, Any]]:
    """The answer to a count_tokens body (Anthropic's key and version headers required)."""
    if not headers.get("x-api-key") and not headers.get("authorization"):
        return 401, error_json(True, 401, None, message="rejected request")
    if not headers.get("anthropic-version"):
        return 400, error_json(True, 400, None, message="rejected request")
    if (
        not isinstance(body, dict)
        or not set(body) <= COUNT_FIELDS
        or not isinstance(body.get("model"), str)
        or not isinstance(body.get("messages"), list)
    ):
        return 400, error_json(True, 400, None, message="rejected request")
    if status >= 300:
        return status, error_json(True, status, None)
    return 200, {"input_tokens": count_of(body)}


def answer(
    path: str, headers: Mapping[str, str], body: object, status: int, input_tokens: int
) -> tuple[int, dict[str, Any]]:
    """The status and body for one of PATHS."""
    if path == EMBEDDINGS_PATH:
        return embeddings(body, status, input_tokens)
    return count_tokens(headers, body, status)
