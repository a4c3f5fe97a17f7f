"""Errors a user can act on.

Every error raised for bad input derives from :class:`DippmError`; the CLI prints its message as one
line and exits with status 2, so the message itself must say what was wrong and what to do next.
"""

from __future__ import annotations

import difflib
import math
import numbers
from collections.abc import Iterable


class DippmError(ValueError):
    """Bad input from the user: the message says what was wrong and what to do."""


class DippmWarning(RuntimeWarning):
    """A fault dippm-nas met and worked around (a cache it could not open, one it set aside as damaged): the
    answer stands, but the user should hear of it. The command line shows these, and no third-party warning."""


class UnknownDeviceError(DippmError, KeyError):
    """A device key the registry does not know; also a KeyError, so ``except KeyError`` catches it."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class UnknownModelError(DippmError):
    """A model name that no frontend recognises (not a timm name, file, ``module:factory`` or ``hf:`` type)."""


class ModelLoadError(DippmError):
    """The model was recognised but could not be read or built (a bad file, a failed import or conversion)."""


class InputSpecError(DippmError):
    """An input shape, dtype or batch size that cannot be used; the message shows the accepted form."""


class MissingExtraError(DippmError, ImportError):
    """A model needs a framework that is an optional extra of dippm-nas."""


class ExportError(DippmError):
    """The model could not be traced with the given inputs (wrong shape, unsupported control flow)."""


def is_finite_number(value: object) -> bool:
    """Whether ``value`` is a finite real number, the only kind a bound or a margin may be (``True`` is not one,
    although Python counts it an int; NaN would reach a comparison that is always false).

    >>> is_finite_number(2.5), is_finite_number(float("nan")), is_finite_number(True), is_finite_number("5")
    (True, False, False, False)
    """
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def one_line(exc: BaseException, limit: int = 300) -> str:
    """``TypeName: first line of the message``: enough to act on, short enough for a one-line error.

    >>> one_line(RuntimeError("shape mismatch")), one_line(ValueError())
    ('RuntimeError: shape mismatch', 'ValueError')
    """
    text = str(exc).splitlines()[0][:limit] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def suggest(name: str, known: Iterable[str], n: int = 5) -> str:
    """A 'did you mean' fragment for an error message, empty when nothing is close.

    >>> suggest("resnet5", ["resnet50", "vit_base"])
    ' Did you mean: resnet50?'
    """
    if not isinstance(name, str):  # a value of the wrong type is close to no name
        return ""
    close = difflib.get_close_matches(name, list(known), n=n, cutoff=0.6)
    return f" Did you mean: {', '.join(close)}?" if close else ""
