"""`LedgerClient`: the `Ledger` methods over the service's JSON API (`ledger serve`): on the
socket or plain HTTP through `ledger.wire`'s kept connections, over TLS on httpx's transport.

A worker switches by changing one constructor: the same method names and arguments, the same
record types (`Reservation`, `SettleResult`, `Selection`) and the same exceptions (`Refused` with
its reason code and retry time, `UsageError`, `NotFoundError`, `StoreError` subclasses). The
client speaks to the unix socket (`LedgerClient("/path/to/state/ledger.sock")`, or the state
directory itself) or to a URL with the bearer token (`LEDGER_TOKEN` unless given).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import httpcore
import httpx
from httpcore._backends.sync import SyncStream  # the stream httpcore's own backend returns

from ledger import errors
from ledger.catalog import Catalog, Model, load_catalog, parse_catalog
from ledger.clock import now_ms, parse_iso_ms
from ledger.config import Policy, load_policy
from ledger.documents import claim_of, times_of
from ledger.home import state_dir
from ledger.kinds import AttemptRole, AttemptStatus, ExclusionReason, FailureKind
from ledger.records import (
    Cancelled,
    Outcome,
    Reservation,
    SettleResult,
    SourceStateChange,
    Success,
)
from ledger.routing.chains import ChainMatch
from ledger.routing.exclusion import Exclusion
from ledger.routing.pools import CandidateView, Lease, PoolView
from ledger.routing.select import Route, Selection
from ledger.store.queue import Claim, CommitFailure, QueueTimes
from ledger.store.token_views import TokenWindowUse
from ledger.targets import Effort, parse_target
from ledger.wire import Broken, ConnectFailed, Wire, tcp_connector, unix_connector

SOCKET_NAME = "ledger.sock"
TOKEN_ENV = "LEDGER_TOKEN"  # noqa: S105 - a variable name, not a secret
TOKEN_FILE = "ledger.token"  # noqa: S105 - the file `ledger serve` generates (server.TOKEN_NAME)


class _UnixBackend(httpcore.SyncBackend):
    """httpcore's backend, but a unix socket whose connect fails is closed (httpcore 1.0 leaks it
    when the service is down, and a worker retrying in a loop would run out of descriptors)."""

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            for option in socket_options or ():
                sock.setsockopt(*option)
            sock.settimeout(timeout)
            sock.connect(path)
        except TimeoutError as exc:
            sock.close()
            raise httpcore.ConnectTimeout(str(exc)) from exc
        except OSError as exc:
            sock.close()
            raise httpcore.ConnectError(str(exc)) from exc
        return _OneWriteStream(sock)


class _OneWriteStream(SyncStream):
    """httpcore's socket stream, but a request's head leaves with the first write after it (its
    body, or the whole body when it is one piece) or, when none follows, when the answer is first
    read: the service is woken once per request, not once for the head and again for the body
    (on a busy machine each wake-up is a context switch or two). A failed write of the head
    alone is left for the read to report, as httpcore does with any failed write."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(sock)
        self._held: bytes | None = None
        self._fresh = True  # the next write starts a request (the head)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        if self._fresh:
            self._fresh = False
            self._held = buffer
            return
        if self._held is not None:
            buffer, self._held = self._held + buffer, None
        super().write(buffer, timeout)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self._fresh = True
        if self._held is not None:
            held, self._held = self._held, None
            with contextlib.suppress(httpcore.WriteError):
                super().write(held, timeout)
        return super().read(max_bytes, timeout)


def unix_transport(path: str) -> httpx.HTTPTransport:
    """An httpx transport on a unix socket that never leaks a socket whose connect failed (for
    an `httpx.Client` on the service's socket: the tests' own, and any program's)."""
    transport = httpx.HTTPTransport(uds=path)
    transport._pool = httpcore.ConnectionPool(uds=path, network_backend=_UnixBackend())
    return transport


def _micro(usd: float | None) -> int | None:
    return None if usd is None else round(usd * 1_000_000)


