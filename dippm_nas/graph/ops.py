"""The operator vocabulary: what each Relax operator is, which unit bounds it, and its FLOPs.

A registry, not an if-chain: :func:`register` adds an operator. Operators not registered still become
nodes (kind ``other``, one FLOP per output element), so an unfamiliar model never fails here.

FLOP conventions (one multiply-add is two FLOPs; MACs are reported separately for conv, matmul and
attention, as timm and DIPPM count them):

* convolution: ``2 * numel(out) * (C_in / groups) * prod(kernel)``
* transposed convolution: ``2 * numel(in) * (C_out / groups) * prod(kernel)``
* matmul ``[..., M, K] @ [..., K, N]``: ``2 * numel(out) * K``
* attention ``softmax(Q K^T) V`` over ``[B, S, H, D]``: ``2 * B * H * S_q * S_k * (D + D_v)``
  (the two matmuls; the softmax is counted with the elementwise work of the other operators)
* normalisation: ``NORM_FLOPS_PER_ELEMENT`` per element; softmax ``SOFTMAX_FLOPS_PER_ELEMENT``
* elementwise, activations and reductions: one per element written (per element read for
  reductions), the fvcore convention
* pooling: ``numel(out) * prod(window)``; data movement and views: zero
* LSTM / GRU (one node, as cuDNN runs them): ``2 * T * B * numel(W)`` for every weight matrix, plus
  ``RECURRENT_POINTWISE_FLOPS`` per gate pre-activation and hidden unit per step

An operator can also say how many kernels it launches (``kernels``; one when it does not say): a
recurrent layer launches a few per time step, which is what it costs at small sizes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache

from dippm_nas.graph.tensor import MAC_CATEGORIES, Tensor

#: mean, variance, subtract, divide, scale-and-shift.
NORM_FLOPS_PER_ELEMENT = 5
#: max, subtract, exp, sum, divide.
SOFTMAX_FLOPS_PER_ELEMENT = 5

#: Per gate pre-activation: two bias adds and the recurrent sum, then its sigmoid or tanh.
RECURRENT_POINTWISE_FLOPS = 4

FlopRule = Callable[[list[Tensor], list[Tensor], Mapping[str, object]], int]
KernelRule = Callable[[list[Tensor], list[Tensor], Mapping[str, object]], int]

#: Categories: which hardware unit bounds an operator in the cost model.
CATEGORIES = (
    "conv", "matmul", "attention", "norm", "activation", "elementwise", "reduce", "pool", "softmax",
    "movement", "view", "other",
)


#: How ``torch.autocast`` runs an operator at half precision (PyTorch's "Autocast Op Reference",
#: CUDA): convolutions, matmuls (linear, bmm, einsum, the recurrent cells), attention and prelu run in
#: half precision, casting float32 inputs first; the kinds below run in float32, casting half inputs
#: up (layer_norm, group_norm, softmax, ... are on that list); everything else runs in the widest
#: type of its inputs, so a half activation added to a float32 one (a residual stream after a layer
#: norm, a position embedding, a layer-scale parameter) gives float32.
AUTOCAST_HALF_CATEGORIES = MAC_CATEGORIES  # autocast runs the multiply-accumulate operators in half
AUTOCAST_HALF_KINDS = frozenset({"prelu"})
AUTOCAST_FLOAT32_KINDS = frozenset({
    "layer_norm", "group_norm", "softmax", "log_softmax", "norm", "exp", "log", "power", "reciprocal",
    "rsqrt", "softplus", "sum", "prod", "cumsum", "cumprod",
})
#: Kinds that take float32 parameters with half inputs and stay in half (cuDNN's batch norm); for
#: any other "widest" operator a float32 parameter of more than one element makes the output float32.
AUTOCAST_KEEPS_WEIGHT_DTYPE = frozenset({"batch_norm", "instance_norm"})


@dataclass(frozen=True)
class OpSpec:
    """What an operator is to the cost models: its node ``kind``, its ``category`` (one of
    ``CATEGORIES``), its FLOP rule and, where it launches more than one kernel, its kernel rule."""

    kind: str
    category: str
    flops: FlopRule
    kernels: KernelRule | None = None
    #: TVM's torch importer converts it into several operators where PyTorch eager runs one kernel:
    #: the torch frontend keeps it one node instead.
    kept_whole: bool = False


_REGISTRY: dict[str, OpSpec] = {}
#: ATen operators that reach the graph as generic nodes (TVM could not convert them), by ATen name.
_ATEN: dict[str, OpSpec] = {}


def register(names: str | tuple[str, ...], category: str, flops: FlopRule) -> None:
    """Cost rules for Relax operators (``relax.nn.conv2d``); the kind is the name without ``relax.``
    and ``nn.``. Raises ValueError for a category not in ``CATEGORIES``."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown category {category!r}")
    for name in (names,) if isinstance(names, str) else names:
        kind = name.removeprefix("relax.").removeprefix("nn.").replace(".", "_")
        _REGISTRY[name] = OpSpec(kind=kind, category=category, flops=flops)
    vocabulary.cache_clear()


