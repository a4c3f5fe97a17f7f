"""A timm model name, built on the ``meta`` device with random (never materialised) weights."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import timm
import torch

from dippm_nas.errors import UnknownModelError
from dippm_nas.frontends._frontend_registry import LoadedModel, register_frontend
from dippm_nas.frontends._module import load_module
from dippm_nas.inputs import InputSpec, TensorSpec
from dippm_nas.model_names import not_a_model, remember_timm_names


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
    remember_timm_names(timm.list_models)
    if not timm.is_model(name):
        raise UnknownModelError(_path_that_is_not_a_model(name) or not_a_model(name, timm.list_models()))
    model = build_timm(name)
    return load_module(model, inputs or (default_input(model),), batch, name, "timm", timm_family(name))


#: Suffixes of model files: a name ending in one is a path, never a timm name.
MODEL_SUFFIXES = (".onnx", ".keras", ".h5", ".tflite", ".pdmodel", ".json", ".pt", ".pth", ".pb", ".safetensors")


def _path_that_is_not_a_model(name: str) -> str:
    """What is wrong with a name that is a path no other frontend took (a directory or file that exists
    but holds no model it reads, or a file path that does not exist), or '' for anything else."""
    path = Path(name)
    if not name.strip():
        return ("the model is an empty name: give a timm model name (resnet50), a model file, "
                "'package.module:factory' or 'hf:<type>'.")
    if path.is_dir():
        return (f"{name} is a directory but holds no model dippm-nas reads: a TensorFlow SavedModel directory "
                "has saved_model.pb in it, a Paddle inference model directory one program (.json or .pdmodel) "
                "beside its .pdiparams; give the model file itself for any other kind.")
    if path.exists() and not path.is_file():
        return f"{name} is not a regular file (a device, a pipe or a socket): give the model file itself."
    if path.is_file():
        return (f"{name} is a file of a kind dippm-nas does not read ({path.suffix or 'no suffix'}); give an .onnx, "
                ".keras, .h5 or .tflite file, a Paddle .json/.pdmodel beside its .pdiparams, or a PyTorch model "
                "as 'package.module:factory'.")
    if os.sep in name or (os.altsep and os.altsep in name) or path.suffix.lower() in MODEL_SUFFIXES:
        return f"no such file or directory: {name}."
    return ""


register_frontend("timm", lambda m: isinstance(m, str), load_timm, priority=100)
