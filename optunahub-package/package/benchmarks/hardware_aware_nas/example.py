"""Search OFA-MobileNetV3 for an A100-40GB 1g.5gb MIG slice: the best NASWOT proxy within 10 ms a batch."""

from __future__ import annotations

import optuna
import optunahub


hwnas = optunahub.load_module("benchmarks/hardware_aware_nas")
problem = hwnas.Problem(
    space="mobilenetv3",
    device="a100-40gb",
    mig_profile="1g.5gb",
    batch=8,
    latency_ms=10.0,
)
study = optuna.create_study(
    directions=problem.directions,
    sampler=optuna.samplers.TPESampler(seed=0),
)
study.optimize(problem, n_trials=30)

feasible = [t for t in study.best_trials if all(v <= 0 for v in t.constraints.values())]
for trial in feasible:
    proxy, latency_ms, energy_j = trial.values
    print(f"NASWOT {proxy:.1f}  {latency_ms:.2f} ms  {energy_j:.3f} J  {trial.params}")
