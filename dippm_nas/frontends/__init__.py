"""Frontends: any supported model description -> one TVM Relax IRModule.

A registry, as in timm: each frontend module registers a matcher and a loader with a priority
(:mod:`dippm_nas.frontends._frontend_registry`), and :func:`load_model` tries them in that order. What comes
out is always a :class:`LoadedModel`, whatever the source framework. Another installed package adds frontends
of its own through an entry point of the group ``dippm_nas.frontends`` that names a module registering them (the
search spaces' ``space:architecture`` candidates come so), loaded here.

>>> frontend_names()[0], frontend_names()[-1]
('torch', 'timm')
"""

from __future__ import annotations

from typing import Any

from dippm_nas.errors import DippmError

# Each module registers its frontends when imported; the priorities, not this order, decide matching.
from dippm_nas.frontends import (  # noqa: F401
    _callable,
    _module,
    _onnx,
    _paddle,
    _tensorflow,
    _timm,
    _transformers,
)
from dippm_nas.frontends._frontend_registry import (
    Frontend,
    LoadedModel,
    frontend_names,
    frontends,
    import_extra,
    register_frontend,
    require_extra,
)
from dippm_nas.frontends._timm import build_timm, default_input, timm_family
from dippm_nas.inputs import InputLike, check_batch, normalize_inputs

#: The entry-point group through which another package registers frontends.
PLUGIN_GROUP = "dippm_nas.frontends"


def _load_plugins() -> None:
    """Import every module the installed packages name in :data:`PLUGIN_GROUP`: each registers its frontends."""
    from importlib.metadata import entry_points

    for point in entry_points(group=PLUGIN_GROUP):
        point.load()


_load_plugins()

__all__ = ["Frontend", "LoadedModel", "build_timm", "default_input", "frontend_names", "frontends", "import_extra",
           "load_model", "register_frontend", "require_extra", "timm_family"]


def load_model(model: Any, inputs: InputLike = None, batch: int = 1) -> LoadedModel:
    """Import ``model`` at ``batch`` into Relax.

    ``model`` is a ``torch.nn.Module``, a timm model name, a path to an ``.onnx`` file,
    ``"package.module:factory"`` (a callable returning an ``nn.Module``), ``"space:architecture"`` (a
    search space's candidate, ``nb201:|nor_conv_3x3~0|+|...|``), ``"hf:<model_type>"``
    (a Hugging Face ``transformers`` architecture built from its default config, no weights), a
    Keras model or file, a SavedModel directory, a ``.tflite`` file, a ``paddle.nn.Layer`` or a
    Paddle inference model.
    ``inputs`` is None for the model's default input (an image, or 128 token ids).
    A model no frontend recognises raises :class:`~dippm_nas.errors.DippmError`; one that cannot
    be read or traced raises a subclass that says why.

    >>> loaded = load_model("resnet18", batch=2)
    >>> loaded.source, loaded.family, loaded.batch
    ('timm', 'resnet', 2)
    >>> [str(spec) for spec in loaded.inputs]
    ['x=3,224,224:float32']
    """
    batch = check_batch(batch)
    spec = normalize_inputs(inputs)
    for frontend in frontends():
        if frontend.matches(model):
            return frontend.load(model, spec, batch)
    raise DippmError(
        f"cannot tell what kind of model {model!r} is; give a torch.nn.Module, a timm model name, a "
        "path to an .onnx, .keras, .h5 or .tflite file, a TensorFlow SavedModel directory, a Paddle "
        "inference model (.json/.pdmodel beside .pdiparams), a keras.Model or paddle.nn.Layer, "
        "'package.module:factory', 'space:architecture' (a search space's candidate) or 'hf:<model_type>'."
    )

