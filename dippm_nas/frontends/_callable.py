"""``package.module:factory``: a callable that returns an ``nn.Module`` (built on ``meta`` if it can be)."""

from __future__ import annotations

import importlib
import reprlib

import torch

from dippm_nas.errors import ModelLoadError, one_line
from dippm_nas.frontends._frontend_registry import LoadedModel, register_frontend
from dippm_nas.frontends._module import load_module
from dippm_nas.inputs import InputSpec
from dippm_nas.model_names import FACTORY_PATTERN


def load_callable(target: str, inputs: InputSpec | None, batch: int) -> LoadedModel:
    """Import ``module:factory``, call the factory on the ``meta`` device and export what it returns;
    raises ModelLoadError where the import fails or the result is not a ``torch.nn.Module``."""
    module_name, _, attr = target.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ModelLoadError(f"cannot import {target!r}: {exc}. Is the module on PYTHONPATH?") from exc
    except Exception as exc:  # the module's own code failed while it was imported
        raise ModelLoadError(f"importing {module_name} for {target!r} raised {one_line(exc)}.") from exc
    if not callable(factory):
        raise ModelLoadError(f"{target} is a {type(factory).__name__}, not a function that returns a "
                             "torch.nn.Module.")
    try:
        try:
            with torch.device("meta"):
                model = factory()
        except Exception:  # a constructor that needs real tensors: on the CPU, as timm's are built
            model = factory()
    except Exception as exc:  # the user's code: any exception is the factory's, said in one line
        raise ModelLoadError(f"{target}() raised {one_line(exc)}; call it yourself to see the traceback.") from exc
    if not isinstance(model, torch.nn.Module):
        raise ModelLoadError(f"{target} returned {reprlib.repr(model)} ({type(model).__name__}), not a "
                             "torch.nn.Module.")
    return load_module(model, inputs, batch, target, "callable")


register_frontend("callable", lambda m: isinstance(m, str) and bool(FACTORY_PATTERN.match(m)), load_callable,
                  priority=60)
