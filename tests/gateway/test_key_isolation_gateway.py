"""R-SC-3a over HTTP through a real `ledger serve`, on SQLite and PostgreSQL: two gateway keys in
two scopes. A key naming another team's source with `X-Ledger-Source` is 403
`source_scope_mismatch` in the format's error shape with nothing reserved (the other scope keeps
its whole budget); a key's new source is made under its scopes; an unscoped source is open to the
socket and the service token only; and two keys' equal `Idempotency-Key`s are independent
requests, while one key repeating its own finds its own reservation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from ledger.cli.main import cli
from ledger.standin.server import StandIn
from tests.support.backends import BACKENDS, db_url, rows
from tests.support.gateway_setup import Gateway, gateway

OPENAI_PATH = "/openai/v1/chat/completions"
ANTHROPIC_PATH = "/anthropic/v1/messages"
POLICY: dict[str, Any] = {
    "callsPerHour": 1000,
    "scopes": {"a": {"callsPerHour": 2}, "b": {"callsPerHour": 2}},
}
MISMATCH = "source_scope_mismatch"


def _cli(home: Path, *args: str) -> str:
    result = CliRunner().invoke(cli, ["--home", str(home), *args])
    assert result.exit_code == 0, result.output
    return result.stdout


def _keys_and_sources(home: Path) -> tuple[str, str]:
    """Key `alpha` under scope a, key `beta` under scope b; `team-b-src` under b, `plain-src`
    under no scope. The two keys."""
    alpha = _cli(home, "key", "create", "alpha", "--scope", "a").strip()
    beta = _cli(home, "key", "create", "beta", "--scope", "b").strip()
    _cli(home, "source", "add", "team-b-src", "--scope", "b")
    _cli(home, "source", "add", "plain-src")
    return alpha, beta


def _openai(
    http: httpx.Client, key: str | None, source: str | None = None, request_id: str | None = None,
    stream: bool = False,
) -> httpx.Response:
    headers = {} if key is None else {"authorization": f"Bearer {key}"}
    if source is not None:
        headers["x-ledger-source"] = source
    if request_id is not None:
        headers["idempotency-key"] = request_id
    body = {"model": "acme/a1", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    return http.post(OPENAI_PATH, json=body, headers=headers)


def _anthropic(http: httpx.Client, key: str, source: str) -> httpx.Response:
    body = {"model": "bolt/b1", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"x-api-key": key, "x-ledger-source": source, "anthropic-version": "2023-06-01"}
    return http.post(ANTHROPIC_PATH, json=body, headers=headers)


def _openai_error(r: httpx.Response) -> tuple[int, str, str]:
    error = r.json()["error"]
    return r.status_code, error["type"], error["code"]


def _anthropic_error(r: httpx.Response) -> tuple[int, str, str, str]:
    document = r.json()
    return r.status_code, document["type"], document["error"]["type"], document["error"]["code"]


def _reserved(url: str, source: str) -> int:
    ((n,),) = rows(url, "SELECT COUNT(*) FROM reservations WHERE source_id = :s", s=source)
    return int(n)


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_sc_3a_a_key_naming_another_scopes_source_is_403_and_spends_nothing(
    home: Path, ledger_db: str | None
) -> None:
    with StandIn() as standin, gateway(home, standin, **POLICY) as gw:
        alpha, beta = _keys_and_sources(home)
        with httpx.Client(base_url=gw.url, timeout=120) as http:
            mismatch = ("invalid_request_error", MISMATCH)
            assert _openai_error(_openai(http, alpha, "team-b-src")) == (403, *mismatch)
            assert _openai_error(_openai(http, alpha, "team-b-src", stream=True)) == (
                403, *mismatch
            )
            assert _openai_error(_openai(http, alpha, "team-b-src", "job-1")) == (403, *mismatch)
            assert _anthropic_error(_anthropic(http, alpha, "team-b-src")) == (
                403, "error", "permission_error", MISMATCH
            )
            assert standin.requests == []  # nothing went upstream
            assert _reserved(db_url(home, ledger_db), "team-b-src") == 0  # nothing reserved
            # scope b untouched: key beta's own requests have its whole hour (2 calls)
            assert _openai(http, beta, "team-b-src").status_code == 200
            assert _anthropic(http, beta, "team-b-src").status_code == 200
            refused = _openai(http, beta, "team-b-src")
            assert _openai_error(refused) == (429, "rate_limit_error", "scope_hourly_budget")
        assert _reserved(db_url(home, ledger_db), "team-b-src") == 2
        assert len(standin.requests) == 2


def _source_scopes(url: str, source: str) -> list[str]:
    found = rows(url, "SELECT scope FROM source_scopes WHERE source_id = :s", s=source)
    return sorted(str(r[0]) for r in found)


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_sc_3a_a_keys_new_source_is_its_own_and_an_unscoped_one_is_not(
    home: Path, ledger_db: str | None
) -> None:
    url = db_url(home, ledger_db)
    with StandIn() as standin, gateway(home, standin, **POLICY) as gw:
        alpha, beta = _keys_and_sources(home)
        with httpx.Client(base_url=gw.url, timeout=120) as http:
            assert _openai(http, alpha, "new-a-src").status_code == 200
            assert _source_scopes(url, "new-a-src") == ["a"]  # made under the key's scopes
            assert _openai_error(_openai(http, beta, "new-a-src"))[2] == MISMATCH
            # without X-Ledger-Source a key's request is its own new source, under its scopes
            own = _openai(http, alpha)
            assert own.status_code == 200
            ((implicit,),) = rows(
                url, "SELECT source_id FROM reservations WHERE id = :i",
                i=int(own.headers["x-ledger-reservation"]),
            )  # fmt: skip
            assert _source_scopes(url, str(implicit)) == ["a"]
            # an existing unscoped source: never for a key, in either format
            assert _openai_error(_openai(http, alpha, "plain-src"))[2] == MISMATCH
            assert _anthropic_error(_anthropic(http, beta, "plain-src"))[3] == MISMATCH
            assert _reserved(url, "plain-src") == 0
            # but open to the service token over TCP and to the socket
            assert _openai(http, gw.token, "plain-src").status_code == 200
        with gw.served.client() as socket:
            assert _openai(socket, None, "plain-src").status_code == 200
        assert _reserved(url, "plain-src") == 2
        assert _source_scopes(url, "plain-src") == []  # still unscoped


def _reservation(r: httpx.Response) -> int:
    assert r.status_code == 200, r.text
    return int(r.headers["x-ledger-reservation"])


def _both_keys_same_ids(gw: Gateway, alpha: str, beta: str) -> dict[str, int]:
    with httpx.Client(base_url=gw.url, timeout=120) as http:
        got = {
            "alpha": _reservation(_openai(http, alpha, request_id="job-1")),
            "beta": _reservation(_openai(http, beta, request_id="job-1")),  # not alpha's
            "token": _reservation(_openai(http, gw.token, request_id="job-1")),
        }
        for key in (alpha, beta, gw.token):  # each repeat finds its own, answered, request
            repeat = _openai(http, key, request_id="job-1")
            assert _openai_error(repeat) == (409, "conflict_error", "idempotency_key_reused")
        # with sources named too: each key's id is its own, never "used for another source"
        got["alpha-2"] = _reservation(_openai(http, alpha, "src-a", "job-2"))
        got["beta-2"] = _reservation(_openai(http, beta, "team-b-src", "job-2"))
        repeat = _openai(http, beta, "team-b-src", "job-2")
        assert _openai_error(repeat)[2] == "idempotency_key_reused"
    return got


@pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)
def test_r_sc_3a_two_keys_same_idempotency_key_are_independent_requests(
    home: Path, ledger_db: str | None
) -> None:
    with StandIn() as standin, gateway(home, standin, **POLICY) as gw:
        alpha, beta = _keys_and_sources(home)
        got = _both_keys_same_ids(gw, alpha, beta)
        assert len(set(got.values())) == 5  # five requests, five reservations
        assert len(standin.requests) == 5  # and no repeat went upstream
        stored = rows(
            db_url(home, ledger_db),
            "SELECT namespace, request_id, id FROM reservations ORDER BY id",
        )
        assert stored == [
            ("key:alpha", "job-1", got["alpha"]),
            ("key:beta", "job-1", got["beta"]),
            ("", "job-1", got["token"]),
            ("key:alpha", "job-2", got["alpha-2"]),
            ("key:beta", "job-2", got["beta-2"]),
        ]
