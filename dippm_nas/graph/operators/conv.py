"""Convolutions (1-D to 3-D, and transposed): cuDNN's implicit GEMMs."""

from __future__ import annotations

import math
from collections.abc import Mapping

from dippm_nas.graph import eager_layout
from dippm_nas.graph.operators._registry import AUTOCAST_LOWER, Node, declare_category, register, spell_aten
from dippm_nas.graph.tensor import Tensor

CONV = declare_category("conv", counts_macs=True, library="cudnn", autocast=AUTOCAST_LOWER, takes_bias=True,
                       layout=eager_layout.first_dense, noun="convolution", kernel="conv",
                       cuda_core_kernel="conv_cuda_cores")

#: cuDNN's tensor-core convolution kernels need channels that are a multiple of 8 per group (cuDNN
#: developer guide, "Tensor Core operations"); others run on the CUDA cores in either layout.
TENSOR_CORE_CHANNEL_MULTIPLE = 8


def conv_output_size(size: int, kernel: int, stride: int = 1, padding: int = 0) -> int:
    """The output size of a convolution (or a pooling) along one axis, as PyTorch computes it (no dilation).

    >>> conv_output_size(224, 7, 2, 3), conv_output_size(56, 3, 1, 1)
    (112, 56)
    """
    return (size + 2 * padding - kernel) // stride + 1


def _conv(args: list[Tensor], outs: list[Tensor], attrs: Mapping[str, object]) -> int:
    """``2 * numel(out) * (C_in / groups) * prod(kernel)``."""
    weight = args[1].shape  # O, I/groups, *kernel (OIHW family of layouts)
    return 2 * outs[0].numel * math.prod(weight[1:])


def _conv_transpose(args: list[Tensor], outs: list[Tensor], attrs: Mapping[str, object]) -> int:
    """``2 * numel(in) * (C_out / groups) * prod(kernel)``."""
    weight = args[1].shape  # I, O/groups, *kernel (IOHW)
    return 2 * args[0].numel * math.prod(weight[1:])


def _weighted(conv: Node) -> bool:
    return bool(conv.weights)


def _gemm(conv: Node) -> tuple[float, float, float, float]:
    """An implicit GEMM per group: M output pixels of the batch, N output channels of the group,
    K = input channels of the group x kernel area."""
    if not conv.outputs or not conv.flops or not conv.weights or len(conv.weights[0].shape) < 3:
        return (0.0,) * 4
    weight = conv.weights[0].shape
    groups = int(conv.attrs.get("groups", 1) or 1)
    return float(groups), math.prod(conv.outputs[0].shape) / weight[0], weight[0] / groups, math.prod(weight[1:])


def _kernel_size(conv: Node) -> tuple[float, float] | None:
    """The window's height and width, from the weight (a 1-D kernel has a height only)."""
    if not _weighted(conv):
        return None
    return (*conv.weights[0].shape[2:4], 0, 0)[:2]


def _cuda_cores(conv: Node) -> bool | None:
    """Whether its channels per group keep it off the tensor cores (depthwise, an RGB stem)."""
    if not _weighted(conv):
        return None
    weight = conv.weights[0].shape
    groups = int(conv.attrs.get("groups", 1) or 1)
    return not (len(weight) >= 2 and not (weight[1] % TENSOR_CORE_CHANNEL_MULTIPLE
                                          or (weight[0] // groups) % TENSOR_CORE_CHANNEL_MULTIPLE))


def _nchw_transpose(conv: Node) -> int:
    """The input elements cuDNN transposes to NHWC for a tensor-core convolution on NCHW activations:
    those of a 2-D one (one off the tensor cores runs on the CUDA cores in either layout)."""
    return conv.inputs[0].numel if len(conv.weights[0].shape) == 4 else 0


_HOOKS = {"gemm": _gemm, "kernel_size": _kernel_size, "cuda_cores": _cuda_cores, "nchw_transpose": _nchw_transpose}

for _name in ("relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d"):
    register(_name.removeprefix("relax.nn."), CONV, _conv, relax=(_name,), **_HOOKS)
for _name in ("relax.nn.conv1d_transpose", "relax.nn.conv2d_transpose", "relax.nn.conv3d_transpose"):
    register(_name.removeprefix("relax.nn."), CONV, _conv_transpose, relax=(_name,), **_HOOKS)
# ATen convolutions TVM's importer misses or rejects on some models (benchmarks/coverage.py lists them).
spell_aten(("_convolution_mode.default", "convolution.default"), "conv2d")
