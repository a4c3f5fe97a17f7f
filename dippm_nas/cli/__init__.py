"""The ``dippm-nas`` command, one module per group of commands: ``predict``, ``mig`` and ``devices``
(:mod:`._predict`), ``manifest`` and ``measure`` (:mod:`._measure`), ``report`` (:mod:`._report`),
``dataset``, ``train`` and ``evaluate`` (:mod:`._training`), ``cache warm`` (:mod:`._cache`).

Bad input prints one line, ``error: ...``, on stderr and exits with status 2; with ``--json`` the same
message is also printed on stdout as ``{"error": "..."}``, for scripts. Arguments are checked before
anything heavy is imported (torch, TVM, timm), so a mistake is answered at once, and each command
imports what it needs when it runs, so ``--help`` and the harness stay light. An exception that is not
the user's (a bug) is one line too, with exit status 1; ``DIPPM_NAS_TRACEBACK=1`` shows its traceback.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import sys
import warnings
from collections.abc import Sequence
from typing import NoReturn

from dippm_nas.cli import _cache, _measure, _prediction, _report, _training
from dippm_nas.errors import DippmError, DippmWarning, one_line

EXIT_USAGE = 2
EXIT_BUG = 1
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports a writer whose reader closed the pipe
TRACEBACK_ENV = "DIPPM_NAS_TRACEBACK"


class UsageError(DippmError):
    """An argument the command line itself refuses (an unknown option, a value of the wrong type)."""


class _Parser(argparse.ArgumentParser):
    """argparse, except that a usage error raises :class:`UsageError` (one line, said by :func:`main`)
    instead of printing the usage and exiting; subcommands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`).")


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: every group's subcommands under one parser."""
    parser = _Parser(
        prog="dippm-nas",
        description="Predict inference latency, energy, GPU memory and MIG slice of a neural network "
                    "on an NVIDIA GPU, without the GPU.",
        epilog=_prediction.EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (_prediction, _measure, _report, _training, _cache):
        group.add_commands(sub)
    return parser


def one_line_message(text: str) -> str:
    """``text`` on one line: its lines joined by spaces.

    >>> one_line_message("no such file\\n  x.onnx")
    'no such file x.onnx'
    """
    return " ".join(text.split())


def fail(message: str, as_json: bool, code: int = EXIT_USAGE) -> int:
    """Say ``message`` as ``error: ...`` on stderr (and as ``{"error": ...}`` on stdout for ``--json``);
    returns the exit status ``code``."""
    message = one_line_message(message)
    if as_json:
        print(json.dumps({"error": message}))
    print(f"error: {message}", file=sys.stderr)
    return code


#: Commands that write nothing but their output (and committed rows of the graph cache): run as the
#: ``dippm-nas`` program, they end the process without Python's finalization (see :func:`exit_now`).
OUTPUT_ONLY_COMMANDS = frozenset({"predict", "mig", "devices"})


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; the exit status: 0, 2 after a one-line error in the input, 1 after a bug.

    Without ``argv`` (as the ``dippm-nas`` program and ``python -m dippm_nas.cli`` call it), ``sys.argv`` is
    read, and a command of :data:`OUTPUT_ONLY_COMMANDS`, or an input error, ends the process itself
    through :func:`exit_now` rather than returning; with ``argv`` it always returns.
    """
    as_program = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if as_program:
        look_in_working_directory()
    code = _run(argv)
    if as_program and (code == EXIT_USAGE or (argv and argv[0] in OUTPUT_ONLY_COMMANDS and code == 0)):
        exit_now(code)
    return code


def look_in_working_directory() -> None:
    """Let ``module:factory`` import a module of the working directory, as ``python -m`` does: an installed
    program's path holds its own folder, not the user's. Appended, so that a folder of the user's never hides
    an installed package of the same name."""
    working = os.getcwd()
    if working not in sys.path and "" not in sys.path:
        sys.path.append(working)


def exit_now(code: int) -> None:
    """End the process with ``code`` once the output is flushed and the ``atexit`` handlers have run, without
    Python's finalization: tearing down torch's and torch-geometric's modules takes about a second, a
    fifth of a prediction from the graph cache, and a command that only printed has nothing left to save
    (the graph cache's rows are committed as they are written)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            pass
    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)  # CPython's; elsewhere finalize normally
    if run_exit_handlers is None:
        sys.exit(code)
    run_exit_handlers()
    os._exit(code)


def hear_only_our_warnings() -> None:
    """Third-party warnings (TVM's, PyTorch's, timm's) are noise to a user of the command line; a fault of
    dippm-nas's own that it worked around (:class:`~dippm_nas.errors.DippmWarning`) is said in one line."""
    warnings.filterwarnings("ignore")
    warnings.filterwarnings("default", category=DippmWarning)
    warnings.showwarning = _say_warning


def _say_warning(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
    print(f"warning: {' '.join(str(message).split())}", file=sys.stderr, flush=True)


def _run(argv: list[str]) -> int:
    as_json = "--json" in argv
    try:
        args = build_parser().parse_args(argv)
        hear_only_our_warnings()
        os.environ.setdefault("TQDM_DISABLE", "1")
        return args.func(args)
    except DippmError as exc:
        return fail(str(exc), as_json)
    except KeyboardInterrupt:
        return fail("interrupted.", as_json, EXIT_INTERRUPTED)
    except BrokenPipeError:  # the reader went away (`dippm-nas predict ... | head`): nothing left to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so that the exit's flush is quiet
        return EXIT_BROKEN_PIPE
    except Exception as exc:  # a bug, not the user's input: still one line, with the way to its traceback
        if os.environ.get(TRACEBACK_ENV, "").strip() not in ("", "0"):
            raise
        return fail(f"internal error, {one_line(exc)}; this is a bug in dippm-nas: report it with the "
                    f"traceback that {TRACEBACK_ENV}=1 shows.", as_json, EXIT_BUG)