def _ms(text: str | None) -> int:
    value = parse_iso_ms(text)
    assert value is not None
    return value


def reservation_of(doc: Mapping[str, Any]) -> Reservation:
    """The `Reservation` a `/v1/reserve` answer (`Reservation.to_json()`) describes."""
    return Reservation(
        id=int(doc["id"]),
        source=str(doc["source"]),
        model=str(doc["model"]),
        created_ms=_ms(doc["created"]),
        deadline_ms=_ms(doc["deadline"]),
        estimate_micro=_micro(doc["estimate_usd"]),
        role=AttemptRole(doc["role"]),
        status=AttemptStatus(doc["status"]),
        request_id=doc["request_id"],
        replayed=bool(doc["replayed"]),
        pool=doc.get("pool"),
        effort=doc.get("effort"),
        estimate_input_tokens=int(doc.get("estimate_input_tokens") or 0),
        estimate_output_tokens=int(doc.get("estimate_output_tokens") or 0),
    )


def settle_result_of(doc: Mapping[str, Any]) -> SettleResult:
    """The `SettleResult` a `/v1/settle` answer (`SettleResult.to_json()`) describes."""
    fallback = doc["fallback"]
    return SettleResult(
        reservation_id=int(doc["reservation"]),
        source=str(doc["source"]),
        model=str(doc["model"]),
        status=AttemptStatus(doc["status"]),
        late=bool(doc["late"]),
        kind=doc["kind"],
        subkind=doc["subkind"],
        reason=doc["reason"],
        actions=tuple(doc["actions"]),
        fallback=None if fallback is None else str(fallback["constraint"]),
        use_correction=bool(doc["correction"]),
        paused=doc["paused"],
        finished=bool(doc["finished"]),
        cost_micro=_micro(doc["cost_usd"]),
    )


def selection_of(doc: Mapping[str, Any]) -> Selection:
    """The `Selection` a `/v1/select` answer (`Selection.to_json()`) describes."""
    excluded = tuple(
        Exclusion(e["model"], ExclusionReason(e["reason"]), parse_iso_ms(e.get("until")))
        for e in doc["excluded"]
    )
    return Selection(
        _routes_of(doc), excluded, parse_iso_ms(doc["retry_at"]), _chain_of(doc), _pools_of(doc)
    )


def _routes_of(doc: Mapping[str, Any]) -> tuple[str, ...]:
    """The routes as `Route` objects with their effort (R-RT-2), from `targets`."""
    efforts = {t["route"]: t.get("effort") for t in doc.get("targets") or ()}
    return tuple(
        Route(r, Effort(efforts[r]) if efforts.get(r) else None) for r in doc["routes"]
    )


def _chain_of(doc: Mapping[str, Any]) -> ChainMatch | None:
    """The chain the primary matched (R-RT-1)."""
    chain = doc.get("chain")
    if not chain:
        return None
    entries = tuple(parse_target(e) for e in chain["entries"])
    return ChainMatch(chain["field"], chain["key"], chain["why"], entries)


def _pools_of(doc: Mapping[str, Any]) -> tuple[PoolView, ...]:
    """The pool routes' candidates with state (R-RT-5)."""
    return tuple(
        PoolView(
            name=p["pool"],
            strategy=p["strategy"],
            sticky=p["sticky"],
            sticky_scope=p["sticky_scope"],
            candidates=tuple(
                CandidateView(
                    c["model"], c["tier"], Effort(c["effort"]) if c["effort"] else None,
                    c["state"], parse_iso_ms(c["until"]),
                )
                for c in p["candidates"]
            ),
            cursor=p["cursor"],
            leases=tuple(
                Lease(p["pool"], "" if x["scope"] == "pool" else x["scope"], x["model"],
                      parse_iso_ms(x["until"]))
                for x in p["leases"]
            ),
        )
        for p in doc.get("pools") or ()
    )


