"""The data passed from the graph stage to the cost models: a dataflow graph of operator calls."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from dippm_nas.graph.table import NodeTable

Shape = tuple[int, ...]

DTYPE_BYTES: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
    "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}

#: A node attribute: for how many steps after its own PyTorch eager keeps the node's output (a module
#: call still running holds it as an argument, or a local variable of a function still running does);
#: set by the torch frontend.
EAGER_HOLD = "eager_hold"
#: A node attribute: the node ran in place in eager (``relu_``, ``add_``), so its output is the storage
#: of its first input, made this many steps before; set by the torch frontend.
EAGER_INPLACE_OF = "eager_inplace_of"


def numel(shape: Shape) -> int:
    return math.prod(shape)


def dtype_bytes(dtype: str) -> int:
    return DTYPE_BYTES.get(dtype, 4)


@dataclass(frozen=True)
class Tensor:
    """A tensor's shape and dtype, the unit the graph counts bytes in."""

    shape: Shape
    dtype: str = "float32"

    @property
    def numel(self) -> int:
        return numel(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * dtype_bytes(self.dtype)


@dataclass(frozen=True)
class Node:
    """One operator call.

    ``inputs`` are the activations it reads (from other operators or from the model's inputs),
    ``weights`` the parameters and constants it reads; parameters are attributes, never nodes.
    ``category`` says which hardware unit bounds it (see :mod:`dippm_nas.graph.ops`).
    """

    id: int
    op: str
    kind: str
    category: str
    attrs: dict[str, object]
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    weights: tuple[Tensor, ...]
    flops: int

    @property
    def is_view(self) -> bool:
        return self.category == "view"

    @property
    def activation_bytes_read(self) -> int:
        return sum(t.nbytes for t in self.inputs)

    @property
    def weight_bytes(self) -> int:
        return sum(t.nbytes for t in self.weights)

    @property
    def bytes_read(self) -> int:
        return self.activation_bytes_read + self.weight_bytes

    @property
    def bytes_written(self) -> int:
        return sum(t.nbytes for t in self.outputs)

    @property
    def macs(self) -> int:
        return self.flops // 2 if self.category in MAC_CATEGORIES else 0


#: Categories whose FLOPs are multiply-accumulates (reported as MACs, as timm and DIPPM do).
MAC_CATEGORIES = frozenset({"conv", "matmul", "attention"})


@dataclass(frozen=True)
class ModelGraph:
    """Operators in a topological order (the order the model runs them) and the tensors between them.

    ``edges`` holds one ``(producer, consumer)`` pair per tensor passed between two operators, so a
    residual add has two producers. ``outputs`` lists the nodes whose results the model returns,
    ``entry_nodes`` those that read the model's inputs.
    """

    name: str
    batch: int
    inputs: tuple[Tensor, ...]
    nodes: tuple[Node, ...]
    edges: tuple[tuple[int, int], ...]
    outputs: tuple[int, ...]
    param_count: int
    param_bytes: int
    source: str = ""
    family: str = ""
    #: Nodes that read one of the model's inputs (they have no producer for it).
    entry_nodes: tuple[int, ...] = ()
    warnings: tuple[str, ...] = field(default=())

    @property
    def flops(self) -> int:
        return sum(n.flops for n in self.nodes)

    @property
    def macs(self) -> int:
        return sum(n.macs for n in self.nodes)

    @property
    def activation_bytes(self) -> int:
        """Bytes of every tensor an operator writes (views write none): DIPPM's 'activations'."""
        return sum(n.bytes_written for n in self.nodes if not n.is_view)

    @cached_property
    def consumers(self) -> dict[int, tuple[int, ...]]:
        out: dict[int, list[int]] = {n.id: [] for n in self.nodes}
        for src, dst in self.edges:
            out[src].append(dst)
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def producers(self) -> dict[int, tuple[int, ...]]:
        out: dict[int, list[int]] = {n.id: [] for n in self.nodes}
        for src, dst in self.edges:
            out[dst].append(src)
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def edge_array(self) -> np.ndarray:
        """``[edges, 2]`` int64 (producer, consumer), for numpy and torch; ``np.array`` over the tuples
        takes three times as long as this."""
        flat = np.fromiter(itertools.chain.from_iterable(self.edges), dtype=np.int64, count=2 * len(self.edges))
        return flat.reshape(-1, 2)

    @cached_property
    def producers_by_consumer(self) -> tuple[np.ndarray, np.ndarray]:
        """``(rows, producers)``, CSR-style: node i's producers, ascending, are
        ``producers[rows[i]:rows[i + 1]]``. Both the autocast pass and the GNN's adjacency read it."""
        pairs = self.edge_array
        order = np.lexsort((pairs[:, 0], pairs[:, 1]))  # by consumer, then producer
        rows = np.zeros(len(self.nodes) + 1, dtype=np.int64)
        np.cumsum(np.bincount(pairs[:, 1], minlength=len(self.nodes)), out=rows[1:])
        return rows, pairs[order, 0]

    @cached_property
    def table(self) -> NodeTable:
        """The operators' numbers as columns, computed once per graph: every MIG slice, device and
        precision a graph is predicted for reads the same table."""
        from dippm_nas.graph.table import NodeTable

        return NodeTable.of(self)

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in self.nodes:
            counts[node.kind] = counts.get(node.kind, 0) + 1
        return counts

    def summary(self) -> dict[str, object]:
        return {
            "name": self.name,
            "batch": self.batch,
            "nodes": len(self.nodes),
            "edges": len(self.edges),
            "gflops": self.flops / 1e9,
            "gmacs": self.macs / 1e9,
            "params_m": self.param_count / 1e6,
            "param_mib": self.param_bytes / 2**20,
            "activation_mib": self.activation_bytes / 2**20,
        }
