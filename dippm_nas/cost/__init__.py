"""Cost models: one interface (:class:`CostModel`), registered here by name.

``analytical`` is the roofline, host queue, allocator replay and power model
(:mod:`dippm_nas.cost.analytical`); ``operators`` times every kernel from its structure on the GPU
(:mod:`dippm_nas.cost.operator_cost`); ``residual`` is PMGNS over it, a bounded whole-graph correction
(:mod:`dippm_nas.cost.residual`); ``pmgns`` is DIPPM's learned correction of the roofline
(:mod:`dippm_nas.cost.learned`). The learned ones load only when asked for, since they need torch and weights.

>>> from dippm_nas.cost import cost_model_names
>>> cost_model_names()
['analytical', 'operators', 'residual', 'pmgns']
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
from dippm_nas.cost_model_names import SHIPPED


def _operators() -> CostModel:
    from dippm_nas.cost.operator_cost import OperatorCostModel

    return OperatorCostModel()


def _residual() -> CostModel:
    from dippm_nas.cost.residual import ResidualCostModel

    return ResidualCostModel()


def _pmgns() -> CostModel:
    from dippm_nas.cost.learned import PMGNSCostModel

    return PMGNSCostModel()


_FACTORIES = {"analytical": AnalyticalCostModel, "operators": _operators, "residual": _residual, "pmgns": _pmgns}
for _name in SHIPPED:
    register_cost_model(_name, _FACTORIES[_name])

__all__ = [
    "AnalyticalCostModel", "CostModel", "Estimate", "MemoryBreakdown", "NodeCost", "NotCovered", "Prediction",
    "cost_model_names", "get_cost_model", "register_cost_model",
]
