"""``dippm-nas report``: a NAS study's Pareto fronts, table and history as one HTML page."""

from __future__ import annotations

import argparse
import os
import re

from dippm_nas.errors import DippmError, one_line
from dippm_nas.user_files import check_writable

#: SQLAlchemy's dialects, the first part of an Optuna RDB storage URL (``postgresql+psycopg://...``).
DIALECTS = ("sqlite", "postgresql", "mysql", "mariadb", "oracle", "mssql", "cockroachdb")
_URL = re.compile(r"^(?P<dialect>[A-Za-z][A-Za-z0-9_]*)(\+[A-Za-z0-9_]+)?://(?P<rest>.*)$")


def check_storage(url: str) -> str:
    """``url`` where it is an Optuna RDB storage URL whose database can exist, or a journal file that exists,
    else one clear error; a SQLite file must exist (Optuna would create an empty one and find no study in it).

    >>> check_storage("postgresql+psycopg://user:password@host/nas")
    'postgresql+psycopg://user:password@host/nas'
    """
    if "://" not in url:  # an Optuna journal file
        if not os.path.isfile(url):
            raise DippmError(f"--storage {url}: no such journal file; give the file a search wrote, or a database "
                             "URL such as sqlite:///nas.db.")
        if _starts_with(url, SQLITE_HEADER):
            raise DippmError(f"--storage {url} is a SQLite database, not a journal file; give it as "
                             f"sqlite:///{url}.")
        if not _first_line_is_json(url):
            raise DippmError(f"--storage {url} is not an Optuna journal file (one JSON object a line); give the "
                             "file a search wrote, or a database URL such as sqlite:///nas.db.")
        return url
    match = _URL.match(url)
    if not match or match["dialect"].lower() not in DIALECTS:
        raise DippmError(f"--storage {url}: not an Optuna storage URL; give one such as sqlite:///nas.db or "
                         "postgresql+psycopg://user:password@host/db (dialects: " + ", ".join(DIALECTS) + ").")
    if match["dialect"].lower() == "sqlite":
        path = match["rest"].removeprefix("/").split("?")[0]
        if path and path != ":memory:" and not os.path.isfile(path):
            raise DippmError(f"--storage {url}: no SQLite database at {path}; give the file the study was run "
                             "with (sqlite:///relative/path.db, or sqlite:////absolute/path.db).")
        if path and path != ":memory:" and not _starts_with(path, SQLITE_HEADER):
            # Optuna would write its tables into an empty file, or fail deep in SQLAlchemy on another kind
            kind = "empty" if os.path.getsize(path) == 0 else "not a SQLite database"
            raise DippmError(f"--storage {url}: {path} is {kind}; give the database the study was run with.")
    return url


#: The first bytes of every SQLite 3 database file.
SQLITE_HEADER = b"SQLite format 3\x00"


def _starts_with(path: str, header: bytes) -> bool:
    with open(path, "rb") as file:
        return file.read(len(header)) == header


def _first_line_is_json(path: str) -> bool:
    """Whether the journal file is empty (a search that has not written yet) or opens with a JSON object."""
    import json

    with open(path, "rb") as file:
        first = file.readline(1 << 20)
    if not first.strip():
        return True
    try:
        return isinstance(json.loads(first), dict)
    except ValueError:  # UnicodeDecodeError and JSONDecodeError alike
        return False


def check_outputs(out: str, png: str | None, screenshot: str | None = None) -> None:
    """``--out`` and ``--screenshot`` must be files that can be written and ``--png`` a folder files can be written
    into: one line where one is not, before anything is read or drawn."""
    if os.path.isdir(out):
        raise DippmError(f"--out {out} is a folder; give the HTML file to write, such as "
                         f"{os.path.join(out, 'report.html')}.")
    check_writable(out, "--out")
    if png is not None and (os.path.isfile(png) or os.path.abspath(png) == os.path.abspath(out)):
        raise DippmError(f"--png {png} is a file (or the --out page); give a folder to write the PNG files into.")
    if png is not None:
        check_writable(os.path.join(png, "pareto.png"), "a PNG file under --png")
    if screenshot is not None:
        check_writable(screenshot, "--screenshot")


def cmd_report(args: argparse.Namespace) -> int:
    """``dippm-nas report``: the outputs and the storage URL are checked before Optuna is imported, and a
    storage that cannot be opened or holds no such study is one line."""
    check_outputs(args.out, args.png, args.screenshot)
    check_storage(args.storage)
    import optuna

    from dippm_nas.integration.report import write_report
    from dippm_nas.integration.study import storage_named

    storage = storage_named(args.storage)
    try:
        study = optuna.load_study(study_name=args.study, storage=storage)
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
        raise DippmError(f"no study {args.study!r} in {args.storage}; "
                         f"studies there: {', '.join(names) or 'none'}.") from None
    except Exception as exc:  # SQLAlchemy and the database drivers raise their own types
        raise DippmError(f"cannot open the Optuna storage {args.storage}: {one_line(exc)}") from exc
    summary = write_report(study, args.out, args.png)
    print(f"{summary.path}: {summary.trials} scored trials, {summary.feasible} feasible, "
          f"{len(summary.pareto)} on the study's Pareto front" + (f"; PNGs in {args.png}" if args.png else ""))
    if args.screenshot:
        from dippm_nas.integration.browser import screenshot

        print(f"screenshot of the page: {screenshot(summary.path, args.screenshot)}")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``report``."""
    rp = sub.add_parser("report", help="a self-contained HTML report of a study: Pareto fronts, table, history")
    rp.add_argument("--storage", required=True,
                    help="Optuna storage URL (sqlite:///nas.db, postgresql://...) or journal file")
    rp.add_argument("--study", required=True, help="study name")
    rp.add_argument("--out", default="report.html", help="HTML file to write (default: report.html)")
    rp.add_argument("--png", default=None, metavar="DIR", help="also write the plots as PNG files into DIR")
    rp.add_argument("--screenshot", default=None, metavar="PNG",
                    help="also a screenshot of the page (headless Chromium)")
    rp.set_defaults(func=cmd_report)
