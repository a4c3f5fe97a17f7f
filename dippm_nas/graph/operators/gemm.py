"""Matrix products: ``matmul`` (batched over leading dimensions), ``linear`` and ``einsum``, as cuBLAS runs them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from dippm_nas.graph import eager_layout
from dippm_nas.graph.operators import _rules
from dippm_nas.graph.operators._registry import AUTOCAST_LOWER, Node, declare_category, register
from dippm_nas.graph.tensor import Shape, Tensor

if TYPE_CHECKING:
    import torch


GEMM = declare_category("matmul", counts_macs=True, library="cublas", autocast=AUTOCAST_LOWER, takes_bias=True,
                       noun="matmul", kernel="gemm")


def _matmul(args: list[Tensor], outs: list[Tensor], attrs: Mapping[str, object]) -> int:
    """``[..., M, K] @ [..., K, N]``: ``2 * numel(out) * K``."""
    k = args[0].shape[-1] if args[0].shape else 1
    return 2 * outs[0].numel * k


def _linear(args: list[Tensor], outs: list[Tensor], attrs: Mapping[str, object]) -> int:
    return 2 * outs[0].numel * args[0].shape[-1]


def gemm_view(node: Node) -> tuple[float, float, float, float]:
    """(batches, M, N, K): a product with a weight folds every leading dimension into M; a product of two
    activations is batched over its leading dimensions. K comes from the FLOPs, since a bias adds one FLOP
    per output, not a step of K."""
    if not node.outputs or not node.flops:
        return (0.0,) * 4
    out = node.outputs[0].shape
    numel = math.prod(out)
    if len(out) < 1 or not numel:
        return (0.0,) * 4
    n = out[-1]
    k = float(node.flops // (2 * numel))
    if node.weights or len(out) < 2:
        return 1.0, numel / n, float(n), k
    return math.prod(out[:-2]), float(out[-2]), float(n), k


def _matmul_layout(inputs: list[torch.Tensor], attrs: dict[str, object], outs: list[Shape]) -> eager_layout.Layout:
    """``matmul`` folds batch dimensions with a reshape, which copies what it cannot view."""
    import torch

    if len(inputs) < 2:
        return eager_layout.CONTIGUOUS
    copies, _ = eager_layout.replay(lambda: torch.matmul(inputs[0], inputs[1]), inputs[:2])
    return eager_layout.Layout(copies)


def _linear_layout(inputs: list[torch.Tensor], attrs: dict[str, object], outs: list[Shape]) -> eager_layout.Layout:
    import torch

    copies, _ = eager_layout.replay(lambda: torch.nn.functional.linear(inputs[0], inputs[1]), inputs[:2])
    return eager_layout.Layout(copies)


register("matmul", GEMM, _matmul, relax=("relax.matmul",), layout=_matmul_layout, copies_contiguous_inputs=True,
         gemm=gemm_view)
register("linear", GEMM, _linear, relax=("relax.linear",), layout=_linear_layout, gemm=gemm_view)
# an einsum's FLOPs are not counted as a GEMM's (one per output), so it has no GEMM view
register("einsum", GEMM, _rules.per_output, relax=("relax.einsum",))
