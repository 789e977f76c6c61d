"""R-TOK-4 on the worker's calls: the token limits a provider reports on the answer a handler's
`job.call` got are settled with the attempt (in process, and through `ledger serve` over
`/v1/settle`), so the next reservation that does not fit is refused before the provider's 429.

p1/m1's reply allowance is 1024 tokens (its maxOutputTokens): 1,428 input bytes (476 tokens)
make an estimate of 1,500 tokens."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ledger.errors import Refused
from ledger.kinds import RefusalReason
from ledger.standin.server import Scripted, StandIn
from ledger.worker.queue import ItemOutcome
from tests.support.queue_setup import (
    ROOT,
    cli_env,
    db_rows,
    one_item,
    open_ledger,
    standin_home,
    worker_argv,
)
from tests.support.serving import running

SIZE = 1428  # 476 input tokens + 1,024 reply tokens = 1,500
HEARD = Scripted(text='{"ok": true}', tokens_remaining=1200, tokens_reset_s=20)


def _refused_until_reset(home: Path) -> None:
    """The library, in this process, is refused what the answer left no room for."""
    led = open_ledger(home)
    try:
        ((remaining, read_at, reset),) = db_rows(
            home, "SELECT remaining, read_at_ms, reset_ms FROM learned_limits"
            " WHERE provider = 'p1' AND model_id = 'm1' AND kind = 'tokens'")
        assert remaining == 1200
        assert 19_000 <= reset - read_at <= 21_000  # never read after the settle: a ms apart
        with pytest.raises(Refused) as info:
            led.reserve("next", "p1/m1", input_bytes=SIZE)
        assert info.value.reason == RefusalReason.PROVIDER_TOKENS_EXHAUSTED
        assert info.value.retry_at_ms == reset
        assert led.reserve("small", "p1/m1", input_bytes=3).estimate_tokens == 1025  # fits
    finally:
        led.close()


def test_r_tok_4_the_worker_settles_what_its_call_heard(tmp_path: Path) -> None:
    with StandIn(default=Scripted(text='{"ok": true}')) as standin:
        standin.set_script("m1", [HEARD])
        home = standin_home(tmp_path / "home", standin)
        led = open_ledger(home)
        report = one_item(led, "s")
        led.close()
        assert report.outcome is ItemOutcome.DONE
        _refused_until_reset(home)


def test_r_tok_4_a_failed_call_is_heard_too(tmp_path: Path) -> None:
    with StandIn(default=Scripted(text='{"ok": true}')) as standin:
        standin.set_script("m1", [Scripted(status=529, tokens_remaining=0, tokens_reset_s=30)])
        home = standin_home(tmp_path / "home", standin)
        led = open_ledger(home)
        one_item(led, "s")
        led.close()
    assert db_rows(home, "SELECT kind, remaining FROM learned_limits"
                   " WHERE model_id = 'm1'") == [("tokens", 0)]  # fmt: skip


def test_r_tok_4_a_worker_through_the_service_settles_them_over_v1(tmp_path: Path) -> None:
    with StandIn(default=Scripted(text='{"ok": true}')) as standin:
        standin.set_script("m1", [HEARD])
        home = standin_home(tmp_path / "home", standin)
        led = open_ledger(home)
        led.add_source("s", "p")
        led.close()
        env = cli_env()
        with running(home, env=env) as served:
            argv = worker_argv(home, "--once", "--json", "--server", str(served.socket))
            done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, timeout=120,
                                  check=False)
            assert done.returncode == 0, done.stderr.decode()
            assert json.loads(done.stdout)["done"] == 1
            _refused_until_reset(home)


def test_r_tok_4_learn_limits_false_learns_nothing(tmp_path: Path) -> None:
    with StandIn(default=Scripted(text='{"ok": true}')) as standin:
        standin.set_script("m1", [HEARD])
        home = standin_home(tmp_path / "home", standin, learnLimits=False)
        led = open_ledger(home)
        one_item(led, "s")
        led.reserve("next", "p1/m1", input_bytes=SIZE)
        led.close()
    assert db_rows(home, "SELECT count(*) FROM learned_limits") == [(0,)]
