"""Optuna integration: score candidates, constrain and prune by predicted cost, filter studies."""

from dippm_nas.integration.candidate import Block, Candidate
from dippm_nas.integration.constraints import PREDICTION_ATTRS, HardwareConstraints, record_prediction
from dippm_nas.integration.cost_model import HardwareCostModel
from dippm_nas.integration.featurizer import CachedFeaturizer
from dippm_nas.integration.filters import (
    feasible_pareto_front,
    is_feasible,
    trials_fitting_mig,
    trials_served_by_slice,
)
from dippm_nas.integration.objective import HardwareObjective, SearchStopped
from dippm_nas.integration.study import open_study

__all__ = [
    "Block", "CachedFeaturizer", "Candidate", "HardwareConstraints", "HardwareCostModel", "HardwareObjective",
    "PREDICTION_ATTRS", "feasible_pareto_front", "is_feasible", "open_study", "record_prediction",
    "SearchStopped", "trials_fitting_mig", "trials_served_by_slice",
]
