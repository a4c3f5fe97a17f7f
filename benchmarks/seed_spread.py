"""How much a split's test figures move with the training seed alone.

`dippm-nas evaluate` reports one seeded run per split. Where the test set is far from the training
data (whole families held out, another GPU) a single run says least: early stopping is noisy and a
different seed (weight initialisation and batch order only; the split itself stays the same) gives
a different model. This trains PMGNS on one split once per seed, exactly as `evaluate` does (early
stopping on validation, refit on training + validation), and prints each run's test MAPE, Kendall
tau and share within 10 % (and energy's and memory's, where the test set has them), then the
latency figures' mean and spread. Nothing here chooses anything.

    python benchmarks/seed_spread.py                          # family split, seeds 0-4
    python benchmarks/seed_spread.py --split rtx4090->rtx3090 --seeds 1,2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from dataclasses import replace


def main() -> int:
    from dippm_nas.training.evaluate import SPLIT_NAMES, splits_for

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", default="family", choices=SPLIT_NAMES,
                        help="which of evaluate's splits (default: family)")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="training seeds, comma-separated (default: 0,1,2,3,4)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's own choice)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import numpy as np
    import torch

    from dippm_nas.cost.pmgns import TARGETS
    from dippm_nas.training.dataset import build_training_set
    from dippm_nas.training.metrics import summary
    from dippm_nas.training.records import load_records
    from dippm_nas.training.train import TrainConfig, fit_split, predict_targets

    if args.threads:
        torch.set_num_threads(args.threads)
    ts = build_training_set(load_records())
    split = next(s for s in splits_for(ts, seed=0) if s.name == args.split)
    print(f"{split.name} split (split seed 0): {split.description}; {len(split.test)} test records", flush=True)
    runs = []
    for seed in (int(s) for s in args.seeds.split(",")):
        start = time.perf_counter()
        fitted = fit_split(ts, split, replace(TrainConfig(), seed=seed), label=f"seed {seed}")
        predicted = predict_targets(fitted, ts, split.test)
        m = summary(predicted[:, 0], ts.targets[split.test, 0])
        runs.append(m)
        others = []
        for t, target in enumerate(TARGETS[1:], start=1):  # only the harness's records have them
            have = ~np.isnan(ts.targets[split.test, t])
            if have.any():
                o = summary(predicted[have, t], ts.targets[split.test, t][have])
                others.append(f"{target} MAPE {o['mape']:.2%}, tau {o['tau']:.3f} ({int(have.sum())} records)")
        print(f"seed {seed}: test MAPE {m['mape']:.2%}, Kendall tau {m['tau']:.3f}, within 10 % {m['within10']:.1%} "
              f"(early stopping chose {fitted.best_epoch + 1} epochs; {time.perf_counter() - start:.0f} s)"
              + "".join(f"; {o}" for o in others), flush=True)
    if len(runs) > 1:
        for key, fmt in (("mape", "{:.2%}"), ("tau", "{:.3f}"), ("within10", "{:.1%}")):
            values = [r[key] for r in runs]
            print(f"{key}: mean {fmt.format(statistics.mean(values))}, standard deviation "
                  f"{fmt.format(statistics.stdev(values))}, "
                  f"range {fmt.format(min(values))} - {fmt.format(max(values))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
