"""R-RES-9, R-SRV-7 (issue 29 item 18): `LedgerClient.evolve` mirrors `Ledger.evolve` through a real
`ledger serve`: an unknown source is `unknown source` (nothing created, no call spent), a known
one gets one override attempt; on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.client import LedgerClient
from ledger.errors import NotFoundError
from ledger.kinds import AttemptRole
from tests.support.backends import BACKENDS, db_url, rows
from tests.support.ledgers import LedgerFactory
from tests.support.serving import running

pytestmark = pytest.mark.parametrize("ledger_db", BACKENDS, indirect=True)


def test_r_res_9_client_evolve_of_an_unknown_source_is_unknown_source_like_the_library(
    home: Path, ledger_db: str | None, make_ledger: LedgerFactory
) -> None:
    url = db_url(home, ledger_db)
    library = make_ledger()
    with pytest.raises(NotFoundError) as by_library:
        library.evolve("typo", "alpha/small")
    library.close()
    with running(home) as served, LedgerClient(served.socket) as client:
        with pytest.raises(NotFoundError) as by_client:
            client.evolve("typo", "alpha/small")
        assert str(by_client.value) == str(by_library.value) == "unknown source"
        assert client.status()["hourly"]["used"] == 0  # no override call was spent
        assert rows(url, "SELECT id FROM sources") == []  # and no source was created
        client.add_source("known", "payload")
        granted = client.evolve("known", "alpha/small")
        assert granted.role is AttemptRole.OVERRIDE
        assert granted.source == "known"
    assert rows(url, "SELECT source_id, role FROM reservations") == [("known", "override")]
