"""Relax -> ModelGraph: nodes, dataflow edges, features and structural signatures.

:func:`relax_to_graph` loads on first use: it needs TVM, and a graph read back from a cache
(:mod:`dippm_nas.graph.serialize`) is predicted without it.
"""

from __future__ import annotations

from typing import Any

from dippm_nas.graph.model_graph import ModelGraph, Node
from dippm_nas.graph.tensor import Tensor

__all__ = ["ModelGraph", "Node", "Tensor", "relax_to_graph"]


def __getattr__(name: str) -> Any:
    if name == "relax_to_graph":
        from dippm_nas.graph.from_relax import relax_to_graph

        return relax_to_graph
    raise AttributeError(f"module 'dippm_nas.graph' has no attribute {name!r}")
