"""SPEC section 19: the gateway on a real `ledger serve`, driven by the official OpenAI and
Anthropic SDKs, with the provider stand-in as the upstream."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from ledger.api import Ledger
from ledger.standin.server import Scripted, StandIn
from tests.support.gateway_setup import STANDIN_KEY, gateway


def test_r_gw_1_openai_sdk_answer_names_the_model_and_reservation(home: Path) -> None:
    with StandIn() as standin, gateway(home, standin) as gw:
        raw = gw.openai().chat.completions.with_raw_response.create(
            model="acme/a1",
            messages=[{"role": "user", "content": "hello"}],
            temperature=0.3,
            max_tokens=100000,
        )
        answer = raw.parse()
        assert answer.model == "acme/a1"
        assert answer.choices[0].message.content == '{"ok": true}'
        assert raw.headers["x-ledger-model"] == "acme/a1"
        assert raw.headers["x-ledger-attempts"] == "1"
        reservation = int(raw.headers["x-ledger-reservation"])
        assert "x-ledger-fallback-from" not in raw.headers
        sent = standin.bodies[0]
        assert sent["model"] == "a1"  # the route's upstream id
        assert sent["temperature"] == 0.3  # passed through
        assert sent["max_tokens"] == 4096  # clamped to the reply allowance (R-GW-3)
        assert standin.requests[0].headers.get("authorization") is None
    with Ledger.open(home).db.engine.connect() as conn:
        row = conn.exec_driver_sql(
            "SELECT model_key, status FROM reservations WHERE id = ?", (reservation,)
        ).one()
    assert tuple(row) == ("acme/a1", "succeeded")


def test_r_gw_1_anthropic_sdk_works_with_x_api_key(home: Path) -> None:
    with StandIn() as standin, gateway(home, standin) as gw:
        raw = gw.anthropic().messages.with_raw_response.create(
            model="b1",  # a bare id naming exactly one catalog model
            max_tokens=64,
            system="be brief",
            messages=[{"role": "user", "content": "hello"}],
        )
        message = raw.parse()
        assert message.model == "bolt/b1"
        assert raw.headers["x-ledger-model"] == "bolt/b1"
        sent = standin.bodies[0]
        assert sent["model"] == "b1"
        assert sent["max_tokens"] == 64  # within the allowance: as asked
        assert sent["system"] == "be brief"
        assert standin.requests[0].headers["x-api-key"] == "<redacted>"  # our credential went


def test_r_gw_1_tcp_needs_the_token_in_either_header(home: Path) -> None:
    with StandIn() as standin, gateway(home, standin) as gw:
        body = {"model": "acme/a1", "messages": [{"role": "user", "content": "x"}]}
        url = gw.url + "/openai/v1/chat/completions"
        for headers in ({}, {"authorization": "Bearer wrong"}, {"x-api-key": "wrong"}):
            answer = httpx.post(url, json=body, headers=headers)
            assert answer.status_code == 401
            assert answer.json()["error"]["code"] == "unauthorized"
        ok = httpx.post(url, json=body, headers={"x-api-key": gw.token})
        assert ok.status_code == 200
        listed = httpx.get(gw.url + "/openai/v1/models", headers={"x-api-key": gw.token})
        assert {m["id"] for m in listed.json()["data"]} >= {"acme/a1", "bolt/b1"}
        assert len(standin.requests) == 1


def test_r_gw_1_models_list_through_the_sdk(home: Path) -> None:
    with StandIn() as standin, gateway(home, standin) as gw:
        ids = [m.id for m in gw.openai().models.list()]
        assert "acme/a1" in ids


def test_r_gw_1_r_rt_4_the_models_list_names_the_pools_a_request_may_name(home: Path) -> None:
    pools = {"fast": {"candidates": ["acme/a1", "cirrus/c1"]}, "all": {"candidates": ["pool/fast"]}}
    with StandIn() as standin, gateway(home, standin, pools=pools) as gw:
        listed = {m.id: m.owned_by for m in gw.openai().models.list()}
        assert listed["pool/all"] == listed["pool/fast"] == "ledger"
        assert listed["acme/a1"] == "acme"
        hello: Any = [{"role": "user", "content": "x"}]
        for key in listed:  # every id listed is one a request may name
            gw.openai().chat.completions.create(model=key, messages=hello)


@pytest.mark.parametrize(
    ("model", "code"),
    [("nope/none", "unknown_model"), ("zzz", "unknown_model")],
)
def test_r_gw_2_a_model_naming_nothing_is_400_and_nothing_upstream(
    home: Path, model: str, code: str
) -> None:
    with StandIn() as standin, gateway(home, standin) as gw:
        with pytest.raises(openai.BadRequestError) as info:
            gw.openai().chat.completions.create(
                model=model, messages=[{"role": "user", "content": "x"}]
            )
        assert info.value.code == code
        assert model not in info.value.response.text
        with pytest.raises(anthropic.BadRequestError) as ainfo:
            gw.anthropic().messages.create(
                model=model, max_tokens=5, messages=[{"role": "user", "content": "x"}]
            )
        assert ainfo.value.body["error"]["code"] == code  # type: ignore[index]
        assert standin.requests == []


def test_r_gw_6_refusal_is_429_with_retry_after_and_the_reason_code(home: Path) -> None:
    with StandIn() as standin, gateway(home, standin, callsPerHour=1) as gw:
        client = gw.openai()
        client.chat.completions.create(model="acme/a1", messages=[{"role": "user", "content": "x"}])
        with pytest.raises(openai.RateLimitError) as info:
            client.chat.completions.create(
                model="acme/a1", messages=[{"role": "user", "content": "x"}]
            )
        assert info.value.code == "shared_hourly_budget"
        assert int(info.value.response.headers["retry-after"]) > 0
        with pytest.raises(anthropic.RateLimitError) as ainfo:
            gw.anthropic().messages.create(
                model="bolt/b1", max_tokens=5, messages=[{"role": "user", "content": "x"}]
            )
        assert ainfo.value.body["error"]["code"] == "shared_hourly_budget"  # type: ignore[index]
        assert len(standin.requests) == 1


def test_r_gw_4_transport_failure_is_retried_once_on_the_same_model(home: Path) -> None:
    script = {"a1": [Scripted(status=500)]}
    with StandIn(script) as standin, gateway(home, standin) as gw:
        raw = gw.openai().chat.completions.with_raw_response.create(
            model="acme/a1", messages=[{"role": "user", "content": "x"}]
        )
        assert raw.headers["x-ledger-attempts"] == "2"
        assert raw.headers["x-ledger-model"] == "acme/a1"
        assert gw.models_asked() == ["a1", "a1"]


def test_r_gw_4_persistent_503_falls_back_after_the_retry(home: Path) -> None:
    script = {"a1": [Scripted(status=503)] * 5}
    with StandIn(script) as standin, gateway(home, standin) as gw:
        raw = gw.openai().chat.completions.with_raw_response.create(
            model="acme/a1", messages=[{"role": "user", "content": "x"}]
        )
        assert raw.parse().model == "cirrus/c1"
        assert raw.headers["x-ledger-fallback-from"] == "acme/a1"
        assert raw.headers["x-ledger-attempts"] == "3"
        assert gw.models_asked() == ["a1", "a1", "c1"]


def test_r_gw_6_upstream_error_body_is_never_echoed(home: Path) -> None:
    marker = "UPSTREAM-SECRET-MARKER"
    script = {"a1": [Scripted(status=400, error_message=marker)]}
    with StandIn(script) as standin, gateway(home, standin, crossProviderFallback=False) as gw:
        answer = httpx.post(
            gw.url + "/openai/v1/chat/completions",
            json={"model": "acme/a1", "messages": [{"role": "user", "content": "x"}]},
            headers={"authorization": f"Bearer {gw.token}"},
        )
        assert answer.status_code == 400
        assert marker not in answer.text
        assert answer.json()["error"]["code"] == "request_rejected"
        assert marker not in "".join(gw.served.log)
        assert len(standin.requests) == 1


def test_r_gw_2_source_header_groups_calls_under_one_source(home: Path) -> None:
    with StandIn() as standin, gateway(home, standin, sourceCalls=2) as gw:
        client = gw.openai(**{"X-Ledger-Source": "nightly-job"})
        for _ in range(2):
            client.chat.completions.create(
                model="acme/a1", messages=[{"role": "user", "content": "x"}]
            )
        with pytest.raises(openai.RateLimitError) as info:
            client.chat.completions.create(
                model="acme/a1", messages=[{"role": "user", "content": "x"}]
            )
        assert info.value.code == "source_calls"
        assert len(standin.requests) == 2


def test_r_gw_2_idempotency_key_is_the_request_id(home: Path) -> None:
    with StandIn() as standin, gateway(home, standin) as gw:
        client = gw.openai(**{"Idempotency-Key": "job-42"})
        client.chat.completions.create(model="acme/a1", messages=[{"role": "user", "content": "x"}])
        with pytest.raises(openai.ConflictError) as info:
            client.chat.completions.create(
                model="acme/a1", messages=[{"role": "user", "content": "x"}]
            )
        assert info.value.code == "idempotency_key_reused"
        assert len(standin.requests) == 1


@pytest.mark.parametrize(
    "body",
    [b"{not json", b'{"model": 5, "messages": []}', b'{"model": "acme/a1", "messages": "x"}',
     b'{"model": "acme/a1", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}',
     # not JSON (RFC 8259), though Python's parser takes it: it went upstream as invalid JSON
     b'{"model": "acme/a1", "messages": [{"role": "user", "content": "x"}], "top_p": NaN}',
     b'{"model": "acme/a1", "messages": [{"role": "user", "content": "x"}], "seed": -Infinity}'],
)  # fmt: skip
@pytest.mark.parametrize("path", ["/openai/v1/chat/completions", "/anthropic/v1/messages"])
def test_r_gw_bad_input_is_4xx_in_the_formats_shape(home: Path, body: bytes, path: str) -> None:
    with StandIn() as standin, gateway(home, standin) as gw:
        answer = httpx.post(
            gw.url + path, content=body, headers={"authorization": f"Bearer {gw.token}"}
        )
        assert 400 <= answer.status_code < 500
        doc = answer.json()
        if path.startswith("/anthropic"):
            assert doc["type"] == "error"
            assert set(doc["error"]) >= {"type", "message"}
        else:
            assert set(doc["error"]) >= {"message", "type", "code"}
        assert "acme/a1" not in answer.text
        big = httpx.post(
            gw.url + path,
            content=b"x" * (10 * 1024 * 1024),
            headers={"authorization": f"Bearer {gw.token}"},
        )
        assert big.status_code == 413
        assert standin.requests == []


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("GET", "/openai/v1/chat/completions", 405), ("POST", "/openai/v1/models", 405),
     ("GET", "/anthropic/v1/messages", 405), ("GET", "/openai/v1/embeddings", 405),
     ("POST", "/openai/v1/chat/completions/", 404), ("GET", "/anthropic/v1/models", 404),
     ("GET", "/anthropic/v1/messages/count_tokens", 405), ("POST", "/openai/v1/images", 404)],
)  # fmt: skip
def test_r_gw_6_unknown_paths_and_methods_answer_in_the_formats_shape(
    home: Path, method: str, path: str, status: int
) -> None:
    """Before: the /v1 API's own 404/405 shape (and a 307 for a trailing slash), which neither
    SDK reads as its error."""
    with StandIn() as standin, gateway(home, standin) as gw:
        answer = httpx.request(method, gw.url + path, json={"model": "acme/a1"},
                               headers={"authorization": f"Bearer {gw.token}"})  # fmt: skip
        assert standin.requests == []
    assert answer.status_code == status
    doc = answer.json()
    if path.startswith("/anthropic"):
        assert doc["type"] == "error"
        assert doc["error"]["type"] == ("not_found_error" if status == 404 else
                                        "invalid_request_error")  # fmt: skip
    else:
        assert doc["error"]["type"] in ("not_found_error", "invalid_request_error")
        assert "param" in doc["error"]
    if status == 405:
        assert answer.headers["allow"] in ("GET", "POST")


def test_r_gw_7_no_body_in_the_ledger_or_log(home: Path) -> None:
    marker = "CALLER-TEXT-MARKER-77"
    with StandIn() as standin, gateway(home, standin) as gw:
        gw.openai().chat.completions.create(
            model="acme/a1", messages=[{"role": "user", "content": marker}]
        )
        assert marker not in "".join(gw.served.log)
    assert marker.encode() not in (home / "ledger.db").read_bytes()
    assert STANDIN_KEY not in json.dumps(standin.bodies)


@pytest.mark.parametrize("path", ["/openai/v1/chat/completions", "/anthropic/v1/messages"])
def test_r_gw_bad_input_a_slow_client_is_408_in_the_formats_shape(home: Path, path: str) -> None:
    with StandIn() as standin, gateway(home, standin) as gw:
        host, port = gw.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=60) as conn:
            head = (
                f"POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {gw.token}\r\n"
                'content-type: application/json\r\ncontent-length: 100\r\n\r\n{"mo'
            )
            conn.sendall(head.encode())
            answer = b""
            while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
                chunk = conn.recv(65536)
                if not chunk:
                    break
                answer += chunk
        status_line, _, rest = answer.partition(b"\r\n")
        assert b" 408 " in status_line
        document = json.loads(rest.split(b"\r\n\r\n", 1)[1])
        if path.startswith("/anthropic"):
            assert document["type"] == "error"
        assert document["error"]["code"] == "request_timeout"
        assert standin.requests == []


@pytest.mark.parametrize("stream", [False, True])
def test_r_gw_2_a_key_in_flight_never_makes_a_second_upstream_call(
    home: Path, stream: bool
) -> None:
    """Before: a second request with the key of one still being answered found the same open
    reservation and called upstream again on it: two provider calls on one slot (one of them
    never counted), and its caller got a 400 `already settled` after the call was made."""
    body = {"model": "acme/a1", "messages": [{"role": "user", "content": "x"}], "stream": stream}
    with StandIn(default=Scripted(text="slow", delay_s=1.0)) as standin, \
            gateway(home, standin) as gw:  # fmt: skip
        answers: list[httpx.Response] = []
        headers = {"authorization": f"Bearer {gw.token}", "Idempotency-Key": "job-7"}

        def one() -> None:
            answers.append(httpx.post(gw.url + "/openai/v1/chat/completions", json=body,
                                      headers=headers, timeout=30))  # fmt: skip

        first = threading.Thread(target=one)
        first.start()
        deadline = time.monotonic() + 10
        while not standin.requests and time.monotonic() < deadline:
            time.sleep(0.01)  # the first request's upstream call is under way
        one()
        first.join()
        asked = len(standin.requests)
    assert asked == 1
    second, answered = answers[0], answers[1]
    assert answered.status_code == 200
    assert second.status_code == 409
    assert second.json()["error"]["code"] == "idempotency_key_in_flight"
    assert int(second.headers["retry-after"]) >= 1
    with Ledger.open(home).db.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT status, request_id FROM reservations").all()
    assert [tuple(r) for r in rows] == [("succeeded", "job-7")]
