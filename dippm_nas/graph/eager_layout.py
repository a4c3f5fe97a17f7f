"""The copies PyTorch eager makes that a dataflow graph hides, found by following memory layouts.

In a graph ``permute`` then ``reshape`` are two free views, but eager can view a tensor only where
its strides allow; otherwise reshape copies it first. ``matmul`` folds batch dimensions with such a
reshape, so attention written as ``q @ k.transpose(-2, -1)`` on heads split by a permute copies
``q`` and ``k`` before the batched GEMM, and layer norm and softmax copy an input that is not
contiguous (``expect_contiguous`` in their CUDA kernels). In unfused attention these copies are a
large part of the time.

The graph reader follows each activation's strides through the operators, whatever the frontend
(a PyTorch module, an ONNX file, Keras or Paddle through ONNX), and asks PyTorch itself which copies
happen: each rule replays the operator on ``meta`` tensors with those strides, under a dispatch mode
that sees the ``clone`` calls of ATen's own decompositions. A copy found becomes a node of its own
(a layout transform) feeding the operator, so the graph, the roofline and the liveness all see it.
Outputs take the strides eager gives them: views keep their input's, elementwise operators follow
their inputs' layout (TensorIterator), upsampling the layout its input suggests, every other kernel
writes a contiguous tensor, attention in the (batch, tokens, heads, dim) layout Relax gives it, as flash
and memory-efficient attention do.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dippm_nas.graph.tensor import Shape

Strides = tuple[int, ...]

#: The operator a copy node is: ATen's clone, a transform into a new (contiguous) layout (graph.ops).
COPY_OP = "clone.default"


@dataclass(frozen=True)
class Layout:
    """What an operator does to layouts: the inputs it copies first (index, shape copied) and its
    outputs' strides (None where contiguous)."""

    copies: tuple[tuple[int, Shape], ...] = ()
    strides: tuple[Strides | None, ...] | None = None  # None: every output contiguous


CONTIGUOUS = Layout()


def on_meta(shape: Shape, strides: Strides | None) -> torch.Tensor:
    """An empty ``meta`` tensor with this shape and layout."""
    if strides is None:
        return torch.empty(shape, device="meta")
    return torch.empty_strided(shape, strides, device="meta")


def _own_strides(t: torch.Tensor) -> Strides | None:
    return None if t.is_contiguous() else tuple(t.stride())


class _CloneRecorder(TorchDispatchMode):
    """Remembers the tensors ``aten.clone`` copies while an operator runs."""

    def __init__(self) -> None:
        super().__init__()
        self.cloned: list[torch.Tensor] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.clone.default:
            self.cloned.append(args[0])
        return func(*args, **(kwargs or {}))


def _replay(run: Callable[[], torch.Tensor | Sequence[torch.Tensor]],
            inputs: Sequence[torch.Tensor]) -> tuple[tuple[tuple[int, Shape], ...], object]:
    """Run ``run`` on meta tensors; the inputs it clones (by index) and its result."""
    with _CloneRecorder() as recorder:
        result = run()
    copies = {}
    for source in recorder.cloned:
        owner = next((i for i, m in enumerate(inputs) if torch._C._is_alias_of(source, m)), None)
        if owner is not None and source.dim() == inputs[owner].dim():
            copies.setdefault(owner, tuple(source.shape))
    return tuple(copies.items()), result


#: A rule: (input meta tensors, the operator's attributes, its output shapes) -> its Layout.
Rule = Callable[[list[torch.Tensor], dict[str, object], list[Shape]], Layout]
_RULES: dict[str, Rule] = {}


def rule(*kinds: str) -> Callable[[Rule], Rule]:
    """Registers a layout rule for operator kinds (graph.ops) or ATen operator names."""

    def register(fn: Rule) -> Rule:
        for kind in kinds:
            _RULES[kind] = fn
        return fn
    return register


@rule("reshape", "flatten", "batch_flatten", "squeeze", "expand_dims", "view", "memory_view")
def _reshape(inputs: list[torch.Tensor], attrs: dict[str, object], outs: list[Shape]) -> Layout:
    copies, out = _replay(lambda: inputs[0].reshape(outs[0]), inputs[:1])
    return Layout(copies, (_own_strides(out),))


@rule("permute_dims")
def _permute(inputs: list[torch.Tensor], attrs: dict[str, object], outs: list[Shape]) -> Layout:
    axes = attrs.get("axes")
    x = inputs[0]
    out = x.permute(tuple(axes)) if axes else x.permute(tuple(reversed(range(x.dim()))))
    return Layout((), (_own_strides(out),))


@rule("broadcast_to")
def _broadcast(inputs: list[torch.Tensor], attrs: dict[str, object], outs: list[Shape]) -> Layout:
    return Layout((), (_own_strides(inputs[0].expand(outs[0])),))


