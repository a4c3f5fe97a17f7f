"""An ``.onnx`` file, through TVM Relax's ONNX frontend; also the path TensorFlow and Paddle models take.

The weights in the file are read (they are in it already), then kept as Relax function inputs, so
the graph sees parameters as attributes exactly as for a PyTorch model. Before TVM sees the model,
its inputs get the shapes of the prediction and its shape arithmetic is folded; after, the Relax
function is made canonical (:mod:`dippm_nas.frontends._canonical`).
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import numpy as np
import onnx
import tvm
from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import ONNXGraphImporter, _get_convert_map

from dippm_nas.errors import ExportError, ModelLoadError, one_line
from dippm_nas.frontends._canonical import canonicalize
from dippm_nas.frontends._frontend_registry import LoadedModel, register_frontend
from dippm_nas.inputs import InputSpec, TensorSpec
from dippm_nas.model_names import read_onnx
from dippm_nas.relax_contract import generic_call

_ONNX_DTYPES = {
    onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16", onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.INT32: "int32", onnx.TensorProto.BOOL: "bool",
}
_FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}


def _erfc(bb: relax.BlockBuilder, inputs: list[relax.Expr], attrs: dict) -> relax.Expr:
    x = inputs[0]
    return relax.op.subtract(relax.const(1.0, x.ty.dtype), relax.op.erf(x))


#: ONNX operators TVM's frontend lacks but that are plain compositions of ones it has.
#: tf2onnx writes Keras' exact GELU with Erfc.
EXTRA_CONVERTERS = {"Erfc": _erfc}
_DIRECTLY_HANDLED = {"If", "Constant"}
#: Kept whole, with the attributes their cost rules read (:mod:`dippm_nas.graph.operators`), as the torch
#: frontend keeps aten.lstm: one cuDNN call, not a node per time step. Keras and Paddle LSTMs reach
#: us as these.
_RECURRENT = {"LSTM", "GRU"}


def _recurrent_attrs(attrs: dict) -> dict[str, object]:
    direction = attrs.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else str(direction)
    return {"hidden_size": int(attrs["hidden_size"]), "num_layers": 1,
            "bidirectional": direction == "bidirectional", "batch_first": int(attrs.get("layout", 0)) == 1}


class _TolerantImporter(ONNXGraphImporter):
    """TVM's ONNX importer, except that an operator it does not know, or fails to convert, becomes a generic node.

    A generic node is an opaque call named ``dippm.generic.onnx.<Op>`` whose output types come from
    ONNX shape inference, so the rest of the graph keeps its shapes; the model loses that one
    operator's cost model, not its prediction.
    """

    def __init__(self, output_types: dict[str, list[relax.TensorType]], **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.output_types = output_types
        self.unknown: set[str] = set()
        self.fallbacks: list[str] = []

    def _check_for_unsupported_ops(self, graph: onnx.GraphProto) -> None:
        known = set(_get_convert_map()) | set(EXTRA_CONVERTERS) | _RECURRENT | _DIRECTLY_HANDLED
        self.unknown = {node.op_type for node in graph.node if node.op_type not in known}

    def _convert_operator(self, op_name: str, inputs: list, attrs: dict, opset: int) -> relax.Expr:
        if op_name in _RECURRENT:
            return self._generic(op_name, inputs, attrs, _recurrent_attrs(attrs))
        if op_name in EXTRA_CONVERTERS:
            return self.bb.normalize(EXTRA_CONVERTERS[op_name](self.bb, inputs, attrs))
        if op_name not in self.unknown:
            try:
                return super()._convert_operator(op_name, inputs, attrs, opset)
            except Exception as exc:  # TVM raises type, value and assertion errors alike
                self.fallbacks.append(f"{op_name} ({one_line(exc, 120)})")
        return self._generic(op_name, inputs, attrs)

    def _generic(self, op_name: str, inputs: list, attrs: dict, extra: dict | None = None) -> relax.Expr:
        args = [x for x in inputs if isinstance(x, relax.Expr) and isinstance(x.ty, relax.TensorType)]
        types = self.output_types.get(attrs["tvm_custom"]["name"]) or [args[0].ty]
        out_ty = types[0] if len(types) == 1 else relax.TupleType(types)
        return self.bb.normalize(generic_call("onnx." + op_name, args, out_ty, extra))


def _named_with_fixed_inputs(model: onnx.ModelProto, shapes: dict[str, list[int]]) -> onnx.ModelProto:
    """A copy whose nodes all have unique names and whose inputs have the shapes we import at."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for i, node in enumerate(model.graph.node):
        node.name = f"{node.name or node.op_type}__{i}"
    for value in model.graph.input:
        if value.name in shapes:
            dims = value.type.tensor_type.shape.dim
            del dims[:]
            for d in shapes[value.name]:
                dims.add().dim_value = d
    return model


