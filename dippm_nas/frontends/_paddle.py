"""PaddlePaddle: a ``paddle.nn.Layer`` object or a saved inference model, through paddle2onnx.

A Layer is traced with ``paddle.jit.to_static`` and saved with a free batch dimension, exactly what
``paddle.jit.save`` gives a user for deployment; paddle2onnx turns that inference model into ONNX,
and the ONNX frontend does the rest. An inference model is given by its program file (``model.json``
for Paddle 3's PIR programs, ``model.pdmodel`` for older ones) or by the directory holding it; the
``.pdiparams`` file beside it holds the weights.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import onnx

from dippm_nas.errors import ModelLoadError, one_line
from dippm_nas.frontends._frontend_registry import LoadedModel, import_extra, register_frontend, require_extra
from dippm_nas.frontends._onnx import import_onnx
from dippm_nas.frontends._quiet import quiet
from dippm_nas.inputs import IMAGE_SHAPE, InputSpec, TensorSpec

OPSET = 17
EXTRA, WHAT = "paddle", "PaddlePaddle models"
PROGRAM_SUFFIXES = (".json", ".pdmodel")
PARAMS_SUFFIX = ".pdiparams"


def _import(module: str) -> ModuleType:
    if "paddle" not in sys.modules and "tensorflow" in sys.modules:
        # Paddle's native core segfaults when it loads after TensorFlow's (the reverse order works).
        raise ModelLoadError("PaddlePaddle cannot be loaded into a process that has already loaded TensorFlow "
                             "(Paddle crashes); import paddle before tensorflow, or predict the two kinds of "
                             "model in separate processes.")
    with quiet():
        return import_extra(module, EXTRA, WHAT)


def _program_file(path: str | os.PathLike) -> Path | None:
    """The program file a path names: the file itself, or the one program with weights in a directory."""
    path = Path(path)
    if path.is_dir():
        found = [p for p in sorted(path.iterdir())
                 if p.suffix in PROGRAM_SUFFIXES and p.with_suffix(PARAMS_SUFFIX).is_file()]
        return found[0] if len(found) == 1 else None
    if path.suffix == ".pdmodel" or (path.suffix == ".json" and path.with_suffix(PARAMS_SUFFIX).is_file()):
        return path
    return None


# paddle2onnx segfaults in a process that has TensorFlow loaded (their native protobufs clash), and
# prints from C++; it runs in a child process of its own, which costs a second or two.
_EXPORT = "import sys, paddle2onnx; paddle2onnx.export(*sys.argv[1:4], opset_version=int(sys.argv[4]), verbose=False)"
EXPORT_TIMEOUT_S = 600


def _to_onnx(program: Path, what: str) -> onnx.ModelProto:
    require_extra("paddle2onnx", EXTRA, WHAT)  # imported in the child process only
    params = program.with_suffix(PARAMS_SUFFIX)
    if not program.is_file() or not params.is_file():
        raise ModelLoadError(f"{what}: need both {program.name} and {params.name} in {program.parent}; save the "
                             "model with paddle.jit.save(layer, 'dir/model').")
    with tempfile.TemporaryDirectory(prefix="dippm-paddle2onnx-") as tmp:
        out = Path(tmp) / "model.onnx"
        done = subprocess.run([sys.executable, "-c", _EXPORT, str(program), str(params), str(out), str(OPSET)],
                              capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S)
        if done.returncode != 0 or not out.is_file():
            lines = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
            raise ModelLoadError(f"paddle2onnx could not convert {what} ({lines[-1][:300] if lines else 'exit code '}"
                                 f"{'' if lines else done.returncode}); check that it is a Paddle inference model "
                                 "saved with paddle.jit.save.")
        return onnx.load(str(out))


def load_paddle_layer(layer: Any, inputs: InputSpec | None, batch: int) -> LoadedModel:
    """A ``paddle.nn.Layer``, traced and saved to a temporary inference model, then read through ONNX;
    no ``inputs`` means one 3x224x224 image."""
    paddle = _import("paddle")
    spec = inputs or (TensorSpec(IMAGE_SHAPE),)
    name = type(layer).__name__
    layer.eval()
    input_spec = [paddle.static.InputSpec([None, *s.shape], s.dtype, s.name) for s in spec]
    with tempfile.TemporaryDirectory(prefix="dippm-paddle-") as tmp:
        try:
            with quiet():
                static = paddle.jit.to_static(layer, input_spec=input_spec, full_graph=True)
                paddle.jit.save(static, os.path.join(tmp, "model"))
        except Exception as exc:
            raise ModelLoadError(f"paddle.jit.to_static could not trace {name} with inputs "
                                 f"{', '.join(map(str, spec))} ({one_line(exc)}).") from exc
        proto = _to_onnx(_program_file(tmp) or Path(tmp) / "model.json", f"Paddle layer {name}")
    family = type(layer).__module__.rsplit(".", 1)[-1]
    return import_onnx(proto, name, "paddle", spec, batch, family)


def load_inference_model(path: str | os.PathLike, inputs: InputSpec | None, batch: int) -> LoadedModel:
    """A saved Paddle inference model (its program file or its directory), read through ONNX."""
    program = _program_file(path)
    if program is None:
        raise ModelLoadError(f"{path} holds no single Paddle program with its {PARAMS_SUFFIX} weights beside it.")
    name = program.stem if program.stem != "model" else program.parent.resolve().name
    return import_onnx(_to_onnx(program, f"Paddle model {path}"), name, "paddle", inputs, batch, name)


def _is_paddle_layer(model: object) -> bool:
    return any(cls.__module__.startswith("paddle.") and cls.__name__ == "Layer" for cls in type(model).__mro__)


def _is_inference_model(model: object) -> bool:
    return isinstance(model, str | os.PathLike) and _program_file(model) is not None


register_frontend("paddle", _is_paddle_layer, load_paddle_layer, priority=40)
register_frontend("paddle-inference", _is_inference_model, load_inference_model, priority=41)
