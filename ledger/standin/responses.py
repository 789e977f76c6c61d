"""The stand-in's OpenAI Responses API (`POST /v1/responses`, base URL
`http://127.0.0.1:PORT/v1`): a response object, or its typed event stream, in the shapes the
official SDKs and the Codex CLI parse (R-FMT-5), with the same scripted replies and faults as
the chat path (`ledger.standin.server.Scripted`).

A stand-in reply is a message with the scripted text, or a function call (`tool_call`); its stop
reason `length` makes it `incomplete` (max_output_tokens), `content_filter` incomplete
(content_filter); usage as the API counts it (`input_tokens` includes the cached ones).
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

StreamEvent = tuple[str, bytes]

PATH = "/v1/responses"
CHAT_ONLY = frozenset({"messages", "max_tokens", "max_completion_tokens", "stream_options"})


def new_id() -> str:
    """A response id of the API's shape."""
    return f"resp_standin{secrets.token_hex(12)}"


def request_problem(body: object) -> tuple[int, str | None] | None:
    """The real API's rejection of a body (status, code), or None."""
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        return 400, "invalid_request_error"
    given = body.get("input")
    if not (isinstance(given, str) or (isinstance(given, list) and all(
        isinstance(item, dict) for item in given
    ))):  # fmt: skip
        return 400, "invalid_request_error"
    if CHAT_ONLY & set(body):
        return 400, "unknown_parameter"
    count = body.get("max_output_tokens")
    if count is not None and not (isinstance(count, int) and count >= 1):
        return 400, "invalid_request_error"
    return None


def _usage(input_tokens: int, output_tokens: int, cache: tuple[int, int]) -> dict[str, Any]:
    written, read = cache
    total = input_tokens + written + read
    details: dict[str, int] = {"cached_tokens": read}
    if written:
        details["cache_write_tokens"] = written
    return {"input_tokens": total, "input_tokens_details": details,
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": total + output_tokens}  # fmt: skip


def _status(stop_reason: str | None) -> tuple[str, dict[str, str] | None]:
    if stop_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if stop_reason == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def _items(text: str, tool_call: tuple[str, str] | None) -> list[dict[str, Any]]:
    if tool_call is not None:
        name, arguments = tool_call
        return [{"id": "fc_standin", "type": "function_call", "call_id": "call_standin",
                 "name": name, "arguments": arguments, "status": "completed"}]  # fmt: skip
    return [{"id": "msg_standin", "type": "message", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": text, "annotations": []}]}]  # fmt: skip


def response(
    model: str, response_id: str, output: list[dict[str, Any]], status: str,
    incomplete: dict[str, str] | None, usage: dict[str, Any] | None,
) -> dict[str, Any]:  # fmt: skip
    return {"id": response_id, "object": "response", "created_at": int(time.time()),
            "status": status, "error": None, "incomplete_details": incomplete,
            "instructions": None, "model": model, "output": output,
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "usage": usage}  # fmt: skip


def success(
    model: str, response_id: str, text: str, stop_reason: str | None, input_tokens: int,
    output_tokens: int, *, cache: tuple[int, int] = (0, 0),
    tool_call: tuple[str, str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """A whole response object."""
    status, incomplete = _status(stop_reason)
    return response(model, response_id, _items(text, tool_call), status, incomplete,
                    _usage(input_tokens, output_tokens, cache))  # fmt: skip


def stream(
    model: str, response_id: str, text: str, stop_reason: str | None, input_tokens: int,
    output_tokens: int, pieces: int = 3, *, cache: tuple[int, int] = (0, 0),
    tool_call: tuple[str, str] | None = None,
) -> list[StreamEvent]:  # fmt: skip
    """The typed event stream: created, in_progress, the item added, its deltas (`content`),
    its done events, then `response.completed` (`finish`: the finish reason, the usage and the
    terminator in one event)."""
    seq = iter(range(10_000))

    def event(kind: str, **data: Any) -> bytes:
        body = {"type": kind, "sequence_number": next(seq), **data}
        return f"event: {kind}\ndata: {json.dumps(body)}\n\n".encode()

    started = response(model, response_id, [], "in_progress", None, None)
    out: list[StreamEvent] = [
        ("preamble", event("response.created", response=started)),
        ("preamble", event("response.in_progress", response=started)),
    ]
    item = _items(text, tool_call)[0]
    if tool_call is not None:
        out.append(("preamble", event("response.output_item.added", output_index=0,
                                      item={**item, "arguments": "", "status": "in_progress"})))
        out += [("content", event("response.function_call_arguments.delta", item_id=item["id"],
                                  output_index=0, delta=p))
                for p in _pieces(tool_call[1], pieces)]  # fmt: skip
        out.append(("preamble", event("response.function_call_arguments.done",
                                      item_id=item["id"], output_index=0,
                                      arguments=tool_call[1])))  # fmt: skip
    else:
        out.append(("preamble", event("response.output_item.added", output_index=0,
                                      item={**item, "status": "in_progress", "content": []})))
        part = {"type": "output_text", "text": "", "annotations": []}
        out.append(("preamble", event("response.content_part.added", item_id=item["id"],
                                      output_index=0, content_index=0, part=part)))
        out += [("content", event("response.output_text.delta", item_id=item["id"],
                                  output_index=0, content_index=0, delta=p, logprobs=[]))
                for p in _pieces(text, pieces)]  # fmt: skip
        out.append(("preamble", event("response.output_text.done", item_id=item["id"],
                                      output_index=0, content_index=0, text=text,
                                      logprobs=[])))  # fmt: skip
        out.append(("preamble", event("response.content_part.done", item_id=item["id"],
                                      output_index=0, content_index=0,
                                      part={**part, "text": text})))  # fmt: skip
    out.append(("preamble", event("response.output_item.done", output_index=0, item=item)))
    status, incomplete = _status(stop_reason)
    done = response(model, response_id, [item], status, incomplete,
                    _usage(input_tokens, output_tokens, cache))  # fmt: skip
    kind = "response.completed" if status == "completed" else "response.incomplete"
    out.append(("finish", event(kind, response=done)))
    return out


def error_event() -> bytes:
    """The `error` event a provider sends mid-stream."""
    data = {"type": "error", "code": "server_error", "message": "scripted error",
            "param": None, "sequence_number": 0}  # fmt: skip
    return b"event: error\ndata: " + json.dumps(data).encode() + b"\n\n"


def _pieces(text: str, pieces: int) -> list[str]:
    if not text:
        return [""]
    size = max(1, -(-len(text) // max(1, pieces)))
    return [text[i : i + size] for i in range(0, len(text), size)]
