"""Where dippm-nas keeps what it caches on disk for a user: read by the command line before anything heavy
is imported, so it imports nothing of the package."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_ENV = "DIPPM_NAS_CACHE_DIR"
NO_CACHE_ENV = "DIPPM_NAS_NO_CACHE"


def cache_dir() -> Path | None:
    """The directory the graph cache lives in, or None when ``DIPPM_NAS_NO_CACHE`` is set (to anything but
    ``0`` or an empty string)."""
    if os.environ.get(NO_CACHE_ENV, "").strip() not in ("", "0"):
        return None
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dippm-nas"
