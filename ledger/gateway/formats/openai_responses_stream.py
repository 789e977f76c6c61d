"""The Responses API's stream (R-FMT-2): its typed events read into the gateway's tracker and
internal events, and internal events written as them.

A stream is `response.created`, `response.in_progress`, then per output item
`response.output_item.added` … its deltas (`response.output_text.delta`,
`response.function_call_arguments.delta`) … `response.output_item.done`, and last
`response.completed` (or `response.incomplete`) carrying the whole response and its usage; a
failure is `error` or `response.failed`. There is no `[DONE]`: the last event is the terminator.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ledger.gateway.formats import internal as i
from ledger.gateway.sse import Event, Malformed, Tracker
from ledger.providers import openai_responses as provider

ENDS = frozenset({"response.completed", "response.incomplete"})
FAILS = frozenset({"error", "response.failed"})
FROM_STOP: Mapping[str, i.Stop] = {
    "length": i.LENGTH, "tool_calls": i.TOOL, "refusal": i.REFUSAL, "content_filter": i.REFUSAL,
}  # fmt: skip


RESPONSE_STATUS: Mapping[i.Stop, tuple[str, str | None]] = {
    i.END: ("completed", None),
    i.TOOL: ("completed", None),
    i.REFUSAL: ("completed", None),
    i.LENGTH: ("incomplete", "max_output_tokens"),
}

def response_usage(usage: i.Usage) -> dict[str, Any]:
    """The response's usage: `input_tokens` includes the cached ones."""
    total = usage.input + usage.cache_write + usage.cache_read
    details: dict[str, int] = {"cached_tokens": usage.cache_read}
    if usage.cache_write:
        details["cache_write_tokens"] = usage.cache_write
    return {
        "input_tokens": total,
        "input_tokens_details": details,
        "output_tokens": usage.output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": total + usage.output,
    }


# --------------------------------------------------------------------------- documents


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip


def call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str = "completed"
) -> dict[str, Any]:
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}  # fmt: skip


def response_object(
    response_id: str,
    model: str,
    output: list[dict[str, Any]],
    stop: i.Stop | None,
    usage: i.Usage | None,
) -> dict[str, Any]:
    """A response object (`stop` None: in progress, no usage yet)."""
    status, reason = RESPONSE_STATUS[stop] if stop is not None else ("in_progress", None)
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "error": None,
        "incomplete_details": None if reason is None else {"reason": reason},
        "instructions": None,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "store": False,
        "usage": None if usage is None else response_usage(usage),
    }


def _type(event: Event) -> str:
    data = event.data
    kind = data.get("type") if isinstance(data, dict) else None
    return kind if isinstance(kind, str) else (event.name or "")


def observe(tracker: Tracker, event: Event) -> None:
    """One event of a Responses route's stream into the tracker: content is any delta or a
    finished output item (a reasoning model's first output, which must not wait behind
    firstTokenMs); the finish reason and usage come with the last event, its terminator."""
    if event.done:  # a `[DONE]` some compatible servers add
        tracker.terminated = True
        return
    kind = _type(event)
    if kind in FAILS or (not kind and "error" in event.data):
        tracker.error = True
        return
    if not kind:
        raise Malformed
    if kind.endswith(".delta") or kind == "response.output_item.done":
        tracker.content = True
    if kind == "response.created" and tracker.answer_id is None:
        response = event.data.get("response")
        answer_id = response.get("id") if isinstance(response, dict) else None
        tracker.answer_id = answer_id if isinstance(answer_id, str) else None
    if kind in ENDS:
        response = event.data.get("response")
        if not isinstance(response, dict):
            raise Malformed
        tracker.finish = provider.stop_of(response) or "stop"
        tracker.content = tracker.terminated = True
        if isinstance(response.get("usage"), dict):  # read as a whole answer's is (R-GW-5c)
            counts = provider.usage_counts(response["usage"])
            tracker.input_tokens, tracker.output_tokens = counts.input_tokens, counts.output_tokens
            tracker.cache_write_tokens = counts.cache_write_tokens
            tracker.cache_read_tokens = counts.cache_read_tokens


@dataclass
class Reader:
    """A Responses route's events as internal events."""

    started: bool = False

    def read(self, event: Event) -> list[i.StreamEvent]:
        if event.done:
            return [i.End()]
        out: list[i.StreamEvent] = []
        if not self.started:
            self.started = True
            out.append(i.Start())
        data = event.data or {}
        kind = _type(event)
        if kind in ("response.output_text.delta", "response.refusal.delta"):
            out.append(i.TextDelta(str(data.get("delta") or "")))
        elif kind == "response.output_item.added":
            item = data.get("item") or {}
            if item.get("type") == "function_call":
                key = data.get("output_index", 0)
                out.append(i.ToolStart(key, item.get("call_id"), item.get("name")))
                if item.get("arguments"):
                    out.append(i.ToolArgs(key, item["arguments"]))
        elif kind == "response.function_call_arguments.delta":
            out.append(i.ToolArgs(data.get("output_index", 0), str(data.get("delta") or "")))
        elif kind in ENDS:
            response = data.get("response") or {}
            counts = provider.usage_counts(response.get("usage"))
            usage = i.Usage(counts.input_tokens or 0, counts.cache_write_tokens or 0,
                            counts.cache_read_tokens or 0, counts.output_tokens or 0)  # fmt: skip
            stop = FROM_STOP.get(provider.stop_of(response) or "", i.END)
            out += [i.Stopped(stop), i.UsageSeen(usage), i.End()]
        return out


