"""Writing `catalog.json` into the state directory (R-CAT-1, R-CAT-4).

Invariant: the file on disk is always either the old complete catalog or the new complete one.
A write goes to a temporary file in the same directory, is fsynced, then atomically replaces the
target with os.replace; on any failure the temporary file is removed and the old file is untouched.
Only valid Catalog objects are written.
"""

from __future__ import annotations

from pathlib import Path

from ledger.atomic_file import write_atomic
from ledger.catalog import CATALOG_FILE, Catalog, dump_catalog
from ledger.errors import UsageError


class CatalogWriteError(UsageError):
    """catalog.json cannot be written to the state directory; the old file (if any) is unchanged"""


def catalog_path(home: Path) -> Path:
    """Where `catalog.json` lives in a state directory."""
    return home / CATALOG_FILE


def catalog_exists(home: Path) -> bool:
    """Whether the state directory already holds a catalog.json."""
    return catalog_path(home).exists()


def write_catalog(home: Path, catalog: Catalog) -> Path:
    """Atomically replace `catalog.json` in an existing state directory with this catalog."""
    target = catalog_path(home)
    data = dump_catalog(catalog).encode()
    try:
        write_atomic(target, data)
    except OSError as exc:
        raise CatalogWriteError from exc
    return target
