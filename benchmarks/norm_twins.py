"""What a model's normalization costs, from twins that differ in it alone.

timm has models whose only difference is the normalization layer: resnet50 and resnet50_gn (batch
norm against group norm), resnetv2_50d and its _gn, _evos (EvoNorm) and _frn (filter response norm)
variants, efficientnet_b0 / b3 and their _gn variants. Under autocast, batch norm runs in half; group
norm is on autocast's float32 list, so its output, the activation after it and the cast back to half
before the next convolution move float32 (EvoNorm and FRN end in float32 through their float32
parameters). The analytical model charges those bytes at the GPU's peak bandwidth.

For every configuration (GPU, PyTorch, layout, image size, batch) where timm measured both twins, this
prints the measured latency ratio (variant over batch-norm twin) beside the analytical model's, and the
variant's measured latency over its analytical one, which is a floor where the bytes are right: a
measurement under it moved fewer bytes than the model charges. Then the harness's measured memory of
the group-norm models beside the analytical peak, which does include their float32 outputs.

Every record is read, test sets of `dippm-nas evaluate` included: it describes the data and chooses
nothing. Which kernels the group-norm models run in NCHW is for a GPU to say: ``--manifest`` writes the
twins' configurations timm measured (fp16, both layouts) for the harness's kernel profile.

    python benchmarks/norm_twins.py
    python benchmarks/norm_twins.py --manifest data/manifests/norm_twins.csv
    python -m dippm_nas.measure --kernels --manifest data/manifests/norm_twins.csv \
        --out data/measurements/kernels/h100.csv
"""

from __future__ import annotations

import argparse
import collections
import sys
import warnings

