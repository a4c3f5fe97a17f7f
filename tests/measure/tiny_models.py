"""Factories the harness tests measure (``module:factory``)."""

import torch
from torch import nn


class _Tiny(nn.Module):
    def __init__(self, oom_from_batch: int | None = None):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.oom_from_batch = oom_from_batch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.oom_from_batch is not None and x.shape[0] >= self.oom_from_batch:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (simulated)")
        return torch.relu(self.conv(x)).mean()


def tiny() -> nn.Module:
    return _Tiny()


def tiny_oom_from_8() -> nn.Module:
    return _Tiny(oom_from_batch=8)
