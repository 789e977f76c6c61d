"""A wire format as one object (R-FMT-1): what the gateway does with a caller's body, answer and
stream in that format, and with a route's when a provider speaks it.

The gateway (endpoints, gate, request loop, streaming, translation) holds a `WireFormat` and calls
it; it never asks which one it holds. A format only callers speak (no catalog provider does)
implements the caller side and the internal form; the provider side then stays NotImplemented.

Invariant: an error body holds only fixed text and reason codes, never a value the caller or a
provider sent.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ledger.gateway.formats import internal
from ledger.gateway.formats.common import sse
from ledger.gateway.sse import Event

if TYPE_CHECKING:
    from ledger.catalog import Model
    from ledger.gateway.sse import Tracker
    from ledger.providers.base import HttpAdapter, ProviderResponse
    from ledger.providers.bounded import JsonReply
    from ledger.targets import Effort


@dataclass(frozen=True)
class Limits:
    """What the gateway sets in the upstream body."""

    upstream_id: str
    max_tokens: int
    max_tokens_field: str  # OpenAI: `max_tokens` or `max_completion_tokens`


@dataclass(frozen=True)
class RouteParts:
    """What a provider format adds to a route's request: its URL, the headers after the content
    type, and the name of its max-tokens field."""

    url: str
    headers: Mapping[str, str]
    max_tokens_field: str


class StreamReader(Protocol):
    """A provider's stream events as internal events (one reader per stream)."""

    def read(self, event: Event) -> list[internal.StreamEvent]: ...


class StreamWriter(Protocol):
    """Internal events as a caller's stream bytes (one writer per stream)."""

    def write(self, event: internal.StreamEvent) -> list[bytes]: ...

    def finish(self) -> list[bytes]:
        """The caller's end of stream when the upstream ended complete without its own."""
        ...


