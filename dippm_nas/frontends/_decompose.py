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

import operator
from collections.abc import Callable

import torch
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils import _pytree as pytree

#: Meta data of the replaced node its operators inherit: where eager ran it.
_PLACE = ("nn_module_stack", "stack_trace")


def _op_name(node: fx.Node) -> str:
    return node.target.__name__  # type: ignore[union-attr]


def decompose_unknown(graph: fx.Graph, known: Callable[[str], bool]) -> None:
    """Replace, in ``graph``, each call of an operator ``known`` rejects by its decomposition in
    ``torch.export``'s default table, where it has one and it traces on meta tensors; others stay."""
    table = torch.export.default_decompositions()
    traced: dict[tuple, fx.GraphModule | None] = {}
    for node in list(graph.nodes):
        if node.op != "call_function" or known(_op_name(node)) or node.target not in table:
            continue
        leaves, spec = pytree.tree_flatten((node.args, node.kwargs))
        key = (node.target, str(spec), tuple(_leaf_key(v) for v in leaves))
        if key not in traced:
            traced[key] = _trace(table[node.target], leaves, spec)
        if traced[key] is not None:
            _inline(graph, node, traced[key], [v for v in leaves if isinstance(v, fx.Node)])


def _leaf_key(value: object) -> object:
    if isinstance(value, fx.Node):
        val = value.meta["val"]
        return ("tensor", tuple(val.shape), tuple(val.stride()), str(val.dtype))
    return repr(value)


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

    metas = [_meta(leaves[i].meta["val"]) for i in positions]
    try:
        traced = make_fx(run)(*metas)
    except Exception:  # a decomposition that needs values: the operator stays a generic node
        return None
    return None if traced.graph.find_nodes(op="get_attr") else traced


def _meta(value: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")


def _inline(graph: fx.Graph, node: fx.Node, traced: fx.GraphModule, arguments: list[fx.Node]) -> None:
    if isinstance(node.meta["val"], list | tuple) and any(u.target is not operator.getitem for u in node.users):
        return  # its tuple is read whole: it stays one node
    env: dict[fx.Node, object] = dict(zip(traced.graph.find_nodes(op="placeholder"), arguments))
    place = {k: node.meta[k] for k in _PLACE if k in node.meta}
    result: object = None
    with graph.inserting_before(node):
        for inner in traced.graph.nodes:
            if inner.op == "call_function":
                new = graph.node_copy(inner, lambda n: env[n])
                new.meta = {**inner.meta, **place}
                env[inner] = new
            elif inner.op == "output":
                result = fx.node.map_arg(inner.args[0], lambda n: env[n])
    if isinstance(result, list | tuple):
        for user in list(node.users):
            user.replace_all_uses_with(result[user.args[1]])
            graph.erase_node(user)
    else:
        node.replace_all_uses_with(result)
    graph.erase_node(node)
