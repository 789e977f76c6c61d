"""The one internal request and answer form every wire format translates to and from (R-FMT-1):
a request from one format reaches a route of another as source -> internal -> target, never by a
translator written for the pair. It holds the common subset (R-GW-3): system, user and assistant
text; tool definitions, calls and results; stop reasons; usage; stream events. A format says
which parts of its bodies are outside it (`WireFormat.outside`), so nothing is dropped silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal

# stop reasons: the turn ended, hit its token limit, called tools, or was refused
END: Final = "end"
LENGTH: Final = "length"
TOOL: Final = "tool"
REFUSAL: Final = "refusal"
Stop = Literal["end", "length", "tool", "refusal"]


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    input: dict[str, Any]


@dataclass(frozen=True)
class ToolResult:
    id: str  # the call's
    text: str


Part = Text | ToolCall | ToolResult


@dataclass(frozen=True)
class Message:
    """One turn: `user` (text, tool results) or `assistant` (text, tool calls)."""

    role: Literal["user", "assistant"]
    parts: tuple[Part, ...]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    schema: dict[str, Any]


@dataclass(frozen=True)
class ToolChoice:
    kind: Literal["auto", "required", "none", "tool"]
    name: str | None = None  # kind `tool`: the one to call


@dataclass(frozen=True)
class Request:
    """A chat request inside the common subset."""

    model: str
    messages: tuple[Message, ...]
    system: str | None = None
    max_tokens: int | None = None
    # sampling and `stream`, as the caller gave them (a key given as null stays given)
    params: dict[str, Any] = field(default_factory=dict)
    stop: list[str] | None = None
    tools: tuple[Tool, ...] | None = None
    tool_choice: ToolChoice | None = None
    one_call: bool = False  # at most one tool call in the turn (parallel calls off)
    effort: str | None = None  # reasoning effort the caller asked for: low, medium, high


@dataclass(frozen=True)
class Usage:
    """Token counts: `input` leaves out the cached prompt tokens (written, read)."""

    input: int = 0
    cache_write: int = 0
    cache_read: int = 0
    output: int = 0


@dataclass(frozen=True)
class Answer:
    """A whole answer."""

    id: str
    model: str
    parts: tuple[Text | ToolCall, ...]
    stop: Stop
    usage: Usage


# --------------------------------------------------------------------------- stream events


@dataclass(frozen=True)
class Start:
    """The answer began."""


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ToolStart:
    key: Any  # the source's own index of the call
    id: str | None
    name: str | None


@dataclass(frozen=True)
class ToolArgs:
    key: Any
    text: str  # a piece of the arguments' JSON


@dataclass(frozen=True)
class Stopped:
    reason: Stop


@dataclass(frozen=True)
class UsageSeen:
    usage: Usage


@dataclass(frozen=True)
class End:
    """The stream's own end (its terminator)."""


StreamEvent = Start | TextDelta | ToolStart | ToolArgs | Stopped | UsageSeen | End
