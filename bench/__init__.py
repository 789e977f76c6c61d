"""Benchmark harness for the ledger (issue 9): every figure is a ratio measured side by side.

Invariant: speed targets live here, never in timed tests; scratch databases live in a temporary
directory (or the git-ignored bench/scratch/) and are never committed.
"""
