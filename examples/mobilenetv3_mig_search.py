"""Search OFA-MobileNetV3 for the best accuracy proxy that runs in an A100-40GB 1g.5gb MIG slice at
batch 8 within a latency bound, all predicted without a GPU.

Latency, energy and memory are predicted inside the slice itself (its SMs, its share of memory
bandwidth, its usable memory), by the same cost model the whole GPU would get. Unless --latency-ms is
given, the bound is derived from the space: the smallest and the largest candidate are scored on the
slice first, and the bound is a third of the way from the one's latency to the other's, so that the
constraint prunes the heavier candidates and leaves a good share feasible.

The accuracy signal is NASWOT (Mellor et al., ICML 2021), a training-free proxy computed on random
inputs: it ranks untrained networks, it is not accuracy. Candidates that break a hardware constraint
are pruned before the proxy runs.

    python examples/mobilenetv3_mig_search.py                     # 40 trials, in memory
    python examples/mobilenetv3_mig_search.py --storage sqlite:///nas.db --study mbv3 --trials 200
    python examples/mobilenetv3_mig_search.py --device h100-sxm --profile 1g.10gb --precision fp16
"""

from __future__ import annotations

import argparse
import sys
import warnings

import optuna
from optuna.trial import TrialState

from dippm_nas.errors import DippmError
from dippm_nas.integration import HardwareConstraints, HardwareCostModel, HardwareObjective, is_feasible, open_study
from search_spaces import get_search_space
from search_spaces.proxies import naswot_score

#: Where the default latency bound sits between the smallest and the largest candidate's latency.
BOUND_SHARE = 1 / 3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=40, help="number of trials (default 40)")
    parser.add_argument("--device", default="a100-40gb", help="GPU key from `dippm-nas devices` (default a100-40gb)")
    parser.add_argument("--profile", default="1g.5gb",
                        help="MIG profile to run in (default 1g.5gb); 'none' for the whole GPU")
    parser.add_argument("--batch", type=int, default=8, help="batch size (default 8)")
    parser.add_argument("--precision", default="fp32", help="fp32, tf32, fp16 or bf16 (default fp32)")
    parser.add_argument("--latency-ms", type=float, default=None,
                        help="predicted latency bound (ms per batch) on the slice; default: a third of the way "
                             "from the space's smallest candidate's latency to its largest's, on that slice "
                             "(about 7 ms for a100-40gb 1g.5gb, batch 8, fp32), printed before the search")
    parser.add_argument("--storage", default=None, help="Optuna storage URL (default: in memory)")
    parser.add_argument("--study", default="mobilenetv3-mig")
    parser.add_argument("--cache", default=None, help="SQLite file for the subgraph cache, shared by workers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report", default=None, metavar="HTML", help="write the study's HTML report here at the end")
    args = parser.parse_args(argv)
    if args.trials < 1 or args.batch < 1:
        parser.error("--trials and --batch must be positive integers")
    if args.latency_ms is not None and args.latency_ms <= 0:
        parser.error("--latency-ms must be a positive number of milliseconds")
    return args


def reachable_latency(space, cost: HardwareCostModel) -> tuple[float, float]:
    """The predicted latency of the space's smallest and largest candidates on the cost model's device."""
    return cost.score(space.extreme()).latency_ms, cost.score(space.extreme(largest=True)).latency_ms


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    warnings.filterwarnings("ignore")
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    profile = None if args.profile.lower() == "none" else args.profile
    target = f"{args.device}:{profile}" if profile else args.device
    try:
        space = get_search_space("mobilenetv3")
        cost = HardwareCostModel(device=target, batch=args.batch, precision=args.precision, cache=args.cache)
        bound = args.latency_ms
        if bound is None:
            low, high = reachable_latency(space, cost)
            bound = low + BOUND_SHARE * (high - low)
            print(f"latency bound {bound:.3f} ms: the space's candidates take {low:.3f} ms (smallest) to {high:.3f} ms "
                  f"(largest) on {target} at batch {args.batch}, {args.precision}; the bound is a third of the way "
                  "(--latency-ms sets it)")
        constraints = HardwareConstraints(latency_ms=bound, mig_profiles=(profile,) if profile else (),
                                          device=args.device)
    except DippmError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    def proxy(candidate) -> float:
        return naswot_score(candidate.instantiate(), candidate.input_shape)

    proxy.metric_name = "NASWOT proxy"
    objective = HardwareObjective(space, proxy, cost, objectives=(), constraints=constraints)
    # workers that share --storage: the study is created race-free, and a killed worker's trial is run again
    sampler = optuna.samplers.TPESampler(seed=args.seed)
    study = open_study(args.storage, args.study, objective.directions, sampler=sampler)
    study.set_metric_names(objective.metric_names)
    study.optimize(objective, n_trials=args.trials, show_progress_bar=True)

    trials = study.get_trials(deepcopy=False)
    states = [t.state for t in trials]
    feasible = [t for t in trials if t.state == TrialState.COMPLETE and is_feasible(t)]
    print(f"\n{len(trials)} trials: {states.count(TrialState.COMPLETE)} complete, {states.count(TrialState.PRUNED)} "
          f"pruned as infeasible before training; {len(feasible)} feasible (within {bound:.3f} ms"
          f"{f' and fitting {target}' if profile else ''} at batch {args.batch})")
    status = 0
    if feasible:
        best = max(feasible, key=lambda t: t.values[0])
        a = best.user_attrs
        print(f"best NASWOT proxy {best.values[0]:.1f} (trial {best.number}): resolution "
              f"{a['architecture']['resolution']}, {a['latency_ms']:.3f} ms, {a['energy_j']:.4f} J per batch, "
              f"{a['memory_mib']:.0f} MiB on {a['device']}, MIG {a['mig_profile'] or 'none'} [{a['cost_model']}]")
    else:
        missed = [t.constraints.get("latency_ms", 0.0) for t in trials if t.constraints.get("latency_ms", 0.0) > 0]
        print("no candidate met the constraints: "
              + (f"the closest missed the latency bound by {min(missed):.3f} ms; raise --latency-ms (the smallest "
                 "candidate's latency is the least any can reach), " if missed else "")
              + "choose a larger --profile, a smaller --batch, or run more --trials")
        status = 1

    if args.report:
        from dippm_nas.integration.report import write_report

        try:
            print(f"report: {write_report(study, args.report).path}")
        except DippmError as error:
            print(f"no report: {error}")
    return status


if __name__ == "__main__":
    sys.exit(main())
