"""Fail before downloading, not when the disk fills up halfway."""

from __future__ import annotations

import shutil
from pathlib import Path

from llmctl.errors import DiskSpaceError

HEADROOM = 64 << 20   # leave room for the index, logs and the OS


def free_bytes(path: Path) -> int:
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def check_space(where: Path, needed: int) -> None:
    free = free_bytes(where)
    if needed + HEADROOM > free:
        raise DiskSpaceError(f"not enough disk space in {where}: the pull needs "
                             f"{needed / 1e9:.2f} GB more, {free / 1e9:.2f} GB is free")
