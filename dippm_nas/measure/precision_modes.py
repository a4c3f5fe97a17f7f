"""Precisions as the harness runs them: the TF32 flags, the autocast dtype and the dtype the model's weights
are cast to of each row of the precision table (:mod:`dippm_nas.precisions`), as torch objects.

A row records the flags it ran under, so a measurement says which units ran.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from dippm_nas.precisions import DEFAULT_PRECISION
from dippm_nas.precisions import PRECISIONS as TABLE


@dataclass(frozen=True)
class Precision:
    """One precision mode: the TF32 flags it sets, the dtype autocast runs in (None: no autocast) and the dtype
    the model is cast to, its inputs with it (None: float32, as built).

    >>> PRECISION_MODES["fp32"].tf32_cudnn, PRECISION_MODES["fp32"].tf32_matmul
    (True, False)
    >>> PRECISION_MODES["bf16"].autocast_dtype, PRECISION_MODES["fp16-weights"].weights_dtype
    (torch.bfloat16, torch.float16)
    """

    name: str
    tf32_matmul: bool
    tf32_cudnn: bool
    autocast_dtype: torch.dtype | None = None
    weights_dtype: torch.dtype | None = None

    def flags(self) -> dict[str, bool]:
        """The flags as a row's columns."""
        return TABLE[self.name].flags()

    @property
    def input_dtype(self) -> torch.dtype:
        """The dtype of a model's floating inputs: its weights', float32 where they stay as built."""
        return self.weights_dtype or torch.float32


def _torch_dtype(name: str | None) -> torch.dtype | None:
    return getattr(torch, name) if name else None


#: Every precision a manifest, a sweep or a row may name, in the order a campaign measures them: PyTorch's
#: defaults and the half precisions first (autocast, then half weights), then the other variants of float32.
PRECISIONS = tuple(sorted(TABLE, key=lambda name: (name != DEFAULT_PRECISION, not TABLE[name].autocast,
                                                   not TABLE[name].weights_dtype)))
PRECISION_MODES: dict[str, Precision] = {
    name: Precision(name, TABLE[name].tf32_matmul, TABLE[name].tf32_cudnn, _torch_dtype(TABLE[name].autocast_dtype),
                    _torch_dtype(TABLE[name].weights_dtype))
    for name in PRECISIONS
}


def precision_mode(name: str) -> Precision:
    """The mode called ``name``; an unknown name raises ValueError listing the known ones.

    >>> precision_mode("tf32").tf32_matmul
    True
    """
    if name not in PRECISION_MODES:
        raise ValueError(f"precision {name!r} is not one of {PRECISIONS}")
    return PRECISION_MODES[name]


@contextlib.contextmanager
def running_in(name: str, device_kind: str) -> Iterator[Precision]:
    """Run the block under precision ``name``: its TF32 flags set (and restored after) and autocast
    entered where the precision asks for it; yields the mode, whose flags a row records. A precision of half
    weights enters no autocast: the model and its inputs are cast before (``weights_dtype``).

    >>> with running_in("fp32-strict", "cpu") as mode:
    ...     torch.backends.cudnn.allow_tf32
    False
    >>> torch.backends.cudnn.allow_tf32  # restored
    True
    """
    mode = precision_mode(name)
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = mode.tf32_matmul, mode.tf32_cudnn
    autocast = (torch.autocast(device_kind, dtype=mode.autocast_dtype) if mode.autocast_dtype is not None
                else contextlib.nullcontext())
    try:
        with autocast:
            yield mode
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
