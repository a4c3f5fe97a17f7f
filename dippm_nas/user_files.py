"""Files a user names: read as text, or written, with one clear line for each way they go wrong.

A user's CSV may be saved by a spreadsheet (a UTF-8 byte-order mark, or another encoding), a path may name a
folder or a place no file can be made; each is said with the file's name and what to do, before any work
that the fault would waste, and never as a fault of dippm-nas.
"""

from __future__ import annotations

import csv
import io
import tempfile
from pathlib import Path

from dippm_nas.errors import DippmError


def read_user_text(path: str | Path, what: str) -> str:
    """The text of the user's file ``path`` (``what`` names it in an error: "the measurements file"), read as
    UTF-8 with or without a byte-order mark; a folder, an unreadable file or another encoding is a DippmError."""
    file = Path(path)
    if file.is_dir():
        raise DippmError(f"{what} {path} is a folder; give the file.")
    try:
        return file.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DippmError(f"{what} {path} is not UTF-8 text (byte {exc.start} is {exc.object[exc.start]:#04x}): "
                         "save it as UTF-8 (a spreadsheet's 'CSV UTF-8') and give it again.") from None
    except OSError as exc:
        raise DippmError(f"cannot read {what} {path}: {exc.strerror or exc}.") from None


def read_user_csv(path: str | Path, what: str) -> csv.DictReader:
    """The rows of the user's CSV file ``path`` as :class:`csv.DictReader` reads them, the file read by
    :func:`read_user_text`."""
    return csv.DictReader(io.StringIO(read_user_text(path, what), newline=""))


def check_writable(path: str | Path, what: str) -> Path:
    """``path`` where a file can be written or appended to, else a DippmError that says why: a folder, a file
    that may not be written, or a folder where no file can be made. Nothing is written: an existing file is
    opened for appending and closed, a new one is tried as a temporary file in the nearest folder that exists
    (the missing ones are made when the file is written)."""
    file = Path(path)
    if file.is_dir():
        raise DippmError(f"{what} {path} is a folder; give the path of a file in it.")
    try:
        if file.exists():
            with file.open("a"):
                pass
        else:
            folder = next(p for p in file.absolute().parents if p.exists())
            if not folder.is_dir():
                raise DippmError(f"{what} {path}: {folder} is a file, not a folder; give a path in a folder.")
            with tempfile.TemporaryFile(dir=folder):
                pass
    except OSError as exc:
        raise DippmError(f"cannot write {what} {path}: {exc.strerror or exc}; give a path in a folder you may "
                         "write to.") from None
    return file