def register_aten(names: str | tuple[str, ...], kind: str, category: str, flops: FlopRule,
                  kernels: KernelRule | None = None, kept_whole: bool = False) -> None:
    """Cost rules for an ATen operator kept as a generic node."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown category {category!r}")
    for name in (names,) if isinstance(names, str) else names:
        _ATEN[name] = OpSpec(kind=kind, category=category, flops=flops, kernels=kernels, kept_whole=kept_whole)
    vocabulary.cache_clear()


def lookup(op_name: str) -> OpSpec | None:
    """The spec of a Relax operator by its full name, or None for one not registered (kind ``other``).

    >>> spec = lookup("relax.nn.conv2d")
    >>> spec.kind, spec.category
    ('conv2d', 'conv')
    """
    return _REGISTRY.get(op_name)


def lookup_aten(aten_name: str) -> OpSpec | None:
    """The spec of an ATen (or ``onnx.``) operator kept as a generic node, or None for one not registered."""
    return _ATEN.get(aten_name)


def kept_whole_aten() -> tuple[str, ...]:
    """The ATen operators the torch frontend keeps one node (see :attr:`OpSpec.kept_whole`)."""
    return tuple(name for name, spec in _ATEN.items() if spec.kept_whole)


@cache
def vocabulary() -> tuple[str, ...]:
    """Every node kind, sorted, then ``other``: the one-hot positions of the node features. Cached
    until the next registration, since every prediction reads it."""
    return tuple(sorted({spec.kind for spec in (*_REGISTRY.values(), *_ATEN.values())})) + ("other",)


# ---- FLOP rules ---------------------------------------------------------------------------------


def _zero(args: list[Tensor], outs: list[Tensor], attrs: Mapping[str, object]) -> int:
    return 0


def _per_output(args: list[Tensor], outs: list[Tensor], attrs: Mapping[str, object]) -> int:
    return sum(t.numel for t in outs)


def _per_input(args: list[Tensor], outs: list[Tensor], attrs: Mapping[str, object]) -> int:
    return args[0].numel if args else 0


def _conv(args: list[Tensor], outs: list[Tensor], attrs: Mapping[str, object]) -> int:
    weight = args[1].shape  # O, I/groups, *kernel (OIHW family of layouts)
    return 2 * outs[0].numel * math.prod(weight[1:])


def _conv_transpose(args: list[Tensor], outs: list[Tensor], attrs: Mapping[str, object]) -> int:
    weight = args[1].shape  # I, O/groups, *kernel (IOHW)
    return 2 * args[0].numel * math.prod(weight[1:])


def _matmul(args: list[Tensor], outs: list[Tensor], attrs: Mapping[str, object]) -> int:
    k = args[0].shape[-1] if args[0].shape else 1
    return 2 * outs[0].numel * k


def _linear(args: list[Tensor], outs: list[Tensor], attrs: Mapping[str, object]) -> int:
    return 2 * outs[0].numel * args[0].shape[-1]


def _attention(args: list[Tensor], outs: list[Tensor], attrs: Mapping[str, object]) -> int:
    q, k, v = (t.shape for t in args[:3])  # [B, S, H, D]
    batch, s_q, heads, d = q
    s_k, d_v = k[1], v[-1]
    return 2 * batch * heads * s_q * s_k * (d + d_v)


def _attention_bhsd(args: list[Tensor], outs: list[Tensor], attrs: Mapping[str, object]) -> int:
    q, k, v = (t.shape for t in args[:3])  # [..., S, D], as torch's scaled_dot_product_attention
    return 2 * math.prod(q[:-2]) * q[-2] * k[-2] * (q[-1] + v[-1])


def _norm(args: list[Tensor], outs: list[Tensor], attrs: Mapping[str, object]) -> int:
    return NORM_FLOPS_PER_ELEMENT * args[0].numel


def _softmax(args: list[Tensor], outs: list[Tensor], attrs: Mapping[str, object]) -> int:
    return SOFTMAX_FLOPS_PER_ELEMENT * args[0].numel


def _pool(args: list[Tensor], outs: list[Tensor], attrs: Mapping[str, object]) -> int:
    window = attrs.get("pool_size") or ()
    return outs[0].numel * math.prod(window)  # type: ignore[arg-type]


def _adaptive_pool(args: list[Tensor], outs: list[Tensor], attrs: Mapping[str, object]) -> int:
    return args[0].numel


def _recurrent_flops(gates: int) -> FlopRule:
    """Per step of every sequence (``T * B``: the input's elements over its feature size), each layer
    and direction applies its [gates * H, I] input and [gates * H, H] recurrent matrices; a layer after
    the first reads the directions' outputs side by side."""

    def flops(args: list[Tensor], outs: list[Tensor], attrs: Mapping[str, object]) -> int:
        steps = args[0].numel // args[0].shape[-1]
        hidden = int(attrs.get("hidden_size", 0))
        directions = 2 if attrs.get("bidirectional") else 1
        per_step = 0
        for layer in range(int(attrs.get("num_layers", 1))):
            features = args[0].shape[-1] if layer == 0 else directions * hidden
            matmul = 2 * gates * hidden * (features + hidden)
            per_step += directions * (matmul + RECURRENT_POINTWISE_FLOPS * gates * hidden + hidden)  # + cell update
        return steps * per_step

    return flops


def _recurrent_kernels(args: list[Tensor], outs: list[Tensor], attrs: Mapping[str, object]) -> int:
    """cuDNN's standard RNN algorithm (PyTorch's): per layer and direction, one GEMM for the inputs
    of every step, then per step a recurrent GEMM and one fused pointwise kernel."""
    steps = args[0].shape[1] if attrs.get("batch_first") else args[0].shape[0]
    return _recurrent_layers(attrs) * (1 + 2 * steps)


def _recurrent_layers(attrs: Mapping[str, object]) -> int:
    """Layers times directions: how many recurrences run."""
    return int(attrs.get("num_layers", 1)) * (2 if attrs.get("bidirectional") else 1)


def _im2col_kernels(args: list[Tensor], outs: list[Tensor], attrs: Mapping[str, object]) -> int:
    """ATen's im2col on CUDA (``im2col_out_cuda_template`` in Im2Col.cu) zeroes its output, then
    launches its kernel once per sample of the batch, one after another; col2im runs one batched kernel."""
    return 1 + (args[0].shape[0] if len(args[0].shape) == 4 else 1)


# ---- the vocabulary -----------------------------------------------------------------------------

register(("relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d"), "conv", _conv)
register(("relax.nn.conv1d_transpose", "relax.nn.conv2d_transpose", "relax.nn.conv3d_transpose"),
         "conv", _conv_transpose)
register("relax.matmul", "matmul", _matmul)
register("relax.linear", "matmul", _linear)
register("relax.einsum", "matmul", _per_output)
register(("relax.nn.attention", "relax.nn.attention_bias"), "attention", _attention)
register(("relax.nn.batch_norm", "relax.nn.layer_norm", "relax.nn.group_norm", "relax.nn.rms_norm",
          "relax.nn.instance_norm", "relax.nn.local_response_norm"), "norm", _norm)
register(("relax.nn.softmax", "relax.nn.log_softmax"), "softmax", _softmax)
register(("relax.nn.relu", "relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.silu", "relax.sigmoid",
          "relax.tanh", "relax.nn.leakyrelu", "relax.nn.prelu", "relax.nn.selu", "relax.nn.softplus",
          "relax.nn.elu", "relax.nn.celu", "relax.clip",
          "relax.erf", "relax.exp", "relax.log", "relax.sqrt", "relax.rsqrt", "relax.abs",
          "relax.negative", "relax.sin", "relax.cos", "relax.square", "relax.sign", "relax.floor",
          "relax.ceil", "relax.round", "relax.trunc", "relax.logical_not", "relax.isnan",
          "relax.isinf", "relax.reciprocal", "relax.nn.mish"), "activation", _per_output)
register(("relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.floor_divide",
          "relax.power", "relax.maximum", "relax.minimum", "relax.where", "relax.equal",
          "relax.not_equal", "relax.less", "relax.greater", "relax.less_equal",
          "relax.greater_equal", "relax.logical_and", "relax.logical_or", "relax.floor_mod",
          "relax.mod", "relax.bitwise_and", "relax.bitwise_or", "relax.astype", "relax.nn.dropout",
          "relax.atan2", "relax.ewise_fma", "relax.log_add_exp"), "elementwise", _per_output)
register(("relax.mean", "relax.sum", "relax.max", "relax.min", "relax.prod", "relax.variance",
          "relax.std", "relax.argmax", "relax.argmin", "relax.cumsum", "relax.cumprod",
          "relax.collapse_sum_like", "relax.collapse_sum_to", "relax.norm", "relax.topk",
          "relax.sort", "relax.argsort"), "reduce", _per_input)
register(("relax.nn.max_pool1d", "relax.nn.max_pool2d", "relax.nn.max_pool3d", "relax.nn.avg_pool1d",
          "relax.nn.avg_pool2d", "relax.nn.avg_pool3d"), "pool", _pool)
register(("relax.nn.adaptive_avg_pool1d", "relax.nn.adaptive_avg_pool2d",
          "relax.nn.adaptive_avg_pool3d", "relax.nn.adaptive_max_pool2d"), "pool", _adaptive_pool)
register(("relax.concat", "relax.nn.pad", "relax.take", "relax.tile", "relax.repeat", "relax.flip",
          "relax.image.resize2d", "relax.image.grid_sample", "relax.gather_elements",
          "relax.gather_nd", "relax.scatter_elements", "relax.scatter_nd", "relax.one_hot",
          "relax.layout_transform", "relax.stack", "relax.index_put", "relax.index_tensor",
          "relax.dynamic_strided_slice", "relax.roll", "relax.tril", "relax.triu", "relax.meshgrid",
          "relax.zeros", "relax.ones", "relax.full", "relax.zeros_like", "relax.ones_like",
          "relax.full_like", "relax.arange", "relax.nn.pixel_shuffle", "relax.hamming_window",
          "relax.eye", "relax.eye_like", "relax.masked_fill", "relax.image.resize3d",
          "relax.slice_scatter"), "movement", _zero)
# Views in PyTorch eager: no kernel, no bytes moved.
register(("relax.reshape", "relax.permute_dims", "relax.squeeze", "relax.expand_dims",
          "relax.flatten", "relax.broadcast_to", "relax.strided_slice", "relax.split",
          "relax.split_like", "relax.unbind", "relax.view", "relax.memory.view",
          "relax.nn.batch_flatten"), "view", _zero)

# ATen operators TVM's importer misses or rejects on some models (benchmarks/coverage.py lists them).
register_aten("scaled_dot_product_attention.default", "attention", "attention", _attention_bhsd)
register_aten(("_convolution_mode.default", "convolution.default"), "conv2d", "conv", _conv)
register_aten(("_fused_rms_norm.default", "rms_norm.default"), "rms_norm", "norm", _norm)
register_aten(("layer_norm.default", "native_layer_norm.default"), "layer_norm", "norm", _norm)
register_aten(("amax.default", "amin.default"), "max", "reduce", _per_input)
register_aten("div.Tensor_mode", "floor_divide", "elementwise", _per_output)
register_aten(("select_scatter.default", "slice_scatter.default"), "slice_scatter", "movement", _zero)
register_aten(("index.Tensor", "_unsafe_index.Tensor"), "index_tensor", "movement", _zero)
register_aten(("_unsafe_index_put.default", "index_put.default"), "index_put", "movement", _zero)
register_aten("unfold.default", "reshape", "view", _zero)
register_aten(("hardswish.default", "hardswish_.default"), "hardswish", "activation", _per_output, kept_whole=True)
register_aten(("hardsigmoid.default", "hardsigmoid_.default"), "hardsigmoid", "activation", _per_output,
              kept_whole=True)
register_aten("linalg_vector_norm.default", "norm", "reduce", _per_input, kept_whole=True)
register_aten("roll.default", "roll", "movement", _zero, kept_whole=True)
# F.unfold and F.fold (VOLO's outlook attention, TNT's pixel embedding) are one ATen kernel each in
# eager, in their input's dtype; decomposed they become a padded copy, a gather and a copy (im2col), and
# a scatter into a float32 zero buffer and a crop (col2im): three extra full-size tensors and a float32
# one where eager makes one tensor of its input's precision. Kept whole, they read as the gather and the
# scatter-add they are (kinds PMGNS has seen in other families); col2im sums the patches that overlap.
register_aten("im2col.default", "index_tensor", "movement", _zero, _im2col_kernels, kept_whole=True)
register_aten("col2im.default", "index_put", "movement", _per_input, kept_whole=True)
# TVM reads clone and contiguous as the identity. Eager's clone copies into a new (contiguous) layout;
# contiguous is a view where its input is contiguous and a copy where not (graph.eager_layout adds it).
register_aten("clone.default", "layout_transform", "movement", _zero, kept_whole=True)
register_aten("contiguous.default", "reshape", "view", _zero, kept_whole=True)
register_aten(("to.device", "_to_copy.default", "alias.default", "lift_fresh_copy.default"), "reshape", "view", _zero)
# TVM unrolls LSTM and GRU into a dozen nodes per time step (27,000 for sequencer2d_s), each charged
# a kernel; PyTorch runs each layer as one cuDNN call, and the torch frontend keeps it one node. Their
# attributes (hidden_size, num_layers, bidirectional, batch_first) come from the frontend.
# The same for ONNX's LSTM and GRU (one layer each), which TVM's ONNX frontend does not convert.
register_aten(("lstm.input", "onnx.LSTM"), "lstm", "matmul", _recurrent_flops(4), _recurrent_kernels)
register_aten(("gru.input", "onnx.GRU"), "gru", "matmul", _recurrent_flops(3), _recurrent_kernels)
