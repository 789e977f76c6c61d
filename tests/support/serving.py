"""Start a real `ledger serve` in a subprocess for the service tests and benches.

Invariant: every service is started with `subprocess` exactly as an operator would run it, and is
stopped by its own pid (SIGTERM, then SIGKILL) when the test ends; the parent learns where it
listens from the one log line it prints.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from ledger.client import unix_transport

LISTENING = re.compile(r"listening on unix:(\S+)(?: and http://([\d.]+):(\d+))?")
START_TIMEOUT_S = 120.0  # a start-up on a loaded 2-core CI machine took over 60 s once


@dataclass
class Served:
    """A running service: its process, socket, TCP URL and token (when TCP was asked for)."""

    proc: subprocess.Popen[str]
    socket: Path
    url: str | None
    token: str | None
    log: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None

    def client(self, tcp: bool = False, timeout_s: float = 30.0) -> httpx.Client:
        """An httpx client on the socket (or TCP with the token)."""
        if tcp:
            assert self.url is not None
            return httpx.Client(
                base_url=self.url,
                headers={"authorization": f"Bearer {self.token}"},
                timeout=timeout_s,
            )
        return httpx.Client(
            base_url="http://ledger",
            transport=unix_transport(str(self.socket)),
            timeout=timeout_s,
        )

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        """Signal the service and wait for its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout=timeout_s)
        self.close()
        return code

    def close(self) -> None:
        """After the exit: the log reader has seen EOF; close the pipe."""
        if self.reader is not None:
            self.reader.join(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


def serve_argv(home: Path, *extra: str, db: str | None = None) -> list[str]:
    """The command line of `ledger serve` for a state directory."""
    argv = [sys.executable, "-m", "ledger", "--home", str(home)]
    if db is not None:
        argv += ["--db", db]
    return [*argv, "serve", *extra]


def start(
    home: Path, *extra: str, db: str | None = None, env: dict[str, str] | None = None
) -> Served:
    """Start `ledger serve` and wait for its listening line (raises if it exits first)."""
    proc = subprocess.Popen(
        serve_argv(home, *extra, db=db),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert proc.stderr is not None
    first = _first_line(proc)
    match = LISTENING.search(first)
    if match is None:
        proc.kill()
        proc.wait()
        proc.stderr.close()
        raise RuntimeError(f"ledger serve did not start: {first!r}")
    log = [first]
    reader = threading.Thread(target=_drain, args=(proc, log), daemon=True)
    reader.start()
    url = f"http://{match[2]}:{match[3]}" if match[2] else None
    token_file = home / "ledger.token"
    token = (env or {}).get("LEDGER_TOKEN") or (
        token_file.read_text().strip() if url and token_file.exists() else None
    )
    return Served(proc, Path(match[1]), url, token, log, reader)


def _first_line(proc: subprocess.Popen[str]) -> str:
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stderr.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(START_TIMEOUT_S)
    return box[0] if box else ""


def _drain(proc: subprocess.Popen[str], log: list[str]) -> None:
    assert proc.stderr is not None
    for line in proc.stderr:
        log.append(line)


@contextmanager
def running(
    home: Path, *extra: str, db: str | None = None, env: dict[str, str] | None = None
) -> Iterator[Served]:
    """A service for the length of a `with` block; killed by pid if it does not stop in time."""
    served = start(home, *extra, db=db, env=env)
    try:
        yield served
    finally:
        try:
            served.stop(timeout_s=20)
        except subprocess.TimeoutExpired:
            served.proc.kill()
            served.proc.wait()
            served.close()
