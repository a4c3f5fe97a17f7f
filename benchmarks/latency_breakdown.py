"""Where the analytical latency and power part from the measurements, per GPU and batch size.

The analytical model is a roofline at each GPU's spec-sheet peaks; PMGNS learns what real kernels
lose against it. This prints, per device (and batch size for our harness's rows), the median and the
10th-90th percentiles of measured over analytical latency, how much of it depends on the model (the
spread of the log ratio, the MAPE left once each group's median is divided out), and for the
harness's rows the same for power (energy over latency) and energy. Then, for the largest batch of
each harness GPU, the models furthest from that GPU's median both ways, beside the ratio the RTX 4090
measured for the same model: what the spec sheet misses on that GPU alone.

Every record is read, test sets of `dippm-nas evaluate` included: it describes the data and chooses
nothing. The per-operator view that explains a model's ratio comes from the harness's kernel rows
(`dippm-nas measure --kernels`, data/measurements/kernels/).

    python benchmarks/latency_breakdown.py
    python benchmarks/latency_breakdown.py --extremes 15
"""

from __future__ import annotations

import argparse
import collections
import sys
import warnings


def _cells(values) -> str:
    import numpy as np

    values = np.asarray(values)
    log = np.log(values)
    left = np.mean(np.abs(np.exp(log - np.median(log)) - 1))
    return (f"{np.median(values):.2f} ({np.percentile(values, 10):.2f}-{np.percentile(values, 90):.2f}) "
            f"sd(log) {log.std():.2f}, MAPE after the median {left:.1%}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--extremes", type=int, default=8, help="models listed each way per harness GPU (default: 8)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import numpy as np

    from dippm_nas.training.dataset import build_training_set
    from dippm_nas.training.records import load_records

    ts = build_training_set(load_records())
    harness = np.array([r.energy_j is not None for r in ts.records])
    latency = ts.targets[:, 0] / ts.analytical[:, 0]
    groups: dict[tuple[str, int], list[int]] = collections.defaultdict(list)
    for i, r in enumerate(ts.records):
        groups[(r.device, r.batch if harness[i] else 0)].append(i)
    print(f"{len(ts.records)} records; measured over analytical, median (10th-90th percentile)")
    for (device, batch), members in sorted(groups.items()):
        label = f"{device} batch {batch}" if batch else f"{device} (timm's benchmarks, every batch)"
        print(f"{label:<42} n={len(members):<5} latency {_cells(latency[members])}")
        if batch:
            measured_w = ts.targets[members, 1] / ts.targets[members, 0] * 1e3
            analytical_w = ts.analytical[members, 1] / ts.analytical[members, 0] * 1e3
            print(f"{'':<50} power   {_cells(measured_w / analytical_w)}")
            print(f"{'':<50} energy  {_cells(ts.targets[members, 1] / ts.analytical[members, 1])}")
    rtx4090: dict[str, list[float]] = collections.defaultdict(list)
    for i, r in enumerate(ts.records):
        if r.device == "rtx4090" and r.layout == "nchw":
            rtx4090[r.model].append(latency[i])
    for device in sorted({d for d, b in groups if b}):
        batch = max(b for d, b in groups if d == device)
        members = sorted(groups[(device, batch)], key=lambda i: latency[i])
        median = np.median(latency[members])
        print(f"\n{device} batch {batch}: measured over analytical latency, furthest from its median {median:.2f} "
              f"(the RTX 4090's median ratio for the model beside it, where timm measured it)")
        for i in members[:args.extremes] + members[-args.extremes:]:
            other = f"{np.median(rtx4090[ts.records[i].model]):.2f}" if rtx4090[ts.records[i].model] else "-"
            print(f"  {ts.records[i].model:<42} {latency[i]:5.2f}   rtx4090 {other}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
