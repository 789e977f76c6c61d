"""R-DIAG-1 in the status document and every rendering of it (text, --json, Prometheus, the page):
the last hour's refusals by reason, scope and gateway key, and a scope at its limit marked full.
The document is built by the library over a real migrated ledger."""

from __future__ import annotations

import re
from collections import Counter

from prometheus_client.parser import text_string_to_metric_families

from ledger.page import render_page
from ledger.status.document import build_status, render_prometheus, render_text
from ledger.store.refusal_counts import MINUTE_MS, RefusalKey, add_counts
from tests.support.ledgers import T0, LedgerFactory

POLICY = {"callsPerHour": 100, "scopes": {"team-a": {"callsPerHour": 1}, "team-b": {}}}
COUNTS = Counter({
    RefusalKey(T0 - T0 % MINUTE_MS, "scope_hourly_budget", "team-a", "batch-key"): 1234,
    RefusalKey(T0 - T0 % MINUTE_MS - MINUTE_MS, "model_cooldown"): 3,
})  # fmt: skip


def _doc(make_ledger: LedgerFactory) -> dict[str, object]:
    ledger = make_ledger(**POLICY)
    ledger.reserve("s1", "alpha/small", scopes=("team-a",))  # team-a's one call this hour
    with ledger.db.write() as txn:
        add_counts(txn.conn, txn.now, COUNTS)
    return build_status(ledger)


def test_r_diag_1_refusals_the_document_has_the_last_hours_refusals_and_full_scopes(
    make_ledger: LedgerFactory,
) -> None:
    doc = _doc(make_ledger)
    assert doc["refusals"] == {
        "window_minutes": 60,
        "total": 1237,
        "by": [
            {"reason": "scope_hourly_budget", "scope": "team-a", "key": "batch-key",
             "count": 1234, "last_minute": "2027-01-15T08:00:00.000Z"},
            {"reason": "model_cooldown", "scope": None, "key": None, "count": 3,
             "last_minute": "2027-01-15T07:59:00.000Z"},
        ],
    }  # fmt: skip
    full = {s["name"]: s["full"] for s in doc["scopes"]}  # type: ignore[attr-defined]
    assert full == {"team-a": ["hourly"], "team-b": []}


def test_r_diag_1_refusals_text_shows_refusals_by_reason_scope_and_key_and_a_full_scope(
    make_ledger: LedgerFactory,
) -> None:
    text = render_text(_doc(make_ledger))
    assert "── refusals (last hour: 1,237) " in text
    row = next(line for line in text.splitlines() if "scope_hourly_budget" in line)
    assert re.search(r"scope_hourly_budget\s+team-a\s+batch-key\s+1,234\s+01-15 08:00:00", row)
    assert re.search(r"model_cooldown\s+-\s+-\s+3", text)
    assert "scope team-a FULL (hourly): calls 1 / 1 this hour" in text
    assert "scope team-b: " in text  # not full: no mark


def test_r_diag_1_refusals_prometheus_labels_refusals_and_full_scopes(
    make_ledger: LedgerFactory,
) -> None:
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(render_prometheus(_doc(make_ledger)))
        for s in family.samples
    }
    key = (("key", "batch-key"), ("reason", "scope_hourly_budget"), ("scope", "team-a"))
    assert samples[("ledger_refusals_1h", key)] == 1234
    assert samples[("ledger_refusals_1h", (("key", ""), ("reason", "model_cooldown"),
                                           ("scope", "")))] == 3  # fmt: skip
    assert samples[("ledger_scope_full", (("limit", "hourly"), ("scope", "team-a")))] == 1
    assert not any(name == "ledger_scope_full" and dict(labels)["scope"] == "team-b"
                   for name, labels in samples)  # team-b sets no limit  # fmt: skip


def test_r_diag_1_refusals_the_page_lists_refusals_and_marks_a_full_scope(
    make_ledger: LedgerFactory,
) -> None:
    page = render_page(_doc(make_ledger))
    section = page[page.index('<section id="refusals"'):]
    section = section[: section.index("</section>")]
    assert "<strong>1237</strong> request(s) refused" in section
    assert '<tr data-refusal="scope_hourly_budget">' in section
    assert "<code>team-a</code>" in section
    assert "<code>batch-key</code>" in section
    assert '<tr data-scope="team-a" class="full">' in page
    assert '<span class="tag full" title="its next request is refused">full: hourly</span>' in page
    assert '<tr data-scope="team-b">' in page
