"""Durable changes on the node's own disk: the one place that syncs a directory after a rename."""

from __future__ import annotations

import os

__all__ = ["fsync_dir"]


def fsync_dir(path: str | os.PathLike[str], *, best_effort: bool = False) -> None:
    """Make the renames and creations in a directory durable (blocking).

    With `best_effort`, a platform or filesystem that cannot open or sync a directory is not an error:
    for files whose loss on a crash is an inconvenience, not lost data.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        if best_effort:
            return
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not best_effort:
            raise
    finally:
        os.close(fd)
