"""`ledger serve` (SPEC 16): the JSON API over a real uvicorn service in a subprocess, on the unix
socket and on 127.0.0.1 with the bearer token."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ledger.api import Ledger
from ledger.service.answers import ReservationOut, SelectionOut, SettleOut
from ledger.service.errors import HTTP_STATUS_BY_EXIT_CODE
from ledger.store.migrate import downgrade
from tests.support.ledgers import write_policy
from tests.support.procs import write_lock_held
from tests.support.serving import running
from tests.support.writelock_setup import rows


def _error(answer: httpx.Response) -> dict[str, Any]:
    doc = answer.json()
    assert set(doc) == {"error"}
    assert {"code", "message"} <= set(doc["error"])
    error: dict[str, Any] = doc["error"]
    return error


def test_r_srv_1_socket_is_0600_and_tcp_needs_the_token(home: Path) -> None:
    with running(home, "--listen", "127.0.0.1:0") as served:
        mode = stat.S_IMODE(os.stat(served.socket).st_mode)
        assert served.socket == home / "ledger.sock"
        assert mode == 0o600
        assert stat.S_IMODE(os.stat(home / "ledger.token").st_mode) == 0o600
        assert served.token is not None
        assert served.token not in "".join(served.log)  # never logged
        with served.client() as sock:
            assert sock.get("/healthz").json() == {"status": "ok"}
        assert served.url is not None
        for headers in ({}, {"authorization": "Bearer wrong-token-wrong-token"}):
            answer = httpx.get(served.url + "/v1/status", headers=headers)
            assert answer.status_code == 401
            assert _error(answer)["code"] == "unauthorized"
            assert served.token not in answer.text
        with served.client(tcp=True) as tcp:
            assert tcp.get("/v1/status").json()["schema"] == 1
    assert not (home / "ledger.sock").exists()  # removed on a clean stop


def test_r_srv_1_token_from_the_environment_is_used_and_not_written(home: Path) -> None:
    token = "t0ken-from-the-environment-123"
    with running(home, "--listen", "127.0.0.1:0", env={"LEDGER_TOKEN": token}) as served:
        assert served.url is not None
        ok = httpx.get(served.url + "/healthz", headers={"authorization": f"Bearer {token}"})
        assert ok.status_code == 200
        assert token not in "".join(served.log)
    assert not (home / "ledger.token").exists()


@pytest.mark.parametrize("address", ["10.1.2.3:8000", "0.0.0.0:8000", "example.com:80", "1:2:x"])
def test_r_srv_1_tcp_is_loopback_only_without_allow_remote(home: Path, address: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ledger", "--home", str(home), "serve", "--listen", address],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_r_srv_2_calls_answer_the_libraries_json(home: Path) -> None:
    write_policy(home, callsPerHour=2)
    with running(home) as served, served.client() as http:
        granted = http.post(
            "/v1/reserve", json={"source": "s1", "model": "alpha/small", "request_id": "r-1"}
        )
        assert granted.status_code == 200
        doc = granted.json()
        ReservationOut.model_validate(doc)  # the documented shape, no extra field
        again = http.post(
            "/v1/reserve", json={"source": "s1", "model": "alpha/small", "request_id": "r-1"}
        )
        assert again.json()["id"] == doc["id"]
        assert again.json()["replayed"] is True
        settled = http.post(
            "/v1/settle",
            json={
                "reservation": doc["id"],
                "outcome": {"result": "http", "http_status": 429, "retry_after": "120"},
            },
        )
        assert settled.status_code == 200
        SettleOut.model_validate(settled.json())
        assert settled.json()["kind"] == "rate_limit"
        refused = http.post("/v1/reserve", json={"source": "s2", "model": "alpha/small"})
        assert refused.status_code == HTTP_STATUS_BY_EXIT_CODE[3] == 409
        assert _error(refused)["code"] == "model_cooldown"
        assert _error(refused)["retry_at"] is not None
        selection = http.post("/v1/select", json={"source": "s2"})
        SelectionOut.model_validate(selection.json())
        excluded = {e["model"]: e for e in selection.json()["excluded"]}
        assert excluded["alpha/small"]["reason"] == "model_cooldown"
        assert excluded["alpha/small"]["until"] == _error(refused)["retry_at"]
        http.post("/v1/reserve", json={"source": "s3", "model": "beta/mid"}).raise_for_status()
        full = http.post("/v1/reserve", json={"source": "s4", "model": "beta/mid"})
        assert _error(full)["code"] == "shared_hourly_budget"
        unknown = http.post(
            "/v1/settle", json={"reservation": 999, "outcome": {"result": "cancelled"}}
        )
        assert unknown.status_code == 404
        bad_model = http.post("/v1/reserve", json={"source": "s5", "model": "nope/x"})
        assert bad_model.status_code == HTTP_STATUS_BY_EXIT_CODE[2] == 400
        assert _error(bad_model)["code"] == "UsageError"
        assert "nope" not in bad_model.text


def test_r_srv_2_cooldowns_and_sources(home: Path) -> None:
    with running(home) as served, served.client() as http:
        set_ = http.post("/v1/cooldowns", json={"target": "alpha/small", "duration": "30m"})
        assert set_.json()["origin"] == "manual"
        listed = http.get("/v1/cooldowns").json()["cooldowns"]
        assert [c["target"] for c in listed] == ["alpha/small"]
        assert http.delete("/v1/cooldowns/alpha/small").json()["removed"] == 1
        added = http.post("/v1/sources", json={"source": "doc/1 a?b", "payload_ref": "ref"})
        assert added.json() == {"source": "doc/1 a?b", "created": True, "queued": True}
        assert http.post("/v1/sources/pause", json={"source": "doc/1 a?b"}).json()["state"] == (
            "paused"
        )
        assert [s["id"] for s in http.get("/v1/sources").json()["sources"]] == ["doc/1 a?b"]
        shown = http.get("/v1/sources/" + quote("doc/1 a?b", safe="/"))
        assert shown.json()["state"] == "paused"
        assert http.get("/v1/sources/nothing-here").status_code == 404


def test_r_srv_2_openapi_documents_every_route(home: Path) -> None:
    with running(home) as served, served.client() as http:
        doc = http.get("/v1/openapi.json").json()
    paths = set(doc["paths"])
    assert {"/v1/reserve", "/v1/settle", "/v1/select", "/v1/status", "/v1/cooldowns"} <= paths
    assert {"/v1/sources", "/metrics", "/healthz", "/readyz"} <= paths
    reserve = doc["paths"]["/v1/reserve"]["post"]
    assert "409" in reserve["responses"]
    assert doc["components"]["schemas"]["ReserveBody"]["additionalProperties"] is False


def test_r_srv_2_documented_shapes_match_the_library(make_ledger: Any) -> None:
    """The OpenAPI response models validate the library's own JSON (no drift either way)."""
    ledger: Ledger = make_ledger()
    from ledger.classify import classify_kind
    from ledger.records import Failed

    res = ledger.reserve("s", "alpha/small", input_bytes=10)
    ReservationOut.model_validate(res.to_json())
    failed = ledger.settle(res.id, Failed(classify_kind("invalid_output", "json_contract")))
    SettleOut.model_validate(failed.to_json())
    SelectionOut.model_validate(ledger.select("s").to_json())
    assert set(ReservationOut.model_fields) == set(res.to_json())
    assert set(SettleOut.model_fields) == set(failed.to_json())


