"""LiteLLM's proxy as a subprocess for the `gateway` figure: no database, loopback only.

A bench-only tool, never a dependency of ledger, and never installed into the project's own
environment (whose packages must equal constraints.txt): install it in a venv of its own and put
that venv's `bin` at the end of PATH for the bench run, as `INSTALL` below says:

    python -m venv /tmp/llvenv && /tmp/llvenv/bin/pip install 'litellm[proxy]' 'click<8.5'
    PATH=$PATH:/tmp/llvenv/bin python -m bench --only gateway

`available()` says whether the `litellm` command is on PATH (its script runs on its own venv's
Python); the proxy starts without the bench's PYTHONPATH, so a worktree's packages never shadow
its own, and is always stopped when the `with` block ends.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

INSTALL = (
    "python -m venv /tmp/llvenv && /tmp/llvenv/bin/pip install 'litellm[proxy]' 'click<8.5', "
    "then run the bench with PATH=$PATH:/tmp/llvenv/bin"
)
"""How to install it: a venv of its own, never the project's environment."""
READY_TIMEOUT_S = 240.0  # importing litellm and starting uvicorn is slow on a loaded machine
STOP_TIMEOUT_S = 20.0
DUMMY_KEY = "sk-bench-dummy"  # the stand-in ignores it; LiteLLM's OpenAI client wants one
# LiteLLM refuses to start without a master key; with one (and no database) it checks the bearer
# token of every call, as `ledger serve` does
MASTER_KEY = "sk-bench-master"


class ProxyError(RuntimeError):
    """The proxy did not start or answer; the message is one line for the results table."""


def available() -> str | None:
    """Path of the `litellm` command, or None when `litellm[proxy]` is not installed."""
    return shutil.which("litellm")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(model_name: str, model_id: str, api_base: str) -> dict[str, object]:
    # JSON is YAML: LiteLLM reads this as its config file
    return {
        "model_list": [
            {
                "model_name": model_name,
                "litellm_params": {
                    "model": f"openai/{model_id}",
                    "api_base": api_base,
                    "api_key": DUMMY_KEY,
                },
            }
        ],
        "litellm_settings": {"num_retries": 0, "request_timeout": 60, "telemetry": False},
        "general_settings": {"master_key": MASTER_KEY},
    }


def _last_line(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:200] if lines else "no output"


@contextmanager
def litellm_proxy(workdir: Path, model_name: str, model_id: str, api_base: str) -> Iterator[str]:
    """The base URL of a running LiteLLM proxy routing `model_name` to `api_base`; callers
    send `Authorization: Bearer MASTER_KEY`."""
    exe = available()
    if exe is None:
        raise ProxyError(f"litellm[proxy] is not installed ({INSTALL})")
    config = workdir / "litellm-config.yaml"
    config.write_text(json.dumps(_config(model_name, model_id, api_base)))
    log_path = workdir / "litellm.log"
    port = _free_port()
    env = {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of the price map over the network
        "LITELLM_TELEMETRY": "False",
        "NO_DOCS": "True",
    }
    for name in ("DATABASE_URL", "LITELLM_MASTER_KEY"):  # no database, no key: a bare proxy
        env.pop(name, None)
    env.pop("PYTHONPATH", None)  # the proxy runs on its own venv's packages alone
    command = [exe, "--config", str(config), "--port", str(port), "--host", "127.0.0.1"]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir,
            start_new_session=True,
        )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_ready(proc, url, log_path)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    with httpx.Client(timeout=5) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ProxyError(f"litellm exited ({proc.returncode}): {_last_line(log)}")
            try:
                if client.get(url + "/health/liveliness").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
    raise ProxyError(f"litellm did not answer within {READY_TIMEOUT_S:.0f} s: {_last_line(log)}")
