"""Does a per-operator kernel-efficiency model transfer to a GPU it never saw?

Each question is answered GPU by GPU with a model trained without that GPU's rows and records
(:mod:`dippm_nas.training.kernel_training`, fixed settings, early stopping on validation records of the
training GPUs, nothing chosen on a held-out GPU):

1. Operators: on each GPU with operator-level rows (the harness's H100 sweep, NeuSight's A100-PCIE,
   V100 and T4 per-operator traces), the time MAPE of the core roofline bound and of that bound times
   the learned slowdown, by group of operators; the model trained on operator rows alone.
2. Whole models, the model trained on operator rows alone: every measured record's latency MAPE with
   the plain roofline and with each operator's time as the model says its kernel runs
   (:func:`~dippm_nas.cost.kernel_efficiency.calibrated_seconds`), by GPU, precision and batch.
3. The same for the GPUs with operator rows, the model trained on every row, theirs included: whether
   the slowdowns of operators timed alone carry to a network's operators at all.
4. Whole models, the model trained on operator rows and on the other GPUs' whole-model records, beside
   PMGNS's leave-one-GPU-out error on the same GPU (``docs/accuracy/transfer_predictions.csv``, written
   by ``dippm-nas evaluate --leave-one-gpu-out``).

    python benchmarks/kernel_transfer.py [--gpus h100-sxm,h200]
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

from dippm_nas.training.dataset import load_graphs
from dippm_nas.training.kernel_training import (
    Networks,
    fit,
    leave_one_gpu_out,
    network_operators,
    of_gpu,
    predict_networks,
    without_gpu,
)
from dippm_nas.training.metrics import summary
from dippm_nas.training.operators import load_operator_rows
from dippm_nas.training.records import load_records
from dippm_nas.training.transfer import batch_range

ROOT = Path(__file__).resolve().parents[1]
PMGNS_TRANSFER = ROOT / "docs" / "accuracy" / "transfer_predictions.csv"


def _line(label: str, roofline: np.ndarray, learned: np.ndarray, measured: np.ndarray) -> str:
    roof, mine = summary(roofline, measured), summary(learned, measured)
    return (f"  {label:<26} {len(measured):5d}   roofline {roof['mape']:6.1%}   learned {mine['mape']:6.1%} "
            f"(tau {mine['tau']:5.3f})   median measured/learned {np.median(measured / learned):4.2f}")


def _print_gpu(test: Networks, learned: np.ndarray, pmgns: dict[str, float] | None = None) -> None:
    gpu = str(test.gpu[0])
    line = _line(gpu, test.roofline_ms, learned, test.measured_ms)
    print(line + (f"   PMGNS {pmgns[gpu]:6.1%}" if pmgns and gpu in pmgns else ""))
    cells = sorted({(p, batch_range(b)) for p, b in zip(test.precision, test.batch)})
    for precision, batches in cells:
        k = (test.precision == precision) & (np.array([batch_range(b) for b in test.batch]) == batches)
        print(_line(f"  {precision} batch {batches}", test.roofline_ms[k], learned[k], test.measured_ms[k]))


def _pmgns_transfer() -> dict[str, float]:
    """PMGNS's leave-one-GPU-out latency MAPE per held-out GPU, from the evaluation's own predictions."""
    if not PMGNS_TRANSFER.exists():
        return {}
    with PMGNS_TRANSFER.open(newline="") as f:
        rows = list(csv.DictReader(f))
    out = {}
    for gpu in {r["device"] for r in rows}:
        mine = [r for r in rows if r["device"] == gpu and r["split"] == f"without {gpu}"]
        if mine:
            out[gpu] = summary(np.array([float(r["pmgns_ms"]) for r in mine]),
                               np.array([float(r["measured_ms"]) for r in mine]))["mape"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", help="registry keys, comma-separated (default: every GPU with records)")
    args = parser.parse_args(argv)
    rows = load_operator_rows()
    records = load_records()
    networks = network_operators(records, load_graphs({r.graph_key for r in records}))
    gpus = args.gpus.split(",") if args.gpus else sorted(set(networks.gpu))
    with_rows = sorted({r.gpu for r in rows} & set(gpus))
    print(f"{len(rows)} operator rows of {len({r.gpu for r in rows})} GPUs; {len(networks)} whole-model records "
          f"of {len(set(networks.gpu))} GPUs ({len(networks.x)} operators)")

    print("\n1. Operators of a GPU held out of training: time MAPE (rows)")
    for held in leave_one_gpu_out(rows, gpus=with_rows):
        print(f"  {held.gpu:<16} {held.rows:5d}   core bound {held.roofline_mape:6.1f}%   "
              f"learned {held.learned_mape:6.1f}%")
        for group, count, roof, learned in held.groups:
            print(f"    {group:<18} {count:5d}   core bound {roof:6.1f}%   learned {learned:6.1f}%")

    everything = fit(rows)
    print("\n2. Whole models, the model trained on the other GPUs' operator rows alone: latency MAPE")
    for gpu in gpus:
        model = fit([r for r in rows if r.gpu != gpu]) if gpu in with_rows else everything
        test = of_gpu(networks, gpu)
        _print_gpu(test, predict_networks(model, test))

    print("\n3. Whole models of the GPUs with operator rows, the model trained on every operator row")
    for gpu in with_rows:
        test = of_gpu(networks, gpu)
        _print_gpu(test, predict_networks(everything, test))

    print("\n4. Whole models, the model trained on the other GPUs' operator rows and whole-model records")
    pmgns = _pmgns_transfer()
    for gpu in gpus:
        model = fit([r for r in rows if r.gpu != gpu], without_gpu(networks, gpu))
        test = of_gpu(networks, gpu)
        _print_gpu(test, predict_networks(model, test), pmgns)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
