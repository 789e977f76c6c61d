"""`ledger status`: the status document, its text and Prometheus forms, refusal and pool text."""
