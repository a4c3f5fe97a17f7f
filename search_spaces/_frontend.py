"""``space:architecture``: a candidate of a registered search space, named as
:meth:`search_spaces.SearchSpace.model_name` writes it (``nb201:|nor_conv_3x3~0|+|...|``), so that rows of
``dippm-nas measure --space`` rebuild anywhere a model is named.

A frontend of dippm-nas's registry that this package adds: its entry point (group ``dippm_nas.frontends``, in
``pyproject.toml``) names this module, which :mod:`dippm_nas.frontends` imports, so dippm-nas never imports the
search spaces itself."""

from __future__ import annotations

from dippm_nas.frontends._frontend_registry import LoadedModel, register_frontend
from dippm_nas.frontends._module import load_module
from dippm_nas.inputs import InputSpec, TensorSpec
from search_spaces import candidate_named, is_candidate_name


def _is_candidate_name(model: object) -> bool:
    return isinstance(model, str) and ":" in model and is_candidate_name(model)


def load_candidate(name: str, inputs: InputSpec | None, batch: int) -> LoadedModel:
    """The candidate's network (on the ``meta`` device), exported at its space's input shape unless
    ``inputs`` says otherwise; a zoo candidate is its timm model."""
    candidate = candidate_named(name)
    spec = inputs or (TensorSpec(candidate.input_shape),)
    if candidate.model is not None:
        from dippm_nas.frontends._timm import load_timm

        return load_timm(candidate.model, spec, batch)
    return load_module(candidate.module, spec, batch, name, candidate.space, candidate.space)


register_frontend("search-space", _is_candidate_name, load_candidate, priority=55)
