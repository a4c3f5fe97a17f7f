"""Questions asked of a finished study."""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial, TrialState

from dippm_nas.hardware.mig import DEFAULT_MIG_MARGIN, fits
from dippm_nas.hardware.registry import get_device


def trials_fitting_mig(study: optuna.Study, profile: str, device: str = "a100-40gb",
                       margin: float = DEFAULT_MIG_MARGIN, states: tuple[TrialState, ...] = (TrialState.COMPLETE,)
                       ) -> list[FrozenTrial]:
    """Trials scored on ``device`` whose predicted memory fits ``profile`` (with the margin)."""
    gpu = get_device(device)
    slot = gpu.mig_profile(profile)
    return [
        t for t in study.get_trials(deepcopy=False, states=states)
        if "memory_mb" in t.user_attrs and str(t.user_attrs.get("device", "")).split(":")[0] == gpu.key
        and fits(slot, float(t.user_attrs["memory_mb"]), margin)
    ]


def is_feasible(trial: FrozenTrial) -> bool:
    return all(v <= 0 for v in trial.constraints.values())


def feasible_pareto_front(study: optuna.Study) -> list[FrozenTrial]:
    """The Pareto-optimal trials among the feasible ones (Optuna's ``best_trials`` already says so
    for a constrained study; this also holds for a study where only some trials set constraints)."""
    return [t for t in study.best_trials if is_feasible(t)]
