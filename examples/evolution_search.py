"""Evolve OFA-MobileNetV3 with NSGA-II for a training-free accuracy proxy against predicted latency,
energy and memory on a GPU or MIG slice: thousands of candidates, all scored without a GPU.

Each generation is asked of Optuna's NSGA-II at once and scored together
(``HardwareObjective.ask_and_tell``): the blocks none of the generation's candidates has in the graph
cache are exported together in worker processes, and every other candidate is stitched from cached
blocks. A candidate that misses the latency bound in the slice, or does not fit its memory, is pruned
before the proxy runs.

The proxy ranks untrained networks; it is not accuracy. ``params`` (the default) is the parameter
count, read off the candidate's graph at no cost: one of the baselines zero-cost proxies are measured
against, and about as well correlated with accuracy as most of them on NAS-Bench-201 (Abdelfattah et al.,
"Zero-Cost Proxies for Lightweight NAS", ICLR 2021). ``naswot`` (Mellor et al., ICML 2021) runs the
untrained network on a mini-batch: about half a second a candidate on two CPU cores, so use it for
hundreds of candidates, not ten thousand.

With --storage the search is resumable: every generation is added to that study once scored, and a
rerun with the same arguments goes on from where it stopped. NSGA-II runs on a copy in memory. A journal
file (any --storage that is not a database URL) takes a millisecond a trial, a SQLite database about fifty:
keep databases for searches of hundreds of trials, or several hosts.

    python examples/evolution_search.py --candidates 10000 --report evolution.html
    python examples/evolution_search.py --storage evolution.log --cache blocks.sqlite
    dippm-nas report --storage evolution.log --study mobilenetv3-evolution --out evolution.html
    python examples/evolution_search.py --device h100-sxm --profile 1g.10gb --precision fp16 --proxy naswot
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from typing import Any

import optuna
from optuna.trial import TrialState
from tqdm import tqdm

from dippm_nas.errors import DippmError
from dippm_nas.integration import HardwareConstraints, HardwareCostModel, HardwareObjective, is_feasible
from dippm_nas.integration.study import storage_named
from search_spaces import get_search_space
from search_spaces.proxies import naswot_score

#: Where the default latency bound sits between the smallest and the largest candidate's latency.
BOUND_SHARE = 1 / 3
PROXIES = ("params", "naswot")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidates", type=int, default=10_000, help="candidates to score in all (default 10000)")
    parser.add_argument("--population", type=int, default=100, help="NSGA-II's population (default 100)")
    parser.add_argument("--device", default="a100-40gb", help="GPU key from `dippm-nas devices` (default a100-40gb)")
    parser.add_argument("--profile", default="1g.5gb", help="MIG profile (default 1g.5gb); 'none': whole GPU")
    parser.add_argument("--batch", type=int, default=8, help="batch size (default 8)")
    parser.add_argument("--precision", default="fp32", help="fp32, tf32, fp16 or bf16 (default fp32)")
    parser.add_argument("--latency-ms", type=float, default=None,
                        help="latency bound (ms per batch) in the slice; default: a third of the way from the space's "
                             "smallest candidate's latency to its largest's there")
    parser.add_argument("--resolution", type=int, default=None,
                        help="hold the input resolution (128-224, a multiple of 4) at one value")
    parser.add_argument("--proxy", choices=PROXIES, default="params", help="the accuracy proxy (default params)")
    parser.add_argument("--storage", default=None,
                        help="an Optuna journal file, or a database URL, that keeps the search resumable")
    parser.add_argument("--study", default="mobilenetv3-evolution")
    parser.add_argument("--cache", default=None, help="SQLite file of the block cache (see `dippm-nas cache warm`)")
    parser.add_argument("--workers", type=int, default=None, help="processes exporting new blocks")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report", default=None, metavar="HTML", help="write the search's HTML report here at the end")
    args = parser.parse_args(argv)
    if args.candidates < 1 or args.batch < 1 or args.population < 2:
        parser.error("--candidates and --batch must be positive, --population at least 2")
    if args.latency_ms is not None and args.latency_ms <= 0:
        parser.error("--latency-ms must be a positive number of milliseconds")
    return args


class EveryGene:
    """The space with every gene asked, kept or not: NSGA-II crosses and mutates a genome of fixed length
    (its search space is the parameters every trial has), and a block a stage's depth drops keeps its genes
    for a child that adds the block back. The candidate holds only the genes it uses."""

    def __init__(self, space: Any):
        self.space = space

    def sample(self, trial: optuna.Trial) -> Any:
        genes = {name: self.space.choose(trial, name) for name in self.space.parameters}

        class _Genes:
            def suggest_categorical(self, name: str, choices: list[Any]) -> Any:
                return genes[name]

        return self.space.sample(_Genes())


def proxy_of(name: str, cost: HardwareCostModel):
    """The accuracy proxy as a function of a candidate, named for the report."""
    if name == "naswot":
        def proxy(candidate) -> float:
            return naswot_score(candidate.instantiate(), candidate.input_shape)
        proxy.metric_name = "NASWOT proxy"
    else:
        def proxy(candidate) -> float:  # the graph was just scored: a cache hit
            return cost.graph(candidate).param_count / 1e6
        proxy.metric_name = "parameters (M)"
    return proxy


def resume(storage: str | None, name: str, directions: list[str], sampler) -> tuple[optuna.Study, optuna.Study | None]:
    """The study NSGA-II runs on, in memory, holding every trial the stored study (if any) has; and the stored one."""
    study = optuna.create_study(directions=directions, sampler=sampler)
    if storage is None:
        return study, None
    stored = optuna.create_study(storage=storage_named(storage), study_name=name, directions=directions,
                                 load_if_exists=True)
    done = [t for t in stored.get_trials(deepcopy=False) if t.state.is_finished()]
    study.add_trials(done)
    return study, stored


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    warnings.filterwarnings("ignore")
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    profile = None if args.profile.lower() == "none" else args.profile
    target = f"{args.device}:{profile}" if profile else args.device
    try:
        space = get_search_space("mobilenetv3", fixed={"resolution": args.resolution} if args.resolution else None)
        cost = HardwareCostModel(device=target, batch=args.batch, precision=args.precision, cache=args.cache,
                                 workers=args.workers)
        bound = args.latency_ms
        if bound is None:
            low, high = (p.latency_ms for p in cost.score_many([space.extreme(), space.extreme(largest=True)]))
            bound = low + BOUND_SHARE * (high - low)
            print(f"latency bound {bound:.3f} ms on {target}: a third of the way from the smallest candidate's "
                  f"{low:.3f} ms to the largest's {high:.3f} ms (--latency-ms sets it)")
        constraints = HardwareConstraints(latency_ms=bound, mig_profiles=(profile,) if profile else (),
                                          device=args.device)
        objective = HardwareObjective(EveryGene(space), proxy_of(args.proxy, cost), cost,
                                      objectives=("latency_ms", "energy_j", "memory_mib"), constraints=constraints)
    except DippmError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    sampler = optuna.samplers.NSGAIISampler(population_size=args.population, seed=args.seed)
    study, stored = resume(args.storage, args.study, objective.directions, sampler)
    study.set_metric_names(objective.metric_names)
    done = earlier = len(study.trials)
    start = time.perf_counter()
    with tqdm(total=args.candidates, initial=min(done, args.candidates), unit="cand", desc="evolution",
              file=sys.stderr) as bar:
        while done < args.candidates:
            told = objective.ask_and_tell(study, min(args.population, args.candidates - done), progress=True)
            if stored is not None:
                stored.add_trials(told)
            done += len(told)
            bar.update(len(told))
            bar.set_postfix(feasible=sum(t.state == TrialState.COMPLETE for t in study.get_trials(deepcopy=False)))
    elapsed = time.perf_counter() - start
    if stored is not None:
        stored.set_metric_names(objective.metric_names)

    trials = study.get_trials(deepcopy=False)
    feasible = [t for t in trials if t.state == TrialState.COMPLETE and is_feasible(t)]
    front = study.best_trials
    print(f"{len(trials)} candidates ({len(trials) - earlier} in {elapsed:.0f} s, {earlier} from earlier runs): "
          f"{len(feasible)} feasible within {bound:.3f} ms{f' in {target}' if profile else ''} at batch {args.batch}, "
          f"{len(front)} on the Pareto front of {', '.join(objective.metric_names)}")
    if feasible:
        best = max(feasible, key=lambda t: t.values[0])
        a = best.user_attrs
        print(f"best {objective.metric_names[0]} {best.values[0]:.3f} (trial {best.number}): resolution "
              f"{a['architecture']['resolution']}, {a['latency_ms']:.3f} ms, {a['energy_j']:.4f} J per batch, "
              f"{a['memory_mib']:.0f} MiB on {a['device']}, MIG {a['mig_profile'] or 'none'}")
    if args.report:
        from dippm_nas.integration.report import write_report

        report_start = time.perf_counter()
        try:
            path = write_report(stored or study, args.report).path
            print(f"report: {path} ({time.perf_counter() - report_start:.1f} s)")
        except DippmError as error:
            print(f"no report: {error}")
    return 0 if feasible else 1


if __name__ == "__main__":
    sys.exit(main())
