"""``hf:<model_type>``: a Hugging Face ``transformers`` architecture from its default config.

Nothing is downloaded: the config is the library's default for that model type (``bert`` is
bert-base, ``gpt2`` is GPT-2 small), or one passed in as a ``PretrainedConfig``; the model is built
on the ``meta`` device. Inputs default to token ids, int64, ``batch x 128``. Needs the optional extra
``pip install 'dippm-nas[transformers]'``.
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


def build_from_config(config: object) -> torch.nn.Module:
    """The ``AutoModel`` of ``config`` on the ``meta`` device, with eager attention."""
    from transformers import AutoModel

    # Eager attention: TVM's importer takes only float masks for SDPA, and transformers builds
    # boolean ones. The matmuls and the softmax are then explicit nodes of the graph.
    config._attn_implementation = "eager"  # type: ignore[attr-defined]
    with torch.device("meta"):
        return AutoModel.from_config(config)


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
    """``hf:<model_type>`` or a ``PretrainedConfig`` into Relax; no ``inputs`` means 128 int64 token ids."""
    config = config_for(target.removeprefix(PREFIX)) if isinstance(target, str) else target
    model = _TokenIdsOnly(build_from_config(config))
    spec = inputs or (TensorSpec((DEFAULT_SEQUENCE_LENGTH,), "int64", "input_ids"),)
    model_type = getattr(config, "model_type", "transformers")
    name = target if isinstance(target, str) else f"{PREFIX}{model_type}"
    return load_module(model, spec, batch, name, "transformers", model_type)


def _is_transformers(model: object) -> bool:
    if isinstance(model, str):
        return model.startswith(PREFIX)
    return type(model).__name__.endswith("Config") and hasattr(model, "model_type")


register_frontend("transformers", _is_transformers, load_transformers, priority=50)
