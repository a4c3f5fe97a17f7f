"""Search OFA-MobileNetV3 for the best accuracy proxy that fits an A100-40GB 1g.5gb slice at batch 8
and meets a latency bound, all predicted without a GPU.

The accuracy signal is NASWOT (Mellor et al., ICML 2021), a training-free proxy computed on random
inputs: it ranks untrained networks, it is not accuracy. Candidates that break a hardware constraint
are pruned before the proxy runs.

    python examples/mobilenetv3_mig_search.py                     # 40 trials, in memory
    python examples/mobilenetv3_mig_search.py --storage sqlite:///nas.db --study mbv3 --trials 200
"""

from __future__ import annotations

import argparse
import warnings

import optuna

from dippm_nas.integration import HardwareConstraints, HardwareCostModel, HardwareObjective, trials_fitting_mig
from search_spaces import get_search_space
from search_spaces.proxies import naswot_score


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--latency-ms", type=float, default=1.6,
                        help="predicted latency bound at batch 8 (default 1.6)")
    parser.add_argument("--storage", default=None, help="Optuna storage URL (default: in memory)")
    parser.add_argument("--study", default="mobilenetv3-1g.5gb")
    parser.add_argument("--cache", default=None, help="SQLite file for the subgraph cache, shared by workers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report", default=None, metavar="HTML", help="write the study's HTML report here at the end")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    space = get_search_space("mobilenetv3")
    cost = HardwareCostModel(device="a100-40gb", batch=8, precision="fp32", cache=args.cache)
    constraints = HardwareConstraints(latency_ms=args.latency_ms, mig_profiles=("1g.5gb",), device="a100-40gb")
    def proxy(candidate) -> float:
        return naswot_score(candidate.instantiate(), candidate.input_shape)

    proxy.metric_name = "NASWOT proxy"
    objective = HardwareObjective(space, proxy, cost,
                                  objectives=(), constraints=constraints)
    study = optuna.create_study(study_name=args.study, storage=args.storage, load_if_exists=True,
                                directions=objective.directions, sampler=optuna.samplers.TPESampler(seed=args.seed))
    study.set_metric_names(objective.metric_names)
    study.optimize(objective, n_trials=args.trials, show_progress_bar=True)

    states = [t.state.name for t in study.trials]
    print(f"\n{len(study.trials)} trials: {states.count('COMPLETE')} complete, {states.count('PRUNED')} pruned "
          f"as infeasible before training")
    fitting = trials_fitting_mig(study, "1g.5gb", "a100-40gb")
    print(f"{len(fitting)} complete trials fit a100-40gb 1g.5gb at batch 8")
    best = study.best_trial
    a = best.user_attrs
    print(f"best NASWOT proxy {best.value:.1f} (trial {best.number}): resolution {a['architecture']['resolution']}, "
          f"{a['latency_ms']:.3f} ms, {a['energy_j']:.4f} J, {a['memory_mb']:.0f} MiB, MIG {a['mig_profile']} "
          f"[{a['cost_model']}]")

    if args.report:
        from dippm_nas.integration.report import write_report

        print(f"report: {write_report(study, args.report).path}")


if __name__ == "__main__":
    main()
