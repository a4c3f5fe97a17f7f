"""Where the shipped learned model answers, read from its model card alone: no torch, no weights.

Deciding that a request goes to the analytical model (a GPU or precision PMGNS was not trained on,
the default A100 at fp32 among them) needs only the card's lists; loading the network for that would
cost the import of torch and torch-geometric, seconds of a command's start-up.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from dippm_nas.hardware.registry import Device

#: Where the shipped weights (``pmgns.safetensors``) and their card (``pmgns.json``) live.
WEIGHTS = Path(__file__).resolve().parent / "weights"


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


def not_covered(device: Device, precision: str, path: Path = WEIGHTS / "pmgns") -> str | None:
    """Why the learned model at ``path`` does not answer for ``device`` at ``precision``, or None where
    it does. A MIG slice is covered where its whole GPU is.

    >>> from dippm_nas.hardware import get_device
    >>> not_covered(get_device("a100-40gb"), "fp32").startswith("PMGNS is trained on")
    True
    """
    trained = _trained_on(path)
    if trained is None:
        return no_weights(path)
    devices, precisions = trained
    gpu = device.key.split(":")[0] if device.slice_of else device.key
    if gpu not in devices:
        return f"PMGNS is trained on {', '.join(devices)}, not {gpu}"
    if precision not in precisions:
        return f"PMGNS is trained for {', '.join(precisions)}, not {precision}"
    return None
