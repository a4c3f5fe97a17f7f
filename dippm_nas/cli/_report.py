"""``dippm-nas report``: a NAS study's Pareto fronts, table and history as one HTML page."""

from __future__ import annotations

import argparse

from dippm_nas.errors import DippmError


def cmd_report(args: argparse.Namespace) -> int:
    import optuna

    from dippm_nas.integration.report import write_report

    try:
        study = optuna.load_study(study_name=args.study, storage=args.storage)
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(args.storage)]
        raise DippmError(f"no study {args.study!r} in {args.storage}; "
                         f"studies there: {', '.join(names) or 'none'}.") from None
    summary = write_report(study, args.out, args.png)
    print(f"{summary.path}: {summary.trials} scored trials, {summary.feasible} feasible, "
          f"{len(summary.pareto)} on a Pareto front" + (f"; PNGs in {args.png}" if args.png else ""))
    if args.screenshot:
        from dippm_nas.integration.browser import screenshot

        print(f"screenshot of the page: {screenshot(summary.path, args.screenshot)}")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``report``."""
    rp = sub.add_parser("report", help="a self-contained HTML report of a study: Pareto fronts, table, history")
    rp.add_argument("--storage", required=True, help="Optuna storage URL, e.g. sqlite:///nas.db or postgresql://...")
    rp.add_argument("--study", required=True, help="study name")
    rp.add_argument("--out", default="report.html", help="HTML file to write (default: report.html)")
    rp.add_argument("--png", default=None, metavar="DIR", help="also write the plots as PNG files into DIR")
    rp.add_argument("--screenshot", default=None, metavar="PNG",
                    help="also a screenshot of the page (headless Chromium)")
    rp.set_defaults(func=cmd_report)
