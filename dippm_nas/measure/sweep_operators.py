"""What an operator sweep knows of each operator: how to draw its shapes, count its work and run it.

A registry (:func:`register`) that :mod:`dippm_nas.measure.sweep` plans from; like the rest of the harness it
imports only torch and the standard library.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

Params = Mapping[str, int]
Step = Callable[[], object]


@dataclass(frozen=True)
class OperatorKind:
    """What the sweep knows of one operator: how to draw its shapes, count its work and run it.

    ``numels`` gives the elements of its inputs, its weights and its output, from which a point's
    bytes (and its memory footprint) follow at any dtype; ``flops`` follows the conventions of
    ``dippm_nas.graph.operators`` (a multiply-add is two FLOPs), so a row and a graph node count alike.
    """

    name: str
    #: shapes drawn per round: the operators that dominate real models' time get more
    weight: int
    sample: Callable[[random.Random], dict[str, int]]
    numels: Callable[[Params], tuple[int, int, int]]
    flops: Callable[[Params], int]
    build: Callable[[Params, torch.dtype, torch.device], Step]


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


def _conv_out(p: Params) -> int:
    return (p["h"] + 2 * (p["r"] // 2) - p["r"]) // p["s"] + 1


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


def _build_linear(p: Params, dtype: torch.dtype, device: torch.device) -> Step:
    x, w, b = (_rand(s, dtype, device) for s in ((p["m"], p["k"]), (p["n"], p["k"]), (p["n"],)))
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


def _nchw(p: Params) -> int:
    return p["n"] * p["c"] * p["h"] * p["h"]


def _pooled(p: Params) -> int:  # max pooling 3x3, stride 2, padding 1
    return p["n"] * p["c"] * ((p["h"] - 1) // 2 + 1) ** 2


register(OperatorKind("mm", 2, _sample_gemm, lambda p: (p["m"] * p["k"] + p["k"] * p["n"], 0, p["m"] * p["n"]),
                      lambda p: 2 * p["m"] * p["n"] * p["k"], _build_mm))
register(OperatorKind("linear", 3, _sample_gemm,
                      lambda p: (p["m"] * p["k"], p["n"] * p["k"] + p["n"], p["m"] * p["n"]),
                      lambda p: 2 * p["m"] * p["n"] * p["k"], _build_linear))
register(OperatorKind("bmm", 2, _sample_bmm,
                      lambda p: (p["b"] * (p["m"] * p["k"] + p["k"] * p["n"]), 0, p["b"] * p["m"] * p["n"]),
                      lambda p: 2 * p["b"] * p["m"] * p["n"] * p["k"], _build_bmm))
register(OperatorKind("conv2d", 6, _sample_conv,
                      lambda p: (_nchw(p), p["k"] * p["c"] // p["g"] * p["r"] ** 2,
                                 p["n"] * p["k"] * _conv_out(p) ** 2),
                      lambda p: 2 * p["n"] * p["k"] * _conv_out(p) ** 2 * p["c"] // p["g"] * p["r"] ** 2, _build_conv))
register(OperatorKind("sdpa", 2, _sample_sdpa, lambda p: (3 * p["b"] * p["h"] * p["s"] * p["d"], 0,
                                                           p["b"] * p["h"] * p["s"] * p["d"]),
                      lambda p: 4 * p["b"] * p["h"] * p["s"] ** 2 * p["d"], _build_sdpa))
for _name, _op in (("add", torch.add), ("mul", torch.mul)):
    register(OperatorKind(_name, 1, _sample_elementwise, lambda p: (2 * p["n"], 0, p["n"]), lambda p: p["n"],
                          _binary(_op)))
for _name, _op in (("relu", F.relu), ("gelu", F.gelu), ("silu", F.silu)):
    register(OperatorKind(_name, 1, _sample_elementwise, lambda p: (p["n"], 0, p["n"]), lambda p: p["n"],
                          _unary(_op, lambda p: (p["n"],))))
register(OperatorKind("sum", 1, _sample_rows, lambda p: (p["m"] * p["n"], 0, p["m"]), lambda p: p["m"] * p["n"],
                      _unary(lambda x: x.sum(-1), _rows_shape)))
register(OperatorKind("mean", 1, _sample_rows, lambda p: (p["m"] * p["n"], 0, p["m"]), lambda p: p["m"] * p["n"],
                      _unary(lambda x: x.mean(-1), _rows_shape)))
register(OperatorKind("batch_norm", 1, _sample_nchw, lambda p: (_nchw(p), 4 * p["c"], _nchw(p)),
                      lambda p: 5 * _nchw(p), _build_batch_norm))
register(OperatorKind("layer_norm", 1, _sample_rows, lambda p: (p["m"] * p["n"], 2 * p["n"], p["m"] * p["n"]),
                      lambda p: 5 * p["m"] * p["n"], _build_layer_norm))
register(OperatorKind("group_norm", 1, _sample_group_norm, lambda p: (_nchw(p), 2 * p["c"], _nchw(p)),
                      lambda p: 5 * _nchw(p), _build_group_norm))
register(OperatorKind("softmax", 1, _sample_rows, lambda p: (p["m"] * p["n"], 0, p["m"] * p["n"]),
                      lambda p: 5 * p["m"] * p["n"], _unary(lambda x: torch.softmax(x, -1), _rows_shape)))
register(OperatorKind("max_pool2d", 1, _sample_nchw, lambda p: (_nchw(p), 0, _pooled(p)), lambda p: 9 * _pooled(p),
                      _unary(lambda x: F.max_pool2d(x, 3, 2, 1), lambda p: (p["n"], p["c"], p["h"], p["h"]))))
register(OperatorKind("adaptive_avg_pool2d", 1, _sample_nchw, lambda p: (_nchw(p), 0, p["n"] * p["c"]), _nchw,
                      _unary(lambda x: F.adaptive_avg_pool2d(x, 1), lambda p: (p["n"], p["c"], p["h"], p["h"]))))
