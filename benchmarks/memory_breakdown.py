"""Where the analytical memory model and the harness's measurements part, term by term.

The harness records three memory figures per configuration (data/measurements/*.csv): the CUDA
context and library handles (taken once per run, before any model), the allocator's peak allocated
and its peak reserved bytes. The analytical model predicts the context plus the peak reserved of
PyTorch's caching allocator replayed over the workspace, the weights and the activations
(dippm_nas.cost.allocator). This prints, per batch size, the median and the 10th-90th percentiles of

* total: measured (context + peak reserved) over the analytical context + peak reserved (the
  kernels' modules, which these columns do not count, left out);
* allocated: measured peak allocated over weights + activations + workspace, the bytes the model
  counts live (what it misses: eager's temporaries it does not know of);
* reserved: measured peak reserved over the replayed one;
* slack: measured peak reserved over peak allocated, next to the replay's own (the allocator's
  rounding and fragmentation);
* context: the measured context over the model's constant.

Then, at the largest batch, the configurations furthest from the analytical model both ways in
allocated bytes (where liveness or a library's buffers are misread) and in reserved bytes (where the
allocator's replay is).

Every measured configuration is read, test sets of `dippm-nas evaluate` included: it describes the
data and chooses nothing.

    python benchmarks/memory_breakdown.py
    python benchmarks/memory_breakdown.py --extremes 10
"""

from __future__ import annotations

import argparse
import csv
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Each column: the figure over the figure it is set against (see the module's docstring).
RATIOS = {"total": ("measured total", "total"), "allocated": ("allocated", "live"),
          "reserved": ("reserved", "replayed"), "slack measured": ("reserved", "allocated"),
          "slack replayed": ("replayed", "live"), "context": ("context", "model context")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measurements", type=Path, default=ROOT / "data" / "measurements",
                        help="folder of harness CSVs (default: data/measurements)")
    parser.add_argument("--extremes", type=int, default=5, help="configurations listed each way (default: 5)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import numpy as np

    from dippm_nas.cost.analytical import AnalyticalCostModel, torch_release
    from dippm_nas.cost.table import node_table
    from dippm_nas.graph.batching import scale_batch
    from dippm_nas.training.dataset import load_graphs

    rows = [r for path in sorted(args.measurements.glob("*.csv")) for r in csv.DictReader(path.open(newline=""))
            if r["status"] == "ok" and r["device_kind"] == "cuda" and r["memory_reserved_mib"]]
    key = {id(r): f"{r['source']}:{r['model']}@{r['input_shape'].split('x')[-1]}" for r in rows}
    graphs = load_graphs(set(key.values()))
    analytical = AnalyticalCostModel()
    by_batch: dict[int, list[tuple[str, dict[str, float]]]] = {}  # per configuration: model, MiB figures
    skipped = 0
    for r in rows:
        graph = graphs.get(key[id(r)])
        if graph is None:
            skipped += 1
            continue
        m = analytical.memory(node_table(scale_batch(graph, int(r["batch"]))), r["precision"],
                              torch_release(r["torch"]))
        context, allocated, reserved = (float(r[c]) for c in
                                        ("memory_context_mib", "memory_allocated_mib", "memory_reserved_mib"))
        live = m.weights_mib + m.activations_mib + m.workspace_mib
        by_batch.setdefault(int(r["batch"]), []).append((r["model"], {
            "measured total": context + reserved, "total": m.context_and_reserved_mib, "allocated": allocated,
            "live": live,
            "reserved": reserved, "replayed": live + m.allocator_mib, "context": context,
            "model context": m.context_mib}))
    print(f"{sum(map(len, by_batch.values()))} measured configurations"
          + (f" ({skipped} without a featurized graph skipped)" if skipped else ""))
    print(f"{'batch':>6} {'n':>4}  " + "  ".join(f"{name:>22}" for name in RATIOS))
    for batch in sorted(by_batch):
        cells = []
        for over, under in RATIOS.values():
            c = np.array([f[over] / f[under] for _, f in by_batch[batch]])
            cells.append(f"{np.median(c):.2f} ({np.percentile(c, 10):.2f}-{np.percentile(c, 90):.2f})")
        print(f"{batch:>6} {len(by_batch[batch]):>4}  " + "  ".join(f"{c:>22}" for c in cells))
    print("medians (10th-90th percentile) of measured over analytical; the slacks are reserved over live bytes")
    if by_batch:
        largest = max(by_batch)
        for label in ("allocated", "reserved"):
            over, under = RATIOS[label]
            ranked = sorted(by_batch[largest], key=lambda sample: sample[1][over] / sample[1][under])
            shown = ranked[:args.extremes] + ranked[-args.extremes:] if len(ranked) > 2 * args.extremes else ranked
            print(f"\nbatch {largest}, {label}: measured over analytical, furthest both ways "
                  "(MiB measured / analytical)")
            for model, f in shown:
                print(f"  {model:<40} {f[over] / f[under]:5.2f}  {f[over]:8.0f} / {f[under]:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
