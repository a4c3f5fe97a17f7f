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

from dataclasses import replace

import torch

from dippm_nas.errors import InputSpecError, ModelLoadError, suggest
from dippm_nas.frontends._frontend_registry import LoadedModel, import_extra, register_frontend
from dippm_nas.frontends._module import load_module
from dippm_nas.inputs import InputSpec, TensorSpec

DEFAULT_SEQUENCE_LENGTH = 128
PREFIX = "hf:"
#: The one input these models are called with.
TOKEN_IDS = "input_ids"
#: Names an input gets when the user names none (``--input 128:int64``, a bare shape): taken as the token ids.
UNNAMED = ("x", "input0")
#: Config fields that bound the positions a model embeds, as transformers' configs name them.
MAX_POSITION_FIELDS = ("max_position_embeddings", "n_positions", "max_seq_len", "max_sequence_length")


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
        known = list(CONFIG_MAPPING.keys())
        raise ModelLoadError(f"unknown transformers model type {model_type!r}." + (suggest(model_type, known) or (
            f" The installed transformers knows {len(known)} types, e.g. bert, gpt2, llama, t5, vit; "
            "`python -c \"import transformers; print(*transformers.CONFIG_MAPPING)\"` lists them all.")))
    return AutoConfig.for_model(model_type, **overrides)


def load_transformers(target: str | object, inputs: InputSpec | None, batch: int) -> LoadedModel:
    """``hf:<model_type>``, ``hf:<config.json>`` or a ``PretrainedConfig`` into Relax; no ``inputs`` means
    128 int64 token ids."""
    architecture = None
    if isinstance(target, str) and target.endswith(".json"):
        config, architecture = config_file(target.removeprefix(PREFIX))
    else:
        config = config_for(target.removeprefix(PREFIX)) if isinstance(target, str) else target
    model_type = getattr(config, "model_type", "transformers")
    spec = token_ids(inputs, config, model_type)
    model = _TokenIdsOnly(build_from_config(config, architecture))
    name = target if isinstance(target, str) else f"{PREFIX}{model_type}"
    loaded = load_module(model, spec, batch, name, "transformers", model_type)
    if inputs:
        return loaded
    assumed = (f"{name}: no input was given, so {DEFAULT_SEQUENCE_LENGTH} int64 token ids per sample were assumed; "
               f"give --input {TOKEN_IDS}=LENGTH:int64 for another sequence length")
    return replace(loaded, warnings=(assumed, *loaded.warnings))


def token_ids(inputs: InputSpec | None, config: object, model_type: str) -> InputSpec:
    """The token-ids input a model is called with: ``inputs`` checked (one input, ``input_ids`` or unnamed,
    integer, a sequence no longer than the config's position limit), or 128 int64 ids."""
    if not inputs:
        return (TensorSpec((DEFAULT_SEQUENCE_LENGTH,), "int64", TOKEN_IDS),)
    named = [s.name for s in inputs if s.name not in UNNAMED]
    if len(inputs) != 1 or named not in ([], [TOKEN_IDS]):
        raise InputSpecError(f"hf: models take one input, {TOKEN_IDS} (token ids), not "
                             f"{', '.join(s.name for s in inputs)}; give e.g. --input {TOKEN_IDS}=128:int64.")
    spec = inputs[0]
    if len(spec.shape) != 1:
        raise InputSpecError(f"{TOKEN_IDS} is a sequence of token ids: give its length alone (e.g. 128), not the "
                             f"shape {','.join(map(str, spec.shape))}.")
    if spec.name in UNNAMED and spec.dtype == "float32":  # a bare length: the ids' usual dtype
        spec = TensorSpec(spec.shape, "int64", TOKEN_IDS)
    if spec.dtype not in ("int64", "int32"):
        raise InputSpecError(f"{TOKEN_IDS} are token ids, int64 or int32, not {spec.dtype}.")
    length = spec.shape[0]
    for field in MAX_POSITION_FIELDS:
        limit = getattr(config, field, None)
        if isinstance(limit, int) and not isinstance(limit, bool) and length > limit:
            raise InputSpecError(f"{model_type} takes at most {limit} positions (its config's {field}), not "
                                 f"{length}: give a sequence of {limit} or fewer, or a config with a larger {field}.")
    return (TensorSpec(spec.shape, spec.dtype, TOKEN_IDS),)


def _is_transformers(model: object) -> bool:
    if isinstance(model, str):
        return model.startswith(PREFIX)
    return type(model).__name__.endswith("Config") and hasattr(model, "model_type")


register_frontend("transformers", _is_transformers, load_transformers, priority=50)
