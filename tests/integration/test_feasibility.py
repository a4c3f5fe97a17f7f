"""A candidate that does not fit the device's memory is infeasible, a report with nothing to plot says why,
and a constraint no candidate could meet is refused when it is made."""

from __future__ import annotations

import re

import optuna
import pytest

from dippm_nas import DippmError
from dippm_nas.cli import main
from dippm_nas.integration import HardwareConstraints, HardwareCostModel, HardwareObjective, is_feasible
from dippm_nas.integration.constraints import FITS_MEMORY
from dippm_nas.integration.report import scored_trials
from search_spaces import get_search_space

optuna.logging.set_verbosity(optuna.logging.WARNING)


def proxy(candidate) -> float:
    return float(candidate.arch["depth_0"])


@pytest.fixture(scope="module")
def space():
    return get_search_space("mobilenetv3", fixed={"resolution": 160})


def _study(objective, n_trials=2, storage=None, name=None) -> optuna.Study:
    study = optuna.create_study(directions=objective.directions, sampler=optuna.samplers.RandomSampler(seed=1),
                                storage=storage, study_name=name)
    study.optimize(objective, n_trials=n_trials)
    return study


def test_out_of_memory_candidates_are_infeasible_without_constraints(space, tmp_path):
    """At batch 1024 no candidate fits an a100-40gb 1g.5gb slice: each is pruned, with the reason."""
    cost = HardwareCostModel("a100-40gb:1g.5gb", batch=1024)
    url = f"sqlite:///{tmp_path / 'oom.db'}"
    study = _study(HardwareObjective(space, proxy, cost), storage=url, name="oom")
    for t in study.trials:
        assert t.state == optuna.trial.TrialState.PRUNED and t.constraints[FITS_MEMORY] > 0
        assert t.user_attrs["fits"] is False and "does not fit the 4864 MiB of a100-40gb:1g.5gb" in (
            t.user_attrs["prune_reason"])
    with pytest.raises(DippmError, match=f"all 2 trials were pruned as infeasible.*{FITS_MEMORY} \\(2 of 2\\)"):
        scored_trials(study)
    assert main(["report", "--storage", url, "--study", "oom", "--out", str(tmp_path / "r.html")]) == 2


def test_fitting_candidates_stay_feasible_and_record_units(space):
    cost = HardwareCostModel("a100-40gb:1g.5gb", batch=8)
    study = _study(HardwareObjective(space, proxy, cost, objectives=("memory_mib", "energy_j_per_sample"),
                                     constraints=HardwareConstraints(mig_profiles=("1g.5gb",))))
    for t in study.trials:
        assert t.state == optuna.trial.TrialState.COMPLETE and is_feasible(t) and t.constraints[FITS_MEMORY] < 0
        a = t.user_attrs
        assert a["memory_mib"] == t.values[1] and a["fits"] is True
        assert a["energy_j_per_sample"] == pytest.approx(a["energy_j"] / 8) == t.values[2]
        assert a["mig_profile"] == "1g.5gb" and a["device"] == "a100-40gb:1g.5gb"


def test_report_names_why_there_is_nothing_to_plot(space):
    with pytest.raises(DippmError, match="has no trials yet"):
        scored_trials(optuna.create_study())
    cost = HardwareCostModel("a100-40gb", batch=8)
    study = _study(HardwareObjective(space, proxy, cost, constraints=HardwareConstraints(latency_ms=0.01)))
    with pytest.raises(DippmError, match=r"pruned as infeasible.*latency_ms \(2 of 2\).*closest missed latency_ms"):
        scored_trials(study)


@pytest.mark.parametrize("bounds, says", [
    ({"latency_ms": -1}, "latency_ms bound must be a finite number above 0 (ms per batch), got -1"),
    ({"latency_ms": 0}, "latency_ms bound must be a finite number above 0"),
    ({"latency_ms": float("nan")}, "got nan"),
    ({"energy_j": float("inf")}, "energy_j bound must be a finite number above 0 (J per batch), got inf"),
    ({"memory_mib": "4GB"}, "memory_mib bound must be a finite number above 0 (MiB), got '4GB'"),
    ({"memory_mib": True}, "memory_mib bound"),
    ({"mig_margin": 1.5}, "from 0 to 1"),
    ({"mig_margin": -0.1}, "MIG safety margin must be a fraction >= 0"),
])
def test_a_bound_no_candidate_could_meet_is_refused_at_construction(bounds, says):
    """Rather than every trial pruned in silence, or an Optuna traceback at the first trial."""
    with pytest.raises(DippmError, match=re.escape(says)):
        HardwareConstraints(**bounds)


def test_an_accuracy_function_must_be_a_function(space):
    with pytest.raises(DippmError, match="accuracy_fn must be a function of a candidate"):
        HardwareObjective(space, None, HardwareCostModel("a100-40gb", batch=8))


def test_a_latency_bound_with_a_mig_profile_is_judged_in_that_slice(space):
    """Scored on the whole GPU, a candidate is judged by its latency in the slice it may run in: a slice
    has a seventh of the multiprocessors, so a bound the whole GPU meets can be one the slice misses."""
    cost = HardwareCostModel("a100-40gb", batch=8)
    candidate = space.extreme()
    graph = cost.graph(candidate)
    whole = cost.predict(graph).latency_ms
    small = cost.predict(graph, device="a100-40gb:1g.5gb").latency_ms
    larger = cost.predict(graph, device="a100-40gb:3g.20gb").latency_ms
    assert whole < larger < small

    def judged(bound: float, profiles: tuple[str, ...]) -> optuna.trial.FrozenTrial:
        constraints = HardwareConstraints(latency_ms=bound, mig_profiles=profiles)
        study = optuna.create_study(directions=["maximize"])
        study.enqueue_trial(dict(candidate.arch))
        study.optimize(HardwareObjective(space, proxy, cost, objectives=(), constraints=constraints), n_trials=1)
        return study.trials[0]

    missed = judged((whole + larger) / 2, ("1g.5gb",))  # the whole GPU meets it, the slice does not
    assert missed.state == optuna.trial.TrialState.PRUNED
    assert missed.user_attrs["mig_slice"] == "1g.5gb" and missed.user_attrs["slice_latency_ms"] == small
    assert missed.constraints["latency_ms"] == pytest.approx(small - (whole + larger) / 2)
    assert missed.user_attrs["latency_ms"] == whole  # the objective's figures stay the scored device's

    met = judged((larger + small) / 2, ("1g.5gb", "3g.20gb"))  # met in the larger slice only
    assert met.state == optuna.trial.TrialState.COMPLETE and is_feasible(met)
    assert met.user_attrs["mig_slice"] == "3g.20gb" and met.user_attrs["slice_latency_ms"] == larger

    assert judged(small * 1.01, ("1g.5gb", "3g.20gb")).user_attrs["mig_slice"] == "1g.5gb"  # smallest that meets it


def test_slice_bounds_need_the_slice_predictions():
    from dippm_nas.prediction import Prediction

    prediction = Prediction(model="m", latency_ms=2.5, energy_j=0.1, memory_mib=900.0, mig_profile="1g.5gb",
                            device="a100-40gb", precision="fp32", batch=8, cost_model="analytical")
    with pytest.raises(DippmError, match="give the candidate's prediction on a100-40gb:1g.5gb"):
        HardwareConstraints(latency_ms=4.0, mig_profiles=("1g.5gb",)).values(prediction)
    assert "mig:1g.5gb" in HardwareConstraints(memory_mib=4000, mig_profiles=("1g.5gb",)).values(prediction)
