"""The worker's handler contract (R-POL-4): the `Job` a handler gets, `load_handler` for
`--handler module:function`, and the built-in `echo_handler` (`ledger.worker:echo_handler`).

Handler contract: ``handler(job: Job) -> HandlerResult``.

- ``Job`` carries the source id, its ``payload_ref``, the ``route`` (model key) and catalog
  ``model``, the reservation's ``deadline_ms`` (ledger time, UTC ms), the attempt ``role``
  (primary / fallback / correction) and ``correction_reason`` — the broken rule to name in the
  corrective prompt (None otherwise). ``job.call(messages)`` makes the call with the built-in
  adapter of the route's provider, max tokens = the reply reservation, timeout = the deadline,
  and returns the raw ``ProviderResponse``. The deadline is kept in ledger time: the time left
  is measured from the reservation (``job.remaining_ms()``), never from the local wall clock,
  and a call that outlives it is settled ``late`` (R-HTTP-3, R-RES-11). A handler may use its
  own client instead (bounded by ``job.remaining_ms()``) and report facts; it passes each raw
  answer to ``job.observe(response)`` so the worker learns the token limits its rate-limit
  headers report (``call`` does this itself).
- ``HandlerResult.success(response, commit=...)``: a usable result (usage from the response).
  ``commit`` is called only after the worker settled the attempt in time (a late result,
  R-RES-11, is never handed over) and only while the worker still holds its lease. The source is
  finished only after ``commit`` returned (R-Q-1): a commit that raises is a failure of the item
  (outcome ``commit_failed``): it counts as one failure of the source with the generic backoff
  (R-POL-3) toward the failure cap (R-POL-5), so the source is claimable again only after its
  backoff, and the worker goes on; a worker that dies before or inside the commit loses nothing
  (the source is rerun after its lease expires), so a commit should be idempotent.
- ``HandlerResult.failed_call(response)``: the worker classifies the adapter's facts.
  ``HandlerResult.failure(kind, reason)``: an explicit kind, e.g. ``invalid_output`` with
  reason ``json_contract``. ``side_effects=True`` forbids fallback and correction (R-POL-7).
- A handler that raises is classified by exception type only (its message is never read).
- Optional: ``handler.input_bytes(payload_ref) -> int`` gives the conservative request size to
  reserve; by default the payload reference's UTF-8 size plus a small margin.
"""

from __future__ import annotations

import importlib
import json
import os
import secrets
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ledger.catalog import Model
from ledger.classify import classify_stop_reason
from ledger.errors import UsageError
from ledger.kinds import AttemptRole, FailureKind
from ledger.providers.base import CallRequest, Message, ProviderResponse
from ledger.targets import Effort
from ledger.worker.queue import HandlerResult

__all__ = ["Handler", "HandlerResult", "Job", "default_worker_id", "echo_handler", "load_handler"]

INPUT_MARGIN_BYTES = 512
"""Added to the payload size when reserving: room for the instructions a handler adds."""


@dataclass(frozen=True)
class Job:
    """One authorised call for a handler: the source, the route and the reservation's deadline."""

    source_id: str
    payload_ref: str | None
    route: str
    model: Model
    deadline_ms: int
    reservation_id: int
    role: AttemptRole
    correction_reason: str | None
    max_tokens: int
    caller: Callable[[CallRequest], ProviderResponse] = field(repr=False, compare=False)
    clock: Callable[[], int] | None = field(default=None, repr=False, compare=False)
    """Ledger time as seen during this call (reservation time + elapsed), for `remaining_ms`."""
    effort: Effort | None = None
    """This route's reasoning effort (R-RT-2), sent by `call` as R-RT-3 says."""
    listener: Callable[[ProviderResponse], None] | None = field(
        default=None, repr=False, compare=False
    )
    """The worker's reader of an answer's rate-limit headers (R-TOK-4), behind `observe`."""

    def remaining_ms(self) -> int:
        """Milliseconds left before the reservation's deadline (R-HTTP-3), for a handler's own
        client: measured from the reservation in ledger time, never from the local wall clock."""
        clock = self.clock
        if clock is None:  # pragma: no cover - the worker always sets it
            raise RuntimeError("this job has no call clock")
        return max(0, self.deadline_ms - clock())

    def observe(self, response: ProviderResponse) -> None:
        """Hand the worker a raw answer, so it learns the token limits its rate-limit headers
        report (R-TOK-4; kept with the attempt's settle). `call` does this itself; a handler
        calling the provider with its own client passes each raw answer here."""
        if self.listener is not None:
            self.listener(response)

    def call(self, messages: Sequence[Message]) -> ProviderResponse:
        """Call the route with the built-in adapter, within the reservation's deadline; the
        answer's rate-limit headers are read (`observe`)."""
        response = self.caller(
            CallRequest(
                model_id=self.model.id,
                messages=tuple(messages),
                max_tokens=self.max_tokens,
                deadline_ms=self.deadline_ms,
                reasoning=self.model.reasoning is not False,
                effort=self.effort,
            )
        )
        self.observe(response)
        return response


Handler = Callable[[Job], HandlerResult]


def echo_handler(job: Job) -> HandlerResult:
    """Built-in handler: send the payload reference as a user message; the reply must be JSON."""
    messages: list[Message] = []
    if job.correction_reason is not None:
        messages.append(
            Message(
                "system",
                f"Your previous reply broke the rule `{job.correction_reason}`. "
                "Reply with one valid JSON document only.",
            )
        )
    messages.append(Message("user", job.payload_ref or job.source_id))
    response = job.call(messages)
    if not response.ok or classify_stop_reason(response.stop_reason) is not None:
        return HandlerResult.failed_call(response)
    try:
        json.loads(response.text or "")
    except ValueError:
        return HandlerResult.failure(FailureKind.INVALID_OUTPUT, "invalid_json", response=response)
    return HandlerResult.success(response)


def load_handler(spec: str) -> Handler:
    """Import `module:function` (e.g. `ledger.worker:echo_handler`)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError("--handler must be module:function")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # an import error in user code is bad usage, not a crash
        raise UsageError("the handler module cannot be imported") from exc
    handler = getattr(module, attr, None)
    if not callable(handler):
        raise UsageError("the handler is not a callable in that module")
    return handler  # type: ignore[no-any-return]


def default_worker_id() -> str:
    """host:pid:random — unique per worker process."""
    return f"{socket.gethostname()[:60]}:{os.getpid()}:{secrets.token_hex(3)}"


def input_bytes(handler: Handler, payload_ref: str | None) -> int:
    """The conservative request size to reserve: the handler's own `input_bytes` when it has one,
    else the payload reference's UTF-8 size plus INPUT_MARGIN_BYTES."""
    sizer = getattr(handler, "input_bytes", None)
    if callable(sizer):
        size = sizer(payload_ref)
        if isinstance(size, int) and not isinstance(size, bool) and size >= 0:
            return size
    return len((payload_ref or "").encode("utf-8")) + INPUT_MARGIN_BYTES
