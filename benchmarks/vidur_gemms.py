"""Vidur's fp16 GEMMs of eight LLMs' layers, each predicted alone as a half-weights linear layer.

Every GEMM of ``data/vidur`` (the four linear layers of a transformer layer, at 1 to 32,768 tokens and
tensor-parallel splits of 1 to 8, on an A100 80GB and an H100 SXM) becomes an ``nn.Linear`` without bias
built in float16 on the meta device, at ``num_tokens`` rows, predicted at its own precision
(``fp16-weights``) under CUDA graphs (the kernel's time, as Vidur's profiler times it, no host). Each GPU's
predictions are compared with Vidur's median, by cost model and by range of tokens: MAPE, the median
absolute error, and the median ratio of predicted to measured (above 1: predicted too slow). The shipped
operator model is trained on these GEMMs, so its figures here are in-sample; with each GPU held out they are in
``docs/operators.md`` (``dippm-nas evaluate --operators``).

``--plan`` writes the same GEMMs as an operator sweep's plan, which ``dippm-nas sweep --points`` (and the
campaign's ``gemms`` step) times on a GPU by the sweep's protocol; ``--ours`` sets those rows beside Vidur's
medians, shape for shape, by range of tokens: how the two protocols compare on one kind of chip.

    python benchmarks/vidur_gemms.py --out benchmarks/results/vidur_gemms.txt
    python benchmarks/vidur_gemms.py --plan data/manifests/vidur_gemms.csv
    python benchmarks/vidur_gemms.py --ours data/measurements/sweeps/nvidia-h100-80gb-hbm3-vidur.csv
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
COST_MODELS = ("auto", "operators", "analytical")


def linear_graph(k: int, n: int):
    """The graph of a float16 ``nn.Linear(k, n, bias=False)`` at batch 1 (one token), built on the meta device."""
    import torch

    import dippm_nas
    from dippm_nas.inputs import TensorSpec

    with torch.device("meta"):
        layer = torch.nn.Linear(k, n, bias=False, dtype=torch.float16)
    return dippm_nas.build_graph(layer, TensorSpec((k,), "float16"), batch=1)


def summary(errors: list[tuple[float, float]]) -> str:
    """MAPE, median APE and the median ratio of predicted to measured, over (predicted, measured) pairs."""
    predicted, measured = np.array(errors).T
    ape = np.abs(predicted - measured) / measured * 100
    return f"{ape.mean():6.1f} % {np.median(ape):6.1f} % {np.median(predicted / measured):6.2f}x {len(ape):6d}"


def band_of(tokens: int) -> int:
    """The index of the range of :data:`~dippm_nas.training.vidur.TOKEN_RANGES` that ``tokens`` lies in."""
    from dippm_nas.training.vidur import TOKEN_RANGES

    return next(i for i, (low, high) in enumerate(TOKEN_RANGES) if low <= tokens <= high)


def predictions_table(limit: int | None) -> list[str]:
    """Every GEMM predicted by each cost model against Vidur's median, by GPU and range of tokens."""
    from tqdm import tqdm

    import dippm_nas
    from dippm_nas.graph.batching import scale_batch
    from dippm_nas.training.vidur import TOKEN_RANGES, VIDUR_GPUS, measured_gemms

    start = time.perf_counter()
    lines = [f"{'GPU':10} {'cost model':11} {'tokens':>11}   {'MAPE':>8} {'median':>8} {'ratio':>7} {'GEMMs':>6}"]
    graphs: dict[tuple[int, int], object] = {}
    for folder, device in VIDUR_GPUS.items():
        gemms = list(measured_gemms(ROOT / "data" / "vidur" / folder).items())[::limit or 1]
        pairs: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
        for (k, n, tokens), measured in tqdm(gemms, desc=device, unit="GEMM", file=sys.stderr):
            if (k, n) not in graphs:
                graphs[(k, n)] = linear_graph(k, n)
            graph = scale_batch(graphs[(k, n)], tokens)
            for cost_model in COST_MODELS:
                p = dippm_nas.predict_graph(graph, device, cost_model=cost_model, mode="cuda-graphs")
                pairs[(cost_model, band_of(tokens))].append((p.latency_ms, measured))
        for cost_model in COST_MODELS:
            for band, (low, high) in enumerate(TOKEN_RANGES):
                if pairs[(cost_model, band)]:
                    lines.append(f"{device:10} {cost_model:11} {f'{low}-{high}':>11}   "
                                 + summary(pairs[(cost_model, band)]))
    lines.append(f"({time.perf_counter() - start:.0f} s; fp16-weights, CUDA graphs, Vidur's median per GEMM shape; "
                 "ratio: the median of predicted over measured; the shipped operator model trained on these GEMMs: "
                 "held out, docs/operators.md)")
    return lines


