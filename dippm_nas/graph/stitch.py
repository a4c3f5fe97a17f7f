"""Join graphs of consecutive blocks into the graph of the whole model.

Block ``i + 1`` reads what block ``i`` returns: every node of block ``i + 1`` that reads the block's
input gets an edge from each output node of block ``i``. That is exactly the graph the whole model
exports to when it runs its blocks in sequence. Eager also keeps what block ``i`` returns until
block ``i + 1`` returns (it is the argument of that module call), so the output nodes of block ``i``
get an ``eager_hold`` to the last node of block ``i + 1``, as the whole model's export gives them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from dippm_nas.graph.model_graph import ModelGraph, Node
from dippm_nas.graph.tensor import EAGER_HOLD


def stitch(blocks: Sequence[ModelGraph], name: str) -> ModelGraph:
    """The graph named ``name`` of ``blocks`` run in sequence (see the module docstring); batch, inputs
    and family are the first block's. Raises ValueError for no blocks."""
    if not blocks:
        raise ValueError("nothing to stitch")
    nodes, edges = [], []
    previous_outputs: tuple[int, ...] = ()
    param_count = param_bytes = 0
    for block in blocks:
        offset = len(nodes)
        nodes.extend(n.renumbered(n.id + offset) for n in block.nodes)
        edges.extend((s + offset, d + offset) for s, d in block.edges)
        for entry in block.entry_nodes:
            edges.extend((p, entry + offset) for p in previous_outputs)
        last = len(nodes) - 1
        for p in previous_outputs:
            nodes[p] = _held_until(nodes[p], last)
        previous_outputs = tuple(o + offset for o in block.outputs)
        param_count += block.param_count
        param_bytes += block.param_bytes
    first = blocks[0]
    graph = ModelGraph(
        name=name, batch=first.batch, inputs=first.inputs, nodes=tuple(nodes),
        edges=tuple(sorted(set(edges))), outputs=previous_outputs, param_count=param_count,
        param_bytes=param_bytes, source="stitched", family=first.family,
        warnings=tuple(w for b in blocks for w in b.warnings), entry_nodes=first.entry_nodes,
    )
    # what a prediction sums over every operator, from the blocks' sums (each block is summed once, as it is cached)
    object.__setattr__(graph, "flops", sum(b.flops for b in blocks))
    object.__setattr__(graph, "float_weight_dtypes", frozenset().union(*(b.float_weight_dtypes for b in blocks)))
    return graph


def _held_until(node: Node, step: int) -> Node:
    hold = max(int(node.attrs.get(EAGER_HOLD, 0)), step - node.id)
    return replace(node, attrs={**node.attrs, EAGER_HOLD: hold})
