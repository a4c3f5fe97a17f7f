"""The data passed from the graph stage to the cost models: a dataflow graph of operator calls."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from dippm_nas.graph import operators
from dippm_nas.graph.tensor import FLOATING_DTYPES, Shape, Tensor


@dataclass(frozen=True)
class Node:
    """One operator call.

    ``inputs`` are the activations it reads (from other operators or from the model's inputs),
    ``weights`` the parameters and constants it reads; parameters are attributes, never nodes.
    ``kind`` and ``category`` are the registry's (:mod:`dippm_nas.graph.operators`): what the operator is,
    and which hardware unit bounds it.
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

    def renumbered(self, node_id: int) -> Node:
        """This operator under another id (its place in a stitched graph), every other field shared: what
        ``dataclasses.replace`` gives, in a fifth of its time, which counts where a NAS search stitches
        hundreds of operators a candidate."""
        node = object.__new__(Node)
        node.__dict__.update(self.__dict__)
        node.__dict__["id"] = node_id
        return node

    @property
    def is_view(self) -> bool:
        """Whether eager runs it as a view: no kernel runs and no data moves."""
        return self.category == "view"

    @property
    def activation_bytes_read(self) -> int:
        """Bytes of the activations it reads, weights not included."""
        return sum(t.nbytes for t in self.inputs)

    @property
    def weight_bytes(self) -> int:
        """Bytes of the parameters and constants it reads."""
        return sum(t.nbytes for t in self.weights)

    @property
    def bytes_written(self) -> int:
        """Bytes of its outputs (counted for views too; :attr:`is_view` tells them apart)."""
        return sum(t.nbytes for t in self.outputs)

    @property
    def macs(self) -> int:
        """Multiply-accumulates: half the FLOPs where its category counts them (convolutions, matrix products,
        attention), 0 for anything else."""
        return self.flops // 2 if operators.category_named(self.category).counts_macs else 0


def operator_node(spelling: str, inputs: tuple[Shape, ...], weights: tuple[Shape, ...], outputs: tuple[Shape, ...],
                  attrs: Mapping[str, object] | None = None, dtype: str = "float32") -> Node:
    """One operator as a graph's node, outside any graph: the registry's kind of ``spelling`` (a Relax or ATen
    name), its FLOPs by that spelling's rule over its arguments (activations, then weights). What a measured
    operator is described by, so that a measurement and a graph's node are counted by the same rules.

    >>> gelu = operator_node("relax.nn.gelu", ((2, 8),), (), ((2, 8),))
    >>> gelu.kind, gelu.category, gelu.flops
    ('gelu', 'activation', 16)
    """
    found = operators.lookup(spelling) or operators.lookup_aten(spelling)
    if found is None:
        raise KeyError(f"the operator registry has no spelling {spelling!r}")
    args, weight_tensors, outs = (tuple(Tensor(tuple(shape), dtype) for shape in shapes)
                                  for shapes in (inputs, weights, outputs))
    attributes = dict(attrs or {})
    flops = int(found.flops([*args, *weight_tensors], list(outs), attributes))
    return Node(0, spelling, found.kind, found.category, attributes, args, outs, weight_tensors, flops)


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

    @cached_property
    def flops(self) -> int:
        """FLOPs of one run at :attr:`batch`, summed over the nodes (conventions: :mod:`dippm_nas.graph.operators`);
        summed once per graph, as every prediction reports them."""
        return sum(n.flops for n in self.nodes)

    @property
    def macs(self) -> int:
        """Multiply-accumulates of one run at :attr:`batch`, as timm and DIPPM count them."""
        return sum(n.macs for n in self.nodes)

    @property
    def activation_bytes(self) -> int:
        """Bytes of every tensor an operator writes (views write none): DIPPM's 'activations'."""
        return sum(n.bytes_written for n in self.nodes if not n.is_view)

    @cached_property
    def float_weight_dtypes(self) -> frozenset[str]:
        """The floating dtypes of its weights: parameters and constants of more than one element (a scalar
        constant keeps its own dtype whatever the model is cast to). Read once per graph, as every prediction
        asks (:func:`dippm_nas.graph.cast.graph_at_precision`)."""
        return frozenset(t.dtype for node in self.nodes for t in node.weights
                         if t.dtype in FLOATING_DTYPES and t.numel > 1)

    @cached_property
    def consumers(self) -> dict[int, tuple[int, ...]]:
        """Each node id -> the ids of the nodes that read its output (empty for a node nothing reads)."""
        out: dict[int, list[int]] = {n.id: [] for n in self.nodes}
        for src, dst in self.edges:
            out[src].append(dst)
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def producers(self) -> dict[int, tuple[int, ...]]:
        """Each node id -> the ids of the nodes whose outputs it reads (empty where it reads only model inputs)."""
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

    def op_counts(self) -> dict[str, int]:
        """How many nodes of each kind the graph has."""
        counts: dict[str, int] = {}
        for node in self.nodes:
            counts[node.kind] = counts.get(node.kind, 0) + 1
        return counts

    def summary(self) -> dict[str, object]:
        """Headline figures for reports: node and edge counts, GFLOPs, GMACs, parameters in millions and
        MiB, activations in MiB."""
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
