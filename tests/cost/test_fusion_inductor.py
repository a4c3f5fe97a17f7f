"""The fusion stage's kernels against Inductor's own: each small model is compiled on the CPU (``torch.compile``
builds C++ kernels there from the same scheduler that builds Triton kernels on a GPU), and the library calls and
generated kernels of its code, in order, are those the fusion stage groups the model's graph into."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_fusion import ResidualBlock
from torch import nn
from torch._inductor.utils import run_and_get_code

import dippm_nas
from dippm_nas.cost.pipeline.fusion import fusion
from dippm_nas.cost.pipeline.table import node_table

#: The ATen name under which Inductor names a kernel after each operator of our graphs (where it differs).
ATEN_NAME = {"batch_norm": "_native_batch_norm_legit_no_training", "layer_norm": "native_layer_norm",
             "multiply": "mul", "softmax": "_softmax", "layout_transform": "permute"}
#: Library calls: our kind and the calls Inductor's code makes for it.
LIBRARY = {"conv2d": ("convolution",), "matmul": ("addmm", "mm", "bmm"),
           "attention": ("_scaled_dot_product_flash_attention_for_cpu",)}
LIBRARY_ATEN = {name for names in LIBRARY.values() for name in names}


class TransformerBlock(nn.Module):
    """Pre-norm attention (fused SDPA) and MLP with residuals, as a ViT block."""

    def __init__(self, d: int = 64, heads: int = 4):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class ConvNeXtBlock(nn.Module):
    """Depthwise convolution, channels-last layer norm and MLP, layer scale, residual."""

    def __init__(self, d: int = 64):
        super().__init__()
        self.dw = nn.Conv2d(d, d, 7, padding=3, groups=d)
        self.ln = nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.gamma = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc2(F.gelu(self.fc1(self.ln(self.dw(x).permute(0, 2, 3, 1))))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class ExplicitAttention(nn.Module):
    """Attention written out: two batched products around a scaled softmax."""

    def __init__(self, d: int = 64):
        super().__init__()
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return x + self.proj((q @ k.transpose(-2, -1) * 0.125).softmax(dim=-1) @ v)


def inductors_kernels(model: nn.Module, x: torch.Tensor) -> list[tuple[str, str]]:
    """The kernels of Inductor's code for ``model``, in the order its wrapper calls them: ``("library", call)`` or
    ``("generated", the ATen names it is named after)``; kernels made only of the library calls' layout copies
    (a channels-last input or weight) are left out: the fusion stage prices those with the library call."""
    torch._dynamo.reset()
    with torch.no_grad():
        _, code = run_and_get_code(torch.compile(model), x)
    kernels = []
    for line in code[0].splitlines():
        generated = re.match(r"\s+cpp_fused_(\w+)_\d+\(", line)
        library = re.search(r"(?:extern_kernels\.|torch\.ops\.aten\.)(\w+)(?:\.default)?\(", line)
        if generated:
            if not re.fullmatch(f"(?:(?:{'|'.join(LIBRARY_ATEN)})_?)+", generated.group(1)):  # not a layout copy
                kernels.append(("generated", f"_{generated.group(1)}_"))
        elif library and library.group(1) in LIBRARY_ATEN:
            kernels.append(("library", library.group(1)))
    return kernels


def fusion_kernels(model: nn.Module, shape: tuple[int, ...], batch: int) -> list[tuple[str, list[str]]]:
    """The fusion stage's kernels of ``model``'s graph: ``("library", [kind])`` or ``("generated", kinds)``."""
    graph = dippm_nas.build_graph(model, shape, batch=batch)
    fused = fusion(node_table(graph))
    return [("library" if fused.library[fused.last[k]] else "generated",
             [graph.nodes[i].kind for i in np.flatnonzero(fused.kernel == k)]) for k in range(fused.kernels)]


@pytest.mark.parametrize("model, shape", [
    (ResidualBlock(), (64, 32, 32)),
    (TransformerBlock(), (50, 64)),
    (ConvNeXtBlock(), (64, 14, 14)),
    (ExplicitAttention(), (50, 64)),
], ids=["residual block", "transformer block", "convnext block", "explicit attention"])
def test_the_fusion_stage_launches_inductors_kernels(model, shape):
    """Kernel by kernel: each library call is the call Inductor makes, and each generated kernel is named after
    the operators the fusion stage puts in it."""
    model = model.eval()
    theirs = inductors_kernels(model, torch.randn(8, *shape))
    ours = fusion_kernels(model, shape, batch=8)
    assert [role for role, _ in ours] == [role for role, _ in theirs], (ours, theirs)
    for (role, kinds), (_, names) in zip(ours, theirs):
        if role == "library":
            assert names in LIBRARY[kinds[0]], (kinds, names)
        else:
            assert all(f"_{ATEN_NAME.get(kind, kind)}_" in names for kind in kinds), (kinds, names)
