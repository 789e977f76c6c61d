"""Writing `catalog.json` into the state directory (R-CAT-1, R-CAT-4).

Invariant: the file on disk is always either the old complete catalog or the new complete one.
A write goes to a temporary file in the same directory, is fsynced, then atomically replaces the
target with os.replace; on any failure the temporary file is removed and the old file is untouched.
Only valid Catalog objects are written.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

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
        fd, temp_name = tempfile.mkstemp(prefix=".catalog.", suffix=".tmp", dir=home)
    except OSError as exc:
        raise CatalogWriteError from exc
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp_name, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp_name)
        raise CatalogWriteError from exc
    _fsync_dir(home)
    return target


def _fsync_dir(path: Path) -> None:
    """Make the rename durable where the platform allows fsync on a directory."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
