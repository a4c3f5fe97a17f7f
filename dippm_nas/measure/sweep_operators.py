"""What an operator sweep knows of each operator: how to draw its shapes, describe and run it.

A registry (:func:`register`) that :mod:`dippm_nas.measure.sweep` plans from. What an operator is (its FLOPs,
its kind of kernel, its GEMM view) is the operator registry's (:mod:`dippm_nas.graph.operators`): a sweep kind
names the registry's spelling of its operator and gives the tensors a shape has, so a sweep row and a graph's
node are counted by the same rules. Like the rest of the harness it imports torch, numpy and the standard
library, never TVM.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from dippm_nas.graph.model_graph import Node, operator_node
from dippm_nas.graph.operators.conv import conv_output_size
from dippm_nas.graph.tensor import Shape

Params = Mapping[str, int]
Step = Callable[[], object]


@dataclass(frozen=True)
class Operands:
    """The shapes of an operator call as the registry's spelling of it reads them: its activations and its
    weights (in the order of the call's arguments), its outputs and its attributes."""

    inputs: tuple[Shape, ...]
    outputs: tuple[Shape, ...]
    weights: tuple[Shape, ...] = ()
    attrs: Mapping[str, object] = field(default_factory=dict)

    @property
    def numel(self) -> int:
        """Elements of every tensor it reads and writes."""
        return sum(math.prod(shape) for shape in (*self.inputs, *self.weights, *self.outputs))


@dataclass(frozen=True)
class OperatorKind:
    """What the sweep knows of one operator: how to draw its shapes, describe and run them.

    ``spelling`` is the registry's name of the operator (``relax.nn.conv2d``), whose rules count a shape's
    FLOPs; ``operands`` gives a shape's tensors, from which its FLOPs, its bytes at any dtype and its memory
    footprint follow. Attention is described in Relax's (batch, tokens, heads, head size) layout, the one
    the registry's ``relax.nn.attention`` reads, though the sweep runs PyTorch's (batch, heads, tokens, head
    size).
    """

    name: str
    #: shapes drawn per round: the operators that dominate real models' time get more
    weight: int
    sample: Callable[[random.Random], dict[str, int]]
    spelling: str
    operands: Callable[[Params], Operands]
    build: Callable[[Params, torch.dtype, torch.device], Step]

    def node(self, params: Params) -> Node:
        """A shape as a graph's node of the registry's kind, with its FLOPs by the registry's rule."""
        described = self.operands(params)
        return operator_node(self.spelling, described.inputs, described.weights, described.outputs, described.attrs)

    def flops(self, params: Params) -> int:
        """Floating-point operations of one call, by the registry's rule."""
        return self.node(params).flops

    def numel(self, params: Params) -> int:
        """Elements of its inputs, weights and outputs: its bytes at one byte an element."""
        return self.operands(params).numel


#: The operators a sweep covers, in the order of a round; :func:`register` adds one.
KINDS: dict[str, OperatorKind] = {}


def register(kind: OperatorKind) -> OperatorKind:
    """Adds an operator to every plan drawn from then on (its shapes come from a stream of its own, so
    the other kinds' samples, and the keys already measured, do not change)."""
    KINDS[kind.name] = kind
    return kind


def _size(rng: random.Random, lo: int, hi: int) -> int:
    """Log-uniform in [lo, hi]; a third rounded down to a multiple of 64 and a third to one of 8, as
    tensor-core kernels see aligned and unaligned sizes differently."""
    x = min(hi, max(lo, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))))
    r = rng.random()
    if r < 1 / 3 and x >= 64:
        x = x // 64 * 64
    elif r < 2 / 3 and x >= 8:
        x = x // 8 * 8
    return x


def _log(rng: random.Random, lo: int, hi: int) -> int:
    return min(hi, max(lo, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))))


#: The spatial sizes of an ImageNet network's stages, which half the spatial draws take.
_PYRAMID = (7, 14, 28, 56, 112, 224)


def _spatial(rng: random.Random) -> int:
    return rng.choice(_PYRAMID) if rng.random() < 0.5 else _log(rng, 7, 224)


