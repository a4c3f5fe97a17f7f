"""A graph at the dtype its model's weights are cast to, and the precision a graph runs at.

``model.half()`` (``model.to(torch.bfloat16)``) casts every floating parameter and buffer, and a model fed
inputs of that dtype then computes every activation in it: :func:`cast_floats` makes that graph from the
one exported as the model was built, without exporting it again, so a model's graph is exported once
whatever precision it is predicted at. An operator the model's own code runs in float32 on purpose
(``x.float()`` before a norm) is not seen in a float32 export, and is cast with the rest.

:func:`graph_at_precision` decides the precision a graph is predicted at: a model whose floating weights
are all half runs half in PyTorch whatever its TF32 or autocast flags say, so it is predicted at its
half-weights precision (the prediction's notes say so); a half-weights precision asked of a model of
float32 weights casts its graph. A request resolves it once, with the graph (:meth:`dippm_nas.Request.resolved`).
"""

from __future__ import annotations

from dataclasses import replace

from dippm_nas.graph.model_graph import ModelGraph, Node
from dippm_nas.graph.tensor import Tensor
from dippm_nas.precisions import DEFAULT_PRECISION, PRECISIONS, Precision, precision_of_weights

#: How a graph's note says its float inputs were read in its weights' half dtype (a cast drops it: the cast's own
#: note says the inputs' dtype).
INPUTS_READ_IN = "its float inputs are read in"


def inputs_read_in_note(name: str, dtype: str) -> str:
    """The note of a model whose float inputs are read in its weights' half ``dtype``."""
    return f"{name}: {INPUTS_READ_IN} {dtype}, its weights' dtype, as PyTorch requires"


def _cast(tensors: tuple[Tensor, ...], source: str, target: str) -> tuple[Tensor, ...]:
    if all(t.dtype != source for t in tensors):
        return tensors
    return tuple(Tensor(t.shape, target) if t.dtype == source else t for t in tensors)


def cast_floats(graph: ModelGraph, source: str, target: str) -> ModelGraph:
    """``graph`` with every tensor of dtype ``source`` (weights, activations and the model's inputs) in
    ``target``: the graph of the model cast with ``model.to(target)`` and fed inputs of ``target``.

    >>> from dippm_nas.graph.model_graph import Node
    >>> node = Node(0, "custom", "other", "other", {}, (Tensor((8, 16)),), (Tensor((8, 4)),), (Tensor((16, 4)),),
    ...             1024)
    >>> graph = ModelGraph("g", 8, (Tensor((8, 16)),), (node,), (), (0,), 64, 256, entry_nodes=(0,))
    >>> half = cast_floats(graph, "float32", "float16")
    >>> half.nodes[0].weights[0].dtype, half.param_bytes, half.inputs[0].nbytes
    ('float16', 128, 256)
    """
    nodes = tuple(_cast_node(node, source, target) for node in graph.nodes)
    param_bytes = graph.param_bytes + sum(
        new.weight_bytes - old.weight_bytes for old, new in zip(graph.nodes, nodes) if new is not old)
    warnings = tuple(w for w in graph.warnings if f"{INPUTS_READ_IN} {source}" not in w)  # they are target now
    return replace(graph, nodes=nodes, inputs=_cast(graph.inputs, source, target), param_bytes=param_bytes,
                   warnings=warnings)


def _cast_node(node: Node, source: str, target: str) -> Node:
    inputs, outputs, weights = (_cast(t, source, target) for t in (node.inputs, node.outputs, node.weights))
    if inputs is node.inputs and outputs is node.outputs and weights is node.weights:
        return node
    return replace(node, inputs=inputs, outputs=outputs, weights=weights)


def graph_at_precision(graph: ModelGraph, asked: Precision | None) -> tuple[ModelGraph, Precision, tuple[str, ...]]:
    """The graph a prediction at ``asked`` prices (cast where the precision casts the model's weights), the
    precision it runs at, and the notes that say what was decided; ``asked`` None is the model's own
    precision: its half-weights precision where its floating weights are all half, else PyTorch's defaults.

    A precision that keeps the weights as built (``fp32``, ``tf32``, the autocast ones) asked of a model whose
    weights are all half is predicted at that model's half-weights precision, with a note: PyTorch runs it half
    whatever those flags say. A half-weights precision casts the weights of the dtype the model has, as
    ``model.to(dtype)`` does.
    """
    dtypes = graph.float_weight_dtypes
    own = precision_of_weights(next(iter(dtypes))) if len(dtypes) == 1 else None
    if asked is None:
        if own is None:
            return graph, PRECISIONS[DEFAULT_PRECISION], ()
        return graph, own, (f"the model's weights are {own.weights_dtype}: predicted at {own.name}, as PyTorch runs "
                            "it (no autocast, no cast)",)
    precision = asked
    if precision.weights_dtype is None:
        if own is None:
            return graph, precision, ()
        return graph, own, (f"the model's weights are {own.weights_dtype}, so PyTorch runs it in {own.weights_dtype} "
                            f"whatever {precision.name} sets: predicted at {own.name}; build it in float32 "
                            f"(model.float()) to predict {precision.name}",)
    if own is precision:
        return graph, precision, ()
    source = own.weights_dtype if own is not None else "float32"
    return cast_floats(graph, source, precision.weights_dtype), precision, (
        f"{precision.name}: the model's {source} weights and activations cast to {precision.weights_dtype}, as "
        f"model.to(torch.{precision.weights_dtype}) does, with {precision.weights_dtype} inputs",)
