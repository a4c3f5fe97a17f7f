"""Each split's test error by GPU and precision, read from the evaluation's own predictions.

``dippm-nas evaluate`` reports one MAPE per split over every test record. A data set that grows by GPUs
and precisions changes what that one figure averages over, so this prints it per (GPU, precision) of
each split, PMGNS beside the analytical model, and the split's figure over the records of the GPUs and
precision a narrower data set had (``--subset``, default: the RTX 3090, the RTX 4090 and the H100 at
fp16). Nothing is trained or chosen here: it reads ``docs/accuracy/predictions.csv``.

    python benchmarks/split_breakdown.py [--predictions docs/accuracy/predictions.csv]
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from dippm_nas.training.metrics import summary

ROOT = Path(__file__).resolve().parents[1]
SUBSET = "rtx3090/fp16,rtx4090/fp16,h100-sxm/fp16"


def _figures(rows: list[dict[str, str]]) -> str:
    measured = np.array([float(r["measured_ms"]) for r in rows])
    cells = []
    for model in ("pmgns", "analytical"):
        m = summary(np.array([float(r[f"{model}_ms"]) for r in rows]), measured)
        cells.append(f"{model} {m['mape']:6.1%} / {m['tau']:5.3f}")
    return f"{len(rows):5d} records   " + "   ".join(cells)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--predictions", default=str(ROOT / "docs" / "accuracy" / "predictions.csv"))
    parser.add_argument("--subset", default=SUBSET, help=f"GPU/precision pairs, comma-separated (default: {SUBSET})")
    args = parser.parse_args(argv)
    path = Path(args.predictions)
    if not path.exists():
        print(f"no {path}: run `dippm-nas evaluate` first", file=sys.stderr)
        return 2
    with path.open() as f:
        rows = list(csv.DictReader(f))
    subset = {tuple(pair.split("/")) for pair in args.subset.split(",") if pair}
    by_split: dict[str, list[dict[str, str]]] = defaultdict(list)
    for row in rows:
        by_split[row["split"]].append(row)
    print("MAPE / Kendall tau of each split's test records (PMGNS, analytical)")
    for split, records in by_split.items():
        print(f"\n{split}: {_figures(records)}")
        inside = [r for r in records if (r["device"], r["precision"]) in subset]
        if inside and len(inside) < len(records):
            print(f"  {'only ' + args.subset:38s} {_figures(inside)}")
        groups: dict[tuple[str, str], list[dict[str, str]]] = defaultdict(list)
        for r in records:
            groups[(r["device"], r["precision"])].append(r)
        for (device, precision), group in sorted(groups.items()):
            print(f"  {device + ' ' + precision:38s} {_figures(group)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
