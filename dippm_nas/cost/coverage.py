"""Where the shipped learned model answers, read from its model card alone: no torch, no weights.

PMGNS reads a GPU through its spec sheet, so it answers for every GPU of the registry, the ones its
records never measured included (their notes say so, and cite its error on GPUs held out of training).
A precision its records never measured is read as the one that runs on the same units (its stand-in in
the precision table, :mod:`dippm_nas.precisions`); only where that one is missing too does a request go
to the analytical model.
Deciding so needs only the card (its lists and its vocabulary, :mod:`dippm_nas.cost.card`): loading the
network would cost the import of torch, seconds of a command's start-up.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from dippm_nas.cost.card import WEIGHTS, read_card, vocabulary_mismatch
from dippm_nas.precisions import PRECISIONS


def weights_available(path: Path = WEIGHTS / "pmgns") -> bool:
    """Whether trained weights are at ``path``: both the ``.safetensors`` file and its ``.json`` card."""
    return path.with_suffix(".safetensors").exists() and path.with_suffix(".json").exists()


def no_weights(path: Path) -> str:
    """Why a learned model without weights at ``path`` answers nothing, and what to do."""
    return f"no trained PMGNS weights at {path}.safetensors (run `dippm-nas train`)"


@cache
def raw_card(path: Path) -> dict | None:
    """The card's JSON as written, or None where no weights are shipped at ``path``."""
    return read_card(path) if weights_available(path) else None


def measured_gpus(path: Path = WEIGHTS / "pmgns") -> tuple[str, ...]:
    """The GPUs whose records the learned model at ``path`` was trained on; empty without weights."""
    raw = raw_card(path)
    return tuple(raw["devices"]) if raw else ()


def operator_model_gpus() -> tuple[str, ...]:
    """The GPUs whose operators or whole-model records the shipped operator model was trained on, from its card
    alone; empty without one."""
    from dippm_nas.cost.card import OPERATOR_WEIGHTS

    if not OPERATOR_WEIGHTS.with_suffix(".json").exists():
        return ()
    card = read_card(OPERATOR_WEIGHTS)
    return tuple(sorted({*card.get("trained_on", {}), *card.get("records", {})}))


def read_as(precision: str, trained: tuple[str, ...]) -> str | None:
    """The precision the network reads a request at ``precision`` as: itself where records measured it,
    else its stand-in where records measured that, else None. The network reads the stand-in; its
    correction applies to the requested precision's own roofline.

    >>> read_as("bf16", ("fp16", "fp32")), read_as("fp32", ("fp32",)), read_as("fp32", ("fp16",))
    ('fp16', 'fp32', None)
    """
    if precision in trained:
        return precision
    stand_in = PRECISIONS[precision].stand_in
    return stand_in if stand_in in trained else None


def not_covered(precision: str, path: Path = WEIGHTS / "pmgns") -> str | None:
    """Why the learned model at ``path`` does not answer at ``precision``, or None where it does: wherever
    there are weights trained with this version's operator vocabulary and ``precision`` or its stand-in was
    measured. It answers on every GPU then, since it reads the GPU's spec sheet.

    >>> not_covered("fp32") is None
    True
    """
    raw = raw_card(path)
    if raw is None:
        return no_weights(path)
    mismatch = vocabulary_mismatch(raw)
    if mismatch:
        return mismatch
    precisions = tuple(raw["precisions"])
    if read_as(precision, precisions) is None:
        stand_in = PRECISIONS[precision].stand_in
        stand_in = f" (nor {stand_in}, which it would read it as)" if stand_in else ""
        return f"PMGNS is trained for {', '.join(precisions)}, not {precision}{stand_in}"
    return None