def test_r_srv_4_metrics_parse_and_count_requests(home: Path) -> None:
    with running(home) as served, served.client() as http:
        http.post("/v1/reserve", json={"source": "s1", "model": "alpha/small"})
        http.get("/nowhere")
        text = http.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["ledger_hourly_calls_used"].samples[0].value == 1
    requests = {
        (s.labels["route"], s.labels["status"]): s.value
        for s in families["ledger_http_requests"].samples
        if s.name == "ledger_http_requests_total"
    }
    assert requests[("/v1/reserve", "200")] == 1
    assert requests[("unmatched", "404")] == 1
    latency = families["ledger_http_request_duration_seconds"]
    assert latency.type == "histogram"
    counts = [s for s in latency.samples if s.name.endswith("_count")]
    assert any(s.labels["route"] == "/v1/reserve" and s.value == 1 for s in counts)


def test_r_srv_4_health_and_readiness(home: Path) -> None:
    with running(home) as served, served.client() as http:
        assert http.get("/healthz").status_code == 200
        ready = http.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["status"] == "ready"
        from ledger.store import Database

        db = Database(f"sqlite:///{home / 'ledger.db'}")
        downgrade(db, "0002")  # an operator rolled the schema back under the running service
        db.dispose()
        behind = http.get("/readyz")
        assert behind.status_code == 503
        assert _error(behind)["code"] == "not_ready"
        assert http.get("/healthz").status_code == 200


def test_r_srv_2_exit_code_table_covers_every_cli_exit_code() -> None:
    assert sorted(HTTP_STATUS_BY_EXIT_CODE) == [0, 1, 2, 3, 4]
    assert HTTP_STATUS_BY_EXIT_CODE[3] < 500  # a refusal is never a server error


def test_r_srv_1_missing_extra_is_one_line_naming_it(home: Path) -> None:
    script = (
        "import sys\n"
        "sys.modules['fastapi'] = None\n"  # as on a plain install without the serve extra
        "sys.modules['uvicorn'] = None\n"
        "from ledger.cli.main import cli\n"
        f"cli.main(['--home', {str(home)!r}, 'serve'], prog_name='ledger')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "ledger: ledger serve needs the serve extra: python -m pip install -e '.[serve]'"
        " in the checkout"
    ]


