"""A timm model name, built on the ``meta`` device with random (never materialised) weights."""

from __future__ import annotations

import warnings

import timm
import torch

from dippm_nas.errors import UnknownModelError, suggest
from dippm_nas.frontends._module import load_module
from dippm_nas.frontends._registry import LoadedModel, register_frontend
from dippm_nas.inputs import InputSpec, TensorSpec


def timm_family(name: str) -> str:
    """timm's own grouping: the module that defines the architecture (``resnet``, ``vision_transformer``)."""
    try:
        from timm.models import get_arch_name
        from timm.models._registry import _model_to_module

        return _model_to_module.get(get_arch_name(name), "")
    except ImportError:  # pragma: no cover - older timm
        return ""


def build_timm(name: str) -> torch.nn.Module:
    """The model on the meta device; on the CPU where its constructor needs real tensors."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with torch.device("meta"):
                return timm.create_model(name, pretrained=False)
        except Exception:
            return timm.create_model(name, pretrained=False)


def default_input(model: torch.nn.Module) -> TensorSpec:
    """The input the model was trained at (its ``pretrained_cfg``), else a 3x224x224 image."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    return TensorSpec(tuple(cfg.get("input_size", (3, 224, 224))))


def load_timm(name: str, inputs: InputSpec | None, batch: int) -> LoadedModel:
    """A timm model by name, at its default input unless ``inputs`` are given; raises UnknownModelError
    with the closest timm names for a name timm does not know."""
    if not timm.is_model(name):
        raise UnknownModelError(
            f"{name!r} is not a timm model, a model file or directory that exists, 'module:factory' or "
            "'hf:<type>' (`dippm-nas predict --help` lists every kind)."
            + suggest(name, timm.list_models(), n=5)
        )
    model = build_timm(name)
    return load_module(model, inputs or (default_input(model),), batch, name, "timm", timm_family(name))


register_frontend("timm", lambda m: isinstance(m, str), load_timm, priority=100)
