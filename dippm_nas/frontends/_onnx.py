"""An ``.onnx`` file, through TVM Relax's ONNX frontend.

The weights in the file are read (they are in it already), then kept as Relax function inputs, so
the graph sees parameters as attributes exactly as for a PyTorch model.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from tvm.relax.frontend.onnx import from_onnx

from dippm_nas.errors import ExportError, ModelLoadError
from dippm_nas.frontends import LoadedModel, register_frontend
from dippm_nas.inputs import InputSpec, TensorSpec

_ONNX_DTYPES = {
    onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16", onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.INT32: "int32", onnx.TensorProto.BOOL: "bool",
}


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


def read_onnx(path: str | os.PathLike) -> onnx.ModelProto:
    path = str(path)
    if not Path(path).is_file():
        raise ModelLoadError(f"no such ONNX file: {path}")
    try:
        model = onnx.load(path)
        onnx.checker.check_model(model)
    except (DecodeError, onnx.checker.ValidationError, ValueError, RuntimeError) as exc:
        raise ModelLoadError(f"{path} is not a valid ONNX model ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else 'unreadable'}); export it again "
                             "with torch.onnx.export or check the file.") from exc
    return model


def load_onnx(path: str | os.PathLike, inputs: InputSpec | None, batch: int) -> LoadedModel:
    model = read_onnx(path)
    spec = inputs or _declared_inputs(model, str(path))
    names = [i.name for i in _graph_inputs(model)]
    if len(spec) != len(names):
        raise ModelLoadError(f"{path} has {len(names)} inputs ({', '.join(names)}) but {len(spec)} were given.")
    shapes = {name: list(s.with_batch(batch)) for name, s in zip(names, spec)}
    dtypes = {name: s.dtype for name, s in zip(names, spec)}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod = from_onnx(model, shape_dict=shapes, dtype_dict=dtypes, keep_params_in_input=True)
    except Exception as exc:
        raise ExportError(f"TVM could not import {path} with inputs {shapes}: "
                          f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}") from exc
    name = Path(path).stem
    return LoadedModel(mod, name, "onnx", tuple(TensorSpec(s.shape, s.dtype, n) for n, s in zip(names, spec)), batch, name)


def _is_onnx(model: object) -> bool:
    return isinstance(model, str | os.PathLike) and str(model).lower().endswith(".onnx")


register_frontend("onnx", _is_onnx, load_onnx)