def test_r_srv_2_status_is_the_status_document(home: Path) -> None:
    with running(home) as served, served.client() as http:
        doc = http.get("/v1/status").json()
    cli = subprocess.run(
        [sys.executable, "-m", "ledger", "--home", str(home), "status", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    expected = json.loads(cli.stdout)
    assert set(doc) == set(expected)
    assert doc["hourly"] == expected["hourly"]


def _readme_block(after: str, lang: str) -> str:
    """The first ```lang block under the heading `after` (in the README or a page of the site)."""
    from tests.docs.pages import fenced, section  # lazy: only these two examples read the docs

    return fenced(section(after), lang)[0]


def test_r_srv_2_readme_cron_and_client_examples_run_against_a_service(home: Path) -> None:
    """The README's curl cron job and its Python client example, as written, on a real service
    (only the socket path and the model key are this test's)."""
    curl_job = _readme_block("From a shell cron job", "sh")
    client_code = _readme_block("The Python client and workers", "python")
    with running(home) as served:
        script = curl_job.replace(
            "SOCK=$HOME/.local/state/ledger/ledger.sock", f"SOCK={served.socket}"
        ).replace("openai/gpt-4.1-mini", "alpha/small")
        for job_result in ("true", "false"):
            result = subprocess.run(
                ["bash", "-c", f"run_my_job() {{ {job_result}; }}\n{script}"],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert result.returncode == 0, result.stderr
        code = client_code.replace(
            '"/home/jobs/.local/state/ledger/ledger.sock"', repr(str(served.socket))
        ).replace("openai/gpt-4o-mini", "alpha/small")
        subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
        with served.client() as http:
            doc = http.get("/v1/sources/nightly-42").json()
            assert doc["state"] == "done"  # the first run succeeded and finished the source
            assert [a["status"] for a in doc["attempts"]] == ["succeeded"]
            assert http.get("/v1/sources/doc-17").json()["calls"] == 1


def test_r_srv_8_a_browser_signs_in_once_and_the_cookie_opens_only_the_page(home: Path) -> None:
    token = "br0wser-token-0123456789abcdef"
    with running(home, "--listen", "127.0.0.1:0", env={"LEDGER_TOKEN": token}) as served:
        assert served.url is not None
        with httpx.Client(base_url=served.url) as browser:
            assert browser.get("/").status_code == 401  # no header, no cookie
            wrong = browser.get("/", params={"token": "not-it"})
            assert wrong.status_code == 401
            assert "not-it" not in wrong.text
            signed = browser.get("/", params={"token": token})
            assert signed.status_code == 303
            assert signed.headers["location"] == "/"  # the token leaves the address bar
            cookie = signed.headers["set-cookie"]
            assert "HttpOnly" in cookie
            assert "SameSite=Strict" in cookie
            page = browser.get("/")  # the client keeps the cookie, as a browser does
            assert page.status_code == 200
            assert "default-src 'none'" in page.headers["content-security-policy"]
            assert token not in page.text
            assert browser.get("/page.css").status_code == 200
            # the cookie is for looking, never for the API
            assert browser.get("/v1/status").status_code == 401
            refused = browser.post("/v1/reserve", json={"source": "s", "model": "alpha/small"})
            assert refused.status_code == 401
        assert token not in "".join(served.log)


def _metric(http: httpx.Client, name: str) -> float:
    answer = http.get("/metrics")
    assert answer.status_code == 200, answer.text
    families = text_string_to_metric_families(answer.text)
    return sum(s.value for f in families for s in f.samples if s.name == name)


def test_r_srv_3_requests_arriving_together_share_one_commit_and_stay_exact(home: Path) -> None:
    """A writer outside the service holds the database while 24 reserves arrive for 10 slots:
    the first transaction waits for it, every request waits in it or behind it (none is
    answered), then those behind go in one transaction of their own: exactly 10 granted, all 24
    in two transactions (the batch sizes are on /metrics; how many the first took depends on
    how many arrived before the committer started it)."""
    write_policy(home, callsPerHour=10, busyTimeoutMs=120_000)  # the held write outlasts the wait
    answers: list[int] = []

    def reserve(index: int) -> None:
        with served.client() as http:
            answer = http.post("/v1/reserve", json={"source": f"s{index}", "model": "alpha/small"})
            answers.append(answer.status_code)

    def arrived(http: httpx.Client) -> float:
        return _metric(http, "ledger_commit_waiting") + _metric(http, "ledger_commit_in_progress")

    with running(home) as served, served.client() as http:
        with write_lock_held(home / "ledger.db"):
            threads = [threading.Thread(target=reserve, args=(i,)) for i in range(24)]
            for thread in threads:
                thread.start()
            deadline = time.monotonic() + 30
            while arrived(http) < 24 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert arrived(http) == 24, answers
            assert _metric(http, "ledger_commit_in_progress") >= 1
            assert answers == []  # nothing answered while the first transaction waits
        for thread in threads:
            thread.join(60)
        assert sorted(answers) == [200] * 10 + [409] * 14
        assert _metric(http, "ledger_commit_batch_size_count") == 2
        assert _metric(http, "ledger_commit_batch_size_sum") == 24
        assert _metric(http, "ledger_commit_in_progress") == 0
    assert rows(home) == 10
