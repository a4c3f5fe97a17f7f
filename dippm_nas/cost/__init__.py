"""Cost models: one interface (:class:`CostModel`), registered here by name.

``analytical`` is the roofline, host queue, allocator replay and power model
(:mod:`dippm_nas.cost.analytical`); ``pmgns`` is the learned correction to it
(:mod:`dippm_nas.cost.learned`), loaded only when asked for, since it needs torch and its weights.

>>> from dippm_nas.cost import cost_model_names
>>> cost_model_names()
['analytical', 'operators', 'pmgns']
"""

from dippm_nas.cost.analytical import AnalyticalCostModel
from dippm_nas.cost.base import (
    CostModel,
    Estimate,
    MemoryBreakdown,
    NodeCost,
    NotCovered,
    Prediction,
    cost_model_names,
    get_cost_model,
    register_cost_model,
)


def _operators() -> CostModel:
    from dippm_nas.cost.operator_cost import OperatorCostModel

    return OperatorCostModel()


def _pmgns() -> CostModel:
    from dippm_nas.cost.learned import PMGNSCostModel

    return PMGNSCostModel()


register_cost_model("analytical", AnalyticalCostModel)
register_cost_model("operators", _operators)
register_cost_model("pmgns", _pmgns)

__all__ = [
    "AnalyticalCostModel", "CostModel", "Estimate", "MemoryBreakdown", "NodeCost", "NotCovered", "Prediction",
    "cost_model_names", "get_cost_model", "register_cost_model",
]
