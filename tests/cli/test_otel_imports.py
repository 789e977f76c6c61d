"""R-OTEL-1: without an OTLP endpoint variable nothing of OpenTelemetry is imported: not by
`ledger --help`, not by a reserve, not while the write lock is held (its hold stays import-free);
a variable set without the extra is one line, and nothing is sent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ledger import telemetry
from ledger.api import Ledger

PROBE = """
import contextlib, json, sys
seen = []

class Spy:  # every import of an opentelemetry module, wherever it comes from
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == 'opentelemetry':
            seen.append(name)
        return None

sys.meta_path.insert(0, Spy())
from ledger.store import writelock
held_with = []
real = writelock.WriteLock.held

@contextlib.contextmanager
def held(self, *args, **kwargs):
    with real(self, *args, **kwargs) as got:
        held_with.append(sorted(m for m in sys.modules if m.startswith('opentelemetry')))
        yield got
        held_with.append(sorted(m for m in sys.modules if m.startswith('opentelemetry')))

writelock.WriteLock.held = held
from ledger.cli.main import cli
try:
    cli.main(sys.argv[1:], prog_name='ledger')
except SystemExit as stop:
    code = stop.code or 0
loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'opentelemetry')
print(json.dumps({'code': code, 'seen': seen, 'held': held_with, 'loaded': loaded}),
      file=sys.stderr)
"""


def _probe(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120,
        env={**clean, **(env or {})}, check=False,
    )  # fmt: skip
    found: dict[str, Any] = json.loads(result.stderr.strip().splitlines()[-1])
    return found


def test_r_otel_1_help_imports_no_opentelemetry() -> None:
    found = _probe("--help")
    assert found["code"] == 0
    assert found["seen"] == []
    assert found["loaded"] == []


@pytest.mark.parametrize("endpoint", [None, "http://127.0.0.1:9"])
def test_r_otel_1_reserve_and_the_write_lock_import_no_opentelemetry(
    home: Path, endpoint: str | None
) -> None:
    """Without the variable; and with it, too: the CLI's reserve is the in-process library,
    which never traces (its caller owns the spans)."""
    Ledger.open(home).close()  # an up-to-date database (creating one runs alembic)
    env = {} if endpoint is None else {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
    found = _probe("--home", str(home), "reserve", "job-1", "--model", "alpha/small", env=env)
    assert found["code"] == 0
    assert found["held"], "the reserve took the write lock"
    assert all(modules == [] for modules in found["held"])
    assert found["seen"] == []
    assert found["loaded"] == []


def test_r_otel_1_endpoint_without_the_extra_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ledger.telemetry.otel", None)  # as without the extra
    lines: list[str] = []
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    with telemetry.session(env, lines.append) as started:
        assert not started
        assert not telemetry.enabled()
    assert lines == [telemetry.MISSING_EXTRA]
    assert telemetry.dropped() == 0


def test_r_otel_1_no_endpoint_no_tracing() -> None:
    lines: list[str] = []
    with telemetry.session({"OTEL_SERVICE_NAME": "x"}, lines.append) as started:
        assert not started
        with telemetry.gateway_request({}, "/x") as traced:
            assert traced is telemetry.NOOP
    assert lines == []
