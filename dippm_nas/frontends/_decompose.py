"""Decompose, node by node, the operators TVM's importer does not know into ones it does.

``ExportedProgram.run_decompositions`` traces the whole model again to decompose even one operator
(``var``, ``rms_norm``, ``repeat_interleave``): seconds for a large model, and its result is the
functional graph, without the in-place operators eager runs. Here each such node is traced alone, on
``meta`` tensors of its arguments' shapes, with the decomposition ``torch.export`` would use, and its
operators take its place, with its module stack and stack trace (what eager's liveness is read from).
A node traced once is reused for every node of the same operator and arguments (a ViT's forty
``rms_norm`` calls).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils import _pytree as pytree

from dippm_nas.frontends._fx_surgery import copy_before, meta_like, read_instead, read_whole, value_key

#: Meta data of the replaced node its operators inherit: where eager ran it.
_PLACE = ("nn_module_stack", "stack_trace")


def decompose_unknown(graph: fx.Graph, known: Callable[[fx.Node], bool]) -> None:
    """Replace, in ``graph``, each call ``known`` rejects by its operator's decomposition in
    ``torch.export``'s default table, where it has one and it traces on meta tensors; others stay, as
    does one whose several outputs are read whole."""
    table = torch.export.default_decompositions()
    traced: dict[tuple, fx.GraphModule | None] = {}
    for node in list(graph.nodes):
        if node.op != "call_function" or known(node) or node.target not in table:
            continue
        if isinstance(node.meta["val"], list | tuple) and read_whole(node):
            continue
        leaves, spec = pytree.tree_flatten((node.args, node.kwargs))
        key = (node.target, str(spec), tuple(value_key(v.meta["val"] if isinstance(v, fx.Node) else v, floats=True)
                                             for v in leaves))
        if key not in traced:
            traced[key] = _trace(table[node.target], leaves, spec)
        if traced[key] is not None:
            arguments = [v for v in leaves if isinstance(v, fx.Node)]
            env: dict[fx.Node, object] = dict(zip(traced[key].graph.find_nodes(op="placeholder"), arguments))
            place = {k: node.meta[k] for k in _PLACE if k in node.meta}
            result = copy_before(graph, node, traced[key].graph, env, lambda meta, place=place: {**meta, **place})
            read_instead(graph, node, result)


def _trace(decomposition: Callable, leaves: list, spec: pytree.TreeSpec) -> fx.GraphModule | None:
    """The decomposition traced on meta tensors standing for the node's tensor arguments (in order),
    or None where it does not trace (it needs values)."""
    positions = [i for i, v in enumerate(leaves) if isinstance(v, fx.Node)]

    def run(*tensors):
        filled = list(leaves)
        for i, t in zip(positions, tensors):
            filled[i] = t
        args, kwargs = pytree.tree_unflatten(filled, spec)
        return decomposition(*args, **kwargs)

    try:
        traced = make_fx(run)(*meta_like([leaves[i].meta["val"] for i in positions]))
    except Exception:  # a decomposition that needs values: the operator stays a generic node
        return None
    return None if traced.graph.find_nodes(op="get_attr") else traced
