"""A ``torch.nn.Module`` object, exported as it is (build it on the ``meta`` device to skip weights)."""

from __future__ import annotations

import torch

from dippm_nas.frontends._registry import LoadedModel, register_frontend
from dippm_nas.frontends._torch import torch_to_relax
from dippm_nas.inputs import IMAGE_SHAPE, InputSpec, TensorSpec


def module_family(module: torch.nn.Module) -> str:
    """The last part of the module that defines the model's class (``resnet`` for timm's ResNet)."""
    return type(module).__module__.rsplit(".", 1)[-1]


def assumed_input_note(name: str) -> str:
    """The note a prediction carries when a module came without its input shape."""
    return (f"{name}: no input shape was given, so one {'x'.join(map(str, IMAGE_SHAPE))} float32 image per sample "
            "was assumed; pass input_shape= (--input-shape or --input) if the model takes another input")


def load_module(module: torch.nn.Module, inputs: InputSpec | None, batch: int, name: str = "",
                source: str = "torch", family: str = "") -> LoadedModel:
    """Export ``module`` at ``batch`` into Relax; no ``inputs`` means one 3x224x224 image, which the
    prediction's notes then say, and an empty ``name`` or ``family`` is taken from the module's class."""
    spec = inputs or (TensorSpec(IMAGE_SHAPE),)
    name = name or type(module).__name__
    mod, notes = torch_to_relax(module, spec, batch, name)
    if not inputs:
        notes = (assumed_input_note(name), *notes)
    return LoadedModel(mod, name, source, spec, batch, family or module_family(module), notes)


register_frontend("torch", lambda m: isinstance(m, torch.nn.Module), load_module, priority=10)
