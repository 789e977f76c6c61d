"""R-CFG-2, R-CFG-3, SPEC 13/15: bad input anywhere is a clear error, never a traceback, never an
echoed value, never a partial write.

Fuzzes arbitrary JSON documents through the policy and catalog parsers and bad arguments through
the CLI commands that write (reserve, settle, source, cooldown).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ledger import catalog as catalog_module
from ledger import config as config_module
from ledger import validation
from ledger.api import Ledger
from ledger.catalog import Catalog, parse_catalog
from ledger.cli.main import cli
from ledger.config import Policy, parse_policy
from ledger.errors import ConfigError
from ledger.kinds import FailureKind
from tests.support.ledgers import TEST_CATALOG


def schema_names(model: type[Any]) -> frozenset[str]:
    """Every property name anywhere in a model's JSON Schema (the only names safe to print)."""
    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            names.update(node.get("properties", {}))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(model.model_json_schema(by_alias=True))
    return frozenset(names)


POLICY_NAMES = schema_names(Policy)
CATALOG_NAMES = schema_names(Catalog)
FIXED_RULES = (
    frozenset(validation._RULES.values())
    | {"is not valid JSON", "must be a JSON object", "is nested too deeply", "is invalid"}
    | {
        rule
        for module in (config_module, catalog_module, validation)
        for rule in re.findall(r'"rule: ([^"]+)"', inspect.getsource(module))
    }
)

scalars = (
    st.none() | st.booleans() | st.integers() | st.floats()
    | st.text(max_size=12) | st.sampled_from(["", "x" * 300, "openai/gpt-4.1", "sk-SECRET123456"])
)


def documents(names: frozenset[str]) -> st.SearchStrategy[Any]:
    """JSON values whose object keys are often schema names, so validation goes deep."""
    keys = st.sampled_from(sorted(names)) | st.text(max_size=12)
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=5),
        max_leaves=25,
    )


def mutated(base: dict[str, Any], names: frozenset[str]) -> st.SearchStrategy[Any]:
    """A valid document with one value anywhere replaced by an arbitrary one."""

    @st.composite
    def build(draw: st.DrawFn) -> Any:
        doc = json.loads(json.dumps(base))
        node: Any = doc
        while True:
            keys = list(node) if isinstance(node, dict) else list(range(len(node)))
            if not keys:
                return doc
            key = draw(st.sampled_from(keys))
            child = node[key]
            if isinstance(child, dict | list) and child and draw(st.booleans()):
                node = child
                continue
            node[key] = draw(documents(names))
            return doc

    return build()


VALID_POLICY = {
    "crossProviderFallback": True, "fallbackModels": ["alpha/small", "beta/mid"],
    "callsPerHour": 20, "sourceCalls": 4, "sourceModels": 2, "timeoutMs": 120000,
    "sourceTimeMs": 300000, "dailyEstimatedUsd": 5.0, "defaultModel": "alpha/small",
    "replyTokens": 4096, "routes": {"allow": ["alpha/*"], "deny": ["beta/free/*"]},
}


