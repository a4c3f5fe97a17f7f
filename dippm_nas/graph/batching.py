"""A graph at batch B from its graph at batch 1, without exporting again (the inverse, a graph's
per-sample values, is in :class:`dippm_nas.cost.pipeline.table.NodeTable`).

Every activation tensor of rank 2 or more carries the batch in its leading dimension (or folded
into it, as ``B * heads``), so scaling that dimension by B scales each tensor's size by B; FLOPs of
every operator that reads activations scale by B too. Rank-1 tensors are per-channel side outputs
(batch norm's running statistics), not activations, and weights do not change.
"""

from __future__ import annotations

from dataclasses import replace

from dippm_nas.graph.model_graph import ModelGraph, Node
from dippm_nas.graph.tensor import Tensor


def _with(node: Node, factor: int, resize) -> Node:
    """A copy of ``node`` with resized activations (``dataclasses.replace`` is slower by ~10x)."""
    new = object.__new__(Node)
    new.__dict__.update(node.__dict__, inputs=tuple(resize(t, factor) for t in node.inputs),
                        outputs=tuple(resize(t, factor) for t in node.outputs))
    new.__dict__["flops"] = node.flops * factor if resize is _scaled else node.flops // factor
    return new


def _scaled(t: Tensor, factor: int) -> Tensor:
    return Tensor((t.shape[0] * factor, *t.shape[1:]), t.dtype) if len(t.shape) >= 2 else t


def scale_batch(graph: ModelGraph, batch: int) -> ModelGraph:
    """``graph``, read at batch 1, as it is at ``batch``: activations and FLOPs times ``batch``.

    Returns ``graph`` itself at batch 1; raises ValueError for a batch below 1 or a graph that is
    not at batch 1.
    """
    if batch <= 0:
        raise ValueError(f"batch must be positive, got {batch}")
    if graph.batch != 1:
        raise ValueError(f"scale_batch starts from a batch-1 graph; this one has batch {graph.batch}")
    if batch == 1:
        return graph
    nodes = tuple(_with(n, batch, _scaled) for n in graph.nodes)
    return replace(graph, batch=batch, nodes=nodes, inputs=tuple(_scaled(t, batch) for t in graph.inputs))
