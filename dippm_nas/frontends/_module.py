"""A ``torch.nn.Module`` object, exported as it is (build it on the ``meta`` device to skip weights).

A module whose floating parameters and buffers are all one half dtype (``model.half()``) takes its float
inputs in that dtype, as PyTorch requires of it: a float32 input spec is read in the weights' dtype.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from dippm_nas.frontends._frontend_registry import LoadedModel, register_frontend
from dippm_nas.frontends._torch import torch_to_relax
from dippm_nas.graph.cast import inputs_read_in_note
from dippm_nas.inputs import IMAGE_SHAPE, InputSpec, TensorSpec
from dippm_nas.precisions import FULL_DTYPE, HALF_FORMATS


def module_family(module: torch.nn.Module) -> str:
    """The last part of the module that defines the model's class (``resnet`` for timm's ResNet)."""
    return type(module).__module__.rsplit(".", 1)[-1]


def half_weights_dtype(module: torch.nn.Module) -> str | None:
    """The half dtype (``float16``, ``bfloat16``) all the module's floating parameters and buffers are in,
    None where they are float32, mixed or absent.

    >>> half_weights_dtype(torch.nn.Linear(2, 2, device="meta").half()), half_weights_dtype(torch.nn.ReLU())
    ('float16', None)
    """
    dtypes = {str(t.dtype).removeprefix("torch.") for t in (*module.parameters(), *module.buffers())
              if t.is_floating_point()}
    return dtypes.pop() if len(dtypes) == 1 and next(iter(dtypes)) in HALF_FORMATS else None


def assumed_input_note(name: str, dtype: str = FULL_DTYPE) -> str:
    """The note a prediction carries when a module came without its input shape."""
    return (f"{name}: no input shape was given, so one {'x'.join(map(str, IMAGE_SHAPE))} {dtype} image per sample "
            "was assumed; pass input_shape= (--input-shape or --input) if the model takes another input")


def load_module(module: torch.nn.Module, inputs: InputSpec | None, batch: int, name: str = "",
                source: str = "torch", family: str = "") -> LoadedModel:
    """Export ``module`` at ``batch`` into Relax; no ``inputs`` means one 3x224x224 image, which the
    prediction's notes then say, and an empty ``name`` or ``family`` is taken from the module's class."""
    half = half_weights_dtype(module)
    spec = inputs or (TensorSpec(IMAGE_SHAPE),)
    if half:
        spec = tuple(replace(s, dtype=half) if s.dtype == FULL_DTYPE else s for s in spec)
    name = name or type(module).__name__
    mod, notes = torch_to_relax(module, spec, batch, name)
    if not inputs:
        notes = (assumed_input_note(name, half or FULL_DTYPE), *notes)
    elif half and any(s.dtype == FULL_DTYPE for s in inputs):
        notes = (inputs_read_in_note(name, half), *notes)
    return LoadedModel(mod, name, source, spec, batch, family or module_family(module), notes)


register_frontend("torch", lambda m: isinstance(m, torch.nn.Module), load_module, priority=10)
