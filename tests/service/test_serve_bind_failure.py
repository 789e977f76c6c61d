"""R-SRV-1: a `ledger serve --listen` whose address cannot be bound (the port in use) fails with
one line and exit 2, and leaves the state directory exactly as it was: no `ledger.db`, journal,
write lock, service lock, socket or token appears.

Before: the address was bound last, after the ledger had created its database, its locks and a
new token, so a failed start left all of them behind."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.ledgers import TEST_CATALOG
from tests.support.serving import serve_argv


@pytest.fixture
def port_in_use() -> Iterator[int]:
    """A loopback port this test holds bound and listening."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        yield int(held.getsockname()[1])


def _snapshot(root: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every path under `root` with its mode and (for a file) its bytes."""
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): (p.stat().st_mode, p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
    }


@pytest.mark.parametrize("existing", [True, False], ids=["existing-home", "no-home-yet"])
def test_r_srv_1_a_port_in_use_leaves_the_state_directory_as_it_was(
    tmp_path: Path, port_in_use: int, existing: bool
) -> None:
    home = tmp_path / "state"
    if existing:
        home.mkdir(mode=0o700)
        (home / "catalog.json").write_text(json.dumps(TEST_CATALOG))
    before = _snapshot(tmp_path)
    ran = subprocess.run(
        serve_argv(home, "--listen", f"127.0.0.1:{port_in_use}"),
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert ran.returncode == 2, ran.stderr
    assert "cannot be bound" in ran.stderr
    assert len(ran.stderr.strip().splitlines()) == 1, ran.stderr
    assert _snapshot(tmp_path) == before