class WireFormat(ABC):
    """One wire format; `name` is the catalog `api` of the providers that speak it."""

    name: str
    prefix: str  # every gateway path of the format starts with it ("/openai/")
    path: str  # the POST route that serves a request
    models_path: str | None = None  # a GET route listing the models, if the format has one
    error_event: str | None = None  # the `event:` name of a stream's error event
    kind = "chat"  # the catalog model kind it serves (R-FMT-3: `chat` or `embedding`)
    beta_header: str | None = None  # the header naming opt-in API flags (`anthropic-beta`)

    def __repr__(self) -> str:
        return f"<wire format {self.name}>"

    # ----------------------------------------------------------------- the caller's side

    @abstractmethod
    def check(self, body: object) -> str | None:
        """Fixed text naming what is wrong with a caller's parsed body, or None; a body that
        passes is an object with a non-empty string `model`."""

    def streams(self, body: Mapping[str, Any]) -> bool:
        """The caller asked for a stream of server-sent events."""
        return body.get("stream") is True

    @abstractmethod
    def outside(self, body: dict[str, Any]) -> str | None:
        """The first part of a checked body outside the internal form, as fixed text naming
        the field (never a value), or None: the request translates whole (R-GW-3)."""

    def dropped(self, body: dict[str, Any]) -> tuple[str, ...]:
        """What of a body inside the internal form is dropped on its way to another format's
        route (hints only, each documented and reported in `x-ledger-dropped`, R-FMT-4)."""
        return ()

    @abstractmethod
    def error_document(self, status: int, code: str, message: str) -> dict[str, Any]:
        """The format's error shape with `code` and fixed text (R-GW-6)."""

    def stream_error_event(self, status: int, code: str, message: str) -> bytes:
        """The error event ending a stream after its first content event (R-GW-5)."""
        data = json.dumps(self.error_document(status, code, message), separators=(",", ":"))
        return sse(data, self.error_event)

    def wants_usage(self, body: Mapping[str, Any]) -> bool:
        """A streaming caller asked to see the usage."""
        return True

    def usage_only(self, data: object) -> bool:
        """A same-format stream event that only carries usage, held back from a caller that
        did not ask for it (`wants_usage`)."""
        return False

    def with_model(self, data: dict[str, Any], model_key: str) -> dict[str, Any]:
        """A same-format stream event as the caller sees it: the model is the model key."""
        return data

    def fits_allowance(self, body: Mapping[str, Any], allowance: int) -> bool:
        """A route with this reply allowance can serve the body within the reservation's
        estimate (else nothing is sent)."""
        return allowance >= 1

    def stores(self, body: Mapping[str, Any]) -> bool:
        """A native route keeps the answer for later requests (R-FMT-2): the ledger records
        which provider answered it (its id, `Tracker.answer_id` or the document's `id`)."""
        return False

    def previous(self, body: Mapping[str, Any]) -> str | None:
        """The id of a kept answer this request continues: it is pinned to the provider that
        answered that one (R-FMT-2), never sent to another."""
        return None

    def requested_effort(self, body: Mapping[str, Any]) -> str | None:
        """The caller's reasoning effort as a route effort level (R-RT-2), applied on another
        format's route when the route sets none (its own effort wins)."""
        return None

    def models_document(self, models: list[tuple[str, str, str]]) -> dict[str, Any]:
        """(model key, owner, kind) triples as the answer of `models_path`."""
        raise NotImplementedError(f"{self.name}: it lists no models")

    # ----------------------------------------------------------------- the internal form

    @abstractmethod
    def to_internal(self, body: dict[str, Any]) -> internal.Request:
        """A checked body with nothing `outside` as the internal request."""

    @abstractmethod
    def from_internal(self, request: internal.Request) -> dict[str, Any]:
        """The internal request as this format's body."""

    @abstractmethod
    def answer_to_internal(self, document: dict[str, Any]) -> internal.Answer:
        """A reply of this format as the internal answer (KeyError, TypeError and the like
        when it is not of the shape: the caller turns them into Malformed)."""

    @abstractmethod
    def answer_from_internal(self, answer: internal.Answer) -> dict[str, Any]:
        """The internal answer as this format's reply."""

    def stream_reader(self) -> StreamReader:
        """Reads a provider stream of this format as internal events."""
        raise NotImplementedError(f"{self.name}: no provider streams it")

    def stream_writer(self, model: str, usage: bool) -> StreamWriter:
        """Writes internal events as this format's stream (`usage`: the caller asked for it)."""
        raise NotImplementedError(f"{self.name}: it does not stream")

    # ----------------------------------------------------------------- the provider's side

    def spoken_by(self, api: str) -> bool:
        """A provider whose catalog `api` is this serves the format's requests (R-FMT-3: an
        OpenAI-compatible provider serves embeddings too)."""
        return api == self.name

    def upstream_route(self, adapter: HttpAdapter, model: Model, allowance: int) -> RouteParts:
        """A route's URL, format headers and max-tokens field (catalog and policy alone)."""
        raise NotImplementedError(f"{self.name}: no provider speaks it")

    def count_url(self, route_url: str) -> str | None:
        """Where a route of this format counts a request's input tokens (R-FMT-4), None when
        it cannot (count_tokens is then 501, never a made-up number)."""
        return None

    def credential_header(self, credential: str) -> tuple[str, str]:
        """The header carrying the provider's credential."""
        raise NotImplementedError(f"{self.name}: no provider speaks it")

    def upstream_body(self, body: Mapping[str, Any], limits: Limits) -> dict[str, Any]:
        """The body for one route: model and max tokens set; all else as sent (R-GW-3)."""
        raise NotImplementedError(f"{self.name}: no provider speaks it")

    def effort_fields(self, level: Effort, body: Mapping[str, Any]) -> Mapping[str, Any]:
        """The fields a route's effort sets in the body sent (R-RT-3)."""
        raise NotImplementedError(f"{self.name}: no provider speaks it")

    def parse_reply(self, reply: JsonReply) -> ProviderResponse:
        """Usage and stop reason of a 2xx body (the provider adapters' own parser)."""
        raise NotImplementedError(f"{self.name}: no provider speaks it")

    def observe(self, tracker: Tracker, event: Event) -> None:
        """Fold one provider stream event into the tracker (Malformed when of the wrong
        shape): content, finish reason, usage, terminator, error."""
        raise NotImplementedError(f"{self.name}: no provider streams it")


class StreamTranslator:
    """A route's stream in a caller's other format: source -> internal -> target."""

    __slots__ = ("reader", "writer")

    def __init__(self, reader: StreamReader, writer: StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def feed(self, event: Event) -> Iterable[bytes]:
        """The caller's bytes for one upstream event."""
        write = self.writer.write
        return [data for step in self.reader.read(event) for data in write(step)]

    def finish(self) -> Iterable[bytes]:
        """The caller's end of stream, when the upstream ended complete without its own."""
        return self.writer.finish()