def _rand(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    # uniform is several times faster than randn on the CPU; the values do not change the timing
    return torch.empty(shape, dtype=dtype, device=device).uniform_(-1.0, 1.0)


def _sample_gemm(rng: random.Random) -> dict[str, int]:
    return {"m": _size(rng, 1, 16384), "n": _size(rng, 1, 16384), "k": _size(rng, 1, 16384)}


def _sample_bmm(rng: random.Random) -> dict[str, int]:
    return {"b": _log(rng, 1, 256), **_sample_gemm(rng)}


def _sample_conv(rng: random.Random) -> dict[str, int]:
    n, h = _log(rng, 1, 256), _spatial(rng)
    r = rng.choices((1, 3, 5, 7), weights=(3, 4, 1.5, 1.5))[0]
    s = rng.choices((1, 2), weights=(3, 1))[0]
    mode = rng.choices(("dense", "depthwise", "grouped"), weights=(2, 1, 1))[0]
    if mode == "depthwise":
        c = k = g = _size(rng, 8, 2048)
    elif mode == "grouped":
        g = rng.choice((2, 4, 8, 16, 32, 64))
        c, k = (g * max(1, _size(rng, 8, 2048) // g) for _ in range(2))
    else:
        g, c, k = 1, 3 if rng.random() < 0.1 else _size(rng, 3, 2048), _size(rng, 8, 2048)
    return {"n": n, "c": c, "k": k, "h": h, "r": r, "s": s, "g": g}


def _sample_elementwise(rng: random.Random) -> dict[str, int]:
    return {"n": _size(rng, 64, 2**28)}


def _sample_rows(rng: random.Random) -> dict[str, int]:
    return {"m": _size(rng, 1, 2**20), "n": _size(rng, 8, 16384)}


def _sample_nchw(rng: random.Random) -> dict[str, int]:
    return {"n": _log(rng, 1, 256), "c": _size(rng, 8, 2048), "h": _spatial(rng)}


def _sample_group_norm(rng: random.Random) -> dict[str, int]:
    p = _sample_nchw(rng)
    g = rng.choice((1, 8, 16, 32))
    return {**p, "c": g * max(1, p["c"] // g), "g": g}


def _sample_sdpa(rng: random.Random) -> dict[str, int]:
    return {"b": _log(rng, 1, 256), "h": _log(rng, 1, 16), "s": _size(rng, 16, 4096), "d": 8 * rng.randint(4, 16)}


def _binary(op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
    def build(p: Params, dtype: torch.dtype, device: torch.device) -> Step:
        x, y = _rand((p["n"],), dtype, device), _rand((p["n"],), dtype, device)
        return lambda: op(x, y)
    return build


def _unary(op: Callable[[torch.Tensor], torch.Tensor], shape: Callable[[Params], tuple[int, ...]]):
    def build(p: Params, dtype: torch.dtype, device: torch.device) -> Step:
        x = _rand(shape(p), dtype, device)
        return lambda: op(x)
    return build


def _build_mm(p: Params, dtype: torch.dtype, device: torch.device) -> Step:
    a, b = _rand((p["m"], p["k"]), dtype, device), _rand((p["k"], p["n"]), dtype, device)
    return lambda: torch.mm(a, b)


def _has_bias(p: Params) -> bool:
    """A drawn linear layer has a bias; a point of a plan of its own says ``bias=0`` for one without (an LLM's
    projections, as Vidur profiled them)."""
    return bool(p.get("bias", 1))


def _build_linear(p: Params, dtype: torch.dtype, device: torch.device) -> Step:
    x, w = _rand((p["m"], p["k"]), dtype, device), _rand((p["n"], p["k"]), dtype, device)
    b = _rand((p["n"],), dtype, device) if _has_bias(p) else None
    return lambda: F.linear(x, w, b)


def _build_bmm(p: Params, dtype: torch.dtype, device: torch.device) -> Step:
    a, b = _rand((p["b"], p["m"], p["k"]), dtype, device), _rand((p["b"], p["k"], p["n"]), dtype, device)
    return lambda: torch.bmm(a, b)


def _build_conv(p: Params, dtype: torch.dtype, device: torch.device) -> Step:
    x = _rand((p["n"], p["c"], p["h"], p["h"]), dtype, device)
    w = _rand((p["k"], p["c"] // p["g"], p["r"], p["r"]), dtype, device)
    return lambda: F.conv2d(x, w, None, p["s"], p["r"] // 2, 1, p["g"])


def _build_batch_norm(p: Params, dtype: torch.dtype, device: torch.device) -> Step:
    x = _rand((p["n"], p["c"], p["h"], p["h"]), dtype, device)
    mean, weight, bias = (_rand((p["c"],), dtype, device) for _ in range(3))
    var = _rand((p["c"],), dtype, device).abs_().add_(0.5)
    return lambda: F.batch_norm(x, mean, var, weight, bias, training=False)


def _build_layer_norm(p: Params, dtype: torch.dtype, device: torch.device) -> Step:
    x, w, b = _rand((p["m"], p["n"]), dtype, device), _rand((p["n"],), dtype, device), _rand((p["n"],), dtype, device)
    return lambda: F.layer_norm(x, (p["n"],), w, b)


def _build_group_norm(p: Params, dtype: torch.dtype, device: torch.device) -> Step:
    x = _rand((p["n"], p["c"], p["h"], p["h"]), dtype, device)
    w, b = _rand((p["c"],), dtype, device), _rand((p["c"],), dtype, device)
    return lambda: F.group_norm(x, p["g"], w, b)


def _build_sdpa(p: Params, dtype: torch.dtype, device: torch.device) -> Step:
    q, k, v = (_rand((p["b"], p["h"], p["s"], p["d"]), dtype, device) for _ in range(3))
    return lambda: F.scaled_dot_product_attention(q, k, v)


def _rows_shape(p: Params) -> tuple[int, ...]:
    return (p["m"], p["n"])


def _nchw_shape(p: Params) -> tuple[int, ...]:
    return (p["n"], p["c"], p["h"], p["h"])


#: The sweep's max pooling: a 3x3 window, stride 2, padding 1.
_POOL_WINDOW, _POOL_STRIDE, _POOL_PADDING = 3, 2, 1


def _pooled_size(p: Params) -> int:
    return conv_output_size(p["h"], _POOL_WINDOW, _POOL_STRIDE, _POOL_PADDING)


def _gemm_operands(p: Params) -> Operands:
    return Operands(inputs=((p["m"], p["k"]), (p["k"], p["n"])), outputs=((p["m"], p["n"]),))


def _linear_operands(p: Params) -> Operands:
    weights = ((p["n"], p["k"]), (p["n"],)) if _has_bias(p) else ((p["n"], p["k"]),)
    return Operands(inputs=((p["m"], p["k"]),), weights=weights, outputs=((p["m"], p["n"]),))


def _bmm_operands(p: Params) -> Operands:
    return Operands(inputs=((p["b"], p["m"], p["k"]), (p["b"], p["k"], p["n"])), outputs=((p["b"], p["m"], p["n"]),))


def _conv_operands(p: Params) -> Operands:
    size = conv_output_size(p["h"], p["r"], p["s"], p["r"] // 2)
    return Operands(inputs=(_nchw_shape(p),), weights=((p["k"], p["c"] // p["g"], p["r"], p["r"]),),
                    outputs=((p["n"], p["k"], size, size),),
                    attrs={"strides": (p["s"], p["s"]), "padding": (p["r"] // 2,) * 4, "groups": p["g"]})


def _attention_operands(p: Params) -> Operands:
    qkv = (p["b"], p["s"], p["h"], p["d"])
    return Operands(inputs=(qkv, qkv, qkv), outputs=(qkv,))


def _binary_operands(p: Params) -> Operands:
    return Operands(inputs=((p["n"],), (p["n"],)), outputs=((p["n"],),))


def _unary_operands(p: Params) -> Operands:
    return Operands(inputs=((p["n"],),), outputs=((p["n"],),))


def _row_reduction_operands(p: Params) -> Operands:
    return Operands(inputs=(_rows_shape(p),), outputs=((p["m"],),), attrs={"axis": (-1,)})


def _rows_operands(p: Params) -> Operands:
    return Operands(inputs=(_rows_shape(p),), outputs=(_rows_shape(p),), attrs={"axis": -1})


def _norm_operands(weights: Callable[[Params], tuple[Shape, ...]], shape: Callable[[Params], tuple[int, ...]]):
    def operands(p: Params) -> Operands:
        return Operands(inputs=(shape(p),), weights=weights(p), outputs=(shape(p),))
    return operands


def _max_pool_operands(p: Params) -> Operands:
    size = _pooled_size(p)
    return Operands(inputs=(_nchw_shape(p),), outputs=((p["n"], p["c"], size, size),),
                    attrs={"pool_size": (_POOL_WINDOW, _POOL_WINDOW), "strides": (_POOL_STRIDE, _POOL_STRIDE),
                           "padding": (_POOL_PADDING,) * 4})


def _global_pool_operands(p: Params) -> Operands:
    return Operands(inputs=(_nchw_shape(p),), outputs=((p["n"], p["c"], 1, 1),), attrs={"output_size": (1, 1)})


register(OperatorKind("mm", 2, _sample_gemm, "relax.matmul", _gemm_operands, _build_mm))
register(OperatorKind("linear", 3, _sample_gemm, "relax.linear", _linear_operands, _build_linear))
register(OperatorKind("bmm", 2, _sample_bmm, "relax.matmul", _bmm_operands, _build_bmm))
register(OperatorKind("conv2d", 6, _sample_conv, "relax.nn.conv2d", _conv_operands, _build_conv))
register(OperatorKind("sdpa", 2, _sample_sdpa, "relax.nn.attention", _attention_operands, _build_sdpa))
for _name, _op in (("add", torch.add), ("mul", torch.mul)):
    register(OperatorKind(_name, 1, _sample_elementwise, f"relax.{'multiply' if _name == 'mul' else _name}",
                          _binary_operands, _binary(_op)))
for _name, _op in (("relu", F.relu), ("gelu", F.gelu), ("silu", F.silu)):
    register(OperatorKind(_name, 1, _sample_elementwise, f"relax.nn.{_name}", _unary_operands,
                          _unary(_op, lambda p: (p["n"],))))
register(OperatorKind("sum", 1, _sample_rows, "relax.sum", _row_reduction_operands,
                      _unary(lambda x: x.sum(-1), _rows_shape)))
register(OperatorKind("mean", 1, _sample_rows, "relax.mean", _row_reduction_operands,
                      _unary(lambda x: x.mean(-1), _rows_shape)))
register(OperatorKind("batch_norm", 1, _sample_nchw, "relax.nn.batch_norm",
                      _norm_operands(lambda p: ((p["c"],),) * 4, _nchw_shape), _build_batch_norm))
register(OperatorKind("layer_norm", 1, _sample_rows, "relax.nn.layer_norm",
                      _norm_operands(lambda p: ((p["n"],),) * 2, _rows_shape), _build_layer_norm))
register(OperatorKind("group_norm", 1, _sample_group_norm, "relax.nn.group_norm",
                      _norm_operands(lambda p: ((p["c"],),) * 2, _nchw_shape), _build_group_norm))
register(OperatorKind("softmax", 1, _sample_rows, "relax.nn.softmax", _rows_operands,
                      _unary(lambda x: torch.softmax(x, -1), _rows_shape)))
register(OperatorKind("max_pool2d", 1, _sample_nchw, "relax.nn.max_pool2d", _max_pool_operands,
                      _unary(lambda x: F.max_pool2d(x, _POOL_WINDOW, _POOL_STRIDE, _POOL_PADDING), _nchw_shape)))
register(OperatorKind("adaptive_avg_pool2d", 1, _sample_nchw, "relax.nn.adaptive_avg_pool2d", _global_pool_operands,
                      _unary(lambda x: F.adaptive_avg_pool2d(x, 1), _nchw_shape)))
