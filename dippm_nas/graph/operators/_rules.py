"""FLOP rules many operator families share (the conventions are in :mod:`dippm_nas.graph.operators`)."""

from __future__ import annotations

from collections.abc import Mapping

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
