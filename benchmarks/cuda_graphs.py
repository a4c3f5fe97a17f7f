"""How far the cost models are off under CUDA graphs, beside eager, on the harness's own rows.

From its second protocol on, the harness times every configuration twice: eager (``latency_ms_median``)
and with the forward captured as one CUDA graph and replayed (``latency_ms_cuda_graphs``). No record reads
the second figure, so no cost model has trained on it: these rows measure ``--mode cuda-graphs`` as a user
would meet it. The shipped PMGNS and operator model did train on these GPUs' eager records, these rows'
among them: their eager figures are of data they fitted. For each GPU, precision and batch range the
script prints the MAPE and median signed error of PMGNS (the default), the operator model and the
analytical model in both modes, and what the operator model predicts beyond each CUDA-graph measurement
per kernel the graph launches (its operators' kernels, autocast's casts aside). Beside it: the GPU time of
one tiny kernel in a replayed chain, from the harness's host-cost measurement of the same run
(``host_profile``'s ``gpu_us``: add and relu, kernels that do next to nothing), which is what a kernel
costs a graph beyond its work.

    python benchmarks/cuda_graphs.py [--out benchmarks/results/cuda_graphs.txt]
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from dippm_nas.cost.analytical import KERNEL_OVERHEAD_US, AnalyticalCostModel
from dippm_nas.cost.learned import PMGNSCostModel
from dippm_nas.cost.operator_cost import OperatorCostModel
from dippm_nas.cost.table import node_table
from dippm_nas.graph.batching import scale_batch
from dippm_nas.hardware.registry import device_named, get_device
from dippm_nas.training.calibrate import read_rows
from dippm_nas.training.dataset import load_graphs
from dippm_nas.training.paths import project
from dippm_nas.training.records import graph_key

#: The batches at or below which kernels are short enough for their launch to matter.
SMALL_BATCH = 8
#: The host-cost chain's kernels that do next to nothing: their time in a replayed graph is a kernel's cost.
TINY_KERNELS = ("add", "relu")
MODES = ("eager", "cuda-graphs")
MODELS = ("pmgns", "operators", "analytical")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="also write the report to this file")
    args = parser.parse_args()
    lines = ["$ python benchmarks/cuda_graphs.py  (2-core build machine, no GPU)",
             "the shipped models; PMGNS and the operator model trained on these GPUs' eager records, these rows' among "
             "them, and on no CUDA-graph timing"]
    models = {"pmgns": PMGNSCostModel(), "operators": OperatorCostModel(), "analytical": AnalyticalCostModel()}
    for path in sorted(project().measurements.glob("*.csv")):
        if "latency_ms_cuda_graphs" not in path.open().readline():
            continue
        lines += _report_file(path, models)
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


def _report_file(path: Path, models: dict[str, object]) -> list[str]:
    """The file's rows measured in both modes, predicted in both, by precision and batch range."""
    by_mode = {mode: {r.line: r for r in read_rows(path, mode)} for mode in MODES}
    both = [line for line in by_mode["cuda-graphs"] if line in by_mode["eager"]]
    first = by_mode["eager"][both[0]]
    device = get_device(device_named(first.gpu_name or "") or "")
    keys = {graph_key("timm", r.model, r.input_size) for r in by_mode["eager"].values()}
    graphs = load_graphs(keys)
    groups: dict[tuple[str, bool], list[dict[str, float]]] = defaultdict(list)
    for line in both:
        row = by_mode["eager"][line]
        key = graph_key("timm", row.model, row.input_size)
        if key not in graphs:
            continue
        graph = scale_batch(graphs[key], row.batch)
        out = {"kernels": float(node_table(graph).kernels.sum())}
        for mode in MODES:
            measured = by_mode[mode][line].latency_ms
            out[f"{mode} measured"] = measured
            for name, model in models.items():
                out[f"{mode} {name}"] = model.estimate(graph, device, row.precision, mode=mode).latency_ms
        groups[(row.precision, row.batch <= SMALL_BATCH)].append(out)
    lines = [f"\n{path.name} ({device.key}): {len(both)} configurations timed eager and as a CUDA graph",
             "MAPE (median signed error) of each cost model and mode; the operator model's excess per kernel under "
             "CUDA graphs (us)",
             f"{'precision':<9} {'batch':<6} {'n':>3}  " + "".join(f"{f'{model}, {mode}':>26}" for mode in MODES
                                                                  for model in MODELS) + f"{'excess':>8}"]
    for (precision, small), rows in sorted(groups.items()):
        cells = []
        for mode in MODES:
            for model in MODELS:
                ratio = np.array([r[f"{mode} {model}"] / r[f"{mode} measured"] - 1 for r in rows])
                cells.append(f"{f'{np.mean(np.abs(ratio)):.1%} ({np.median(ratio):+.1%})':>26}")
        excess = statistics.median((r["cuda-graphs operators"] - r["cuda-graphs measured"]) * 1e3 / r["kernels"]
                                   for r in rows)
        batches = f"<= {SMALL_BATCH}" if small else f"> {SMALL_BATCH}"
        lines.append(f"{precision:<9} {batches:<6} {len(rows):>3}  " + "".join(cells) + f"{excess:>+8.2f}")
    lines.append(f"a tiny kernel in the harness's replayed chain ({', '.join(TINY_KERNELS)}): "
                 f"{_tiny_kernel_us(path)}; the cost models charge {KERNEL_OVERHEAD_US:g} us a kernel in both modes")
    return lines


def _tiny_kernel_us(path: Path) -> str:
    """The GPU time (us) of each tiny kernel of the run's host-cost chain replayed as a CUDA graph, by precision."""
    with path.open(newline="") as f:
        profile = json.loads(next(csv.DictReader(f))["host_profile"] or "{}")
    gpu = profile.get("gpu_us", {})
    return "; ".join(f"{precision} " + ", ".join(f"{kind} {times[kind]:.2f} us" for kind in TINY_KERNELS
                                                 if kind in times) for precision, times in sorted(gpu.items()))


if __name__ == "__main__":
    sys.exit(main())
