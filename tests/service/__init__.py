"""`ledger serve` (R-SRV): the JSON API, its client, its trust boundary, lifecycle and page."""
