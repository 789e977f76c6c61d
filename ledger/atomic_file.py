"""Whole-file writes: the target is always either the old complete file or the new complete one.

A write goes to a temporary file in the target's directory, is fsynced, then replaces the target
with os.replace; on any failure the temporary file is removed, the old file is untouched and the
OSError propagates.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomic(target: Path, data: bytes, mode: int | None = None) -> None:
    """Replace `target` with `data` atomically (`mode`: the new file's permissions)."""
    fd, temp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(temp_name, mode)
        os.replace(temp_name, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp_name)
        raise
    fsync_dir(target.parent)


def fsync_dir(path: Path) -> None:
    """Make a rename durable where the platform allows fsync on a directory."""
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
