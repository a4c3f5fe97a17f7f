"""Where the shipped learned model answers, read from its model card alone: no torch, no weights.

PMGNS reads a GPU through its spec sheet, so it answers for every GPU of the registry, the ones its
records never measured included (their notes say so, and cite its error on GPUs held out of training).
A precision its records never measured is read as the one that runs on the same units
(:data:`STAND_IN`); only where that one is missing too does a request go to the analytical model.
Deciding so needs only the card's lists: loading the network would cost the import of torch, seconds
of a command's start-up.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

#: Where the shipped weights (``pmgns.safetensors``) and their card (``pmgns.json``) live.
WEIGHTS = Path(__file__).resolve().parent / "weights"

#: The measured precision a precision without records of its own is read as: bf16 autocast runs on the
#: fp16 tensor cores at the same peak, and TF32 on or off everywhere differs from PyTorch's fp32 defaults
#: only in which operators the roofline prices on tensor cores. The network reads the stand-in; its
#: correction applies to the requested precision's own roofline.
STAND_IN = {"bf16": "fp16", "tf32": "fp32", "fp32-strict": "fp32"}


def weights_available(path: Path = WEIGHTS / "pmgns") -> bool:
    """Whether trained weights are at ``path``: both the ``.safetensors`` file and its ``.json`` card."""
    return path.with_suffix(".safetensors").exists() and path.with_suffix(".json").exists()


def no_weights(path: Path) -> str:
    """Why a learned model without weights at ``path`` answers nothing, and what to do."""
    return f"no trained PMGNS weights at {path}.safetensors (run `dippm-nas train`)"


@cache
def _trained_on(path: Path) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The card's devices and precisions, or None where no weights are shipped at ``path``."""
    if not weights_available(path):
        return None
    raw = json.loads(path.with_suffix(".json").read_text())
    return tuple(raw["devices"]), tuple(raw["precisions"])


def measured_gpus(path: Path = WEIGHTS / "pmgns") -> tuple[str, ...]:
    """The GPUs whose records the learned model at ``path`` was trained on; empty without weights."""
    trained = _trained_on(path)
    return trained[0] if trained else ()


def read_as(precision: str, trained: tuple[str, ...]) -> str | None:
    """The precision the network reads a request at ``precision`` as: itself where records measured it,
    else its :data:`STAND_IN` where records measured that, else None.

    >>> read_as("bf16", ("fp16", "fp32")), read_as("fp32", ("fp32",)), read_as("fp32", ("fp16",))
    ('fp16', 'fp32', None)
    """
    if precision in trained:
        return precision
    stand_in = STAND_IN.get(precision)
    return stand_in if stand_in in trained else None


def not_covered(precision: str, path: Path = WEIGHTS / "pmgns") -> str | None:
    """Why the learned model at ``path`` does not answer at ``precision``, or None where it does: wherever
    there are weights and ``precision`` or its stand-in was measured. It answers on every GPU then, since
    it reads the GPU's spec sheet.

    >>> not_covered("fp32") is None
    True
    """
    trained = _trained_on(path)
    if trained is None:
        return no_weights(path)
    _, precisions = trained
    if read_as(precision, precisions) is None:
        stand_in = f" (nor {STAND_IN[precision]}, which it would read it as)" if precision in STAND_IN else ""
        return f"PMGNS is trained for {', '.join(precisions)}, not {precision}{stand_in}"
    return None
