"""`ledger simulate` and `trace export` (R-SIM): virtual time over the real code."""
