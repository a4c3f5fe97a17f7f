"""Where the analytical memory model and the harness's measurements part, term by term.

The harness records three memory figures per configuration (data/measurements/*.csv): the CUDA
context and library handles (taken once per run, before any model), the allocator's peak allocated
and its peak reserved bytes. The analytical model predicts the context plus the peak reserved of
PyTorch's caching allocator replayed over the workspace, the weights and the activations
(dippm_nas.cost.allocator). This prints, per batch size, the median and the 10th-90th percentiles of

* total: measured (context + peak reserved) over the analytical total;
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measurements", type=Path, default=ROOT / "data" / "measurements",
                        help="folder of harness CSVs (default: data/measurements)")
    parser.add_argument("--extremes", type=int, default=5, help="configurations listed each way (default: 5)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import numpy as np

    from dippm_nas.cost.analytical import AnalyticalCostModel, torch_release
    from dippm_nas.graph.batching import scale_batch
    from dippm_nas.training.dataset import load_graphs

    rows = [r for path in sorted(args.measurements.glob("*.csv")) for r in csv.DictReader(path.open(newline=""))
            if r["status"] == "ok" and r["device_kind"] == "cuda" and r["memory_reserved_mib"]]
    key = {id(r): f"{r['source']}:{r['model']}@{r['input_shape'].split('x')[-1]}" for r in rows}
    graphs = load_graphs(set(key.values()))
    analytical = AnalyticalCostModel()
    by_batch: dict[int, list[tuple[float, float, float, float]]] = {}
    named: dict[int, list[tuple[str, float, float, float, float]]] = {}  # model, allocated and reserved MiB
    skipped = 0
    for r in rows:
        graph = graphs.get(key[id(r)])
        if graph is None:
            skipped += 1
            continue
        m = analytical.memory(scale_batch(graph, int(r["batch"])).table, r["precision"], torch_release(r["torch"]))
        context, allocated, reserved = (float(r[c]) for c in
                                        ("memory_context_mib", "memory_allocated_mib", "memory_reserved_mib"))
        live = m.weights_mib + m.activations_mib + m.workspace_mib
        by_batch.setdefault(int(r["batch"]), []).append((
            (context + reserved) / m.total_mib, allocated / live, reserved / (live + m.allocator_mib),
            reserved / allocated, (live + m.allocator_mib) / live, context / m.context_mib))
        named.setdefault(int(r["batch"]), []).append((r["model"], allocated, live, reserved, live + m.allocator_mib))
    print(f"{sum(map(len, by_batch.values()))} measured configurations"
          + (f" ({skipped} without a featurized graph skipped)" if skipped else ""))
    names = ("total", "allocated", "reserved", "slack measured", "slack replayed", "context")
    print(f"{'batch':>6} {'n':>4}  " + "  ".join(f"{name:>22}" for name in names))
    for batch in sorted(by_batch):
        ratios = np.array(by_batch[batch])
        cells = [f"{np.median(c):.2f} ({np.percentile(c, 10):.2f}-{np.percentile(c, 90):.2f})" for c in ratios.T]
        print(f"{batch:>6} {len(ratios):>4}  " + "  ".join(f"{c:>22}" for c in cells))
    print("medians (10th-90th percentile) of measured over analytical; the slacks are reserved over live bytes")
    if named:
        largest = max(named)
        for label, measured, predicted in (("allocated", 1, 2), ("reserved", 3, 4)):
            rows_ = sorted(named[largest], key=lambda row: row[measured] / row[predicted])
            shown = rows_[:args.extremes] + rows_[-args.extremes:] if len(rows_) > 2 * args.extremes else rows_
            print(f"\nbatch {largest}, {label}: measured over analytical, furthest both ways (MiB measured / analytical)")
            for row in shown:
                print(f"  {row[0]:<40} {row[measured] / row[predicted]:5.2f}  {row[measured]:8.0f} / {row[predicted]:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
