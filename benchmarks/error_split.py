"""Where the operator model's eager error lies: in the host's time to issue the operators, or in the GPU's.

The harness's rows that measured, beside the eager latency, the host's time to issue one forward pass
(``host_issue_ms``) and the same pass under CUDA graphs (``latency_ms_cuda_graphs``: the GPU's own time)
split a prediction's error in two. Eager PyTorch's latency is close to the later of the two (the host
issues while the GPU runs), which the first line checks on the rows. Then, per GPU, precision and batch
range, for the shipped operator model and for the one trained without the GPU's chip (what a user of a
GPU never measured gets; ``benchmarks/calibration.py`` keeps it), the MAPE of:

- eager, as predicted;
- the GPU alone: the prediction under CUDA graphs against the measured CUDA-graph latency;
- the host alone: the host profile's time to issue the graph's operators against ``host_issue_ms``;
- eager with one part measured: the later of the measured host and the predicted GPU, and of the
  predicted host and the measured GPU. Whichever of these comes close to the measurement, the other
  part carries the error.

Last, where one machine measured a model at two batches where the host binds (the host's time is the
later), its host time per operator at each: the same operators issued by the same host, which a
prediction from the graph gives as one time.

    python benchmarks/error_split.py [--out benchmarks/results/error_split.txt]
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from calibration import held_out_model
from ground_truth_noise import (
    HOST_BOUND_BATCH,
    Measurement,
    harness_files,
    pair_kind,
    read_measurements,
    regime,
)

from dippm_nas._cache_location import cache_dir
from dippm_nas.cost.operator_cost import OperatorCostModel
from dippm_nas.cost.table import node_table
from dippm_nas.graph.batching import scale_batch
from dippm_nas.hardware.registry import get_device
from dippm_nas.training.calibrate import scaled_latency_ms
from dippm_nas.training.dataset import load_graphs
from dippm_nas.training.metrics import mape
from dippm_nas.training.paths import project


@dataclass(frozen=True)
class Split:
    """One row's measured eager, host and GPU times (ms) and one cost model's predictions of each."""

    gpu: str
    precision: str
    batch: int
    eager: float
    host: float
    gpu_alone: float
    predicted_eager: float
    predicted_host: float
    predicted_gpu: float


def splits(rows: list[Measurement], model: OperatorCostModel, graphs: dict) -> list[Split]:
    """Each row with a stored graph, measured and as ``model`` predicts it."""
    out = []
    for m in rows:
        r = m.record
        graph = scale_batch(graphs[r.graph_key], r.batch)
        device = get_device(r.device)
        parts = model.latency_parts(graph, device, r.precision)  # eager's queue; under CUDA graphs, the GPU's sum
        out.append(Split(
            r.device, r.precision, r.batch, r.latency_ms, float(m.host_issue_ms), float(m.cuda_graphs_ms),
            scaled_latency_ms(parts, np.ones(3)), float(parts.host_s.sum() * 1e3),
            float((parts.gemm_s.sum() + parts.other_s.sum()) * 1e3)))
    return out


def split_lines(label: str, found: list[Split]) -> list[str]:
    """Per GPU, precision and batch range, the MAPE of eager, of each part alone and of eager with one part
    measured."""
    groups = defaultdict(list)
    for s in found:
        groups[(s.gpu, s.precision, regime(s.batch))].append(s)
    lines = [f"## {label}", "",
             "| GPU | precision | batches | rows | eager | GPU alone | host alone | measured host, predicted GPU "
             "| predicted host, measured GPU |", "|---|---|---|---|---|---|---|---|---|"]
    for (gpu, precision, batches), group in sorted(groups.items()):
        a = {f: np.array([getattr(s, f) for s in group]) for f in Split.__dataclass_fields__ if f not in
             ("gpu", "precision", "batch")}
        lines.append(
            f"| {gpu} | {precision} | {batches} | {len(group)} | {mape(a['predicted_eager'], a['eager']):.1%} "
            f"| {mape(a['predicted_gpu'], a['gpu_alone']):.1%} | {mape(a['predicted_host'], a['host']):.1%} "
            f"| {mape(np.maximum(a['host'], a['predicted_gpu']), a['eager']):.1%} "
            f"| {mape(np.maximum(a['predicted_host'], a['gpu_alone']), a['eager']):.1%} |")
    return lines + [""]


def host_pairs(rows: list[Measurement], graphs: dict) -> list[str]:
    """Each model measured by one machine at two host-bound batches: its host time per operator at each."""
    by_series = defaultdict(list)
    for m in rows:
        if m.record.batch <= HOST_BOUND_BATCH and float(m.host_issue_ms) > float(m.cuda_graphs_ms):
            by_series[m.series].append(m)
    lines = ["## The host's time per operator of one model at two host-bound batches, on one machine", "",
             "| GPU | model | precision | batches | us per operator | larger / smaller |", "|---|---|---|---|---|---|"]
    ratios = []
    for series in sorted(by_series.values(), key=lambda s: (s[0].record.device, s[0].record.model)):
        ordered = sorted(series, key=lambda m: (m.date, m.record.batch))
        for first, second in zip(ordered, ordered[1:]):
            if pair_kind(first, second) != "another process" or first.record.batch == second.record.batch:
                continue
            operators = int((~node_table(graphs[first.record.graph_key]).is_view).sum())
            us = [float(m.host_issue_ms) * 1e3 / operators for m in (first, second)]
            ratios.append(max(us) / min(us))
            r = first.record
            lines.append(f"| {r.device} | {r.model} | {r.precision} | {r.batch}, {second.record.batch} "
                         f"| {us[0]:.1f}, {us[1]:.1f} | {ratios[-1]:.2f} |")
    if ratios:
        lines += ["", f"{len(ratios)} pairs: the larger host time over the smaller, median {np.median(ratios):.2f}, "
                      f"mean {np.mean(ratios):.2f}, largest {max(ratios):.2f}; within 10 %: "
                      f"{np.mean(np.array(ratios) <= 1.1):.0%} of the pairs"]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="also write the report here")
    args = parser.parse_args()
    root = project().root
    rows = [m for m in read_measurements(harness_files(root)) if m.host_issue_ms and m.cuda_graphs_ms]
    graphs = load_graphs({m.record.graph_key for m in rows})
    rows = [m for m in rows if m.record.graph_key in graphs]
    if not rows:
        print("no harness row measured both the host's time and the latency under CUDA graphs", file=sys.stderr)
        return 1
    eager = np.array([m.record.latency_ms for m in rows])
    host = np.array([float(m.host_issue_ms) for m in rows])
    gpu = np.array([float(m.cuda_graphs_ms) for m in rows])
    lines = ["$ python benchmarks/error_split.py  (2-core build machine, no GPU)", "",
             f"{len(rows)} harness rows measured the host's time and the latency under CUDA graphs beside the eager "
             f"latency ({', '.join(sorted({m.record.device for m in rows}))}); eager latency against the later of the "
             f"host's time and the CUDA-graph latency: MAPE {mape(np.maximum(host, gpu), eager):.1%}", ""]
    folder = (cache_dir() or Path(".")) / "held-out"
    for gpu_key in sorted({m.record.device for m in rows}):
        mine = [m for m in rows if m.record.device == gpu_key]
        lines += split_lines("the shipped operator model", splits(mine, OperatorCostModel(), graphs))
        lines += split_lines(f"the operator model trained without {gpu_key}'s chip",
                             splits(mine, held_out_model(gpu_key, folder), graphs))
    lines += host_pairs(rows, graphs)
    report = "\n".join(lines)
    print(report)
    if args.out:
        args.out.write_text(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