#: (batch-norm model, variant): the same network, another normalization.
TWINS = (("resnet50", "resnet50_gn"), ("resnetv2_50d", "resnetv2_50d_gn"), ("resnetv2_50d", "resnetv2_50d_evos"),
         ("resnetv2_50d", "resnetv2_50d_frn"), ("efficientnet_b0", "efficientnet_b0_gn"),
         ("efficientnet_b3", "efficientnet_b3_gn"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--manifest", metavar="CSV", help="also write the twins' configurations as a harness manifest")
    parser.add_argument("--kernels", metavar="CSV", help="also compare the twins in this kernel profile "
                        "(python -m dippm_nas.measure --kernels), e.g. data/measurements/kernels/h100.csv")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    from dataclasses import asdict

    from dippm_nas.cost.analytical import AnalyticalCostModel
    from dippm_nas.cost.learned_inputs import record_inputs
    from dippm_nas.cost.table import node_table
    from dippm_nas.graph.batching import scale_batch
    from dippm_nas.training.dataset import load_graphs
    from dippm_nas.training.records import load_records

    names = {name for pair in TWINS for name in pair}
    records = [r for r in load_records() if r.model in names]
    graphs = load_graphs({r.graph_key for r in records})
    model = AnalyticalCostModel()

    def analytical(record):
        """The analytical estimate of a record, as the data set's is made."""
        table = node_table(scale_batch(graphs[record.graph_key], record.batch))
        return record_inputs(table, asdict(record), model).estimate

    def config(record):
        return record.device, record.torch, record.layout, record.image_size, record.batch

    by_config = collections.defaultdict(dict)
    for r in records:
        if r.graph_key in graphs:
            by_config[r.model][config(r)] = r
    print("variant / batch-norm twin, measured against analytical latency; the variant's measured / analytical "
          "latency (under 1: faster than its bytes at peak bandwidth)")
    for base, variant in TWINS:
        shared = sorted(set(by_config[base]) & set(by_config[variant]))
        for key in shared:
            a, b = by_config[base][key], by_config[variant][key]
            measured = b.latency_ms / a.latency_ms
            estimate_b = analytical(b).latency_ms
            predicted = estimate_b / analytical(a).latency_ms
            device, torch_version, layout, size, batch = key
            print(f"  {variant:<20} {device:<8} torch {torch_version:<6} {layout} {size}px batch {batch:<5} measured "
                  f"{measured:4.2f}, analytical {predicted:4.2f}; "
                  f"{variant} measured / analytical {b.latency_ms / estimate_b:4.2f}")
    if args.manifest:
        _write_twins_manifest(by_config, args.manifest)
    harness = [r for r in records if r.memory_mb is not None and "gn" in r.model]
    if harness:
        print("\nthe harness's group-norm models: measured memory against the analytical peak "
              "(float32 outputs included)")
        for r in sorted(harness, key=lambda r: (r.model, r.batch)):
            estimate = analytical(r)
            print(f"  {r.model:<20} {r.device} batch {r.batch:<4} measured {r.memory_mb:8.1f} MiB, analytical "
                  f"{estimate.memory_mib:8.1f} MiB ({r.memory_mb / estimate.memory_mib:4.2f}); "
                  f"latency measured / analytical {r.latency_ms / estimate.latency_ms:4.2f}")
    if args.kernels:
        _compare_profiles(args.kernels, by_config, lambda record: analytical(record).latency_ms)
    return 0


#: ATen operators whose self time the profile comparison names; the rest is summed as "other".
PROFILE_OPERATORS = ("aten::cudnn_convolution", "aten::cudnn_batch_norm", "aten::native_group_norm", "aten::copy_")


def _compare_profiles(path: str, by_config: dict, analytical_ms) -> None:
    """Kernel time per iteration of each twin in the profile, against the analytical model on its GPU."""
    from dataclasses import replace
    from pathlib import Path

    from dippm_nas.training.records import operator_times

    times = operator_times(Path(path))
    print(f"\nkernel profile {path}: variant / batch-norm twin, time in GPU kernels per iteration against the "
          "analytical ratio on that GPU; the variant's kernel time by ATen operator (self time)")
    for base, variant in TWINS:
        for run in sorted((r for r in times if r.model == variant), key=lambda r: (r.image_size, r.layout)):
            twin = next((r for r in times
                         if r.model == base and (r.image_size, r.layout) == (run.image_size, run.layout)), None)
            if twin is None:
                continue
            total = sum(times[run].values())
            ratio = total / sum(times[twin].values())
            estimates = []
            for name in (base, variant):  # a record at this input size, so that its graph is loaded
                record = next(r for r in by_config[name].values() if r.image_size == run.image_size)
                estimates.append(analytical_ms(replace(record, device=run.device, layout=run.layout, batch=run.batch,
                                                       precision=run.precision, torch=run.torch)))
            named = {name: times[run].get(name, 0.0) for name in PROFILE_OPERATORS}
            named["other"] = total - sum(named.values())
            split = ", ".join(f"{name.removeprefix('aten::')} {us / total:4.0%}" for name, us in named.items() if us)
            print(f"  {variant:<20} {run.device:<8} torch {run.torch.split('+')[0]} {run.layout} {run.image_size}px "
                  f"batch {run.batch}  measured {ratio:4.2f} ({total / 1000:6.1f} ms), analytical "
                  f"{estimates[1] / estimates[0]:4.2f}; {split}")


#: The batch of the kernel profile: large enough for the GPU to bind, as in timm's rows.
PROFILE_BATCH = 256


def _write_twins_manifest(by_config: dict, path: str) -> None:
    """Each twin at every input size and layout timm measured both at, fp16, batch PROFILE_BATCH."""
    from dippm_nas.measure.config import MeasureConfig, write_manifest

    configs = {}
    for base, variant in TWINS:
        for _, _, layout, size, _ in set(by_config[base]) & set(by_config[variant]):
            for name in (base, variant):
                record = by_config[name][next(k for k in by_config[name] if k[2:4] == (layout, size))]
                configs[(name, size, layout)] = MeasureConfig(name, (3, size, size), PROFILE_BATCH, "fp16", "timm",
                                                              record.family, layout)
    write_manifest([configs[k] for k in sorted(configs)], path)
    print(f"{len(configs)} configurations written to {path}\n")


if __name__ == "__main__":
    sys.exit(main())