def _folded(model: onnx.ModelProto) -> onnx.ModelProto:
    """Shape arithmetic folded to constants, now that the input shapes are fixed.

    tf2onnx writes the target shape of many reshapes as Shape -> Gather -> Concat on the input;
    TVM's importer wants a constant there.
    """
    import onnxscript.optimizer

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # constant folding only: optimize() would also drop an Add of zeros, i.e. a zero bias
            onnxscript.optimizer.fold_constants(model, onnx_shape_inference=True)
            onnxscript.optimizer.remove_unused_nodes(model)
    except Exception:  # folding is an improvement, never a requirement
        pass
    return model


def _inferred_output_types(model: onnx.ModelProto) -> dict[str, list[relax.TensorType]]:
    """Each node's output types by node name, where ONNX shape inference knows them all."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # inference is a help for generic nodes only
        return {}
    known = {v.name: v.type.tensor_type for v in [*inferred.graph.value_info, *inferred.graph.output]}
    types: dict[str, list[relax.TensorType]] = {}
    for node in inferred.graph.node:
        found = [known.get(out) for out in node.output]
        if all(t is not None and t.shape.dim and all(d.HasField("dim_value") for d in t.shape.dim) for t in found):
            types[node.name] = [relax.TensorType([d.dim_value for d in t.shape.dim],
                                                 _ONNX_DTYPES.get(t.elem_type, "float32")) for t in found]
    return types


def onnx_to_relax(model: onnx.ModelProto, shapes: dict[str, list[int]],
                  dtypes: dict[str, str]) -> tuple[tvm.IRModule, tuple[str, ...]]:
    """TVM's ``from_onnx`` with generic nodes for unknown operators; returns notes on what was kept opaque."""
    model = _weights_and_constants(_folded(_named_with_fixed_inputs(model, shapes)))
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    importer = _TolerantImporter(_inferred_output_types(model), shape_dict=shapes, dtype_dict=dtypes,
                                 keep_params_in_input=True)
    mod = importer.from_onnx(model.graph, opset)
    mod["main"] = canonicalize(mod["main"])
    notes = tuple(f"operator {op} is unknown to TVM's ONNX frontend; it is kept as a generic node (its "
                  "shape is right, its cost is estimated as elementwise work)" for op in sorted(importer.unknown))
    notes += tuple(f"TVM failed to convert {failure}; that node is kept as a generic node"
                   for failure in sorted(set(importer.fallbacks)))
    return mod, notes


def _graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    initializers = {init.name for init in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in initializers]


def _declared_inputs(model: onnx.ModelProto, path: str) -> InputSpec:
    """The file's own input shapes, batch dimension dropped; symbolic dimensions are an error."""
    specs = []
    for value in _graph_inputs(model):
        dims = value.type.tensor_type.shape.dim[1:]
        if any(not d.HasField("dim_value") for d in dims):
            raise ModelLoadError(
                f"{path}: input {value.name!r} has symbolic dimensions beyond the batch; give its shape "
                f"with --input {value.name}=D1,D2,...[:dtype]."
            )
        dtype = _ONNX_DTYPES.get(value.type.tensor_type.elem_type, "float32")
        specs.append(TensorSpec(tuple(d.dim_value for d in dims), dtype, value.name))
    return tuple(specs)


def _is_weight(tensor: onnx.TensorProto) -> bool:
    return tensor.data_type in _FLOAT_TYPES and int(np.prod(tensor.dims, dtype=np.int64)) > 1


def _weights_and_constants(model: onnx.ModelProto) -> onnx.ModelProto:
    """Float tensors of more than one element are weights (initializers); anything else is a constant.

    Changes ``model`` in place (:func:`onnx_to_relax` works on its own copy).

    Exporters differ: paddle2onnx writes weights as ``Constant`` nodes, tf2onnx writes epsilons and
    shape vectors as initializers. Only initializers become Relax parameters, so without this a
    Paddle weight would count as computed data and a Keras epsilon as a parameter the rewrites
    cannot read.
    """
    weights = [n for n in model.graph.node if n.op_type == "Constant" and len(n.attribute) == 1
               and n.attribute[0].name == "value" and _is_weight(n.attribute[0].t)]
    constants = [t for t in model.graph.initializer if not _is_weight(t)]
    for node in weights:
        tensor = onnx.TensorProto()
        tensor.CopyFrom(node.attribute[0].t)
        tensor.name = node.output[0]
        model.graph.initializer.append(tensor)
        model.graph.node.remove(node)
    for tensor in constants:
        model.graph.node.insert(0, onnx.helper.make_node("Constant", [], [tensor.name], value=tensor))
        model.graph.initializer.remove(tensor)
    names = {t.name for t in constants}
    for value in [v for v in model.graph.input if v.name in names]:
        model.graph.input.remove(value)
    return model


