"""The ledger as a local service (`ledger serve`): a JSON API over one `Ledger`.

Needs the optional `serve` extra (FastAPI on uvicorn): `pip install 'ledger[serve]'`.
"""

from __future__ import annotations
