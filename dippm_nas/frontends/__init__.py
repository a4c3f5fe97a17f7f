"""Frontends: any supported model description -> one TVM Relax IRModule.

A registry, as in timm: each frontend registers a matcher and a loader with :func:`register_frontend`,
and :func:`load_model` tries them in order. What comes out is always a :class:`LoadedModel`, whatever
the source framework.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import tvm

from dippm_nas.errors import DippmError, MissingExtraError
from dippm_nas.inputs import InputLike, InputSpec, check_batch, normalize_inputs


@dataclass(frozen=True)
class LoadedModel:
    """A model imported into Relax, with what is needed to describe it."""

    mod: tvm.IRModule
    name: str
    source: str  # "torch", "timm", "onnx", "callable", "transformers"
    inputs: InputSpec
    batch: int
    family: str = ""
    warnings: tuple[str, ...] = ()


Matcher = Callable[[Any], bool]
Loader = Callable[[Any, "InputSpec | None", int], LoadedModel]

_FRONTENDS: list[tuple[str, Matcher, Loader]] = []


def register_frontend(name: str, matches: Matcher, load: Loader) -> None:
    _FRONTENDS.append((name, matches, load))


def require_extra(module: str, extra: str, what: str) -> None:
    """Say which ``pip install`` brings ``module`` if it is missing, without importing it."""
    try:
        found = importlib.util.find_spec(module) is not None
    except ValueError:  # sys.modules[module] is None: imports of it fail
        found = False
    if not found:
        raise MissingExtraError(f"{what} need the {module} package, which is not installed; install the extra: "
                                f"pip install 'dippm-nas[{extra}]'")


def import_extra(module: str, extra: str, what: str) -> ModuleType:
    """Import a framework that only an optional extra installs, or say which ``pip install`` brings it."""
    require_extra(module, extra, what)
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(f"{what} need the {module} package, which does not import ({exc}); reinstall "
                                f"the extra: pip install 'dippm-nas[{extra}]'") from exc


def frontend_names() -> list[str]:
    return [name for name, _, _ in _FRONTENDS]


def load_model(model: Any, inputs: InputLike = None, batch: int = 1) -> LoadedModel:
    """Import ``model`` at ``batch`` into Relax.

    ``model`` is a ``torch.nn.Module``, a timm model name, a path to an ``.onnx`` file,
    ``"package.module:factory"`` (a callable returning an ``nn.Module``), ``"hf:<model_type>"``
    (a Hugging Face ``transformers`` architecture built from its default config, no weights), a
    Keras model or file, a SavedModel directory, a ``.tflite`` file, a ``paddle.nn.Layer`` or a
    Paddle inference model.
    ``inputs`` is None for the model's default input (an image, or 128 token ids).
    """
    check_batch(batch)
    spec = normalize_inputs(inputs)
    for _, matches, load in _FRONTENDS:
        if matches(model):
            return load(model, spec, batch)
    raise DippmError(
        f"cannot tell what kind of model {model!r} is; give a torch.nn.Module, a timm model name, a "
        "path to an .onnx, .keras, .h5 or .tflite file, a TensorFlow SavedModel directory, a Paddle "
        "inference model (.json/.pdmodel beside .pdiparams), a keras.Model or paddle.nn.Layer, "
        "'package.module:factory' or 'hf:<model_type>'."
    )


# Registration order is matching order: the catch-all timm name comes last.
from dippm_nas.frontends import _module, _onnx, _tensorflow, _paddle, _transformers, _callable, _timm  # noqa: E402,F401
