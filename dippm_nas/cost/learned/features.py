"""Features for learning: per-node vectors, per-graph static features, torch-geometric export.

Both are defined on one sample (the batch-1 graph) and read from a :class:`NodeTable`, which keeps the
per-sample values of a graph at any batch: the batch enters the learned model as a feature.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING

import numpy as np

from dippm_nas.cost.pipeline.table import MAX_RANK, SHAPE_COLUMNS, NodeTable, node_table
from dippm_nas.graph import operators
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.graph.operators.elementwise import RELU

if TYPE_CHECKING:
    import torch


def _log(value: float) -> float:
    return math.log1p(max(value, 0.0))


def node_feature_names() -> list[str]:
    """The names of :func:`node_feature_matrix`'s columns, in its order."""
    kinds = [f"kind={k}" for k in operators.vocabulary()]
    cats = [f"category={c}" for c in operators.category_names()]
    counts = ["log_flops", "log_bytes_read", "log_bytes_written", "log_weight_bytes"]
    shape = [f"log_out_dim{i}" for i in range(MAX_RANK)]
    named = [("log_groups" if c == "groups" else c) for c in SHAPE_COLUMNS]
    return kinds + cats + counts + named + shape + ["autocast_float32"]


def node_feature_matrix(table: NodeTable) -> torch.Tensor:
    """``[nodes, features]`` in the order of :func:`node_feature_names`: kind one-hot, category
    one-hot, then :func:`dense_node_features`."""
    import torch

    n_onehot = one_hot_width()
    x = np.zeros((len(table), n_onehot + DENSE_NODE_FEATURES), dtype=np.float32)
    rows = np.arange(len(table))
    for columns in one_hot_columns(table):
        x[rows, columns] = 1.0
    x[:, n_onehot:] = dense_node_features(table)
    return torch.from_numpy(x)


#: FLOPs and bytes (4), operator attributes, output dimensions, whether the output stays float32.
DENSE_NODE_FEATURES = 4 + len(SHAPE_COLUMNS) + MAX_RANK + 1


def one_hot_width() -> int:
    """The node features' leading one-hot columns: kinds, then categories."""
    return len(operators.vocabulary()) + len(operators.categories())


def one_hot_columns(table: NodeTable) -> tuple[np.ndarray, np.ndarray]:
    """Each operator's two one-hot columns in the node features: its kind's and its category's."""
    return table.kind, len(operators.vocabulary()) + table.category


def dense_node_features(table: NodeTable) -> np.ndarray:
    """The node features after the one-hot columns: FLOPs, bytes, groups and dimensions as
    log(1 + x), the other operator attributes as they are, and whether the output stays float32
    under autocast."""
    counts = np.stack([table.flops1, table.read1 + table.weight_bytes, table.written1, table.weight_bytes], axis=1)
    shape_attrs = table.shape_attrs.copy()
    groups = SHAPE_COLUMNS.index("groups")
    shape_attrs[:, groups] = np.log1p(np.maximum(shape_attrs[:, groups], 0.0))
    return np.concatenate([np.log1p(np.maximum(counts, 0.0)), shape_attrs, np.log1p(np.maximum(table.out_dims1, 0.0)),
                           table.autocast.stays_f32[:, None]], axis=1, dtype=np.float32)


def edge_index(graph: ModelGraph) -> torch.Tensor:
    """Who feeds whom as torch-geometric's ``[2, edges]`` index: producers in row 0, consumers in row 1."""
    import torch

    return torch.from_numpy(graph.edge_array.T.copy())


def adjacency(graph: ModelGraph) -> torch.Tensor:
    """Who feeds whom as a sparse CSR matrix (row: consumer): torch-geometric's convolutions accept
    it in place of ``edge_index`` and aggregate with one sparse product instead of a scatter, which
    is what one prediction wants. It is built from the graph's producers by consumer, because
    torch-geometric's converter takes longer than a graph convolution."""
    import torch

    n = len(graph.nodes)
    rows, producers = graph.producers_by_consumer
    with warnings.catch_warnings():  # "sparse CSR support is in beta", once per process
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(torch.from_numpy(rows), torch.from_numpy(producers),
                                       torch.ones(len(producers)), size=(n, n), check_invariants=False)


def static_features(table: NodeTable) -> dict[str, float]:
    """Per-sample features of a graph; DIPPM's five (MACs, batch, #conv, #dense, #relu) are among them."""
    vocab = operators.vocabulary()
    counts = np.bincount(table.kind, minlength=len(vocab))
    category_counts = np.bincount(table.category, minlength=len(operators.categories()))
    macs = float((table.flops1[operators.kind_table().counts_macs[table.kind]] // 2).sum())
    values = {
        "batch": float(table.batch),
        "log_flops": _log(float(table.flops1.sum())),
        "log_macs": _log(macs),
        "log_params": _log(table.param_count),
        "log_param_bytes": _log(table.param_bytes),
        "log_activation_bytes": _log(float(table.written1[~table.is_view].sum())),
        "n_nodes": float(len(table)),
        "n_edges": float(len(table.edges)),
        "dippm_convs": float(category_counts[operators.CONV.index]),
        "dippm_dense": float(category_counts[operators.GEMM.index]),
        "dippm_relus": float(counts[vocab.index(RELU)]),
    }
    values.update({f"count={kind}": float(c) for kind, c in zip(vocab, counts.tolist())})
    return values


def to_pyg(graph: ModelGraph):
    """A ``torch_geometric.data.Data`` with ``x``, ``edge_index`` and ``static`` (1 x F)."""
    import torch
    from torch_geometric.data import Data

    table = node_table(graph)
    static = torch.tensor([list(static_features(table).values())], dtype=torch.float32)
    return Data(x=node_feature_matrix(table), edge_index=edge_index(graph), static=static, num_nodes=len(graph.nodes))
