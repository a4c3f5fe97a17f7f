"""Features for learning: per-node vectors, per-graph static features, torch-geometric export."""

from __future__ import annotations

import math

import numpy as np
import torch

from dippm_nas.graph import ops
from dippm_nas.graph.model_graph import ModelGraph, Node

MAX_RANK = 5
_SPATIAL_ATTRS = ("strides", "dilation", "padding", "pool_size")


def _log(value: float) -> float:
    return math.log1p(max(value, 0.0))


def _pair(value: object, n: int = 2) -> list[float]:
    items = list(value) if isinstance(value, tuple | list) else ([value] if value is not None else [])
    items = [float(v) for v in items if isinstance(v, int | float)][:n]
    return items + [0.0] * (n - len(items))


def node_feature_names() -> list[str]:
    kinds = [f"kind={k}" for k in ops.vocabulary()]
    cats = [f"category={c}" for c in ops.CATEGORIES]
    numeric = ["log_flops", "log_bytes_read", "log_bytes_written", "log_weight_bytes", "kernel_h",
               "kernel_w", "log_groups", "n_inputs", "rank"]
    attrs = [f"{a}_{i}" for a in _SPATIAL_ATTRS for i in range(2)]
    shape = [f"log_out_dim{i}" for i in range(MAX_RANK)]
    return kinds + cats + numeric + attrs + shape


#: Columns of the dense block that are counts of FLOPs, bytes or groups, fed as log(1 + x).
_LOG_COLUMNS = (0, 1, 2, 3, 6)


def _raw_dense(node: Node) -> list[float]:
    """The dense features before their logs, in one pass over the node.

    Prediction featurizes every graph it is given, so this loop is on PMGNS's critical path.
    """
    kernel = node.weights[0].shape[2:4] if node.category == "conv" and node.weights else ()
    out = node.outputs[0].shape if node.outputs else ()
    weight = sum(t.nbytes for t in node.weights)
    attrs = node.attrs
    row = [float(node.flops), float(sum(t.nbytes for t in node.inputs) + weight), float(sum(t.nbytes for t in node.outputs)),
           float(weight), *_pair(tuple(kernel)), float(attrs.get("groups", 1) or 1), float(len(node.inputs)),
           float(len(out))]
    for name in _SPATIAL_ATTRS:
        row += _pair(attrs.get(name))
    tail = out[-MAX_RANK:]
    return row + [float(d) for d in tail] + [0.0] * (MAX_RANK - len(tail))


_CATEGORY_INDEX = {c: i for i, c in enumerate(ops.CATEGORIES)}


def node_feature_matrix(graph: ModelGraph) -> torch.Tensor:
    """``[nodes, features]`` in the order of :func:`node_feature_names`: kind one-hot, category
    one-hot, then the dense features. Built in numpy: tiny torch ops cost more than they compute."""
    vocab = ops.vocabulary()
    kinds = {k: i for i, k in enumerate(vocab)}
    n_kinds, n_cats = len(vocab), len(ops.CATEGORIES)
    n_dense = len(node_feature_names()) - n_kinds - n_cats
    x = np.zeros((len(graph.nodes), n_kinds + n_cats + n_dense), dtype=np.float32)
    if graph.nodes:
        dense = np.array([_raw_dense(n) for n in graph.nodes], dtype=np.float64)
        logs = [*_LOG_COLUMNS, *range(n_dense - MAX_RANK, n_dense)]
        dense[:, logs] = np.log1p(np.maximum(dense[:, logs], 0.0))
        rows = np.arange(len(graph.nodes))
        x[rows, [kinds.get(n.kind, kinds["other"]) for n in graph.nodes]] = 1.0
        x[rows, [n_kinds + _CATEGORY_INDEX[n.category] for n in graph.nodes]] = 1.0
        x[:, n_kinds + n_cats:] = dense
    return torch.from_numpy(x)


def edge_index(graph: ModelGraph) -> torch.Tensor:
    if not graph.edges:
        return torch.zeros((2, 0), dtype=torch.long)
    return torch.tensor(graph.edges, dtype=torch.long).t().contiguous()


def static_feature_names() -> list[str]:
    base = ["batch", "log_flops", "log_macs", "log_params", "log_param_bytes", "log_activation_bytes",
            "n_nodes", "n_edges", "dippm_convs", "dippm_dense", "dippm_relus"]
    return base + [f"count={k}" for k in ops.vocabulary()]


def static_features(graph: ModelGraph) -> dict[str, float]:
    """Per-graph features; DIPPM's five (MACs, batch, #conv, #dense, #relu) are among them."""
    counts = graph.op_counts()
    vocab = ops.vocabulary()
    values = {
        "batch": float(graph.batch),
        "log_flops": _log(graph.flops),
        "log_macs": _log(graph.macs),
        "log_params": _log(graph.param_count),
        "log_param_bytes": _log(graph.param_bytes),
        "log_activation_bytes": _log(graph.activation_bytes),
        "n_nodes": float(len(graph.nodes)),
        "n_edges": float(len(graph.edges)),
        "dippm_convs": float(sum(1 for n in graph.nodes if n.category == "conv")),
        "dippm_dense": float(sum(1 for n in graph.nodes if n.category == "matmul")),
        "dippm_relus": float(counts.get("relu", 0)),
    }
    for kind in vocab:
        values[f"count={kind}"] = float(counts.get(kind, 0)) if kind != "other" else float(
            sum(c for k, c in counts.items() if k not in vocab or k == "other"))
    return values


def to_pyg(graph: ModelGraph):
    """A ``torch_geometric.data.Data`` with ``x``, ``edge_index`` and ``static`` (1 x F)."""
    from torch_geometric.data import Data

    static = torch.tensor([list(static_features(graph).values())], dtype=torch.float32)
    return Data(x=node_feature_matrix(graph), edge_index=edge_index(graph), static=static, num_nodes=len(graph.nodes))
