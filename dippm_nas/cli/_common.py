"""What the command groups share: table printing and argument parsing helpers."""

from __future__ import annotations

import argparse

from dippm_nas.errors import DippmError


def format_table(rows: list[list[str]], header: list[str]) -> str:
    """``rows`` under ``header`` as left-aligned text columns, with a rule under the header."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def parse_ints(text: str) -> list[int]:
    """``"1,8,32"`` as ``[1, 8, 32]``; anything else is one clear error."""
    try:
        return [int(v) for v in text.split(",") if v]
    except ValueError:
        raise DippmError(f"cannot read {text!r}: give integers separated by commas, e.g. 1,8,32.") from None


def inputs_of(args: argparse.Namespace) -> object:
    """The model's inputs as ``--input-shape`` or ``--input`` gave them (not both), in the form
    :func:`dippm_nas.predict` takes."""
    if args.input_shape and args.input:
        raise DippmError("give either --input-shape or --input, not both.")
    return args.input_shape or (";".join(args.input) if args.input else None)
