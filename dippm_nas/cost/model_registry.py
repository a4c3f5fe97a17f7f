"""The cost models by name: what ``cost_model=`` and ``--cost-model`` name, every one with one signature
(:class:`~dippm_nas.cost.estimate.CostModel`)."""

from __future__ import annotations

from collections.abc import Callable

from dippm_nas.cost.estimate import CostModel
from dippm_nas.cost_model_names import add_cost_model_name, check_cost_model

_FACTORIES: dict[str, Callable[[], CostModel]] = {}
_MODELS: dict[str, CostModel] = {}


def register_cost_model(name: str, factory: Callable[[], CostModel]) -> None:
    """Make ``factory`` answer to ``name`` in :func:`get_cost_model` (and wherever a request names a cost model):
    it is called once, on first use, as a cost model keeps no state of a request."""
    add_cost_model_name(name)
    _FACTORIES[name] = factory
    _MODELS.pop(name, None)


def get_cost_model(name: str) -> CostModel:
    """The cost model registered as ``name``; an unknown name is an error that lists the known ones.

    >>> get_cost_model("analytical").name
    'analytical'
    """
    model = _MODELS.get(name)
    if model is None:
        check_cost_model(name)
        model = _MODELS[name] = _FACTORIES[name]()
    return model