def write_plan(path: Path) -> list[str]:
    """Vidur's GEMMs as a sweep's plan of points (:func:`dippm_nas.training.vidur.sweep_plan`)."""
    from dippm_nas.training.vidur import sweep_plan

    plan = sweep_plan(ROOT / "data" / "vidur")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(plan[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(plan)
    return [f"{len(plan)} GEMMs of Vidur's profiles as sweep points -> {path}"]


def protocol_table(ours: Path) -> list[str]:
    """Our sweep's timings of Vidur's GEMMs (``ok`` rows of ``linear`` without bias at fp16-weights) set beside
    Vidur's median of the same shape on each of its GPUs: the median ratio of ours to Vidur's, by range of
    tokens, with the median absolute difference."""
    from dippm_nas.measure.sweep import Point
    from dippm_nas.training.vidur import TOKEN_RANGES, VIDUR_GPUS, VIDUR_PRECISION, measured_gemms

    timed: dict[tuple[int, int, int], float] = {}
    gpus = set()
    with ours.open(newline="") as fh:
        for row in csv.DictReader(fh):
            point = Point.from_key(row["key"])
            shape = point.shape
            if (row["status"] != "ok" or point.kind != "linear" or shape.get("bias", 1)
                    or point.precision != VIDUR_PRECISION):
                continue
            timed[(shape["k"], shape["n"], shape["m"])] = float(row["latency_ms_median"])
            gpus.add(row["gpu_name"] or row["device_kind"])
    if not timed:
        raise SystemExit(f"{ours} holds no timed GEMM of Vidur's plan (linear, bias=0, {VIDUR_PRECISION}); "
                         "time some with dippm-nas sweep --points data/manifests/vidur_gemms.csv")
    lines = [f"{len(timed)} GEMMs timed on {', '.join(sorted(gpus))} ({ours}); ratio: ours over Vidur's median",
             f"{'Vidur GPU':10} {'tokens':>11}   {'ratio':>7} {'p10':>6} {'p90':>6} {'|diff|':>8} {'GEMMs':>6}"]
    for folder, device in VIDUR_GPUS.items():
        vidur = measured_gemms(ROOT / "data" / "vidur" / folder)
        pairs: dict[int, list[tuple[float, float]]] = defaultdict(list)
        for shape, ms in timed.items():
            if shape in vidur:
                pairs[band_of(shape[2])].append((ms, vidur[shape]))
        for band, (low, high) in enumerate(TOKEN_RANGES):
            if pairs[band]:
                mine, theirs = np.array(pairs[band]).T
                ratio = mine / theirs
                lines.append(f"{device:10} {f'{low}-{high}':>11}   {np.median(ratio):6.2f}x "
                             f"{np.percentile(ratio, 10):6.2f} {np.percentile(ratio, 90):6.2f} "
                             f"{np.median(np.abs(mine - theirs)) * 1000:6.1f}us {len(ratio):6d}")
    if len(lines) == 2:
        lines.append("(none of these shapes is one Vidur profiled)")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="also write the table to this file")
    parser.add_argument("--limit", type=int, default=None, help="only every Nth GEMM (a quick look)")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--plan", type=Path, default=None, metavar="CSV",
                      help="instead: write Vidur's GEMMs as a sweep's plan (dippm-nas sweep --points)")
    what.add_argument("--ours", type=Path, default=None, metavar="SWEEP.csv",
                      help="instead: set a sweep's timings of that plan beside Vidur's, shape for shape")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    if args.plan:
        lines = write_plan(args.plan)
    elif args.ours:
        lines = protocol_table(args.ours)
    else:
        lines = predictions_table(args.limit)
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
