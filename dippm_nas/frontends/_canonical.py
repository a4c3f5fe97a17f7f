"""One spelling per layer: rewrite what exporters decompose back into the TVM operator it stands for.

tf2onnx writes a Keras LayerNormalization as a dozen arithmetic nodes, a Dense on a 3-D input as
reshape-matmul-reshape, and an exact GELU through Erfc; paddle2onnx writes GELU through Erf and adds
zero after every scale. PyTorch's exporter gives ``layer_norm``, one batched ``matmul`` and ``gelu``,
which is the one spelling. The same architecture must give the same graph, so ONNX-born Relax
functions (TensorFlow, Paddle, ONNX files) are rewritten here with TVM's dataflow patterns before
the graph is read. Each rule checks its constants and shapes, so only the exact formula is replaced.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import DFPattern, is_const, is_op, rewrite_call, wildcard

from dippm_nas.relax_contract import shape_and_dtype

Rewriter = Callable[[relax.Expr, dict[DFPattern, relax.Expr]], relax.Expr]
Rule = Callable[[], tuple[DFPattern, Rewriter]]
#: Each rule with the operators a function must call for the rule to have anything to match: a
#: pass of ``rewrite_call`` costs about 0.3 ms per binding whether it matches or not.
_RULES: list[tuple[frozenset[str], Rule]] = []


def rule(*anchors: str) -> Callable[[Rule], Rule]:
    """Register a rewrite rule, tried only on functions that call every operator in ``anchors``."""
    def register(build: Rule) -> Rule:
        _RULES.append((frozenset(anchors), build))
        return build

    return register


def _scalar(expr: relax.Expr) -> float | None:
    if isinstance(expr, tvm.ir.Constant):
        data = expr.value.numpy()
        if data.size == 1:
            return float(data.reshape(()))
    return None


def _is(expr: relax.Expr, value: float) -> bool:
    found = _scalar(expr)
    return found is not None and math.isclose(found, value, rel_tol=1e-5, abs_tol=1e-7)


def _shape(expr: relax.Expr) -> tuple[int, ...] | None:
    """None where the shape is unknown or symbolic: such an expression is left as it is."""
    try:
        known = shape_and_dtype(expr.ty)
    except TypeError:
        return None
    return known[0] if known is not None else None


def _mul(a: DFPattern, b: DFPattern) -> DFPattern:
    return is_op("relax.multiply")(a, b) | is_op("relax.multiply")(b, a)


def _add(a: DFPattern, b: DFPattern) -> DFPattern:
    return is_op("relax.add")(a, b) | is_op("relax.add")(b, a)


@rule("relax.erf")
def _gelu_erf() -> tuple[DFPattern, Rewriter]:
    """0.5 * x * (1 + erf(x / sqrt 2)), in any order of the products (ONNX's own spelling, paddle2onnx)."""
    x, scale, one, half = wildcard(), is_const(), is_const(), is_const()
    erf = is_op("relax.erf")(is_op("relax.divide")(x, scale) | _mul(x, scale))
    plus_one = _add(erf, one)
    pattern = _mul(_mul(x, plus_one), half) | _mul(_mul(x, half), plus_one)

    def rewrite(expr: relax.Expr, m: dict[DFPattern, relax.Expr]) -> relax.Expr:
        s = _scalar(m[scale])
        if s is None or not (math.isclose(s, math.sqrt(2), rel_tol=1e-5)
                             or math.isclose(s, 1 / math.sqrt(2), rel_tol=1e-5)):
            return expr
        return relax.op.nn.gelu(m[x]) if _is(m[one], 1.0) and _is(m[half], 0.5) else expr

    return pattern, rewrite


@rule("relax.erf", "relax.negative")
def _gelu_erfc() -> tuple[DFPattern, Rewriter]:
    """(0.5 * x) * (1 - erf(-x / sqrt 2)): Keras' exact GELU, through tf2onnx's Erfc."""
    x, scale, one, half = wildcard(), is_const(), is_const(), is_const()
    erf = is_op("relax.erf")(_mul(is_op("relax.negative")(x), scale))
    pattern = _mul(_mul(x, half), is_op("relax.subtract")(one, erf))

    def rewrite(expr: relax.Expr, m: dict[DFPattern, relax.Expr]) -> relax.Expr:
        ok = _is(m[scale], 1 / math.sqrt(2)) and _is(m[one], 1.0) and _is(m[half], 0.5)
        return relax.op.nn.gelu(m[x]) if ok else expr

    return pattern, rewrite


@rule("relax.mean")
def _layer_norm() -> tuple[DFPattern, Rewriter]:
    """(x - mean) / sqrt(var + eps) * gamma + beta over the last axis, in the plain and in TF's spelling.

    TF's ``batch_normalization`` spells it x * g + (beta - mean * g) with g = gamma / sqrt(var + eps).
    A gamma of ones or a beta of zeros (a fresh Keras layer) has been folded away by the exporter:
    those variants match too, and the layer norm gets them back as constants.
    """
    x, eps, gamma, beta = wildcard(), is_const(), wildcard(), wildcard()
    mean = is_op("relax.mean")(x)
    centred = is_op("relax.subtract")(x, mean)
    variance = is_op("relax.mean")(_mul(centred, centred) | is_op("relax.power")(centred, is_const()))
    var_eps = _add(variance, eps)
    std = is_op("relax.sqrt")(var_eps)
    inv_std = is_op("relax.divide")(is_const(), std) | is_op("relax.rsqrt")(var_eps)
    normalized = is_op("relax.divide")(centred, std) | _mul(centred, inv_std)
    scaled = _mul(normalized, gamma) | normalized
    plain = _add(scaled, beta) | _mul(normalized, gamma)
    g = _mul(inv_std, gamma) | inv_std
    shift = _mul(is_op("relax.negative")(mean), g)
    tf_shift = _add(shift, beta) | is_op("relax.subtract")(beta, _mul(mean, g)) | shift
    pattern = plain | _add(_mul(x, g), tf_shift)

    def rewrite(expr: relax.Expr, m: dict[DFPattern, relax.Expr]) -> relax.Expr:
        shape = _shape(m[x])
        means = [v for v in m.values() if isinstance(v, relax.Call) and v.op.name == "relax.mean"]
        epsilon = _scalar(m[eps])
        if shape is None or epsilon is None or any(not _over_last_axis(v, len(shape)) for v in means):
            return expr
        width, dtype = shape[-1], m[x].ty.dtype
        scale = _as_vector(m[gamma], width) if gamma in m else relax.const(np.ones(width, dtype))
        offset = _as_vector(m[beta], width) if beta in m else relax.const(np.zeros(width, dtype))
        if scale is None or offset is None:
            return expr
        return relax.op.nn.layer_norm(m[x], scale, offset, axes=[-1], epsilon=epsilon)

    return pattern, rewrite


def _over_last_axis(mean: relax.Call, rank: int) -> bool:
    axes = [int(a) for a in (mean.attrs.axis or [])]
    return bool(mean.attrs.keepdims) and len(axes) == 1 and axes[0] in (-1, rank - 1)


def _as_vector(expr: relax.Expr, width: int) -> relax.Expr | None:
    """gamma or beta as the 1-D tensor layer_norm takes, if it is one, broadcast to rank."""
    shape = _shape(expr)
    if shape is None or int(np.prod(shape)) != width or shape[-1] != width:
        return None
    return expr if shape == (width,) else relax.op.reshape(expr, [width])


@rule("relax.reshape", "relax.matmul")
def _tensordot() -> tuple[DFPattern, Rewriter]:
    """reshape(matmul(A, W), [..., N]) with a 2-D A: TensorFlow's Dense on a 3-D input.

    Becomes matmul(reshape(A, [..., K]), W): the reshape is a free view, and the bias add that
    follows can fuse into the matmul as it does for PyTorch's batched one.
    """
    a, weight, back = wildcard(), wildcard(), wildcard()
    pattern = is_op("relax.reshape")(is_op("relax.matmul")(a, weight), back)

    def rewrite(expr: relax.Expr, m: dict[DFPattern, relax.Expr]) -> relax.Expr:
        a_shape, w_shape, out_shape = _shape(m[a]), _shape(m[weight]), _shape(expr)
        if a_shape is None or w_shape is None or out_shape is None or len(a_shape) != 2 or len(w_shape) != 2:
            return expr
        if len(out_shape) < 3 or out_shape[-1] != w_shape[1] or int(np.prod(out_shape[:-1])) != a_shape[0]:
            return expr
        return relax.op.matmul(relax.op.reshape(m[a], [*out_shape[:-1], a_shape[1]]), m[weight])

    return pattern, rewrite


@rule("relax.reshape")
def _reshape_chain() -> tuple[DFPattern, Rewriter]:
    """reshape(reshape(x)) is one reshape, and none at all when it gives x's own shape back."""
    x, first, second = wildcard(), wildcard(), wildcard()
    pattern = is_op("relax.reshape")(is_op("relax.reshape")(x, first), second)

    def rewrite(expr: relax.Expr, m: dict[DFPattern, relax.Expr]) -> relax.Expr:
        shape = _shape(expr)
        if shape is None:
            return expr
        return m[x] if _shape(m[x]) == shape else relax.op.reshape(m[x], list(shape))

    return pattern, rewrite


def _ints(expr: relax.Expr) -> list[int] | None:
    """The integers of a tuple argument such as strided_slice's axes; None where one is not constant."""
    try:
        return [int(field.value) for field in expr.fields]
    except (AttributeError, TypeError):
        return None


@rule("relax.squeeze", "relax.strided_slice")
def _select() -> tuple[DFPattern, Rewriter]:
    """squeeze(strided_slice(x, [a], [i], [i + 1]), [a]): ONNX's Slice and Squeeze for taking one
    entry of an axis (tf2onnx, paddle2onnx), where PyTorch's ``x[i]`` is one operator, a take."""
    x, axes, begin, end, strides = wildcard(), wildcard(), wildcard(), wildcard(), wildcard()
    pattern = is_op("relax.squeeze")(is_op("relax.strided_slice")(x, axes, begin, end, strides))

    def rewrite(expr: relax.Expr, m: dict[DFPattern, relax.Expr]) -> relax.Expr:
        axis, first, last, step = _ints(m[axes]), _ints(m[begin]), _ints(m[end]), _ints(m[strides])
        squeezed = [int(a) for a in expr.attrs.axis] if expr.attrs.axis is not None else None
        if None in (axis, first, last, step) or len(axis) != 1 or squeezed != axis or step != [1]:
            return expr
        if last[0] != first[0] + 1 or first[0] < 0:
            return expr
        return relax.op.take(m[x], relax.const(first[0], "int64"), axis=axis[0], mode="fast")

    return pattern, rewrite


@rule()
def _identity_arithmetic() -> tuple[DFPattern, Rewriter]:
    """x + 0 and x * 1 (paddle2onnx writes ``scale`` as a multiply and an add of zero)."""
    x, c = wildcard(), is_const()
    pattern = _add(x, c) | _mul(x, c)

    def rewrite(expr: relax.Expr, m: dict[DFPattern, relax.Expr]) -> relax.Expr:
        neutral = 0.0 if expr.op.name == "relax.add" else 1.0
        same = _shape(m[x]) == _shape(expr) and m[x].ty.dtype == expr.ty.dtype
        return m[x] if same and _is(m[c], neutral) else expr

    return pattern, rewrite


def _called_ops(func: relax.Function) -> set[str]:
    return {b.value.op.name for block in func.body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)}


def canonicalize(func: relax.Function) -> relax.Function:
    """Apply every rule that can match (each to a fixed point), then drop what no longer has a reader."""
    called = _called_ops(func)
    for anchors, build in _RULES:
        if anchors <= called:
            pattern, rewrite = build()
            func = rewrite_call(pattern, rewrite, func)
    return relax.analysis.remove_all_unused(func)
