"""TensorFlow: a Keras model object, a ``.keras``/``.h5`` file, a SavedModel directory or a ``.tflite`` file.

All four go through tf2onnx and then the ONNX frontend. Why not TVM Relax's TFLite frontend: a
TFLite file is what the TFLite converter made of a model after fusing activations and padding into
convolutions, folding batch norms and often quantizing, so reading Keras models through TFLite would
throw away the operator structure the graph is about (MobileNetV2 loses its 4 Pad and 17 Mul nodes).
tf2onnx maps each TensorFlow op to its ONNX twin, reads TFLite files as well, and lands on the one
ONNX -> Relax path that the tests hold equal to PyTorch's.

Image inputs are converted channels-first (tf2onnx's ``inputs_as_nchw``): a GPU runs a Keras
convolution on the NHWC tensor it is given, so the transpose tf2onnx would otherwise put in front of
the first convolution is not work the GPU does. Input shapes are given the Keras way, without the
batch: ``224,224,3``.
"""

from __future__ import annotations

import logging
import os
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import onnx

from dippm_nas.errors import ModelLoadError, one_line
from dippm_nas.frontends._frontend_registry import LoadedModel, import_extra, register_frontend
from dippm_nas.frontends._onnx import import_onnx
from dippm_nas.frontends._quiet import quiet
from dippm_nas.inputs import InputSpec, TensorSpec

OPSET = 17
EXTRA = "tensorflow"
KERAS_SUFFIXES = (".keras", ".h5")
# (name, shape with the batch first, None where unknown, dtype name)
Declared = Sequence[tuple[str, Sequence[int | None], str]]


def _tensorflow() -> tuple[ModuleType, ModuleType]:
    """tensorflow and tf2onnx, quiet: their C++ and Python logs would bury the prediction."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with quiet():
        tf = import_extra("tensorflow", EXTRA, "TensorFlow, Keras and TFLite models")
        tf2onnx = import_extra("tf2onnx", EXTRA, "TensorFlow, Keras and TFLite models")
    for name in ("tf2onnx", "tensorflow", "absl"):
        logging.getLogger(name).setLevel(logging.ERROR)
    return tf, tf2onnx


def _resolve_inputs(declared: Declared, given: InputSpec | None, what: str) -> InputSpec:
    """The user's shapes if given, else the model's own; an unknown dimension beyond the batch is an error."""
    if given:
        if len(given) != len(declared):
            names = ", ".join(name for name, _, _ in declared)
            raise ModelLoadError(f"{what} has {len(declared)} inputs ({names}) but {len(given)} were given.")
        return given
    specs = []
    for name, shape, dtype in declared:
        rest = tuple(shape[1:])
        if any(d is None or d <= 0 for d in rest):
            shown = ", ".join("?" if d is None or d <= 0 else str(d) for d in rest)
            raise ModelLoadError(
                f"{what}: input {name!r} has unknown dimensions (batch, {shown}); give its shape without the "
                f"batch, channels last as Keras has it, e.g. --input {name}=224,224,3 (in Python: "
                f"inputs=TensorSpec((224, 224, 3), name={name!r}))."
            )
        specs.append(TensorSpec(rest, dtype, name))
    return tuple(specs)


def _is_image(s: TensorSpec) -> bool:
    return len(s.shape) == 3 and s.dtype.startswith(("float", "bfloat"))


def _nchw_names(spec: InputSpec, onnx_names: Sequence[str]) -> list[str]:
    return [name for name, s in zip(onnx_names, spec) if _is_image(s)]


def _channels_first(spec: InputSpec) -> InputSpec:
    """The shapes the ONNX graph has after ``inputs_as_nchw``."""
    return tuple(TensorSpec((s.shape[2], s.shape[0], s.shape[1]), s.dtype, s.name) if _is_image(s) else s
                 for s in spec)


def _converted(convert: Callable[[], Any], what: str) -> onnx.ModelProto:
    try:
        with quiet():
            proto, _ = convert()
    except Exception as exc:
        raise ModelLoadError(f"tf2onnx could not convert {what} ({one_line(exc)}).") from exc
    return proto


def _to_relax(proto: onnx.ModelProto, name: str, spec: InputSpec, batch: int, family: str) -> LoadedModel:
    loaded = import_onnx(proto, name, "tensorflow", _channels_first(spec), batch, family)
    return replace(loaded, inputs=spec)


def load_keras(model: Any, inputs: InputSpec | None, batch: int, name: str = "") -> LoadedModel:
    """A Keras model object; no ``inputs`` means its own input shapes, which must then be fully known."""
    tf, tf2onnx = _tensorflow()
    if not hasattr(model, "inputs") or not callable(model):
        raise ModelLoadError(f"{type(model).__name__} is not a Keras model; save it with tf.saved_model.save(obj, "
                             "DIR) and give DIR.")
    name = name or model.name
    try:
        model_inputs = list(model.inputs)
    except (AttributeError, ValueError) as exc:
        raise ModelLoadError(f"Keras model {name!r} has no defined inputs yet; build it with keras.Input(...) or "
                             "call it once on a tensor before predicting.") from exc
    declared = [(t.name, tuple(t.shape), str(getattr(t.dtype, "name", t.dtype))) for t in model_inputs]
    spec = _resolve_inputs(declared, inputs, f"Keras model {name!r}")
    names = [t.name for t in model_inputs]
    signature = [tf.TensorSpec((batch, *s.shape), s.dtype, name=n) for n, s in zip(names, spec)]
    proto = _converted(lambda: tf2onnx.convert.from_keras(model, input_signature=signature, opset=OPSET,
                                                         inputs_as_nchw=_nchw_names(spec, names)),
                       f"Keras model {name!r}")
    return _to_relax(proto, name, spec, batch, model.name)


#: The first bytes of an HDF5 file (a Keras ``.h5`` model); a ``.keras`` file is a zip archive.
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def load_keras_file(path: str | os.PathLike, inputs: InputSpec | None, batch: int) -> LoadedModel:
    """A ``.keras`` or ``.h5`` file, loaded without compiling and read as :func:`load_keras` reads a model; a file
    of another kind is said before Keras reads it (Keras answers it with "File not found")."""
    with open(path, "rb") as file:
        kind_of_file = zipfile.is_zipfile(file) if str(path).lower().endswith(".keras") else \
            file.read(len(HDF5_SIGNATURE)) == HDF5_SIGNATURE
    if not kind_of_file:
        raise ModelLoadError(f"{path} is not a Keras model file (a .keras file is a zip archive, a .h5 file an HDF5 "
                             "file); save the model again with model.save('model.keras').")
    _tensorflow()
    keras = import_extra("keras", EXTRA, "Keras model files")
    try:
        with quiet():
            model = keras.models.load_model(str(path), compile=False)
    except Exception as exc:
        raise ModelLoadError(f"{path} is not a readable Keras model file ({one_line(exc, 200)}); save it again with "
                             "model.save('model.keras').") from exc
    return load_keras(model, inputs, batch, Path(path).stem)


_TF_DTYPES = {1: "float32", 19: "float16", 14: "bfloat16", 3: "int32", 9: "int64", 10: "bool"}  # tf.DType enum


def _placeholders(graph_def: Any, names: Sequence[str]) -> Declared:
    """Shapes of a frozen graph's inputs, read off its Placeholder nodes (-1 is unknown)."""
    by_name = {node.name: node for node in graph_def.node}
    declared = []
    for tensor in names:
        node = by_name[tensor.split(":")[0]]
        dims = [d.size if d.size >= 0 else None for d in node.attr["shape"].shape.dim]
        declared.append((tensor, dims, _TF_DTYPES.get(node.attr["dtype"].type, "float32")))
    return declared