@dataclass
class _Item:
    index: int
    item_id: str
    kind: str  # message | function_call
    call_id: str = ""
    name: str = ""
    text: list[str] = field(default_factory=list)
    open: bool = True


@dataclass
class Writer:
    """Internal events as the Responses stream's typed events."""

    model: str
    response_id: str
    seq: int = 0
    items: list[_Item] = field(default_factory=list)
    calls: dict[Any, _Item] = field(default_factory=dict)
    stop: i.Stop = i.END
    usage: i.Usage | None = None
    done: bool = False

    def _event(self, kind: str, **data: Any) -> bytes:
        body = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(body, separators=(',', ':'))}\n\n".encode()

    def _response(self, stop: i.Stop | None) -> dict[str, Any]:
        output = [self._document(item) for item in self.items]
        return response_object(self.response_id, self.model, output, stop,
                               None if stop is None else self.usage or i.Usage())  # fmt: skip

    def _document(self, item: _Item) -> dict[str, Any]:
        status = "in_progress" if item.open else "completed"
        text = "".join(item.text)
        if item.kind == "message":
            return {"id": item.item_id, "type": "message", "role": "assistant", "status": status,
                    "content": [{"type": "output_text", "text": text, "annotations": []}]
                    if not item.open else []}  # fmt: skip
        return {"id": item.item_id, "type": "function_call", "call_id": item.call_id,
                "name": item.name, "arguments": text if not item.open else "",
                "status": status}  # fmt: skip

    def _open_message(self) -> list[bytes]:
        last = self.items[-1] if self.items else None
        if last is not None and last.kind == "message" and last.open:
            return []
        item = _Item(len(self.items), _id("msg"), "message")
        self.items.append(item)
        part = {"type": "output_text", "text": "", "annotations": []}
        return [
            self._event("response.output_item.added", output_index=item.index,
                        item=self._document(item)),
            self._event("response.content_part.added", item_id=item.item_id,
                        output_index=item.index, content_index=0, part=part),
        ]  # fmt: skip

    def _close(self, item: _Item) -> list[bytes]:
        if not item.open:
            return []
        item.open = False
        text = "".join(item.text)
        out: list[bytes] = []
        if item.kind == "message":
            out.append(self._event("response.output_text.done", item_id=item.item_id,
                                   output_index=item.index, content_index=0, text=text,
                                   logprobs=[]))  # fmt: skip
            part = {"type": "output_text", "text": text, "annotations": []}
            out.append(self._event("response.content_part.done", item_id=item.item_id,
                                   output_index=item.index, content_index=0, part=part))
        else:
            out.append(self._event("response.function_call_arguments.done", item_id=item.item_id,
                                   output_index=item.index, arguments=text))  # fmt: skip
        out.append(self._event("response.output_item.done", output_index=item.index,
                               item=self._document(item)))  # fmt: skip
        return out

    def write(self, event: i.StreamEvent) -> list[bytes]:
        if isinstance(event, i.TextDelta):
            out = self._open_message()
            item = self.items[-1]
            item.text.append(event.text)
            return [*out, self._event("response.output_text.delta", item_id=item.item_id,
                                      output_index=item.index, content_index=0,
                                      delta=event.text, logprobs=[])]  # fmt: skip
        if isinstance(event, i.ToolArgs):
            call = self.calls.get(event.key)
            if call is None:
                return []
            call.text.append(event.text)
            return [self._event("response.function_call_arguments.delta", item_id=call.item_id,
                                output_index=call.index, delta=event.text)]  # fmt: skip
        if isinstance(event, i.Start):
            response = self._response(None)
            return [self._event("response.created", response=response),
                    self._event("response.in_progress", response=response)]  # fmt: skip
        if isinstance(event, i.ToolStart):
            out = [data for item in self.items if item.kind == "message"
                   for data in self._close(item)]  # fmt: skip
            call = _Item(len(self.items), _id("fc"), "function_call",
                         event.id or _id("call"), event.name or "")  # fmt: skip
            self.items.append(call)
            self.calls[event.key] = call
            return [*out, self._event("response.output_item.added", output_index=call.index,
                                      item=self._document(call))]  # fmt: skip
        if isinstance(event, i.Stopped):
            self.stop = event.reason
            return [data for item in self.items for data in self._close(item)]
        if isinstance(event, i.UsageSeen):
            self.usage = event.usage
            return []
        return self.finish()  # End

    def finish(self) -> list[bytes]:
        if self.done:
            return []
        self.done = True
        out = [data for item in self.items for data in self._close(item)]
        kind = "response.incomplete" if self.stop == i.LENGTH else "response.completed"
        return [*out, self._event(kind, response=self._response(self.stop))]


def _id(prefix: str) -> str:
    return f"{prefix}_ledger{secrets.token_hex(12)}"

