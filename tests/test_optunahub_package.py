"""The OptunaHub package (optunahub-package/) loads as OptunaHub loads a registry package, runs its example
as written, and works with Optuna's constrained samplers; its README follows the registry's rules."""

from __future__ import annotations

import re
from pathlib import Path

import optuna
import optunahub
import pytest

from dippm_nas.integration import HardwareCostModel
from search_spaces import get_search_space

ROOT = Path(__file__).resolve().parents[1]
REGISTRY_ROOT = ROOT / "optunahub-package" / "package"
NAME = "benchmarks/hardware_aware_nas"
PACKAGE = REGISTRY_ROOT / NAME
#: The front matter the registry's header check requires, each non-empty.
FRONT_MATTER = ("author", "title", "description", "tags", "optuna_versions", "license")

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _load():
    return optunahub.load_local_module(package=NAME, registry_root=str(REGISTRY_ROOT))


def test_the_example_runs_as_written(monkeypatch, capsys):
    """example.py, with its load_module answered from this folder and 4 trials for 30."""
    monkeypatch.setattr(optunahub, "load_module", lambda package, **_: optunahub.load_local_module(
        package=package, registry_root=str(REGISTRY_ROOT)))
    code = (PACKAGE / "example.py").read_text()
    assert "n_trials=30" in code
    example = compile(code.replace("n_trials=30", "n_trials=4"), str(PACKAGE / "example.py"), "exec")
    exec(example, {"__name__": "__main__"})
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(re.match(r"NASWOT [\d.-]+  [\d.]+ ms  [\d.]+ J  \{", line) for line in lines), lines


@pytest.mark.parametrize("sampler", [
    optuna.samplers.TPESampler(seed=0, n_startup_trials=2),
    optuna.samplers.GPSampler(seed=0, n_startup_trials=2),
    optuna.samplers.NSGAIISampler(seed=0, population_size=2),
], ids=["tpe", "gp", "nsga2"])
def test_constrained_samplers_see_the_gpu_constraints(sampler):
    problem = _load().Problem(space="mobilenetv3", device="a100-40gb", mig_profile="1g.5gb", batch=8, latency_ms=7.0)
    study = optuna.create_study(directions=problem.directions, sampler=sampler)
    study.optimize(problem, n_trials=4)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 4
    for trial in study.trials:
        assert set(trial.constraints) == {"latency_ms", "fits_memory", "mig:1g.5gb"}
    trial = study.trials[-1]  # the values are dippm-nas's own prediction in the slice
    space = get_search_space("mobilenetv3")
    prediction = HardwareCostModel(device="a100-40gb:1g.5gb", batch=8).score(space.from_arch(trial.params))
    assert trial.values[1:] == [prediction.latency_ms, prediction.energy_j]
    assert trial.constraints["latency_ms"] == pytest.approx(prediction.latency_ms - 7.0)


def test_bad_arguments_are_one_clear_error():
    problem_class = _load().Problem
    with pytest.raises(ValueError, match="space must be one of mobilenetv3, resnet, vit"):
        problem_class(space="nasbench")
    with pytest.raises(ValueError, match="unknown costs"):
        problem_class(costs=("latency",))


def test_the_package_follows_the_registrys_rules():
    assert {p.name for p in PACKAGE.iterdir() if not p.name.startswith("__pycache__")} >= {
        "__init__.py", "README.md", "LICENSE", "example.py", "requirements.txt"}
    assert (PACKAGE / "LICENSE").read_text().startswith("MIT License")
    assert (PACKAGE / "requirements.txt").read_text().split() == ["dippm-nas"]
    readme = (PACKAGE / "README.md").read_text()
    header = readme.split("---\n")[1]
    fields = dict(line.split(": ", 1) for line in header.strip().splitlines())
    assert all(fields.get(key, "").strip() for key in FRONT_MATTER), fields
    assert "benchmark" in fields["tags"] and fields["license"] == "MIT License"
    assert not re.search(r"</?[a-zA-Z][^>]*>", readme), "the registry allows no HTML in a README"
    for heading in ("## Abstract", "## APIs", "## Installation", "## Example"):
        assert f"\n{heading}\n" in readme
    example = readme.split("## Example\n\n```python\n", 1)[1].split("```", 1)[0]
    assert example in (PACKAGE / "example.py").read_text()  # the README shows the example that runs
