"""Relax -> ModelGraph: nodes, dataflow edges, the operator registry and eager's layouts.

The names load on first use: :func:`relax_to_graph` needs TVM, and a graph read back from a cache
(:mod:`dippm_nas.graph.serialize`) is predicted without it; the leaf :mod:`dippm_nas.graph.tensor`
(dtypes and their sizes) is read by the precision table, which the ground-truth harness imports too.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"ModelGraph": "dippm_nas.graph.model_graph", "Node": "dippm_nas.graph.model_graph",
            "Tensor": "dippm_nas.graph.tensor", "relax_to_graph": "dippm_nas.graph.from_relax"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'dippm_nas.graph' has no attribute {name!r}")
