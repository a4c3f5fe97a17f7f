"""Relax -> ModelGraph: nodes, dataflow edges, features and structural signatures."""

from dippm_nas.graph.from_relax import relax_to_graph
from dippm_nas.graph.model_graph import ModelGraph, Node
from dippm_nas.graph.tensor import Tensor

__all__ = ["ModelGraph", "Node", "Tensor", "relax_to_graph"]