def outcome_json(outcome: Outcome) -> dict[str, Any]:
    """A library outcome as the service's `outcome` object (with the learned limits it carries,
    R-TOK-4)."""
    doc = _outcome_json(outcome)
    if outcome.limits is not None:
        doc["limits"] = outcome.limits.to_json()
    return doc


def _outcome_json(outcome: Outcome) -> dict[str, Any]:
    if isinstance(outcome, Success):
        return {
            "result": "success",
            "input_tokens": outcome.input_tokens,
            "output_tokens": outcome.output_tokens,
            "cost_usd": outcome.cost_usd,
            "finish": outcome.finish,
            "cache_write_tokens": outcome.cache_write_tokens,
            "cache_read_tokens": outcome.cache_read_tokens,
        }
    if isinstance(outcome, Cancelled):
        if outcome.usage_seen or outcome.usage_estimated:
            raise errors.UsageError("the service's cancelled outcome carries no usage")
        return {"result": "cancelled"}
    c = outcome.classification
    return {
        "result": "failed",
        "kind": c.kind.value,
        "subkind": c.subkind,
        "reason": c.reason,
        "retry_after_ms": c.retry_after_ms,
        "reset_at_ms": c.reset_at_ms,
        "side_effects": outcome.side_effects,
        "input_tokens": outcome.input_tokens,
        "output_tokens": outcome.output_tokens,
        "cache_write_tokens": outcome.cache_write_tokens,
        "cache_read_tokens": outcome.cache_read_tokens,
    }


def error_of(status: int, doc: Any) -> errors.LedgerError:
    """The library exception an error answer stands for (same class, reason code and message)."""
    detail = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(detail, dict):
        return errors.LedgerError(f"the service answered HTTP {status}")
    code, message = str(detail.get("code", "")), str(detail.get("message", ""))
    if status == 409:
        inner = message.removeprefix(f"refused: {code}").strip()
        scope = detail.get("scope")
        return errors.Refused(
            code,
            inner[1:-1] if inner.startswith("(") else "",
            parse_iso_ms(detail.get("retry_at")),
            scope=scope if isinstance(scope, str) else None,
        )
    named = getattr(errors, code, None)
    plain = named not in (errors.ConfigError, errors.Refused)  # their constructors differ
    if isinstance(named, type) and issubclass(named, errors.LedgerError) and plain:
        return named(message)
    if status == 404:
        return errors.NotFoundError(message)
    if status > 500:
        return errors.StoreError(message)
    if 400 <= status < 500:
        return errors.UsageError(message)
    return errors.LedgerError(message)


RECONNECT_S = 10.0
"""How long a client that has reached the service connects again after a refused connection."""
_RECONNECT_PAUSE_S = (0.05, 1.0)  # the first pause between connection attempts, and the longest
NOT_SERVED = frozenset({"the service is not available", "too many connections; retry shortly"})
"""The messages of the service's 503 `unavailable` answers given before a request is read (a
draining service, ledger/service/errors.py; past the connection limit, ledger/service/server.py):
the request was not served, so it may be sent again like one that could not connect."""


TRANSPORT_ERRORS = (
    httpcore.TimeoutException,
    httpcore.NetworkError,
    httpcore.ProtocolError,
    httpcore.ProxyError,
    httpcore.UnsupportedProtocol,
)
"""What httpx would raise as `httpx.TransportError` (the client speaks to httpcore directly)."""


class _NotConnected(Exception):
    """No connection to the service could be made: the request was not sent."""


@dataclass(frozen=True)
class _Answer:
    """A service's whole answer: its status and body."""

    status_code: int
    content: bytes

    def json(self) -> Any:
        """The body as JSON (ValueError when it is not)."""
        return json.loads(self.content)


def _not_served(answer: _Answer) -> bool:
    """A 503 the service gave before reading the request (draining, or too many connections)."""
    if answer.status_code != 503:
        return False
    try:
        detail = answer.json().get("error")
    except (ValueError, AttributeError):
        return False
    return isinstance(detail, dict) and detail.get("message") in NOT_SERVED


