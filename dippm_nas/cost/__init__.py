"""Cost models: stages written once (:mod:`dippm_nas.cost.pipeline`), composed by the models
(:mod:`dippm_nas.cost.models`), all with one signature, ``estimate(graph, request) -> Estimate``, registered here
by name. The learned parts (networks, features, cards, weights) live in :mod:`dippm_nas.cost.learned`; a model
module loads on first use, as the learned ones need torch.

>>> from dippm_nas.cost_model_names import cost_model_names
>>> cost_model_names()
('auto', 'operators', 'residual', 'analytical', 'pmgns', 'calibrated')
"""

from dippm_nas.cost.estimate import CostModel, Estimate, MemoryBreakdown, NodeCost, NotCovered
from dippm_nas.cost.model_registry import get_cost_model, register_cost_model
from dippm_nas.cost_model_names import cost_model_names


def _auto() -> CostModel:
    from dippm_nas.cost.models.auto import AutoCostModel

    return AutoCostModel()


def _operators() -> CostModel:
    from dippm_nas.cost.models.operators import OperatorCostModel

    return OperatorCostModel()


def _residual() -> CostModel:
    from dippm_nas.cost.models.residual import ResidualCostModel

    return ResidualCostModel()


def _analytical() -> CostModel:
    from dippm_nas.cost.models.analytical import AnalyticalCostModel

    return AnalyticalCostModel()


def _pmgns() -> CostModel:
    from dippm_nas.cost.models.pmgns import PMGNSCostModel

    return PMGNSCostModel()


def _calibrated() -> CostModel:
    from dippm_nas.cost.models.calibrated import CalibratedCostModel

    return CalibratedCostModel()


for _name, _factory in (("auto", _auto), ("operators", _operators), ("residual", _residual),
                        ("analytical", _analytical), ("pmgns", _pmgns), ("calibrated", _calibrated)):
    register_cost_model(_name, _factory)

__all__ = ["CostModel", "Estimate", "MemoryBreakdown", "NodeCost", "NotCovered", "cost_model_names",
           "get_cost_model", "register_cost_model"]