def strings_in(value: Any) -> Iterator[str]:
    """Every key and string value in a JSON document."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from strings_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings_in(item)


def check_parse(text: str | bytes, doc: Any, parse: Any, kind: type[Any],
                names: frozenset[str]) -> None:
    """A valid config or the fixed ConfigError; the message names schema fields only."""
    file = "state/config.json"
    try:
        result = parse(text, file)
    except ConfigError as caught:
        error = caught
    else:
        assert isinstance(result, kind)
        return
    assert error.message == f"{file}: {error.path}: {error.rule}"
    assert "\n" not in error.message
    if error.path.startswith("line "):  # invalid JSON: placed, never quoted (issue 15 item 7)
        assert re.fullmatch(r"line \d+, column \d+", error.path)
        assert re.fullmatch(r"is not valid JSON \([a-z ',:]+\)", error.rule), error.rule
        return
    tokens = [t for t in re.split(r"[.\[\]]", error.path) if t]
    # an unknown key is shown only as a plausible identifier, and only as the path's last item
    unknown = tokens[-1] if error.rule.startswith("unknown key") and tokens else None
    shown = unknown if unknown not in names and unknown != "<key>" else None
    if shown is not None:
        assert re.fullmatch(r"[A-Za-z0-9_]{1,32}", shown), shown
    for token in tokens:
        assert (
            token in names or token.isdigit() or token in {"<key>", "(top level)"}
            or token == shown
        ), token
    suggestion = re.fullmatch(r"unknown key \(not allowed\); did you mean `([^`]+)`\?", error.rule)
    assert (
        error.rule in FIXED_RULES
        or re.fullmatch(r"is invalid \([a-z_]+\)", error.rule)
        or (suggestion is not None and suggestion.group(1) in names)
    ), error.rule
    # our own fixed vocabulary may coincide with a document's text ("(top l" in "(top level)")
    fixed_text = f"{file}: {error.rule} (top level) <key>"
    for value in strings_in(doc):
        if len(value) > 5 and value not in names and value not in fixed_text and value != shown:
            assert value not in error.message


@example(doc=[{"(top l": None}])  # found by CI: a key that is a piece of "(top level)"
@given(doc=documents(POLICY_NAMES) | mutated(VALID_POLICY, POLICY_NAMES))
@settings(max_examples=400, deadline=None)
def test_r_cfg_3_fuzzed_policy_is_valid_or_fixed_error(doc: Any) -> None:
    check_parse(json.dumps(doc), doc, parse_policy, Policy, POLICY_NAMES)


@given(doc=documents(CATALOG_NAMES) | mutated(TEST_CATALOG, CATALOG_NAMES))
@settings(max_examples=400, deadline=None)
def test_r_cfg_3_fuzzed_catalog_is_valid_or_fixed_error(doc: Any) -> None:
    check_parse(json.dumps(doc), doc, parse_catalog, Catalog, CATALOG_NAMES)


@given(raw=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
@settings(max_examples=150, deadline=None)
def test_r_cfg_2_arbitrary_bytes_fail_closed(raw: bytes) -> None:
    check_parse(raw, None, parse_policy, Policy, POLICY_NAMES)
    check_parse(raw, None, parse_catalog, Catalog, CATALOG_NAMES)


def test_r_cfg_2_deeply_nested_document_fails_closed() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(ConfigError):
        parse_policy(deep)
    with pytest.raises(ConfigError):
        parse_catalog('{"providers": ' + deep + "}")


# --- CLI arguments ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cli_home() -> Iterator[Path]:
    """A state directory with one source and one open reservation (module-wide for hypothesis)."""
    home = Path(tempfile.mkdtemp(prefix="ledger-fuzz-")) / "state"
    home.mkdir(mode=0o700)
    (home / "catalog.json").write_text(json.dumps(TEST_CATALOG))
    led = Ledger.open(home, env={})
    led.reserve("s1", "alpha/small")
    led.close()
    yield home
    shutil.rmtree(home.parent, ignore_errors=True)


def snapshot(home: Path) -> tuple[str, list[str]]:
    return (hashlib.sha256((home / "ledger.db").read_bytes()).hexdigest(),
            sorted(p.name for p in home.iterdir()))


bad_chars = st.characters(categories=["Cc", "Cf", "Zl", "Zp"])  # non-printable (no surrogates)
bad_ids = (
    st.tuples(st.text(max_size=8), bad_chars, st.text(max_size=8)).map("".join)
    | st.integers(201, 400).map(lambda n: "x" * n)
    | st.just("")
)
huge_or_negative = st.integers(max_value=-1) | st.integers(min_value=10**12 + 1)
bad_usd = (st.floats(max_value=-1e-9) | st.floats(min_value=1e9 + 1)
           | st.sampled_from([math.nan, math.inf, -math.inf]))
bad_durations = (
    st.sampled_from(["-5m", "0s", "0", "367d", "1x", "", "5", "1h1h", "m5", "1.5h", "-1ms"])
    | st.text(max_size=10).filter(lambda s: not re.fullmatch(r"[0-9dhms]+", s))
)
unknown_kinds = (st.text(min_size=1, max_size=20) | bad_ids).filter(
    lambda s: s not in {k.value for k in FailureKind}
)
unknown_models = st.text(min_size=1, max_size=30).filter(lambda s: s not in {
    f"{m['provider']}/{m['id']}" for m in TEST_CATALOG["models"]
})

bad_argv = st.one_of(
    bad_ids.map(lambda s: ["reserve", s, "--model", "alpha/small"]),
    bad_ids.map(lambda s: ["reserve", "s2", "--model", "alpha/small", "--request-id", s]),
    huge_or_negative.map(lambda n: ["reserve", "s2", "--model", "alpha/small",
                                    "--input-bytes", str(n)]),
    unknown_models.map(lambda s: ["reserve", "s2", "--model", s]),
    st.sampled_from(["source add", "source show", "source pause", "source resume",
                     "source done"]).flatmap(
        lambda cmd: bad_ids.map(lambda s: [*cmd.split(), s])),
    bad_ids.map(lambda s: ["source", "evolve", s, "--model", "alpha/small"]),
    (st.integers(max_value=0) | st.integers(min_value=2**62 + 1)).map(
        lambda n: ["settle", str(n), "--ok"]),
    st.integers(2, 10**9).map(lambda n: ["settle", str(n), "--ok"]),  # unknown reservation
    unknown_kinds.map(lambda k: ["settle", "1", "--kind", k]),
    huge_or_negative.map(lambda n: ["settle", "1", "--ok", "--input-tokens", str(n)]),
    bad_usd.map(lambda x: ["settle", "1", "--ok", "--cost-usd", repr(x)]),
    st.just(["settle", "1", "--ok", "--cancelled"]),
    st.just(["settle", "1", "--kind", "unknown", "--reason", "Bad Reason!"]),
    bad_durations.map(lambda d: ["cooldown", "set", "alpha", "--", d]),
    bad_ids.map(lambda s: ["cooldown", "set", s, "5m"]),
    bad_ids.map(lambda s: ["cooldown", "clear", s]),
    bad_ids.map(lambda s: ["settle", "1", "--http-status", s]),
)


@given(argv=bad_argv)
@settings(max_examples=250, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_spec_13_bad_cli_arguments_exit_2_one_line_nothing_written(
    cli_home: Path, argv: list[str]
) -> None:
    before = snapshot(cli_home)
    result = CliRunner().invoke(cli, ["--home", str(cli_home), *argv])
    assert result.exit_code == 2, (argv, result.output)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, (argv, result.stderr)
    assert lines[0].startswith("ledger: ")
    assert lines[0].isprintable()
    assert result.stdout == ""
    assert snapshot(cli_home) == before
