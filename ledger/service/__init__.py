"""The ledger as a local service (`ledger serve`): a JSON API over one `Ledger`.

Needs the optional `serve` extra (FastAPI on uvicorn): `python -m pip install -e '.[serve]'`
in a checkout.
"""

from __future__ import annotations
