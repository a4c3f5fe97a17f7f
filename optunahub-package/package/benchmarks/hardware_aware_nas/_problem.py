from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import optuna
import optunahub


try:
    from dippm_nas.integration import HardwareConstraints
    from dippm_nas.integration import HardwareCostModel
    from search_spaces import get_search_space
    from search_spaces.proxies import naswot_score
except ModuleNotFoundError as error:
    raise ModuleNotFoundError(
        "Please run `pip install dippm-nas` to use `hardware_aware_nas`."
    ) from error


#: The spaces the problem searches: OFA-MobileNetV3, a ResNet and a ViT space of dippm-nas.
SPACES = ("mobilenetv3", "resnet", "vit")
#: The predicted costs it can minimise besides the accuracy proxy it maximises.
COSTS = ("latency_ms", "energy_j", "memory_mib")


class Problem(optunahub.benchmarks.BaseProblem):
    """Hardware-aware NAS: maximise a training-free accuracy proxy and minimise predicted GPU costs.

    Each architecture of ``space`` is scored on ``device`` (a GPU of dippm-nas's registry) or on its
    MIG slice ``mig_profile``, at ``batch`` and ``precision``, by dippm-nas's cost model, without a
    GPU. The constraints are the latency bound ``latency_ms`` (per batch, in the slice) and the
    slice's memory: a candidate is feasible when every value of ``evaluate_constraints`` is <= 0.
    """

    def __init__(
        self,
        space: str = "mobilenetv3",
        device: str = "a100-40gb",
        mig_profile: str | None = "1g.5gb",
        batch: int = 8,
        precision: str = "fp32",
        latency_ms: float | None = 7.0,
        costs: Sequence[str] = ("latency_ms", "energy_j"),
    ) -> None:
        if space not in SPACES:
            raise ValueError(f"space must be one of {', '.join(SPACES)}, not {space!r}.")
        unknown = [c for c in costs if c not in COSTS]
        if unknown:
            raise ValueError(f"unknown costs {unknown}; choose from {', '.join(COSTS)}.")
        target = f"{device}:{mig_profile}" if mig_profile else device
        self._space = get_search_space(space)
        self._cost = HardwareCostModel(device=target, batch=batch, precision=precision)
        self._constraints = HardwareConstraints(
            latency_ms=latency_ms,
            mig_profiles=(mig_profile,) if mig_profile else (),
            device=device,
        )
        self._costs = tuple(costs)
        self._last: tuple[tuple[Any, ...], list[float], dict[str, float]] | None = None

    @property
    def search_space(self) -> dict[str, optuna.distributions.BaseDistribution]:
        return {
            name: optuna.distributions.CategoricalDistribution(list(choices))
            for name, choices in self._space.parameters.items()
            if name not in self._space.fixed
        }

    @property
    def directions(self) -> list[optuna.study.StudyDirection]:
        return [optuna.study.StudyDirection.MAXIMIZE] + [
            optuna.study.StudyDirection.MINIMIZE
        ] * len(self._costs)

    def evaluate(self, params: dict[str, Any]) -> list[float]:
        return self._score(params)[0]

    def evaluate_constraints(self, params: dict[str, Any]) -> dict[str, float]:
        return self._score(params)[1]

    def _score(self, params: dict[str, Any]) -> tuple[list[float], dict[str, float]]:
        """The objective values and the constraints of one architecture, scored once for both."""
        key = tuple(sorted(params.items()))
        if self._last is None or self._last[0] != key:
            candidate = self._space.from_arch({**params, **self._space.fixed})
            prediction = self._cost.score(candidate)
            proxy = naswot_score(candidate.instantiate(), candidate.input_shape)
            values = [proxy, *(float(getattr(prediction, cost)) for cost in self._costs)]
            self._last = (key, values, self._constraints.values(prediction))
        return self._last[1], self._last[2]
