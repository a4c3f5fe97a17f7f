"""ModelGraph <-> compact bytes (zlib-compressed JSON), for caches shared between processes and hosts.

JSON rather than pickle: a cache row written by one version or host is data, never code.
"""

from __future__ import annotations

import json
import zlib

from dippm_nas.graph import operators
from dippm_nas.graph.model_graph import ModelGraph, Node
from dippm_nas.graph.tensor import Tensor

#: What a stored graph means, not only how it is laid out: bump it whenever the frontends read a model
#: differently (a persistent cache would otherwise mix graphs of two versions in one study).
FORMAT = 3


def graph_version() -> str:
    """What a cached graph depends on besides its model: the format and the operator vocabulary it was read
    with (a kind registered since reads as ``other`` in a graph built before). Graph caches key on it."""
    return f"{FORMAT}.{operators.fingerprint()[:16]}"


def _tensor(t: Tensor) -> list[object]:
    return [list(t.shape), t.dtype]


def _untensor(raw: list[object]) -> Tensor:
    return Tensor(tuple(raw[0]), raw[1])  # type: ignore[arg-type]


def _attr(value: object) -> object:
    return {"__tuple__": [_attr(v) for v in value]} if isinstance(value, tuple) else value


def _unattr(value: object) -> object:
    if isinstance(value, dict) and "__tuple__" in value:
        return tuple(_unattr(v) for v in value["__tuple__"])
    return value


def graph_to_bytes(graph: ModelGraph) -> bytes:
    """``graph`` as zlib-compressed JSON, tagged with ``FORMAT``; :func:`graph_from_bytes` reads it back.

    >>> graph = ModelGraph("empty", batch=1, inputs=(Tensor((1, 3)),), nodes=(), edges=(), outputs=(),
    ...                    param_count=0, param_bytes=0)
    >>> graph_from_bytes(graph_to_bytes(graph)) == graph
    True
    """
    payload = {
        "format": FORMAT, "name": graph.name, "batch": graph.batch, "source": graph.source,
        "family": graph.family, "warnings": list(graph.warnings),
        "inputs": [_tensor(t) for t in graph.inputs], "edges": [list(e) for e in graph.edges],
        "outputs": list(graph.outputs), "entry_nodes": list(graph.entry_nodes),
        "param_count": graph.param_count, "param_bytes": graph.param_bytes,
        "nodes": [[n.id, n.op, n.kind, n.category, {k: _attr(v) for k, v in n.attrs.items()},
                   [_tensor(t) for t in n.inputs], [_tensor(t) for t in n.outputs],
                   [_tensor(t) for t in n.weights], n.flops] for n in graph.nodes],
    }
    return zlib.compress(json.dumps(payload, separators=(",", ":")).encode(), 6)


def graph_from_bytes(blob: bytes) -> ModelGraph:
    """The graph :func:`graph_to_bytes` wrote; raises ValueError for bytes of another ``FORMAT``."""
    p = json.loads(zlib.decompress(blob))
    if p.get("format") != FORMAT:
        raise ValueError(f"cached graph has format {p.get('format')}, this version reads {FORMAT}")
    nodes = tuple(
        Node(id=i, op=op, kind=kind, category=cat, attrs={k: _unattr(v) for k, v in attrs.items()},
             inputs=tuple(map(_untensor, ins)), outputs=tuple(map(_untensor, outs)),
             weights=tuple(map(_untensor, ws)), flops=flops)
        for i, op, kind, cat, attrs, ins, outs, ws, flops in p["nodes"]
    )
    return ModelGraph(
        name=p["name"], batch=p["batch"], inputs=tuple(map(_untensor, p["inputs"])), nodes=nodes,
        edges=tuple(tuple(e) for e in p["edges"]), outputs=tuple(p["outputs"]),
        param_count=p["param_count"], param_bytes=p["param_bytes"], source=p["source"],
        family=p["family"], warnings=tuple(p["warnings"]), entry_nodes=tuple(p["entry_nodes"]),
    )
