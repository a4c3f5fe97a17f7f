"""Cost models: one interface (:class:`CostModel`), registered by name."""

from dippm_nas.cost import analytical  # noqa: F401  (registers "analytical")
from dippm_nas.cost.analytical import AnalyticalCostModel
from dippm_nas.cost.base import CostModel, Estimate, MemoryBreakdown, NodeCost, Prediction, get_cost_model, register_cost_model

__all__ = [
    "AnalyticalCostModel", "CostModel", "Estimate", "MemoryBreakdown", "NodeCost", "Prediction",
    "get_cost_model", "register_cost_model",
]