#: The runtime a model of each source besides PyTorch is usually run by: it is priced as PyTorch eager would run
#: its graph, which a prediction's note says.
OTHER_RUNTIMES = {"onnx": "ONNX Runtime or TensorRT", "tensorflow": "TensorFlow", "paddle": "Paddle"}


def import_onnx(model: onnx.ModelProto, name: str, source: str, inputs: InputSpec | None, batch: int,
                family: str = "") -> LoadedModel:
    """An ONNX model in memory into Relax: the one path that TensorFlow, TFLite and Paddle models share. Its
    prediction says that it prices the graph as PyTorch eager would run it, not as its own runtime does."""
    spec = _by_name(inputs, model, name) if inputs else _declared_inputs(model, name)
    names = [i.name for i in _graph_inputs(model)]
    if len(spec) != len(names):
        raise ModelLoadError(f"{name} has {len(names)} inputs ({', '.join(names)}) but {len(spec)} were given.")
    notes = (*_rebatched(model, name, batch),
             f"{name}: priced as PyTorch eager would run its graph (images NCHW, PyTorch's kernels and precision "
             f"flags), not as {OTHER_RUNTIMES.get(source, source)} runs it")
    shapes = {n: list(s.with_batch(batch)) for n, s in zip(names, spec)}
    dtypes = {n: s.dtype for n, s in zip(names, spec)}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod, generic = onnx_to_relax(model, shapes, dtypes)
    except Exception as exc:
        raise ExportError(f"TVM could not import {name} with inputs {shapes}: {one_line(exc)}") from exc
    return LoadedModel(mod, name, source, tuple(TensorSpec(s.shape, s.dtype, n) for n, s in zip(names, spec)),
                       batch, family or name, (*notes, *(f"{name}: {note}" for note in generic)))


#: The names :func:`dippm_nas.inputs.normalize_inputs` gives inputs the user did not name.
_UNNAMED = re.compile(r"^(input\d+|x)$")


def _by_name(inputs: InputSpec, model: onnx.ModelProto, name: str) -> InputSpec:
    """The given inputs in the graph's order where they are named as its inputs are; unnamed ones stay in the
    order given. A name the graph does not have is a ModelLoadError that lists those it has."""
    names = [i.name for i in _graph_inputs(model)]
    unknown = [s.name for s in inputs if s.name not in names and not _UNNAMED.match(s.name)]
    if unknown:
        raise ModelLoadError(f"{name} has no input named {', '.join(map(repr, unknown))}; its inputs are "
                             f"{', '.join(names)}: give --input NAME=SHAPE[:DTYPE] with those names.")
    given = {s.name: s for s in inputs}
    if set(names) <= set(given):
        return tuple(given[n] for n in names)
    return inputs


def _rebatched(model: onnx.ModelProto, name: str, batch: int) -> tuple[str, ...]:
    """A note where the file fixes a batch other than ``batch``: its inputs are re-shaped to it."""
    fixed = {d.dim_value for value in _graph_inputs(model)
             for d in value.type.tensor_type.shape.dim[:1] if d.HasField("dim_value") and d.dim_value > 0}
    if fixed and fixed != {batch}:
        return (f"{name}: the file fixes a batch of {', '.join(map(str, sorted(fixed)))}; predicted at batch "
                f"{batch}, its inputs re-shaped to it (give --batch to choose another)",)
    return ()


def load_onnx(path: str | os.PathLike, inputs: InputSpec | None, batch: int) -> LoadedModel:
    """An ``.onnx`` file into Relax; no ``inputs`` means the file's own input shapes."""
    return import_onnx(read_onnx(path), Path(path).stem, "onnx", inputs, batch)


def _is_onnx(model: object) -> bool:
    return isinstance(model, str | os.PathLike) and str(model).lower().endswith(".onnx")


register_frontend("onnx", _is_onnx, load_onnx, priority=20)
