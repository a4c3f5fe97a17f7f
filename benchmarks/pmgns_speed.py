"""Time PMGNS predictions once the graph exists (the bar: under 5 ms per graph on this machine).

Builds the graphs of a fixed list of timm models first (not timed), then times
``PMGNSCostModel.estimate`` on each, several rounds, and prints the median and 95th percentile per
graph, next to the analytical model's own time for scale.

    python benchmarks/pmgns_speed.py
"""

from __future__ import annotations

import statistics
import sys
import time
import warnings

MODELS = ["resnet18", "resnet50", "mobilenetv3_large_100", "efficientnet_b0", "convnext_tiny",
          "vit_small_patch16_224", "swin_tiny_patch4_window7_224", "regnety_040", "densenet121", "deit_tiny_patch16_224"]
ROUNDS = 10


def main() -> int:
    warnings.filterwarnings("ignore")
    from dippm_nas import build_graph
    from dippm_nas.cost.analytical import AnalyticalCostModel
    from dippm_nas.cost.learned import PMGNSCostModel
    from dippm_nas.hardware import get_device

    device = get_device("rtx4090")
    graphs = [build_graph(m, batch=32) for m in MODELS]
    learned, analytical = PMGNSCostModel(), AnalyticalCostModel()
    learned.estimate(graphs[0], device, "fp16")  # load the weights once
    timings: dict[str, list[float]] = {"pmgns": [], "analytical": []}
    for _ in range(ROUNDS):
        for g in graphs:
            for name, model in (("pmgns", learned), ("analytical", analytical)):
                start = time.perf_counter()
                model.estimate(g, device, "fp16")
                timings[name].append((time.perf_counter() - start) * 1e3)
    nodes = statistics.median(len(g.nodes) for g in graphs)
    for name, t in timings.items():
        ordered = sorted(t)
        print(f"{name:10s} per graph: median {statistics.median(t):.2f} ms, p95 {ordered[int(0.95 * len(t)) - 1]:.2f} ms "
              f"({len(graphs)} timm graphs, median {nodes:.0f} operators, {ROUNDS} rounds)")
    median = statistics.median(timings["pmgns"])
    print(f"bar: PMGNS under 5 ms per graph -> {'met' if median < 5 else 'NOT met'}")
    return 0 if median < 5 else 1


if __name__ == "__main__":
    sys.exit(main())
