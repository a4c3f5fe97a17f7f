"""``hf:<model_type>`` or ``hf:<config.json>``: a Hugging Face ``transformers`` architecture from a config.

Nothing is downloaded. ``hf:<model_type>`` takes the library's default config for that model type
(``bert`` is bert-base, ``gpt2`` is GPT-2 small) and builds the bare model (``AutoModel``);
``hf:path/to/config.json`` reads a config file and builds the architecture the file names in its
``architectures`` list, head included (``GPT2LMHeadModel``), as a benchmark that measured that config
ran it; a ``PretrainedConfig`` object builds the bare model. Every model is built on the ``meta``
device with eager attention. Inputs default to token ids, int64, ``batch x 128``. Needs the optional
extra ``pip install 'dippm-nas[transformers]'``.
"""

from __future__ import annotations

import torch

from dippm_nas.errors import ModelLoadError, suggest
from dippm_nas.frontends._module import load_module
from dippm_nas.frontends._registry import LoadedModel, import_extra, register_frontend
from dippm_nas.inputs import InputSpec, TensorSpec

DEFAULT_SEQUENCE_LENGTH = 128
PREFIX = "hf:"


class _TokenIdsOnly(torch.nn.Module):
    """Calls the model with token ids alone and returns its main output tensor."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if _accepts_cache(self.model):
            out = self.model(input_ids=input_ids, use_cache=False)
        else:
            out = self.model(input_ids=input_ids)
        return out[0]


def _accepts_cache(model: torch.nn.Module) -> bool:
    return bool(getattr(getattr(model, "config", None), "use_cache", False))


def build_from_config(config: object, architecture: str | None = None) -> torch.nn.Module:
    """The ``AutoModel`` of ``config`` (or the transformers class ``architecture``) on the ``meta``
    device, with eager attention."""
    import transformers

    # Eager attention: TVM's importer takes only float masks for SDPA, and transformers builds
    # boolean ones. The matmuls and the softmax are then explicit nodes of the graph.
    config._attn_implementation = "eager"  # type: ignore[attr-defined]
    if architecture is not None and not hasattr(transformers, architecture):
        raise ModelLoadError(f"transformers has no architecture {architecture!r} (the config names it); "
                             f"transformers {transformers.__version__} is installed.")
    with torch.device("meta"):
        if architecture is None:
            return transformers.AutoModel.from_config(config)
        return getattr(transformers, architecture)(config)


def config_file(path: str) -> tuple[object, str | None]:
    """A config JSON file's ``PretrainedConfig`` and the architecture it names (None if it names none)."""
    import json
    from pathlib import Path

    transformers = import_extra("transformers", "transformers", "Hugging Face models")
    file = Path(path)
    if not file.is_file():
        raise ModelLoadError(f"no transformers config file at {path}.")
    raw = json.loads(file.read_text())
    if "model_type" not in raw:
        raise ModelLoadError(f"{path} has no model_type: not a transformers config.")
    config = transformers.AutoConfig.for_model(**raw)
    architectures = raw.get("architectures") or [None]
    return config, architectures[0]


def config_for(model_type: str, **overrides: object) -> object:
    """The library's default config for ``model_type`` (``bert``), with ``overrides``; raises
    ModelLoadError with the closest types for an unknown one."""
    transformers = import_extra("transformers", "transformers", "Hugging Face models")
    CONFIG_MAPPING, AutoConfig = transformers.CONFIG_MAPPING, transformers.AutoConfig
    if model_type not in CONFIG_MAPPING:
        raise ModelLoadError(f"unknown transformers model type {model_type!r}."
                             + suggest(model_type, list(CONFIG_MAPPING.keys())))
    return AutoConfig.for_model(model_type, **overrides)


def load_transformers(target: str | object, inputs: InputSpec | None, batch: int) -> LoadedModel:
    """``hf:<model_type>``, ``hf:<config.json>`` or a ``PretrainedConfig`` into Relax; no ``inputs`` means
    128 int64 token ids."""
    architecture = None
    if isinstance(target, str) and target.endswith(".json"):
        config, architecture = config_file(target.removeprefix(PREFIX))
    else:
        config = config_for(target.removeprefix(PREFIX)) if isinstance(target, str) else target
    model = _TokenIdsOnly(build_from_config(config, architecture))
    spec = inputs or (TensorSpec((DEFAULT_SEQUENCE_LENGTH,), "int64", "input_ids"),)
    model_type = getattr(config, "model_type", "transformers")
    name = target if isinstance(target, str) else f"{PREFIX}{model_type}"
    return load_module(model, spec, batch, name, "transformers", model_type)


def _is_transformers(model: object) -> bool:
    if isinstance(model, str):
        return model.startswith(PREFIX)
    return type(model).__name__.endswith("Config") and hasattr(model, "model_type")


register_frontend("transformers", _is_transformers, load_transformers, priority=50)
