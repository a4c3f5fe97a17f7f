"""Precisions as PyTorch runs them: the TF32 flags and the autocast dtype each one means.

``fp32`` is PyTorch's defaults: cuDNN convolutions may use TF32 (``torch.backends.cudnn.allow_tf32``
is True) while matmuls do not (``torch.backends.cuda.matmul.allow_tf32`` is False). ``fp32-strict``
turns TF32 off everywhere, ``tf32`` on everywhere; ``fp16`` and ``bf16`` are ``torch.autocast`` with
PyTorch's default flags. A row records the flags it ran under, so a measurement says which units ran.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Precision:
    """One precision mode: the TF32 flags it sets and the dtype autocast runs in (None: no autocast).

    >>> PRECISION_MODES["fp32"].tf32_cudnn, PRECISION_MODES["fp32"].tf32_matmul
    (True, False)
    >>> PRECISION_MODES["bf16"].autocast_dtype
    torch.bfloat16
    """

    name: str
    tf32_matmul: bool
    tf32_cudnn: bool
    autocast_dtype: torch.dtype | None = None

    def flags(self) -> dict[str, bool]:
        """The flags as a row's columns."""
        return {"tf32_matmul": self.tf32_matmul, "tf32_cudnn": self.tf32_cudnn}


#: Every precision a manifest, a sweep or a row may name, in the order a campaign measures them.
PRECISION_MODES: dict[str, Precision] = {p.name: p for p in (
    Precision("fp32", tf32_matmul=False, tf32_cudnn=True),
    Precision("fp16", tf32_matmul=False, tf32_cudnn=True, autocast_dtype=torch.float16),
    Precision("bf16", tf32_matmul=False, tf32_cudnn=True, autocast_dtype=torch.bfloat16),
    Precision("fp32-strict", tf32_matmul=False, tf32_cudnn=False),
    Precision("tf32", tf32_matmul=True, tf32_cudnn=True),
)}
PRECISIONS = tuple(PRECISION_MODES)


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
    entered where the precision asks for it; yields the mode, whose flags a row records.

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
