"""Vidur's fp16 GEMMs of eight LLMs' layers, each predicted alone as a half-weights linear layer.

Every GEMM of ``data/vidur`` (the four linear layers of a transformer layer, at 1 to 32,768 tokens and
tensor-parallel splits of 1 to 8, on an A100 80GB and an H100 SXM) becomes an ``nn.Linear`` without bias
built in float16 on the meta device, at ``num_tokens`` rows, predicted at its own precision
(``fp16-weights``) under CUDA graphs (the kernel's time, as Vidur's profiler times it, no host). Each GPU's
predictions are compared with Vidur's median, by cost model and by range of tokens: MAPE, the median
absolute error, and the median ratio of predicted to measured (above 1: predicted too slow). The shipped
operator model is trained on these GEMMs, so its figures here are in-sample; with each GPU held out they are in
``docs/operators.md`` (``dippm-nas evaluate --operators``).

    python benchmarks/vidur_gemms.py --out benchmarks/results/vidur_gemms.txt
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TOKEN_RANGES = ((1, 255), (256, 1999), (2000, 32768))
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="also write the table to this file")
    parser.add_argument("--limit", type=int, default=None, help="only every Nth GEMM (a quick look)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    from tqdm import tqdm

    import dippm_nas
    from dippm_nas.graph.batching import scale_batch
    from dippm_nas.training.vidur import VIDUR_GPUS, measured_gemms

    start = time.perf_counter()
    lines = [f"{'GPU':10} {'cost model':11} {'tokens':>11}   {'MAPE':>8} {'median':>8} {'ratio':>7} {'GEMMs':>6}"]
    graphs: dict[tuple[int, int], object] = {}
    for folder, device in VIDUR_GPUS.items():
        gemms = list(measured_gemms(ROOT / "data" / "vidur" / folder).items())[::args.limit or 1]
        pairs: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
        for (k, n, tokens), measured in tqdm(gemms, desc=device, unit="GEMM", file=sys.stderr):
            if (k, n) not in graphs:
                graphs[(k, n)] = linear_graph(k, n)
            graph = scale_batch(graphs[(k, n)], tokens)
            for cost_model in COST_MODELS:
                p = dippm_nas.predict_graph(graph, device, cost_model=cost_model, mode="cuda-graphs")
                band = next(i for i, (low, high) in enumerate(TOKEN_RANGES) if low <= tokens <= high)
                pairs[(cost_model, band)].append((p.latency_ms, measured))
        for cost_model in COST_MODELS:
            for band, (low, high) in enumerate(TOKEN_RANGES):
                if pairs[(cost_model, band)]:
                    lines.append(f"{device:10} {cost_model:11} {f'{low}-{high}':>11}   "
                                 + summary(pairs[(cost_model, band)]))
    lines.append(f"({time.perf_counter() - start:.0f} s; fp16-weights, CUDA graphs, Vidur's median per GEMM shape; "
                 "ratio: the median of predicted over measured; the shipped operator model trained on these GEMMs: "
                 "held out, docs/operators.md)")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
