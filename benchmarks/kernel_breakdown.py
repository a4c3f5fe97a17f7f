"""Where a GPU's time goes by kind of operator, against where the analytical model puts it.

The harness's kernel profile (``dippm-nas measure --kernels``) gives every ATen operator's own
time in GPU kernels per iteration. This sums it by the graph's operator categories (convolution,
normalization, activation, elementwise, ...; ``ATEN_CATEGORIES`` says which ATen operator counts as
which, copies and casts apart) and sets each sum beside the analytical model's roofline time of the
graph's operators of that category, for the same model, input size, batch, precision and layout on
the same GPU. A category whose ratio stands far from 1 in every configuration is a kernel the
roofline's peak does not describe; one near 1 is modelled. The whole model's ratio is the GPU's time
in kernels over the analytical latency (which includes the host's issue time where it binds).

It describes the profile and chooses nothing. ``--manifest`` writes what to profile next: one model of
every family among the configurations the harness measured, at the largest batch measured, so that
each profile sits beside a measured latency.

    python benchmarks/kernel_breakdown.py
    python benchmarks/kernel_breakdown.py --kernels data/measurements/kernels/h100.csv
    python benchmarks/kernel_breakdown.py --manifest data/manifests/kernels_per_family.csv
"""

from __future__ import annotations

import argparse
import collections
import csv
import statistics
import sys
import warnings

#: ATen operators (as the profiler names them) by the category of the graph operators they run;
#: the ones missing here count as "other". Copies are casts and layout conversions: the graph has no
#: operator of theirs, the analytical model charges casts inside the operators that need them.
ATEN_CATEGORIES = {
    "conv": ("aten::cudnn_convolution", "aten::_conv_depthwise2d", "aten::slow_conv2d_forward"),
    "matmul": ("aten::addmm", "aten::mm", "aten::bmm"),
    "norm": ("aten::cudnn_batch_norm", "aten::native_batch_norm", "aten::native_group_norm", "aten::native_layer_norm"),
    "activation": ("aten::clamp_min_", "aten::relu_", "aten::relu", "aten::silu_", "aten::silu", "aten::sigmoid",
                   "aten::gelu", "aten::hardswish_", "aten::hardsigmoid_"),
    "elementwise": ("aten::add_", "aten::add", "aten::mul", "aten::mul_", "aten::div", "aten::sub", "aten::square",
                    "aten::pow", "aten::rsqrt", "aten::sqrt", "aten::maximum"),
    "reduce": ("aten::mean", "aten::var", "aten::sum"),
    "pool": ("aten::max_pool2d_with_indices", "aten::avg_pool2d", "aten::adaptive_avg_pool2d"),
    "copy": ("aten::copy_",),
}
SHOWN = ("conv", "matmul", "norm", "activation", "elementwise", "reduce", "pool", "copy", "other")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", default="data/measurements/kernels/h100.csv", metavar="CSV",
                        help="a kernel profile of the harness (default: %(default)s)")
    parser.add_argument("--manifest", metavar="CSV", help="write instead a manifest of one measured model per family "
                        "(from --measured), for the harness's next kernel profile")
    parser.add_argument("--measured", default="data/measurements/h100.csv", metavar="CSV",
                        help="the harness's latency rows --manifest draws from (default: %(default)s)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    if args.manifest:
        _write_per_family_manifest(args.measured, args.manifest)
        return 0

    from pathlib import Path

    from dippm_nas.cost.models.analytical import AnalyticalCostModel
    from dippm_nas.cost.pipeline.table import node_table
    from dippm_nas.graph.batching import scale_batch
    from dippm_nas.hardware import get_device
    from dippm_nas.precisions import PRECISIONS
    from dippm_nas.request import Request, torch_major_minor
    from dippm_nas.training.dataset import load_graphs
    from dippm_nas.training.records import operator_times

    category_of = {name: category for category, names in ATEN_CATEGORIES.items() for name in names}
    times = operator_times(Path(args.kernels))
    graphs = load_graphs({run.graph_key for run in times})
    model = AnalyticalCostModel()
    print(f"{args.kernels}: time in GPU kernels per iteration by category, over the analytical model's roofline "
          "time of that category (measured ms / analytical ms); 'copy' has no analytical counterpart")
    print(f"  {'configuration':<44} {'GPU':<9} {'whole':>6}  " + "  ".join(f"{c:>17}" for c in SHOWN))
    ratios = collections.defaultdict(list)
    for run in sorted(times, key=lambda r: (r.source, r.model, r.input_shape, r.batch, r.precision, r.layout)):
        graph = graphs.get(run.graph_key)
        if graph is None:
            print(f"  {run.model}: no graph in the store (dippm-nas dataset --featurize)")
            continue
        table = node_table(scale_batch(graph, run.batch))
        roofline = model.timed(table, Request(get_device(run.device), PRECISIONS[run.precision], run.layout,
                                              runtime=torch_major_minor(run.torch)))
        analytical_ms = collections.defaultdict(float)
        for node, seconds in zip(graph.nodes, roofline.gpu_s.tolist()):
            analytical_ms[node.category if node.category in SHOWN else "other"] += seconds * 1e3
        measured = collections.defaultdict(float)
        for name, us in times[run].items():
            measured[category_of.get(name, "other")] += us / 1e3
        whole = sum(measured.values()) / (roofline.latency_s * 1e3)
        ratios["whole"].append(whole)
        cells = []
        for category in SHOWN:
            got, expected = measured.get(category, 0.0), analytical_ms.get(category, 0.0)
            if category != "copy" and got and expected:
                ratios[category].append(got / expected)
            cells.append(f"{got:6.2f}/{expected:6.2f}" + (f" {got / expected:4.2f}" if got and expected else "     ")
                         if got or expected else " " * 17)
        label = f"{run.model} {run.input_shape} b{run.batch} {run.precision} {run.layout}"
        print(f"  {label:<44} {run.device:<9} {whole:6.2f}  " + "  ".join(f"{c:>17}" for c in cells))
    print("median measured / analytical over the configurations: " + ", ".join(
        f"{c} {statistics.median(v):.2f} ({len(v)})" for c, v in ratios.items()))
    return 0


def _write_per_family_manifest(measured: str, path: str) -> None:
    """The first model the harness measured of each family (its manifest goes one family at a time), at
    the largest batch it measured without running out of memory, in the same precision and layout."""
    from dippm_nas.measure.config import MeasureConfig, write_manifest

    chosen: dict[str, dict] = {}
    with open(measured, newline="") as handle:
        for row in csv.DictReader(handle):
            if row["status"] != "ok":
                continue
            kept = chosen.setdefault(row["family"], row)
            if kept["model"] == row["model"] and int(row["batch"]) > int(kept["batch"]):
                chosen[row["family"]] = row
    configs = [MeasureConfig(r["model"], tuple(int(d) for d in r["input_shape"].split("x")), int(r["batch"]),
                             r["precision"], r["source"], r["family"], r["layout"]) for r in chosen.values()]
    write_manifest(configs, path)
    print(f"{len(configs)} configurations (one model of each of {len(chosen)} families) written to {path}")


if __name__ == "__main__":
    sys.exit(main())