class LedgerClient:
    """The `Ledger` API over HTTP: a unix socket path (or state directory), or a URL + token.

    `policy`, `catalog` and `env` (what a worker needs to call providers itself) are read once
    from the state directory `home` (resolved as the CLI does) when first asked for, unless given.

    A service this client has reached before that then refuses the connection (a restart: its
    socket is gone or nobody listens, or it is draining and answers 503 without reading the
    request) is connected to again, with backoff, for up to
    `reconnect_s` (default: the policy's busy timeout when a policy is given, else 10 s), as the
    store reopens a PostgreSQL session (issue 29 item 9): a request that could not connect was
    never sent, so sending it again cannot do anything twice. Past that, and for any other
    transport failure, `ServiceUnreachableError`.
    """

    def __init__(
        self,
        server: str | Path,
        *,
        token: str | None = None,
        timeout_s: float = 60.0,
        env: Mapping[str, str] | None = None,
        home: str | Path | None = None,
        policy: Policy | None = None,
        catalog: Catalog | None = None,
        reconnect_s: float | None = None,
    ) -> None:
        if reconnect_s is None:
            reconnect_s = RECONNECT_S if policy is None else policy.busy_timeout_ms / 1000
        self._reconnect_s = reconnect_s
        self._reached = False
        env = os.environ if env is None else env
        self.env: Mapping[str, str] = env
        self._home = None if home is None else str(home)
        self._policy = policy
        self._catalog = catalog
        target = str(server)
        headers: list[tuple[bytes, bytes]] = []
        self._token_given = False
        # Plain connections (a unix socket, http://) on `ledger.wire` (kept sockets, answers
        # parsed by llhttp: a request costs a sixth of httpcore's CPU); TLS on httpx's transport.
        # Either way the headers httpx sent but Accept-Encoding (the service never compresses).
        self._transport: httpx.HTTPTransport | None = None
        self._wire: Wire | None = None
        wire: Callable[[], socket.socket] | None = None
        self._prefix = b""
        if target.startswith(("http://", "https://")):
            base = target.rstrip("/")
            url = httpx.URL(base)
            if url.scheme == "https":
                self._transport = httpx.HTTPTransport()
            else:
                wire = tcp_connector(url.host, url.port or 80, timeout_s)
                self._prefix = url.raw_path.rstrip(b"/")
            token = token if token is not None else env.get(TOKEN_ENV)
            self._token_given = bool(token)
            if token:
                headers.append((b"authorization", f"Bearer {token}".encode()))
        else:
            path = Path(target)
            if path.is_dir():
                path = path / SOCKET_NAME
            wire = unix_connector(str(path), timeout_s)
            base = "http://ledger"
        self._base = base
        self._headers = [
            (b"host", httpx.URL(base).netloc),
            (b"accept", b"*/*"),
            (b"connection", b"keep-alive"),
            (b"user-agent", f"python-httpx/{httpx.__version__}".encode()),
            *headers,
        ]
        self._timeouts = {"timeout": dict.fromkeys(("connect", "read", "write", "pool"), timeout_s)}
        if wire is not None:
            try:
                self._wire = Wire(wire, timeout_s, self._headers)
            except ValueError:  # the token (the only header from outside): never echoed
                raise errors.UsageError(
                    f"the bearer token (${TOKEN_ENV} or the token given) holds characters an "
                    "HTTP header cannot carry"
                ) from None

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        answer = self._send(method, path, body)
        try:
            doc = answer.json()
        except ValueError:
            doc = None
        if answer.status_code == 401:
            raise errors.UsageError(self._token_help())
        if answer.status_code >= 400:
            raise error_of(answer.status_code, doc)
        return doc

    def _send(self, method: str, path: str, body: dict[str, Any] | None) -> _Answer:
        """The service's answer. A request a service reached before did not serve (it could not
        connect, or the service was draining) is sent again with backoff for `reconnect_s`."""
        first_failure: float | None = None
        pause = _RECONNECT_PAUSE_S[0]
        content = b""
        if body is not None:  # as httpx encodes `json=`
            content = json.dumps(
                body, ensure_ascii=False, separators=(",", ":"), allow_nan=False
            ).encode()
        while True:
            try:
                answer = self._exchange(method, path, content)
            except _NotConnected as exc:
                if not self._reached:
                    raise errors.ServiceUnreachableError() from exc
                cause: Exception | None = exc
            else:
                self._reached = True
                if not _not_served(answer):
                    return answer
                cause = None
            first_failure = first_failure or time.monotonic()
            left = self._reconnect_s - (time.monotonic() - first_failure)
            if left <= 0:
                raise errors.ServiceUnreachableError() from cause
            time.sleep(min(pause, left))
            pause = min(pause * 2, _RECONNECT_PAUSE_S[1])

    def _exchange(self, method: str, path: str, content: bytes) -> _Answer:
        """One request and its answer; `_NotConnected` when nothing could be sent (no
        connection), `ServiceUnreachableError` for any other transport failure."""
        if self._wire is not None:
            try:
                sent = self._wire.request(method.encode(), self._prefix + path.encode(), content)
            except ConnectFailed as exc:
                raise _NotConnected() from exc
            except Broken as exc:
                raise errors.ServiceUnreachableError() from exc
            except ValueError:  # a target HTTP cannot carry (the client builds every one)
                raise errors.UsageError("a request path HTTP cannot carry") from None
            return _Answer(sent.status_code, sent.content)
        assert self._transport is not None
        headers = self._headers
        if content:  # the wire adds these itself
            headers = [
                *headers,
                (b"content-length", str(len(content)).encode()),
                (b"content-type", b"application/json"),
            ]
        try:
            answer = self._transport._pool.request(
                method, self._base + path, headers=headers, content=content,
                extensions=self._timeouts,
            )
        except httpcore.ConnectError as exc:
            raise _NotConnected() from exc
        except TRANSPORT_ERRORS as exc:
            raise errors.ServiceUnreachableError() from exc
        return _Answer(answer.status, answer.content)

    def _token_help(self) -> str:
        """Where the token is (a path, never the token itself): a 401 over TCP."""
        given = "the token given was refused" if self._token_given else "no token was given"
        local = state_dir(self._home, None).path / TOKEN_FILE
        where = (
            f"{local} (or the `{TOKEN_FILE}` file in the service's state directory)"
            if local.exists()
            else f"the `{TOKEN_FILE}` file in the service's state directory"
        )
        return (
            f"a valid bearer token is required over TCP ({given}): set ${TOKEN_ENV} to the "
            f"service's token, which is ${TOKEN_ENV} where `ledger serve` runs or else {where}"
        )

    def served_catalog(self) -> Catalog:
        """The catalog of the ledger the service serves (`GET /v1/catalog`)."""
        return parse_catalog(json.dumps(self._call("GET", "/v1/catalog")), "the service's catalog")

    def reserve(
        self,
        source: str,
        model: str,
        *,
        input_bytes: int | None = None,
        text: str | None = None,
        request_id: str | None = None,
        override: bool = False,
        role: AttemptRole = AttemptRole.PRIMARY,
        fallback_from: str | None = None,
        after: int | None = None,
        scopes: Iterable[str] = (),
    ) -> Reservation:
        """Permission for one call, or `Refused` with its reason code (as `Ledger.reserve`)."""
        effort = getattr(model, "effort", None)  # a Route from select keeps its effort (R-RT-2)
        key = str(model) if effort is None else f"{model}:{effort}"
        body: dict[str, Any] = {"source": source, "model": key}
        optional = {
            "input_bytes": input_bytes,
            "text": text,
            "request_id": request_id,
            "fallback_from": fallback_from,
            "after": after,
        }
        body.update({k: v for k, v in optional.items() if v is not None})
        if override:
            body["override"] = True
        if role is not AttemptRole.PRIMARY:
            body["role"] = AttemptRole(role).value
        if scopes:
            body["scopes"] = [scopes] if isinstance(scopes, str) else list(scopes)
        return reservation_of(self._call("POST", "/v1/reserve", body))

    def settle(
        self, reservation_id: int, outcome: Outcome, *, overran: bool = False
    ) -> SettleResult:
        """Record the outcome of a reservation (as `Ledger.settle`)."""
        body = {"reservation": reservation_id, "outcome": outcome_json(outcome)}
        if overran:
            body["overran"] = True
        return settle_result_of(self._call("POST", "/v1/settle", body))

    def evolve(self, source: str, model: str, *, input_bytes: int | None = None) -> Reservation:
        """One explicit override attempt on a known source (as `Ledger.evolve`: `NotFoundError`
        for an unknown one, which creates nothing and spends no call)."""
        body: dict[str, Any] = {"source": source, "model": model}
        if input_bytes is not None:
            body["input_bytes"] = input_bytes
        return reservation_of(self._call("POST", "/v1/evolve", body))

    def select(
        self,
        source: str | None,
        *,
        model: str | None = None,
        input_bytes: int | None = None,
        text: str | None = None,
        after_failure: FailureKind | None = None,
        failed_model: str | None = None,
        tried: frozenset[str] = frozenset(),
    ) -> Selection:
        """Ordered eligible routes and every exclusion (as `Ledger.select`)."""
        optional = {
            "source": source,
            "model": model,
            "input_bytes": input_bytes,
            "text": text,
            "after_failure": None if after_failure is None else FailureKind(after_failure).value,
            "failed_model": failed_model,
        }
        body: dict[str, Any] = {k: v for k, v in optional.items() if v is not None}
        if tried:
            body["tried"] = sorted(tried)
        return selection_of(self._call("POST", "/v1/select", body))

    def add_source(
        self,
        source: str,
        payload_ref: str | None = None,
        enqueue: bool = True,
        *,
        scopes: Iterable[str] = (),
    ) -> bool:
        """Create or enqueue a source for workers (as `Ledger.add_source`)."""
        body: dict[str, Any] = {"source": source, "enqueue": enqueue}
        if payload_ref is not None:
            body["payload_ref"] = payload_ref
        if scopes:
            body["scopes"] = [scopes] if isinstance(scopes, str) else list(scopes)
        return bool(self._call("POST", "/v1/sources", body)["created"])

    def set_source_state(self, source: str, action: str) -> SourceStateChange:
        """pause / resume / done (as `Ledger.set_source_state`)."""
        if action not in ("pause", "resume", "done"):
            raise errors.UsageError("unknown source action")
        doc = self._call("POST", f"/v1/sources/{action}", {"source": source})
        reason = doc.get("pause_reason")
        return SourceStateChange(
            str(doc["source"]),
            str(doc["state"]),
            doc.get("already") is True,
            None if reason is None else str(reason),
        )

    def status(self) -> dict[str, Any]:
        """The status document (`ledger status --json`, `ledger.status.document.build_status`)."""
        doc: dict[str, Any] = self._call("GET", "/v1/status")
        return doc

    @property
    def policy(self) -> Policy:
        """The policy (recovery.json of the state directory), read once."""
        if self._policy is None:
            self._policy = load_policy(state_dir(self._home, None).path)
        return self._policy

    @property
    def catalog(self) -> Catalog:
        """The catalog (catalog.json of the state directory), read once."""
        if self._catalog is None:
            self._catalog = load_catalog(state_dir(self._home, None).path)
        return self._catalog

    @property
    def clock_fn(self) -> Callable[[], int]:
        """This host's clock (the service stamps reservations; calls are timed from those)."""
        return now_ms

    def model(self, key: str) -> Model:
        """A catalog model or a usage error (as `Ledger.model`)."""
        return self.catalog.require_model(key)

    def claim(
        self, worker_id: str, *, checked_before: int | None = None,
        skip_scopes: Iterable[str] = (),
    ) -> Claim | None:
        """Lease the due source checked longest ago (as `Ledger.claim`)."""
        body: dict[str, Any] = {"worker_id": worker_id}
        if checked_before is not None:
            body["checked_before"] = checked_before
        skip = sorted(set(skip_scopes))
        if skip:
            body["skip_scopes"] = skip
        return claim_of(self._call("POST", "/v1/queue/claim", body))

    def token_windows(self) -> list[TokenWindowUse]:
        """Every token window the policy sets, with its use now (as `Ledger.token_windows`:
        the status document's `token_budgets`)."""
        return [
            TokenWindowUse(
                str(w["kind"]), str(w["scope"] if w["kind"] == "scope" else w["target"]),
                str(w["window"]), int(w["limit"]), int(w["used"]), parse_iso_ms(w["frees_at"]),
            )
            for w in self.status().get("token_budgets") or ()
        ]  # fmt: skip

    def renew(
        self, source: str, worker_id: str, *, cover_until_ms: int = 0, unpaused: bool = False
    ) -> bool:
        """Extend a lease this worker still holds (as `Ledger.renew`)."""
        body = {
            "source": source,
            "worker_id": worker_id,
            "cover_until_ms": cover_until_ms,
            "unpaused": unpaused,
        }
        return bool(self._call("POST", "/v1/queue/renew", body)["held"])

    def finish(self, source: str, worker_id: str) -> bool:
        """Mark a leased source done (as `Ledger.finish`)."""
        body = {"source": source, "worker_id": worker_id}
        return bool(self._call("POST", "/v1/queue/finish", body)["held"])

    def release(self, source: str, worker_id: str) -> bool:
        """Give a lease back (as `Ledger.release`)."""
        body = {"source": source, "worker_id": worker_id}
        return bool(self._call("POST", "/v1/queue/release", body)["held"])

    def release_spent(self, source: str, worker_id: str) -> str | None:
        """Give a lease back, pausing a spent source (as `Ledger.release_spent`)."""
        body = {"source": source, "worker_id": worker_id}
        paused = self._call("POST", "/v1/queue/release-spent", body)["paused"]
        return None if paused is None else str(paused)

    def defer_owed_fallback(self, source: str, worker_id: str) -> int | None:
        """The generic backoff for an owed fallback with no alternate (as `Ledger`'s)."""
        body = {"source": source, "worker_id": worker_id}
        retry_at = self._call("POST", "/v1/queue/defer", body)["retry_at_ms"]
        return None if retry_at is None else int(retry_at)

    def commit_failed(self, source: str, worker_id: str, model: str) -> CommitFailure | None:
        """The handler's commit raised: one failure of the source (as `Ledger.commit_failed`)."""
        body = {"source": source, "worker_id": worker_id, "model": model}
        answer = self._call("POST", "/v1/queue/commit-failed", body)
        if not answer["held"]:
            return None
        retry_at = answer["retry_at_ms"]
        return CommitFailure(None if retry_at is None else int(retry_at), answer["paused"])

    def queue_times(self) -> QueueTimes:
        """Ledger time now and when queued work next becomes due (as `Ledger.queue_times`)."""
        return times_of(self._call("GET", "/v1/queue/times"))

    def ledger_now(self) -> int:
        """The ledger's current time, as the service sees it."""
        return self.queue_times().now_ms

    def compact(self, batch: int) -> int:
        """One bounded compaction step, done by the service (as `Ledger.compact`)."""
        return int(self._call("POST", "/v1/queue/compact", {"batch": batch})["folded"])

    def close(self) -> None:
        """Close the idle connections."""
        if self._wire is not None:
            self._wire.close()
        if self._transport is not None:
            self._transport.close()

    def __enter__(self) -> LedgerClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
