"""FLOP rules many operator families share (the conventions are in :mod:`dippm_nas.graph.operators`)."""

from __future__ import annotations

from collections.abc import Mapping

from dippm_nas.graph.operators._registry import Node
from dippm_nas.graph.tensor import Tensor


def zero(args: list[Tensor], outs: list[Tensor], attrs: Mapping[str, object]) -> int:
    """No arithmetic: data movement and views."""
    return 0


def per_output(args: list[Tensor], outs: list[Tensor], attrs: Mapping[str, object]) -> int:
    """One FLOP per element written (elementwise operators and activations)."""
    return sum(t.numel for t in outs)


def per_input(args: list[Tensor], outs: list[Tensor], attrs: Mapping[str, object]) -> int:
    """One FLOP per element read (reductions)."""
    return args[0].numel if args else 0


def rows_of_last_axis(node: Node) -> tuple[float, float]:
    """(rows, row length) of a kernel that works along its input's last axis, one row at a time."""
    if not node.inputs or not node.inputs[0].shape:
        return 0.0, 0.0
    length = node.inputs[0].shape[-1]
    return node.inputs[0].numel / max(length, 1), float(length)


def rows_of_planes(node: Node) -> tuple[float, float]:
    """(planes, plane size) of a kernel that works through an NCHW tensor plane by plane (batch norm)."""
    if not node.inputs or len(node.inputs[0].shape) < 3:
        return rows_of_last_axis(node)
    shape = node.inputs[0].shape
    return float(shape[0] * shape[1]), node.inputs[0].numel / max(shape[0] * shape[1], 1)


def rows_reduced(node: Node) -> tuple[float, float]:
    """(rows, row length) of a reduction: one row per output element, as long as the input over the output."""
    if not node.inputs or not node.outputs:
        return 0.0, 0.0
    out = max(node.outputs[0].numel, 1)
    return float(out), node.inputs[0].numel / out
