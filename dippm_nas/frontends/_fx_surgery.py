"""Replacing one node of an FX graph by the operators of another graph, and the values that decide it.

The splice of repeated blocks (:mod:`._repeated`) and the node-by-node decomposition
(:mod:`._decompose`) both put a small graph's operators in the place of one node and have its readers
read what that graph returns; both tell values apart by what can change a graph, never by data.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch
from torch import fx
from torch.utils import _pytree as pytree


def value_key(value: object, floats: bool = False) -> object:
    """A value as far as it can change a graph: a tensor by its shape, strides and dtype; a float only
    where ``floats`` (a scale or an epsilon is an operand of the same operators, and no cost reads it)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), tuple(value.stride()), str(value.dtype))
    if isinstance(value, float):
        return value if floats else float
    if isinstance(value, bool | int | str | type(None)):
        return value
    if isinstance(value, tuple | list):
        return tuple(value_key(v, floats) for v in value)
    return repr(value)


def meta_like(tree: object) -> object:
    """Meta tensors of the same shapes, strides and dtypes as the tensors of ``tree``, which allocate nothing."""
    return pytree.tree_map_only(
        torch.Tensor, lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta"), tree)


def copy_before(graph: fx.Graph, node: fx.Node, body: fx.Graph, env: dict[fx.Node, object],
                meta: Callable[[dict], dict]) -> object:
    """Copy ``body``'s operators into ``graph`` before ``node``, each reading what ``env`` maps its
    inputs to (every placeholder of ``body`` must be there) and carrying ``meta`` of its own meta data;
    returns what ``body`` outputs, in ``graph``'s nodes."""
    result: object = None
    with graph.inserting_before(node):
        for inner in body.nodes:
            if inner.op == "call_function":
                new = graph.node_copy(inner, lambda n: env[n])
                new.meta = meta(inner.meta)
                env[inner] = new
            elif inner.op == "output":
                result = fx.node.map_arg(inner.args[0], lambda n: env[n])
    return result


def read_whole(node: fx.Node) -> bool:
    """Whether a node that returns several values has a reader of them all, not item by item."""
    return any(user.target is not operator.getitem for user in node.users)


def read_instead(graph: fx.Graph, node: fx.Node, result: object) -> None:
    """Have ``node``'s readers read ``result`` and remove ``node``: item by item where ``result`` is a
    tuple or list. Raises ValueError, changing nothing, where such a node is :func:`read_whole`."""
    if isinstance(result, list | tuple):
        if read_whole(node):
            raise ValueError(f"{node} returns several values and is read whole")
        for user in list(node.users):
            user.replace_all_uses_with(result[user.args[1]])
            graph.erase_node(user)
    else:
        node.replace_all_uses_with(result)
    graph.erase_node(node)