def load_saved_model(path: str | os.PathLike, inputs: InputSpec | None, batch: int) -> LoadedModel:
    """A TensorFlow SavedModel directory; no ``inputs`` means the shapes of its signature's placeholders."""
    _, tf2onnx = _tensorflow()
    from tf2onnx import tf_loader

    what = f"SavedModel {path}"
    try:
        with quiet():
            graph_def, in_names, out_names = tf_loader.from_saved_model(str(path), None, None)
    except Exception as exc:
        raise ModelLoadError(f"{path} is not a readable TensorFlow SavedModel ({one_line(exc, 200)}); save it "
                             "again with tf.saved_model.save(model, DIR) or model.export(DIR).") from exc
    spec = _resolve_inputs(_placeholders(graph_def, in_names), inputs, what)
    overrides = {n: [batch, *s.shape] for n, s in zip(in_names, spec)}
    proto = _converted(lambda: tf2onnx.convert.from_graph_def(
        graph_def, input_names=in_names, output_names=out_names, opset=OPSET, shape_override=overrides,
        inputs_as_nchw=_nchw_names(spec, in_names)), what)
    name = Path(path).resolve().name
    return _to_relax(proto, name, spec, batch, name)


def load_tflite(path: str | os.PathLike, inputs: InputSpec | None, batch: int) -> LoadedModel:
    """A ``.tflite`` file; no ``inputs`` means the shapes its interpreter reports."""
    tf, tf2onnx = _tensorflow()
    what = f"TFLite file {path}"
    if not Path(path).is_file():
        raise ModelLoadError(f"no such TFLite file: {path}")
    try:
        with quiet():
            details = tf.lite.Interpreter(model_path=str(path)).get_input_details()
    except Exception as exc:
        raise ModelLoadError(f"{path} is not a readable TFLite model ({type(exc).__name__}); convert it again "
                             "with tf.lite.TFLiteConverter.") from exc
    declared = [(d["name"], [int(x) if x > 0 else None for x in d["shape_signature"]], d["dtype"].__name__)
                for d in details]
    spec = _resolve_inputs(declared, inputs, what)
    names = [d["name"] for d in details]
    overrides = {n: [batch, *s.shape] for n, s in zip(names, spec)}
    proto = _converted(lambda: tf2onnx.convert.from_tflite(str(path), opset=OPSET, shape_override=overrides,
                                                          inputs_as_nchw=_nchw_names(spec, names)), what)
    return _to_relax(proto, Path(path).stem, spec, batch, Path(path).stem)


def _is_tensorflow_object(model: object) -> bool:
    return not isinstance(model, str | os.PathLike) and any(
        cls.__module__.split(".")[0] in {"keras", "tf_keras", "tensorflow"} for cls in type(model).__mro__)


def _suffix_is(*suffixes: str) -> Callable[[object], bool]:
    return lambda m: isinstance(m, str | os.PathLike) and str(m).lower().endswith(suffixes)


def _is_saved_model(model: object) -> bool:
    return isinstance(model, str | os.PathLike) and (Path(model) / "saved_model.pb").is_file()


register_frontend("keras", _is_tensorflow_object, load_keras, priority=30)
register_frontend("keras-file", _suffix_is(*KERAS_SUFFIXES), load_keras_file, priority=31)
register_frontend("saved-model", _is_saved_model, load_saved_model, priority=32)
register_frontend("tflite", _suffix_is(".tflite"), load_tflite, priority=33)
