"""The ``dippm-nas`` command, one module per group of commands: ``predict``, ``mig`` and ``devices``
(:mod:`._predict`), ``manifest`` and ``measure`` (:mod:`._measure`), ``report`` (:mod:`._report`),
``dataset``, ``train`` and ``evaluate`` (:mod:`._training`).

Bad input prints one line, ``error: ...``, and exits with status 2; ``--json`` output is for scripts.
Each command imports what it needs when it runs, so ``--help`` and the harness stay light.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Sequence

from dippm_nas.cli import _measure, _predict, _report, _training
from dippm_nas.errors import DippmError

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: every group's subcommands under one parser."""
    parser = argparse.ArgumentParser(
        prog="dippm-nas",
        description="Predict inference latency, energy, GPU memory and MIG slice of a neural network "
                    "on an NVIDIA GPU, without the GPU.",
        epilog=_predict.EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (_predict, _measure, _report, _training):
        group.add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; the exit status: 0, or 2 after a one-line error."""
    args = build_parser().parse_args(argv)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TQDM_DISABLE", "1")
    try:
        return args.func(args)
    except DippmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE

