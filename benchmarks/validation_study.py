"""Compare training configurations on a split's validation set, the only place choices are made.

Every hyper-parameter of `TrainConfig` was chosen this way, and a proposed change should be too: this
trains PMGNS on the split's training records once per variant and seed (every member of its ensemble,
each with its own early stopping on validation) and no refit (the refit would train on validation), and
prints the analytical model's validation MAPE per target (what a correction has to beat), then the
validation MAPE, Kendall tau and share within 10 % of each run, the mean per-family MAPE (each
validation family counting once, as each unseen family does for a user) and the means over seeds,
and the energy and memory MAPE on the validation records that measured them (our harness's).
The test records are never predicted.

    python benchmarks/validation_study.py                                      # the shipped configuration, seeds 0-2
    python benchmarks/validation_study.py --variant 'wide={"hidden": 128}' --seeds 0,1
    python benchmarks/validation_study.py --split random --no-baseline --variant 'short={"epochs": 20}'
    python benchmarks/validation_study.py --split 'rtx3090->rtx4090' --transfer h100-sxm --seeds 0
    python benchmarks/validation_study.py --seeds 0 --predictions val.csv     # every validation prediction, to study

A device split's validation records are the training GPU's, so they say nothing of how a choice carries
to another GPU; ``--transfer DEVICE`` also predicts the latency of a GPU's records that are in none of
the split's sets (the H100's, measured by our harness, are in neither device split) and prints the
MAPE, Kendall tau and median predicted over measured there, beside the analytical model's.

A variant is NAME=JSON, the JSON an object of TrainConfig fields; the shipped configuration runs first
as the baseline unless --no-baseline. On the 2-core build machine a family-split run takes 8-12 minutes
per member with one thread ('{"members": 1}' for one network); two processes side by side (different
--seeds) use both cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from dataclasses import fields, replace
from pathlib import Path


def _variant(text: str) -> tuple[str, dict]:
    from dippm_nas.training.train import TrainConfig

    name, sep, overrides = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"a variant is NAME=JSON, e.g. 'wide={{\"hidden\": 128}}', not {text!r}")
    try:
        values = json.loads(overrides)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"variant {name!r}: {overrides!r} is not JSON ({error})") from None
    known = {f.name for f in fields(TrainConfig)} - {"seed", "refit", "stop_after"}
    if not isinstance(values, dict) or set(values) - known:
        raise argparse.ArgumentTypeError(f"variant {name!r}: give an object of TrainConfig fields; unknown: "
                                         f"{sorted(set(values) - known) if isinstance(values, dict) else values!r}; "
                                         f"known: {', '.join(sorted(known))}")
    return name, values


def _transfer_figures(predicted, measured) -> str:
    import numpy as np

    from dippm_nas.training.metrics import summary

    m = summary(predicted, measured)
    return (f"latency MAPE {m['mape']:.2%}, Kendall tau {m['tau']:.4f}, median predicted / measured "
            f"{float(np.median(predicted / measured)):.3f}")


def main() -> int:
    from dippm_nas.training.evaluate import SPLIT_NAMES

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", default="family", choices=SPLIT_NAMES,
                        help="which of evaluate's splits (default: family)")
    parser.add_argument("--seeds", default="0,1,2", help="training seeds, comma-separated (default: 0,1,2)")
    parser.add_argument("--variant", action="append", type=_variant, default=[], metavar="NAME=JSON",
                        help="a configuration to compare, as TrainConfig overrides; repeatable")
    parser.add_argument("--no-baseline", action="store_true", help="leave out the shipped configuration")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    parser.add_argument("--predictions", metavar="CSV",
                        help="write every run's validation predictions beside the measurements to this CSV")
    parser.add_argument("--transfer", metavar="DEVICE",
                        help="also predict this GPU's records, which must be in none of the split's sets")
    args = parser.parse_args()
    variants = ([] if args.no_baseline else [("shipped", {})]) + args.variant
    if not variants:
        parser.error("nothing to run: give --variant or drop --no-baseline")
    warnings.filterwarnings("ignore")
    import numpy as np
    import torch

    from dippm_nas.training.accuracy_report import write_predictions
    from dippm_nas.training.dataset import build_training_set
    from dippm_nas.training.evaluate import PREDICTION_KEYS, splits_for
    from dippm_nas.training.metrics import mape, summary
    from dippm_nas.training.records import load_records
    from dippm_nas.training.train import TrainConfig, applied_corrections, fit_split, predict_targets

    torch.set_num_threads(args.threads)
    ts = build_training_set(load_records())
    split = next(s for s in splits_for(ts, seed=0) if s.name == args.split)
    families = ts.families[split.val]
    measured = ts.targets[split.val, 0]
    print(f"{split.name} split (split seed 0): {split.description}; {len(split.val)} validation records "
          f"from {len(set(families))} families", flush=True)
    transfer = np.flatnonzero(ts.devices == args.transfer) if args.transfer else np.zeros(0, dtype=int)
    if args.transfer:
        used = np.concatenate([split.train, split.val, split.test])
        if not len(transfer) or np.isin(transfer, used).any():
            parser.error(f"--transfer {args.transfer}: its records must exist and be in none of the {split.name} "
                         f"split's sets; devices with records: {', '.join(sorted(set(ts.devices)))}")
        print(f"transfer to {args.transfer}: {len(transfer)} records; analytical model alone: "
              f"{_transfer_figures(ts.analytical[transfer, 0], ts.targets[transfer, 0])}", flush=True)
    for column, target in enumerate(("latency", "energy", "memory")):
        has = ~np.isnan(ts.targets[split.val, column])
        if has.any():
            print(f"analytical model alone: {target} validation MAPE "
                  f"{mape(ts.analytical[split.val, column][has], ts.targets[split.val, column][has]):.2%} "
                  f"on {int(has.sum())} records", flush=True)
    rows: list[dict] = []
    for name, overrides in variants:
        runs = []
        for seed in (int(s) for s in args.seeds.split(",")):
            start = time.perf_counter()
            config = replace(TrainConfig(), **overrides, seed=seed, refit=False)
            fitted = fit_split(ts, split, config, label=f"{name} seed {seed}")
            every = predict_targets(fitted, ts, split.val, every_correction=True)
            all_targets = applied_corrections(fitted, ts, split.val, every)
            predicted = all_targets[:, 0]
            m = summary(predicted, measured)
            m["family_mape"] = float(np.mean([mape(predicted[families == f], measured[families == f])
                                              for f in np.unique(families)]))
            runs.append(m)
            rows += [{"variant": name, "seed": seed, **{key: getattr(ts.records[i], key) for key in PREDICTION_KEYS},
                      "measured_ms": truth, "analytical_ms": ts.analytical[i, 0], "predicted_ms": guess}
                     for i, truth, guess in zip(split.val.tolist(), measured.tolist(), predicted.tolist())]
            print(f"{name} seed {seed}: validation MAPE {m['mape']:.2%}, Kendall tau {m['tau']:.4f}, within 10 % "
                  f"{m['within10']:.1%}, mean per-family MAPE {m['family_mape']:.2%} (early stopping chose "
                  f"{fitted.best_epoch + 1} epochs; {time.perf_counter() - start:.0f} s)", flush=True)
            if len(transfer):
                print(f"{name} seed {seed}: transfer to {args.transfer}: "
                      f"{_transfer_figures(predict_targets(fitted, ts, transfer)[:, 0], ts.targets[transfer, 0])}",
                      flush=True)
            for column, target in ((1, "energy"), (2, "memory")):
                has = ~np.isnan(ts.targets[split.val, column])
                if has.any():
                    truth = ts.targets[split.val, column][has]
                    print(f"{name} seed {seed}: {target} validation MAPE {mape(all_targets[has, column], truth):.2%} "
                          f"on {int(has.sum())} records (its head's correction applied: "
                          f"{mape(every[has, column], truth):.2%})", flush=True)
        means = {k: statistics.mean(r[k] for r in runs) for k in ("mape", "tau", "within10", "family_mape")}
        print(f"{name} {json.dumps(overrides)}: mean over {len(runs)} seeds: MAPE {means['mape']:.2%}, tau "
              f"{means['tau']:.4f}, within 10 % {means['within10']:.1%}, per-family MAPE {means['family_mape']:.2%}",
              flush=True)
    if args.predictions:
        write_predictions(rows, Path(args.predictions))
        print(f"wrote {len(rows)} validation predictions to {args.predictions}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
