"""The Optuna plugin on real Optuna 5 studies."""

from __future__ import annotations

from typing import Any

import optuna
import pytest
import torch
from torch import nn

from dippm_nas import DippmError
from dippm_nas.errors import DippmWarning
from dippm_nas.hardware.mig import fits, required_memory
from dippm_nas.hardware.registry import get_device
from dippm_nas.integration import (
    HardwareConstraints,
    HardwareCostModel,
    HardwareObjective,
    feasible_pareto_front,
    is_feasible,
    trials_fitting_mig,
)
from search_spaces import BlockSpec, Candidate, SearchSpace, get_search_space
from search_spaces.base import register_block

optuna.logging.set_verbosity(optuna.logging.WARNING)
N_TRIALS = 14


def proxy(candidate) -> float:
    """A deterministic stand-in score for tests: deeper and wider scores higher."""
    return float(sum(v for k, v in candidate.arch.items() if k.startswith(("depth", "expand"))))


@pytest.fixture(scope="module")
def cost() -> HardwareCostModel:
    return HardwareCostModel("a100-40gb", batch=8)


@pytest.fixture(scope="module")
def space():
    return get_search_space("mobilenetv3", fixed={"resolution": 160})


@pytest.fixture(scope="module")
def unconstrained_scores(cost, space):
    """Latencies of the trials a seeded sampler proposes, to set bounds that split them."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    return [cost.score(space.sample(study.ask())).latency_ms for _ in range(N_TRIALS)]


def _study(objective: HardwareObjective) -> optuna.Study:
    study = optuna.create_study(directions=objective.directions, sampler=optuna.samplers.RandomSampler(seed=1))
    study.optimize(objective, n_trials=N_TRIALS)
    return study


def test_constraint_values_and_best_trials_feasible(cost, space, unconstrained_scores):
    bound = sorted(unconstrained_scores)[len(unconstrained_scores) // 2]
    constraints = HardwareConstraints(latency_ms=bound, device="a100-40gb")
    objective = HardwareObjective(space, proxy, cost, objectives=("latency_ms", "energy_j"),
                                  constraints=constraints, prune_infeasible=False)
    study = _study(objective)
    complete = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(complete) == N_TRIALS
    feasible = [t for t in complete if is_feasible(t)]
    assert 0 < len(feasible) < N_TRIALS
    for t in complete:
        assert t.constraints["latency_ms"] == pytest.approx(t.user_attrs["latency_ms"] - bound)
        assert t.values[1] == t.user_attrs["latency_ms"] and t.values[2] == t.user_attrs["energy_j"]
        assert t.user_attrs["device"] == "a100-40gb" and "architecture" in t.user_attrs
        assert any("no operator of a100-40gb was measured" in note for note in t.user_attrs["notes"])  # spec sheet
    assert study.best_trials and all(is_feasible(t) for t in study.best_trials)
    assert {t.number for t in feasible_pareto_front(study)} == {t.number for t in study.best_trials}


def test_infeasible_candidates_pruned_with_constraints(cost, space, unconstrained_scores):
    bound = sorted(unconstrained_scores)[len(unconstrained_scores) // 2]
    trained = []
    objective = HardwareObjective(space, lambda c: trained.append(c) or proxy(c), cost,
                                  constraints=HardwareConstraints(latency_ms=bound))
    study = _study(objective)
    pruned = study.get_trials(states=(optuna.trial.TrialState.PRUNED,))
    complete = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert pruned and complete and len(trained) == len(complete)  # pruned ones were never "trained"
    for t in pruned:
        assert t.constraints["latency_ms"] > 0 and "infeasible before training" in t.user_attrs["prune_reason"]
    assert all(t.constraints["latency_ms"] <= 0 for t in complete)


def test_mig_constraint_and_filter(cost, space):
    objective = HardwareObjective(space, proxy, cost, constraints=HardwareConstraints(mig_profiles=("1g.5gb",)),
                                  prune_infeasible=False)
    study = _study(objective)
    usable = get_device("a100-40gb").mig_profile("1g.5gb").usable_mib
    for t in study.trials:
        assert t.constraints["mig:1g.5gb"] == pytest.approx(required_memory(t.user_attrs["memory_mib"]) - usable)
    slot = get_device("a100-40gb").mig_profile("1g.5gb")
    expected = {t.number for t in study.trials if fits(slot, t.user_attrs["memory_mib"])}
    assert {t.number for t in trials_fitting_mig(study, "1g.5gb", "a100-40gb")} == expected
    # at batch 768 only some candidates fit a 1g.5gb slice (at 1024 none does): the filter returns exactly those
    big = HardwareCostModel("a100-40gb", batch=768, cache=cost.cache)
    heavy = _study(HardwareObjective(space, proxy, big, constraints=HardwareConstraints(mig_profiles=("1g.5gb",)),
                                     prune_infeasible=False))
    fitting = {t.number for t in heavy.trials if fits(slot, t.user_attrs["memory_mib"])}
    assert 0 < len(fitting) < len(heavy.trials)
    assert ({t.number for t in trials_fitting_mig(heavy, "1g.5gb")} == fitting
            == {t.number for t in heavy.trials if is_feasible(t)})
    assert len(trials_fitting_mig(heavy, "1g.5gb", margin=1.0)) <= len(fitting)  # twice the memory: fewer fit
    with pytest.raises(DippmError, match="from 0 to 1"):  # the margin the command line bounds, bounded here too
        trials_fitting_mig(heavy, "1g.5gb", margin=10.0)


def test_bad_input_clear_errors():
    with pytest.raises(DippmError, match="has no parameter 'kernel_size'"):
        get_search_space("mobilenetv3", fixed={"kernel_size": 3})
    with pytest.raises(DippmError, match="is not one of"):
        get_search_space("mobilenetv3").from_arch({"resolution": 100})
    with pytest.raises(DippmError, match="its profiles are"):
        HardwareConstraints(mig_profiles=("1g.4gb",), device="a100-40gb")
    with pytest.raises(DippmError, match="does not support MIG"):
        HardwareConstraints(mig_profiles=("1g.5gb",), device="rtx4090")
    with pytest.raises(DippmError, match="unknown search space"):
        get_search_space("mobilenet")


class _Mismatch(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels + 1, 4, 3)  # expects one channel more than it gets

    def forward(self, x):
        return self.conv(x)


register_block("test_mismatch")(_Mismatch)
register_block("test_conv")(lambda channels: nn.Conv2d(channels, 4, 3))


class _FlakySpace(SearchSpace):
    """Every other candidate has a block that cannot be exported."""

    name = "flaky"

    @property
    def parameters(self) -> dict[str, tuple[Any, ...]]:
        return {"broken": (False, True)}

    def sample(self, trial) -> Candidate:
        return self.from_arch({"broken": trial.number % 2 == 1})

    def from_arch(self, arch) -> Candidate:
        kind = "test_mismatch" if arch["broken"] else "test_conv"
        return Candidate(self.name, dict(arch), (3, 16, 16), (BlockSpec.of(kind, (3, 16, 16), channels=3),))


def test_candidate_that_fails_to_export_is_pruned_not_crashed(cost):
    objective = HardwareObjective(_FlakySpace(), lambda c: 1.0, HardwareCostModel(batch=2))
    study = optuna.create_study(directions=objective.directions)
    study.optimize(objective, n_trials=4)
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.COMPLETE) == 2 and states.count(optuna.trial.TrialState.PRUNED) == 2
    for t in study.trials:
        if t.state == optuna.trial.TrialState.PRUNED:
            reason = t.user_attrs["prune_reason"]
            assert "featurizing failed" in reason and "could not trace" in reason


def test_other_spaces_score(cost):
    for name, kwargs in [("resnet", {}), ("vit", {}), ("timm_zoo", {"entries": ["resnet18"]})]:
        space = get_search_space(name, **kwargs)
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        candidate = space.sample(study.ask())
        p = cost.score(candidate)
        assert p.latency_ms > 0 and p.memory_mib > 0
        if name == "timm_zoo":
            assert candidate.metadata["top1"] > 60 and candidate.model == "resnet18"
        else:
            assert isinstance(candidate.module, nn.Module) and len(candidate.blocks) > 3


def test_cached_and_uncached_predictions_equal(cost, space):
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    fresh = HardwareCostModel("a100-40gb", batch=8, use_cache=False)
    for _ in range(2):
        candidate = space.sample(study.ask())
        a, b = cost.score(candidate), fresh.score(candidate)
        assert (a.latency_ms, a.energy_j, a.memory_mib, a.mig_profile) == (
            b.latency_ms, b.energy_j, b.memory_mib, b.mig_profile)


def test_plain_model_uses_whole_model_cache():
    model = HardwareCostModel(batch=2)
    with torch.device("meta"):
        net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
    first = model.score(net, (3, 32, 32))
    second = model.score(net, (3, 32, 32))
    assert first.latency_ms == second.latency_ms and model.cache.hits["model"] == 1


def test_a_search_whose_candidates_are_host_bound_says_so_once(cost, space, monkeypatch):
    """MobileNetV3 candidates at batch 8 on a whole A100, eager: the host's time to issue their operators is their
    latency, so the search cannot tell them apart by it and says so, once; under CUDA graphs, or in a slice where the
    GPU's work is the latency, it says nothing."""
    import warnings

    from dippm_nas.integration import objective as objective_module

    monkeypatch.setattr(objective_module, "HOST_BOUND_SAMPLE", 4)
    objective = HardwareObjective(space, proxy, cost)
    with pytest.warns(DippmWarning) as said:
        _study(objective)
    host_bound = [w for w in said if "candidates in a row are host-bound on a100-40gb at batch 8 (eager)" in
                  str(w.message)]
    assert len(host_bound) == 1 and "mode='cuda-graphs' or a larger batch" in str(host_bound[0].message)
    for device, mode in (("a100-40gb", "cuda-graphs"), ("a100-40gb:1g.5gb", "eager")):
        with warnings.catch_warnings():
            warnings.simplefilter("error", DippmWarning)
            _study(HardwareObjective(space, proxy, HardwareCostModel(device, batch=8, mode=mode)))
