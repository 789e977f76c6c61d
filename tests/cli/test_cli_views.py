"""Issue 20 item 16: what `select`, `status`, `source show`, `settle` and `catalog import-litellm`
tell an operator — the credential variable to set (its name, never its value), per-reason counts on
a large catalog, measured times, the open allowance counted as time used, each line once, and the
`--providers` name that matched nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from freezegun import freeze_time

from ledger.cli.main import cli
from tests.support.ledgers import TEST_CATALOG

SECRET = "sk-test-VALUE-never-shown-0123456789"


def invoke(home: Path, *args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, ["--home", str(home), *args], env=env)


def doc(result: Result) -> Any:
    assert result.exit_code in (0, 3), result.output
    return json.loads(result.output)


def test_issue20_item16_unavailable_names_the_credential_variable(home: Path) -> None:
    env = {"GAMMA_TEST_KEY": ""}  # set but empty: still unavailable (R-CAT-2)
    assert invoke(home, "db", "upgrade").exit_code == 0
    selected = doc(invoke(home, "select", "s1", "--json", env=env))
    gamma = next(e for e in selected["excluded"] if e["model"] == "gamma/g1")
    assert gamma == {  # the test catalog's gamma has no baseUrl either (issue 33: both named)
        "model": "gamma/g1", "reason": "unavailable", "credential_env": "GAMMA_TEST_KEY",
        "base_url_missing": True,
    }
    for args in (["select", "s1"], ["select", "s1", "--all"], ["status"]):
        text = invoke(home, *args, env=env).output
        assert "GAMMA_TEST_KEY" in text, args
    status = doc(invoke(home, "status", "--json", env=env))
    assert {"model": "gamma/g1", "reason": "unavailable", "until": None,
            "credential_env": "GAMMA_TEST_KEY", "base_url_missing": True} in status["excluded"]


def test_issue20_item16_credential_value_is_never_shown(home: Path) -> None:
    catalog = json.loads(json.dumps(TEST_CATALOG))
    catalog["providers"]["delta"] = {"credentialEnv": "DELTA_KEY"}
    catalog["models"].append({"provider": "delta", "id": "d1"})
    (home / "catalog.json").write_text(json.dumps(catalog))
    env = {"GAMMA_TEST_KEY": SECRET}  # gamma available; delta not
    assert invoke(home, "db", "upgrade").exit_code == 0
    for args in (["select", "s1", "--all"], ["status"], ["status", "--json"]):
        out = invoke(home, *args, env=env).output
        assert SECRET not in out
        assert "DELTA_KEY" in out
        assert "GAMMA_TEST_KEY" not in out  # an available provider needs nothing


def _big_catalog(home: Path, n: int) -> None:
    catalog = json.loads(json.dumps(TEST_CATALOG))
    for i in range(n):
        provider = f"p{i % 40:02d}"
        catalog["providers"].setdefault(provider, {"credentialEnv": f"P{i % 40:02d}_API_KEY"})
        catalog["models"].append({"provider": provider, "id": f"m{i:04d}"})
    (home / "catalog.json").write_text(json.dumps(catalog))


def test_issue20_item16_status_counts_exclusions_per_reason_on_a_large_catalog(
    home: Path,
) -> None:
    _big_catalog(home, 400)
    assert invoke(home, "db", "upgrade").exit_code == 0
    text = invoke(home, "status").output
    status = doc(invoke(home, "status", "--json"))
    assert status["excluded_by_reason"] == {"unavailable": 401}
    assert len(status["excluded"]) == 401  # JSON keeps every exclusion
    section = text.split("── routes")[1].split("── budgets")[0]
    assert "m0001" not in section  # no arbitrary sample of models
    assert re.search(r"excluded +unavailable +401\b", section)
    assert "P00_API_KEY" in section
    assert "more" in section  # 41 variables: the most useful are named, the rest counted
    assert len(section.splitlines()) <= 8
    narrow = CliRunner().invoke(cli, ["--home", str(home), "status"], env={"COLUMNS": "80"})
    assert max(len(line) for line in narrow.output.splitlines()) <= 80


def test_issue20_item16_source_show_time_as_measured(home: Path) -> None:
    with freeze_time("2027-01-15T08:00:00Z") as frozen:
        rid = doc(invoke(home, "reserve", "s1", "--model", "alpha/small", "--json"))["id"]
        frozen.tick(0.007)
        assert invoke(home, "settle", str(rid), "--ok").exit_code == 0
        shown = invoke(home, "source", "show", "s1").output
        status = invoke(home, "status").output
    assert "time used 7ms" in shown
    assert "0.0s" not in shown
    assert re.search(r"\bs1 .* 7ms\b", status)


def test_issue20_item16_open_allowance_is_said_to_count_as_time_used(home: Path) -> None:
    with freeze_time("2027-01-15T08:00:00Z"):
        assert invoke(home, "reserve", "s1", "--model", "alpha/small").exit_code == 0
        status = invoke(home, "status").output
        status_doc = doc(invoke(home, "status", "--json"))
        shown = invoke(home, "source", "show", "s1").output
        shown_doc = doc(invoke(home, "source", "show", "s1", "--json"))
    (source,) = status_doc["sources"]["list"]
    assert (source["time_used_ms"], source["open_allowance_ms"]) == (120_000, 120_000)
    assert shown_doc["open_allowance_ms"] == 120_000
    assert "2m*" in status
    assert "* time used counts the whole allowance of open reservations" in status
    assert "time used 2m\n" in shown
    assert "of that, 2m is the whole allowance of 1 unsettled reservation" in shown


def test_issue20_item16_settle_says_fallback_permitted_once(home: Path) -> None:
    rid = doc(invoke(home, "reserve", "s1", "--model", "alpha/small", "--json"))["id"]
    out = invoke(home, "settle", str(rid), "--http-status", "401").output
    assert out.count("fallback permitted") == 1


@pytest.mark.parametrize(
    ("names", "shown", "hidden"),
    [
        ("anthropic,nosuchprovider", "`nosuchprovider`", None),
        ("antropic", "did you mean `anthropic`?", None),
        (f"anthropic,{SECRET.lower()}", "1 name", SECRET.lower()),
    ],
)
def test_issue20_item16_providers_error_names_the_name(
    tmp_path: Path, names: str, shown: str, hidden: str | None
) -> None:
    source = tmp_path / "prices.json"
    source.write_text(
        json.dumps(
            {
                "claude-x": {"litellm_provider": "anthropic", "mode": "chat"},
                "gpt-x": {"litellm_provider": "openai", "mode": "chat"},
            }
        )
    )
    result = invoke(tmp_path / "state", "catalog", "import-litellm", str(source),
                    "--providers", names)
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1
    assert shown in result.output
    if hidden is not None:
        assert hidden not in result.output
