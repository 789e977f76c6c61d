"""One table from CLI exit codes to HTTP statuses, and the one place errors become JSON answers.

Every error answer is `{"error": {"code", "message"}}` with a fixed message: never a traceback,
never a value the client sent (a pasted secret in a field name or value is not echoed back).
A refusal by policy is an answer (409 with its reason code), never a server error.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ledger.clock import iso
from ledger.errors import LedgerError, NotFoundError, ReadOnlyError, Refused
from ledger.gateway.errors import RETRY_AFTER_S, TOO_MANY
from ledger.service.bodies import REQUEST_MODELS
from ledger.status.refusal_text import retry_text

HTTP_STATUS_BY_EXIT_CODE: dict[int, int] = {
    0: 200,  # success
    1: 500,  # an unexpected internal error (a bug; never a refusal or bad input)
    2: 400,  # bad usage or bad input (404 for an unknown reservation or source)
    3: 409,  # refused by policy: the reason code is the error code
    4: 503,  # database busy, too new, too old or unreadable (retry later)
}
"""The documented mapping (README "Service"): what `ledger …` exits with, the service answers."""

HTTP_CODES: dict[int, str] = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "body_too_large",
    422: "invalid_body",
    500: "internal_error",
    503: "unavailable",
}
MESSAGES: dict[int, str] = {
    400: "bad request",
    401: "a valid bearer token is required",
    404: "no such path in the API",
    405: "method not allowed on this path",
    408: "the request did not arrive in time",
    413: "the request body is larger than 64 KiB",
    500: "internal error",
    503: "the service is not available",
}

REPLACED = (
    "the database file was replaced while this request ran; the service reopened it and wrote "
    "nothing: retry"
)

HEADERS: dict[int, dict[str, str]] = {
    401: {"www-authenticate": "Bearer"},
    408: {"connection": "close"},  # the rest of the request is not read: the connection ends
    413: {"connection": "close"},
}


TOO_MANY_HEADERS = {"retry-after": str(RETRY_AFTER_S), "connection": "close"}


def too_many_response() -> JSONResponse:
    """503 `too_many_connections` with Retry-After; the connection is closed after it."""
    return JSONResponse(
        error_body(*TOO_MANY), status_code=503, headers=TOO_MANY_HEADERS
    )


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    """The one error shape (the same as the CLI's `--json` errors)."""
    return {"error": {"code": code, "message": message, **extra}}


def error_response(
    status: int, code: str | None = None, message: str | None = None
) -> JSONResponse:
    """An HTTP-level error (no CLI counterpart): fixed code and message per status."""
    code = code or HTTP_CODES.get(status, "error")
    return JSONResponse(
        error_body(code, message or MESSAGES.get(status, "error")),
        status_code=status,
        headers=HEADERS.get(status),
    )


def status_for(error: LedgerError) -> int:
    """The HTTP status of a domain error, by its CLI exit code."""
    if isinstance(error, NotFoundError):
        return 404
    return HTTP_STATUS_BY_EXIT_CODE.get(error.exit_code, 500)


def ledger_error_response(error: LedgerError) -> JSONResponse:
    """A domain error as the CLI's `--json` prints it: code = reason code or error name."""
    extra: dict[str, Any] = {}
    code = type(error).__name__
    if isinstance(error, Refused):
        code = error.reason
        # as the CLI's --json: when to retry, or (when waiting does not help) what clears it
        extra["retry_at"] = iso(error.retry_at_ms)
        extra["hint"] = (
            None
            if error.retry_at_ms is not None
            else retry_text(error.reason, error.retry_at_ms, error.now_ms)
        )
        if error.scope is not None:  # R-SC-1: the scope that refused
            extra["scope"] = error.scope
    return JSONResponse(error_body(code, error.message, **extra), status_code=status_for(error))


def _validation_message(error: RequestValidationError) -> tuple[int, str, str]:
    """Status, code and a message naming only our own field names and pydantic's error type."""
    first: dict[str, Any] = next(iter(error.errors()), {})
    kind = str(first.get("type", "invalid"))
    if kind == "json_invalid":
        return 400, "malformed_json", "the request body is not valid JSON"
    if kind == "extra_forbidden":
        return 422, "invalid_body", "the request body has an unknown field"
    loc = [p for p in first.get("loc", ()) if isinstance(p, int) or p in KNOWN_FIELDS]
    where = ".".join(str(p) for p in loc) or "body"
    return 422, "invalid_body", f"{where}: {kind}"


KNOWN_FIELDS = frozenset({"body", "query", "path", "action", "target", "source_id", "force"}).union(
    *(model.model_fields for model in REQUEST_MODELS)
)
"""Field and parameter names of the API: a validation error names nothing else back."""


def install(app: FastAPI) -> None:
    """Register the handlers: domain errors, validation errors, HTTP errors, anything else."""

    async def on_ledger_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, LedgerError)
        if isinstance(exc, ReadOnlyError):  # the file may have been replaced under the request
            watch = request.app.state.db_watch
            reopened = watch.reopened
            problem = watch.check()
            if problem is not None:
                return error_response(503, "database_gone", problem)
            if watch.reopened != reopened:
                return error_response(503, "database_replaced", REPLACED)
        return ledger_error_response(exc)

    async def on_validation(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        status, code, message = _validation_message(exc)
        return error_response(status, code, message)

    async def on_http(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        return error_response(exc.status_code)

    async def on_other(_request: Request, _exc: Exception) -> JSONResponse:
        return error_response(500)

    app.add_exception_handler(LedgerError, on_ledger_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(HTTPException, on_http)
    app.add_exception_handler(Exception, on_other)