@rule("strided_slice", "split", "unbind", "dynamic_strided_slice")
def _slice(inputs: list[torch.Tensor], attrs: dict[str, object], outs: list[Shape]) -> Layout:
    """A slice keeps its input's strides (a select drops the axis it selects on): contiguous only
    where it cuts the leading axes."""
    x = inputs[0]
    strides = []
    for shape in outs:
        kept = list(x.stride())
        if len(shape) == x.dim() - 1:
            axis = attrs.get("axis")
            axis = axis if isinstance(axis, int) else next(
                (i for i in range(len(shape)) if shape[i] != x.shape[i]), len(shape))
            kept.pop(axis % x.dim())
        if len(kept) != len(shape):
            strides.append(None)
            continue
        strides.append(_own_strides(on_meta(shape, tuple(kept))))
    return Layout((), tuple(strides))


@rule("matmul")
def _matmul(inputs: list[torch.Tensor], attrs: dict[str, object], outs: list[Shape]) -> Layout:
    if len(inputs) < 2:
        return CONTIGUOUS
    copies, _ = _replay(lambda: torch.matmul(inputs[0], inputs[1]), inputs[:2])
    return Layout(copies)


@rule("linear")
def _linear(inputs: list[torch.Tensor], attrs: dict[str, object], outs: list[Shape]) -> Layout:
    copies, _ = _replay(lambda: torch.nn.functional.linear(inputs[0], inputs[1]), inputs[:2])
    return Layout(copies)


@rule("layer_norm", "rms_norm", "group_norm", "softmax", "log_softmax", "contiguous.default")
def _first_contiguous(inputs: list[torch.Tensor], attrs: dict[str, object], outs: list[Shape]) -> Layout:
    x = inputs[0]
    return CONTIGUOUS if x.is_contiguous() else Layout(((0, tuple(x.shape)),))


@rule("conv1d", "conv2d", "conv3d", "conv1d_transpose", "conv2d_transpose", "conv3d_transpose", "batch_norm")
def _first_dense(inputs: list[torch.Tensor], attrs: dict[str, object], outs: list[Shape]) -> Layout:
    """cuDNN takes a channels-last input as it is (it runs NHWC); any other layout it copies."""
    x = inputs[0]
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
        return CONTIGUOUS
    return _first_contiguous(inputs, attrs, outs)


def _elementwise(inputs: list[torch.Tensor], attrs: dict[str, object], outs: list[Shape]) -> Layout:
    """TensorIterator lays its output out like its inputs (a permuted tensor times two is permuted)."""
    out = functools.reduce(torch.add, inputs)
    if len(outs) != 1 or tuple(out.shape) != tuple(outs[0]):
        return CONTIGUOUS
    return Layout((), (_own_strides(out),))


@rule("image_resize2d")
def _resize(inputs: list[torch.Tensor], attrs: dict[str, object], outs: list[Shape]) -> Layout:
    """ATen's upsampling kernels write their output in the layout their input suggests."""
    if not suggests_channels_last(tuple(inputs[0].shape), tuple(inputs[0].stride())) or len(outs[0]) != 4:
        return CONTIGUOUS
    return Layout((), (tuple(torch.empty(outs[0], device="meta", memory_format=torch.channels_last).stride()),))


_CATEGORY_RULES: dict[str, Rule] = {"elementwise": _elementwise, "activation": _elementwise}

#: Operators whose ATen kernel is chosen by the layout of their input; their rule gives them a
#: channels-last output exactly when it is, and the graph reader records that in their
#: ``eager_channels_last`` attribute.
DISPATCH_ON_LAYOUT = frozenset({"image_resize2d"})


def suggests_channels_last(shape: Shape, strides: Strides | None) -> bool:
    """Whether ATen dispatches a 4-D tensor to its channels-last kernels (``suggest_memory_format``):
    channels-last strides, contiguous or not; a token sequence transposed into an image has them."""
    if strides is None or len(shape) != 4:
        return False
    from torch._prims_common import suggest_memory_format

    if shape[0] == 1:  # graphs are read at batch 1, where the batch stride is arbitrary: give it the batch's span
        strides = (max(s * n for s, n in zip(strides[1:], shape[1:])), *strides[1:])
    return suggest_memory_format(on_meta(shape, strides)) == torch.channels_last


#: Operators that may copy inputs that are all contiguous: a broadcast batch is expanded first.
_COPY_CONTIGUOUS = frozenset({"matmul"})


def layout_of(op: str, kind: str, category: str, inputs: list[tuple[Shape, Strides | None]],
              attrs: dict[str, object], outs: list[Shape]) -> Layout:
    """How eager lays out this operator: the inputs it copies (by position in ``inputs``, the
    operator's tensor arguments in order, weights contiguous) and its outputs' strides."""
    fn = _RULES.get(op) or _RULES.get(kind) or _CATEGORY_RULES.get(category)
    if fn is None or not inputs:
        return CONTIGUOUS
    if category != "view" and kind not in _COPY_CONTIGUOUS and all(s is None for _, s in inputs):
        return CONTIGUOUS  # a kernel on contiguous inputs writes contiguous outputs
    metas = [on_meta(shape, strides) for shape, strides in inputs]
    try:
        return fn(metas, attrs, outs)
    except (RuntimeError, TypeError, ValueError, IndexError):  # shapes meta tensors reject: no copy
        return CONTIGUOUS
