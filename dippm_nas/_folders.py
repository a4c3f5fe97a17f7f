"""Folders made for the files a user asks for: made only where the user named a file inside one, and said."""

from __future__ import annotations

import warnings
from pathlib import Path

from dippm_nas.errors import DippmWarning


def make_parent(path: str | Path, what: str) -> None:
    """Make the folder ``path`` goes in where it does not exist yet, and say so: :func:`make_folder`."""
    make_folder(Path(path).parent, f"{what} {path}")


def make_folder(folder: str | Path, what: str) -> None:
    """Make ``folder`` for ``what`` where it does not exist yet, and say so (a :class:`DippmWarning`): a
    mistyped folder then shows at once instead of a tree of empty folders somewhere unexpected."""
    folder = Path(folder)
    if folder.is_dir():
        return
    folder.mkdir(parents=True, exist_ok=True)
    warnings.warn(f"made the folder {folder} for {what}", DippmWarning, stacklevel=3)
