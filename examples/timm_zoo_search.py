"""Choose a published timm model for an A100-40GB MIG slice: maximise real ImageNet top-1 (timm's
own evaluation of its weights) against predicted latency and energy, constrained to fit 2g.10gb at
batch 32. The result is a Pareto front of real accuracy against predicted cost.

    python examples/timm_zoo_search.py                            # 30 trials over a curated list
    python examples/timm_zoo_search.py --storage sqlite:///zoo.db --trials 100 --all
"""

from __future__ import annotations

import argparse
import sys
import warnings

import optuna

from dippm_nas.errors import DippmError
from dippm_nas.integration import (
    HardwareConstraints,
    HardwareCostModel,
    HardwareObjective,
    feasible_pareto_front,
    open_study,
)
from search_spaces import get_search_space

CURATED = ["resnet18", "resnet50", "resnet101", "mobilenetv3_large_100", "efficientnet_b0", "efficientnet_b3",
           "convnext_tiny", "convnext_small", "vit_small_patch16_224", "vit_base_patch16_224", "deit_small_patch16_224",
           "regnety_040", "densenet121", "swin_tiny_patch4_window7_224", "mobilevit_s", "ghostnet_100"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--profile", default="2g.10gb", help="MIG profile of the a100-40gb to fit (default 2g.10gb)")
    parser.add_argument("--models", default=None, metavar="A,B,...",
                        help="timm models to choose from (default: a curated list of 16)")
    parser.add_argument("--all", action="store_true", help="every model of timm's results, not the curated list")
    parser.add_argument("--storage", default=None, help="Optuna storage URL (default: in memory)")
    parser.add_argument("--study", default="timm-zoo-a100")
    parser.add_argument("--cache", default=None, help="SQLite file for the graph cache, shared by workers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report", default=None, metavar="HTML", help="write the study's HTML report here at the end")
    args = parser.parse_args(argv)
    if args.trials < 1 or args.batch < 1:
        parser.error("--trials and --batch must be positive integers")
    warnings.filterwarnings("ignore")
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    entries = None if args.all else (args.models.split(",") if args.models else CURATED)
    try:
        space = get_search_space("timm_zoo", entries=entries)
        cost = HardwareCostModel(device="a100-40gb", batch=args.batch, precision="fp16", cache=args.cache)
        constraints = HardwareConstraints(mig_profiles=(args.profile,), device="a100-40gb")
    except DippmError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    def top1(candidate) -> float:
        return candidate.metadata["top1"]

    top1.metric_name = "ImageNet top-1 (%)"
    objective = HardwareObjective(space, top1, cost, objectives=("latency_ms", "energy_j"), constraints=constraints)
    # workers that share --storage: the study is created race-free, and a killed worker's trial is run again
    sampler = optuna.samplers.TPESampler(seed=args.seed)
    study = open_study(args.storage, args.study, objective.directions, sampler=sampler)
    study.set_metric_names(objective.metric_names)
    study.optimize(objective, n_trials=args.trials, show_progress_bar=True)

    front = {t.params["model"]: t for t in feasible_pareto_front(study)}.values()  # TPE may repeat a choice
    front = sorted(front, key=lambda t: t.values[1])
    if not front:
        reasons = {t.user_attrs.get("prune_reason", t.state.name) for t in study.trials}
        print(f"\nno model fits a100-40gb {args.profile} at batch {args.batch}, fp16 ({'; '.join(sorted(reasons))}); "
              "choose a larger --profile or a smaller --batch")
        return 1
    print(f"\nPareto front (top-1 up, latency and energy per batch down) on a100-40gb, models fitting {args.profile}, "
          f"batch {args.batch}, fp16 [{front[0].user_attrs['cost_model']}]:")
    print(f"{'weights':40s} {'top-1':>6s} {'ms':>8s} {'J':>8s} {'MiB':>7s}  MIG")
    for t in front:
        a = t.user_attrs
        print(f"{t.params['model']:40s} {t.values[0]:6.2f} {a['latency_ms']:8.3f} {a['energy_j']:8.4f} "
              f"{a['memory_mib']:7.0f}  {a['mig_profile']}")

    if args.report:
        from dippm_nas.integration.report import write_report

        try:
            print(f"report: {write_report(study, args.report).path}")
        except DippmError as error:
            print(f"no report: {error}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
