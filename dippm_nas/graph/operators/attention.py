"""Attention, ``normalise(Q K^T) V`` as one operator: Relax's (batch, tokens, heads, dim) and PyTorch's
``scaled_dot_product_attention``, and eager's unfused fallback where no fused kernel takes it.

FLOPs over ``[B, S, H, D]``: ``2 * B * H * S_q * S_k * (D + D_v)``, the two products; the normalisation
of the scores is counted with the elementwise work of the other operators.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from dippm_nas.graph.operators._registry import AUTOCAST_LOWER, Node, declare_category, register, spell_aten
from dippm_nas.graph.tensor import Tensor, dtype_bytes

ATTENTION = declare_category("attention", counts_macs=True, library="cublas", autocast=AUTOCAST_LOWER,
                             kernel="attention")

#: Eager's math fallback of scaled_dot_product_attention (``_scaled_dot_product_attention_math``;
#: :func:`_math_fallback` says when it runs): it scales query and key, multiplies them (a batched GEMM),
#: adds the mask in place, normalises the scores, multiplies by the values. From PyTorch 2.5 on, unless
#: allow_fp16_bf16_reduction_math_sdp is set, it upcasts lower-precision inputs to float32 first (a float32
#: GEMM: no tensor cores, cuBLAS's TF32 being off by default), casts the output back, returns the attention
#: weights cast back as well, and wraps the normalisation in a "safe" one (then eq, all and where over the
#: scores). timm's RTX 4090 records of the models that take this path (NesT, SAM's ViT) show the step
#: between PyTorch 2.4 and 2.9.
MATH_UPCAST_SINCE = (2, 5)
MATH_KERNELS = 5  # two scalings, two GEMMs, the normalisation
SAFE_NORMALISATION_KERNELS = 3  # eq, all, where
UPCAST_KERNELS = 5  # three upcasts, two casts back
FLOAT32_BYTES = dtype_bytes("float32")
BOOL_BYTES = dtype_bytes("bool")


def _attention(args: list[Tensor], outs: list[Tensor], attrs: Mapping[str, object]) -> int:
    q, k, v = (t.shape for t in args[:3])  # [B, S, H, D]
    batch, s_q, heads, d = q
    s_k, d_v = k[1], v[-1]
    return 2 * batch * heads * s_q * s_k * (d + d_v)


def _attention_bhsd(args: list[Tensor], outs: list[Tensor], attrs: Mapping[str, object]) -> int:
    q, k, v = (t.shape for t in args[:3])  # [..., S, D], as torch's scaled_dot_product_attention
    return 2 * math.prod(q[:-2]) * q[-2] * k[-2] * (q[-1] + v[-1])


def _gemm(attention: Node) -> tuple[float, float, float, float]:
    """The scores (query, key: batch x tokens x heads x head size): one GEMM per (sample, head)."""
    if not attention.outputs or not attention.flops:
        return (0.0,) * 4
    if len(attention.inputs) >= 2 and len(attention.inputs[0].shape) == 4:
        q, k = attention.inputs[0].shape, attention.inputs[1].shape
        return float(q[0] * q[2]), float(q[1]), float(k[1]), float(q[3])
    return (0.0,) * 4


def _math_fallback(attention: Node) -> tuple[float, ...]:
    """What eager's math fallback works on, for an attention no fused kernel takes: score elements,
    query, key, value and output elements, and 1 when a mask is added (zeros for one a fused kernel runs).
    PyTorch's flash, memory-efficient and cuDNN kernels all require 4-D query, key and value
    (``check_tensor_shapes`` in ATen's sdp_utils); a model that calls it on 5-D blocks of heads (NesT,
    Twins, Hiera's mask unit attention) or 3-D heads folded into the batch (SAM's ViT) gets
    ``_scaled_dot_product_attention_math``. Relax's own attention is 4-D."""
    if len(attention.inputs) < 3 or not attention.outputs:
        return (0.0,) * 6
    q, k, v = (t.shape for t in attention.inputs[:3])
    if len(q) == 4 or len(q) < 2 or len(k) < 2:
        return (0.0,) * 6
    scores = math.prod(q[:-1]) * k[-2]
    return (float(scores), float(math.prod(q)), float(math.prod(k)), float(math.prod(v)),
            float(attention.outputs[0].numel), float(len(attention.inputs) > 3))


def math_fallback_cost(columns: np.ndarray, autocast: bool, element_bytes: int,
                       torch_version: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """Per operator, what eager's math attention adds to the fused operator the graph has, from the
    ``math_fallback`` columns ``[n, 6]``: bytes moved, kernels, the tensors it holds at its peak (one
    column each, in the order it allocates them: its float32 copies of query, key and value when it
    upcasts, the scaled query, the raw scores, their normalisation, and the safe normalisation's bool mask
    and result) and whether it computes in float32; zeros where a fused kernel runs it. ``autocast`` and
    ``element_bytes``: the precision's; ``torch_version`` is PyTorch's (major, minor), None for the current one.
    The allocator replays the tensors one by one: as one block, a 13-bytes-per-score lump fits none of the
    segments the scores of the previous attention left behind."""
    scores, q, k, v, out, mask = columns.T
    on = scores > 0
    since = torch_version is None or torch_version >= MATH_UPCAST_SINCE
    upcast = autocast and since
    f = FLOAT32_BYTES
    e = f if upcast or not autocast else element_bytes  # bytes per element it computes in
    # Per score: the GEMM writes it, the normalisation reads and writes it, the second GEMM reads it; the
    # mask's add reads both and writes; the safe normalisation's eq reads and writes a bool, all reads that,
    # where reads and writes; the weights' cast back reads float32 and writes the lower precision.
    per_score = 4 * e + 3 * e * mask + (3 * e + 2 * BOOL_BYTES if since else 0) + (f + element_bytes if upcast else 0)
    moved = scores * per_score + (q + k) * 2 * e  # and the scalings of query and key
    kernels = np.where(on, MATH_KERNELS - 1 + mask + (SAFE_NORMALISATION_KERNELS if since else 0)
                       + (UPCAST_KERNELS if upcast else 0), 0.0)
    copies = (q * f, k * f, v * f) if upcast else ()
    safe = (scores * BOOL_BYTES, scores * e) if since else ()
    held = np.stack([*copies, q * e, scores * e, scores * e, *safe], axis=1)
    if upcast:  # upcasts; float32 output, cast back
        moved = moved + (q + k + v) * (element_bytes + f) + out * (f + f + element_bytes)
    return moved, kernels, held, e == f


register("attention", ATTENTION, _attention, relax=("relax.nn.attention",), gemm=_gemm, math_fallback=_math_fallback)
register("attention_bias", ATTENTION, _attention, relax=("relax.nn.attention_bias",), gemm=_gemm)
spell_aten(("scaled_dot_product_attention.default",), "attention", flops=_attention_bhsd)
