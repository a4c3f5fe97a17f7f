"""The copies PyTorch eager makes that a dataflow graph hides, found by following memory layouts.

In a graph ``permute`` then ``reshape`` are two free views, but eager can view a tensor only where
its strides allow; otherwise reshape copies it first. A batched matrix product folds batch dimensions
with such a reshape, so attention written as ``q @ k.transpose(-2, -1)`` on heads split by a permute
copies ``q`` and ``k`` before the batched GEMM, and normalisations copy an input that is not
contiguous (``expect_contiguous`` in their CUDA kernels). In unfused attention these copies are a
large part of the time.

The graph reader follows each activation's strides through the operators, whatever the frontend
(a PyTorch module, an ONNX file, Keras or Paddle through ONNX), and asks PyTorch itself which copies
happen: each operator's layout rule (its registry entry's, :mod:`dippm_nas.graph.operators`) replays the
operator on ``meta`` tensors with those strides, under a dispatch mode that sees the ``clone`` calls of
ATen's own decompositions. A copy found becomes a node of its own (a layout transform) feeding the
operator, so the graph, the roofline and the liveness all see it. Outputs take the strides eager gives
them: views keep their input's, elementwise operators follow their inputs' layout (TensorIterator),
every other kernel writes a contiguous tensor unless its rule says otherwise.

This module holds the machinery and the patterns many operators share; torch is imported on first use,
so that a graph read back from a cache is predicted without it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dippm_nas.graph.tensor import Shape

if TYPE_CHECKING:
    import torch

Strides = tuple[int, ...]


@dataclass(frozen=True)
class Layout:
    """What an operator does to layouts: the inputs it copies first (index, shape copied) and its
    outputs' strides (None where contiguous)."""

    copies: tuple[tuple[int, Shape], ...] = ()
    strides: tuple[Strides | None, ...] | None = None  # None: every output contiguous


CONTIGUOUS = Layout()


def on_meta(shape: Shape, strides: Strides | None) -> torch.Tensor:
    """An empty ``meta`` tensor with this shape and layout."""
    import torch

    if strides is None:
        return torch.empty(shape, device="meta")
    return torch.empty_strided(shape, strides, device="meta")


def own_strides(t: torch.Tensor) -> Strides | None:
    """A tensor's strides, None where it is contiguous."""
    return None if t.is_contiguous() else tuple(t.stride())


@functools.cache
def _clone_recorder() -> type:
    """A dispatch mode that remembers the tensors ``aten.clone`` copies while an operator runs."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class CloneRecorder(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.cloned: list[torch.Tensor] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.clone.default:
                self.cloned.append(args[0])
            return func(*args, **(kwargs or {}))

    return CloneRecorder


def replay(run: Callable[[], Any], inputs: Sequence[torch.Tensor]) -> tuple[tuple[tuple[int, Shape], ...], Any]:
    """Run ``run`` on meta tensors; the inputs it clones (by index) and its result."""
    import torch

    with _clone_recorder()() as recorder:
        result = run()
    copies = {}
    for source in recorder.cloned:
        owner = next((i for i, m in enumerate(inputs) if torch._C._is_alias_of(source, m)), None)
        if owner is not None and source.dim() == inputs[owner].dim():
            copies.setdefault(owner, tuple(source.shape))
    return tuple(copies.items()), result


# ---- patterns shared by many operators ----------------------------------------------------------


def reshaped(inputs: list[torch.Tensor], attrs: dict[str, object], outs: list[Shape]) -> Layout:
    """A reshape (flatten, squeeze, ...): a view where the strides allow one, else a copy first."""
    copies, out = replay(lambda: inputs[0].reshape(outs[0]), inputs[:1])
    return Layout(copies, (own_strides(out),))


def permuted(inputs: list[torch.Tensor], attrs: dict[str, object], outs: list[Shape]) -> Layout:
    """A permutation of the axes: a view with the strides permuted."""
    axes = attrs.get("axes")
    x = inputs[0]
    out = x.permute(tuple(axes)) if axes else x.permute(tuple(reversed(range(x.dim()))))
    return Layout((), (own_strides(out),))


def broadcast(inputs: list[torch.Tensor], attrs: dict[str, object], outs: list[Shape]) -> Layout:
    """An expansion: a view with zero strides on the broadcast axes."""
    return Layout((), (own_strides(inputs[0].expand(outs[0])),))


def sliced(inputs: list[torch.Tensor], attrs: dict[str, object], outs: list[Shape]) -> Layout:
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
        strides.append(own_strides(on_meta(shape, tuple(kept))))
    return Layout((), tuple(strides))


def first_contiguous(inputs: list[torch.Tensor], attrs: dict[str, object], outs: list[Shape]) -> Layout:
    """A kernel that copies a first input that is not contiguous (``expect_contiguous``)."""
    x = inputs[0]
    return CONTIGUOUS if x.is_contiguous() else Layout(((0, tuple(x.shape)),))


def first_dense(inputs: list[torch.Tensor], attrs: dict[str, object], outs: list[Shape]) -> Layout:
    """cuDNN takes a channels-last input as it is (it runs NHWC); any other layout it copies."""
    import torch

    x = inputs[0]
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
        return CONTIGUOUS
    return first_contiguous(inputs, attrs, outs)


def elementwise(inputs: list[torch.Tensor], attrs: dict[str, object], outs: list[Shape]) -> Layout:
    """TensorIterator lays its output out like its inputs (a permuted tensor times two is permuted)."""
    import torch

    out = functools.reduce(torch.add, inputs)
    if len(outs) != 1 or tuple(out.shape) != tuple(outs[0]):
        return CONTIGUOUS
    return Layout((), (own_strides(out),))


def suggests_channels_last(shape: Shape, strides: Strides | None) -> bool:
    """Whether ATen dispatches a 4-D tensor to its channels-last kernels (``suggest_memory_format``):
    channels-last strides, contiguous or not; a token sequence transposed into an image has them."""
    if strides is None or len(shape) != 4:
        return False
    import torch
    from torch._prims_common import suggest_memory_format

    if shape[0] == 1:  # graphs are read at batch 1, where the batch stride is arbitrary: give it the batch's span
        strides = (max(s * n for s, n in zip(strides[1:], shape[1:])), *strides[1:])
    return suggest_memory_format(on_meta(shape, strides)) == torch.channels_last
