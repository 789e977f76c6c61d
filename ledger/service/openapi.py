"""The OpenAPI side of the service: the error statuses each operation can answer (R-SRV-2) and
the served document made valid JSON Schema with the bearer security scheme."""

from __future__ import annotations

from typing import Any

from ledger.service.answers import ErrorOut

ERROR_DESCRIPTIONS: dict[int, str] = {
    400: "bad input: malformed JSON or a usage error (the message says which; exit code 2)",
    401: "over TCP without a valid bearer token (the unix socket needs none)",
    404: "no such reservation or source",
    405: "a path parameter with a line break matches no route of this operation",
    408: "the request body did not arrive in time (the connection is closed)",
    409: "refused by policy: `code` is the reason code, `retry_at` or `hint` says what next",
    413: "the request body is larger than 64 KiB",
    422: "a field of the wrong type, out of range, or unknown",
    503: "the service is stopping, or the database is busy, unreachable, too new or too old: retry",
}
GATE = (401, 503)
"""What the gate in front of every route can answer: no token over TCP; draining or stopped."""
WITH_BODY = (400, 408, 413, 422, *GATE)
"""A route that reads a JSON body: malformed, too slow, too large, invalid, plus the gate's."""
PATH_PARAM = (405,)
"""A route with a path parameter: the router's patterns do not match a line break in it."""


def errors(*statuses: int, json_ref: bool = False) -> dict[int | str, dict[str, Any]]:
    """The `responses` of an operation for the error statuses it can really return, each an
    `ErrorOut`. `json_ref`: for a route whose own answer is not JSON (the page, the metrics), the
    errors are declared as `application/json` explicitly rather than under the route's type."""
    if json_ref:
        schema = {"$ref": "#/components/schemas/ErrorOut"}
        return {
            status: {
                "description": ERROR_DESCRIPTIONS[status],
                "content": {"application/json": {"schema": schema}},
            }
            for status in sorted(statuses)
        }
    return {
        status: {"model": ErrorOut, "description": ERROR_DESCRIPTIONS[status]}
        for status in sorted(statuses)
    }


BEARER_SCHEME = "bearer"


def finish_openapi(doc: dict[str, Any]) -> dict[str, Any]:
    """The served OpenAPI document, made valid JSON Schema for generators: integer bounds as
    integers (FastAPI's document model turns them into floats, `maximum: 599.0`), and the bearer
    security scheme TCP requires (optional on the unix socket: `{}` is also allowed); FastAPI's
    default validation error shape, which this service never answers, is replaced by ErrorOut."""

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "integer":
                for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
                    value = node.get(key)
                    if isinstance(value, float) and value.is_integer():
                        node[key] = int(value)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(doc)
    components = doc.setdefault("components", {})
    # every validation error is answered as ErrorOut (errors.py), never FastAPI's default shape
    schemas = components.get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    for path in doc.get("paths", {}).values():
        for operation in path.values():
            answer = operation.get("responses", {}).get("422")
            if answer is not None:
                answer.update(errors(422, json_ref=True)[422])
    components.setdefault("securitySchemes", {})[BEARER_SCHEME] = {
        "type": "http",
        "scheme": "bearer",
        "description": "TCP only (`ledger serve --listen`): $LEDGER_TOKEN or the `ledger.token` "
        "file in the state directory. The unix socket's file mode is its authentication.",
    }
    doc["security"] = [{BEARER_SCHEME: []}, {}]
    return doc
