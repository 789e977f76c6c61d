"""R-SC-3: gateway keys are printed once, stored as a salted hash only, listed without the key,
revoked at once, verified in constant time, and never open `/v1`, the page or `/metrics`."""

from __future__ import annotations

import hmac
import json
import threading
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner, Result

from ledger import keys as key_core
from ledger.api import Ledger
from ledger.cli.main import cli
from ledger.keys import KeyIdentity
from ledger.service.app import create_app
from ledger.store.keys import create_key, verify_key
from tests.support.backends import fresh_pg_database, pg_server_url
from tests.support.ledgers import Clock, LedgerFactory, write_policy
from tests.support.serving import running

SCOPES = {"nightly": {"callsPerHour": 50}, "team": {"inFlight": 4}}


def secret_of(key: str) -> str:
    """The secret part of `lgk_<16 hex>_<43 urlsafe>` (it may itself hold '_')."""
    secret = key[len(key_core.PREFIX) + 17 :]
    assert len(secret) == 43
    return secret
DAY = 24 * 3_600_000


def invoke(home: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--home", str(home), *args])


def created_key(home: Path, name: str = "ci", *extra: str) -> str:
    result = invoke(home, "key", "create", name, "--scope", "nightly", "--scope", "team", *extra)
    assert result.exit_code == 0, result.output
    assert "will not be shown again" in result.stderr
    (key,) = result.stdout.split()  # stdout is the key alone (KEY=$(ledger key create ...))
    return key


def files_text(home: Path) -> bytes:
    return b"".join(p.read_bytes() for p in home.rglob("*") if p.is_file())


def test_r_sc_3_create_prints_once_list_never_shows_it_revoke_ends_it(home: Path) -> None:
    write_policy(home, scopes=SCOPES)
    key = created_key(home, "ci", "--expires", "30d")
    secret = secret_of(key)
    led = Ledger.open(home, env={})
    try:
        assert verify_key(led.db, key) == KeyIdentity("ci", ("nightly", "team"))
        listed = invoke(home, "key", "list")
        as_json = invoke(home, "key", "list", "--json")
        assert listed.exit_code == as_json.exit_code == 0
        assert "ci" in listed.output
        assert "nightly,team" in listed.output
        (row,) = json.loads(as_json.output)["keys"]
        assert (row["name"], row["scopes"], row["state"]) == ("ci", ["nightly", "team"], "active")
        assert row["expires"] is not None
        assert row["last_used"] is not None
        for text in (listed.output, as_json.output):
            assert secret not in text
        assert secret.encode() not in files_text(home)  # neither the key nor its secret stored
        assert key.encode() not in files_text(home)
        again = invoke(home, "key", "create", "ci", "--scope", "team")
        assert again.exit_code == 2
        assert "exists" in again.output
        assert invoke(home, "key", "revoke", "ci").exit_code == 0
        assert verify_key(led.db, key) is None  # at once
        assert json.loads(invoke(home, "key", "list", "--json").output)["keys"][0]["state"] == (
            "revoked"
        )
        assert invoke(home, "key", "revoke", "nobody").exit_code == 2
    finally:
        led.close()


def test_r_sc_3_bad_input_is_a_usage_error_that_echoes_nothing(home: Path) -> None:
    write_policy(home, scopes=SCOPES)
    odd = "\x1b[31msk-live-oops"
    for args in (
        ("key", "create", odd, "--scope", "team"),
        ("key", "create", "ok", "--scope", "nope\x1b"),
        ("key", "create", "ok", "--scope", "team", "--expires", "soon"),
        ("key", "create", "ok"),  # a key is put under at least one scope
    ):
        result = invoke(home, *args)
        assert result.exit_code == 2, args
        assert "\x1b" not in result.output
        assert "sk-live" not in result.output
    assert not (home / "ledger.db").exists()


def test_r_sc_3_expired_unknown_and_forged_keys_verify_as_none(
    make_ledger: LedgerFactory, clock: Clock
) -> None:
    led = make_ledger(scopes=SCOPES)
    key, row = create_key(led.db, "short", ("team",), DAY)
    assert row.expires_ms == clock.ms + DAY
    assert verify_key(led.db, key) == KeyIdentity("short", ("team",))
    secret = secret_of(key)
    prefix = key[: -len(secret)]
    forged = f"{prefix}{'A' if secret[0] != 'A' else 'B'}{secret[1:]}"  # right id, wrong secret
    other_id = f"lgk_{'0' * 16}_{secret}"
    for bad in (forged, other_id, key + "x", "", "Bearer " + key, None, 7):
        assert verify_key(led.db, bad) is None
    clock.advance(DAY - 1)
    assert verify_key(led.db, key) is not None
    clock.advance(1)  # at its expiry it is expired
    assert verify_key(led.db, key) is None


def test_r_sc_3_comparison_is_constant_time_even_for_an_unknown_id(
    make_ledger: LedgerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    led = make_ledger(scopes=SCOPES)
    key, _ = create_key(led.db, "k", ("team",), None)
    seen: list[tuple[str, str]] = []
    real = hmac.compare_digest

    me = threading.get_ident()

    def spy(a: str, b: str) -> bool:
        if threading.get_ident() == me:  # not a token check of another test's leftover thread
            seen.append((a, b))
        return bool(real(a, b))

    monkeypatch.setattr(hmac, "compare_digest", spy)  # ledger.keys calls it through the module
    assert verify_key(led.db, key) is not None
    secret = secret_of(key)
    assert verify_key(led.db, f"{key_core.PREFIX}{'0' * 16}_{secret}") is None
    assert len(seen) == 2  # the digest was compared with compare_digest both times
    assert all(len(a) == len(b) == 64 for a, b in seen)


def test_r_sc_3_a_key_never_opens_v1_the_page_or_metrics_and_never_shows(home: Path) -> None:
    write_policy(home, scopes=SCOPES)
    key = created_key(home)
    token = "t" * 40
    with running(home, "--listen", "127.0.0.1:0", env={"LEDGER_TOKEN": token}) as served:
        assert served.url is not None
        with httpx.Client(base_url=served.url, timeout=30) as http:
            for path in ("/v1/status", "/", "/metrics", "/v1/openapi.json"):
                for header in ({"authorization": f"Bearer {key}"}, {"x-api-key": key}):
                    assert http.get(path, headers=header).status_code == 401, path
            answer = http.post(
                "/v1/reserve",
                json={"source": "s1", "model": "alpha/small"},
                headers={"authorization": f"Bearer {key}"},
            )
            assert answer.status_code == 401
            good = {"authorization": f"Bearer {token}"}
            shown = [http.get(p, headers=good).text for p in ("/v1/status", "/metrics", "/")]
            assert all(key_core.PREFIX not in text for text in shown)
    secret = secret_of(key)
    status = invoke(home, "status", "--json").output + invoke(home, "status").output
    assert secret not in status
    assert secret not in "".join(served.log)
    assert secret.encode() not in files_text(home)


def test_r_sc_3_the_service_offers_its_key_check_to_the_gateway(home: Path) -> None:
    write_policy(home, scopes=SCOPES)
    key = created_key(home)
    led = Ledger.open(home, env={})
    try:
        verifier = create_app(led).state.key_verifier
        assert verifier(key) == KeyIdentity("ci", ("nightly", "team"))
        assert verifier("lgk_nothing") is None
    finally:
        led.close()


def test_r_sc_3_revoked_is_refused_at_once_by_every_service_on_one_postgresql(
    tmp_path: Path,
) -> None:
    pg_server_url()
    with fresh_pg_database() as url:
        homes = [tmp_path / "a", tmp_path / "b"]
        for home in homes:
            home.mkdir(mode=0o700)
            write_policy(home, scopes=SCOPES)
        ledgers = [Ledger.open(home, url, env={}) for home in homes]
        try:
            verifiers = [create_app(led).state.key_verifier for led in ledgers]
            result = CliRunner().invoke(
                cli, ["--home", str(homes[0]), "--db", url, "key", "create", "ci", "--scope",
                      "team"]
            )
            assert result.exit_code == 0, result.output
            key = result.stdout.strip()
            assert [v(key) for v in verifiers] == [KeyIdentity("ci", ("team",))] * 2
            revoked = CliRunner().invoke(
                cli, ["--home", str(homes[1]), "--db", url, "key", "revoke", "ci"]
            )
            assert revoked.exit_code == 0
            assert [v(key) for v in verifiers] == [None, None]  # no service caches a key
        finally:
            for led in ledgers:
                led.close()
