"""Deterministic structural signatures of a graph and of any subgraph, for caches.

Each node hashes its own label (kind, structural attributes, shapes) together with the sorted
hashes of its producers, as a Merkle DAG does; a graph's signature hashes the sorted multiset of its
node hashes. So the signature depends on structure alone: not on node numbering, not on the order a
frontend emitted independent operators in, not on names.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

from dippm_nas.graph.model_graph import ModelGraph, Node
from dippm_nas.graph.tensor import EAGER_HOLD, EAGER_INPLACE_OF

#: Attributes that name a layout or a dtype, or say how long eager keeps an output, rather than
#: change the computation's structure.
COSMETIC_ATTRS = frozenset({"data_layout", "kernel_layout", "out_layout", "layout", "out_dtype", "aten", EAGER_HOLD,
                            EAGER_INPLACE_OF})


def _digest(payload: object) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def _round(value: object) -> object:
    if isinstance(value, float):
        return float(f"{value:.5g}")  # 1e-05 and float32's 9.9999997e-06 are one epsilon
    if isinstance(value, tuple):
        return tuple(_round(v) for v in value)
    return value


def _is_global_pool(node: Node) -> bool:
    """Global average pooling, however the frontend spelled it."""
    if node.kind.startswith("adaptive_avg_pool"):
        return all(d == 1 for d in node.outputs[0].shape[2:])
    if node.kind == "mean" and node.inputs and node.attrs.get("keepdims"):
        rank = len(node.inputs[0].shape)
        axes = node.attrs.get("axis") or ()
        return rank > 2 and {a % rank for a in axes} == set(range(2, rank))  # type: ignore[union-attr,operator]
    return False


def canonical(node: Node) -> tuple[str, dict[str, object]]:
    """The node's kind and structural attributes, with equivalent spellings made one."""
    if _is_global_pool(node):
        return "global_avg_pool", {}
    return node.kind, {k: _round(v) for k, v in node.attrs.items() if k not in COSMETIC_ATTRS}


def node_label(node: Node) -> list[object]:
    """What a node's hash covers: its canonical kind and attributes, input and weight shapes, and
    output shapes with dtypes (JSON-ready)."""
    kind, attrs = canonical(node)
    return [
        kind,
        attrs,
        [list(t.shape) for t in node.inputs],
        [[list(t.shape), t.dtype] for t in node.outputs],
        sorted(list(t.shape) for t in node.weights),
    ]


def node_hashes(graph: ModelGraph, subset: Iterable[int] | None = None) -> dict[int, str]:
    """Merkle hash of each node in ``subset`` (all nodes by default) over producers inside it."""
    inside = set(subset) if subset is not None else {n.id for n in graph.nodes}
    hashes: dict[int, str] = {}
    for node in graph.nodes:  # topological order: producers come first
        if node.id not in inside:
            continue
        parents = sorted(hashes[p] for p in graph.producers[node.id] if p in inside)
        hashes[node.id] = _digest([node_label(node), parents])
    return hashes


def graph_signature(graph: ModelGraph, subset: Iterable[int] | None = None) -> str:
    """Signature of the whole graph, or of the subgraph induced by ``subset``."""
    return _digest(sorted(node_hashes(graph, subset).values()))
