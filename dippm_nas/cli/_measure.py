"""``dippm-nas manifest`` and ``measure``: the ground-truth harness (torch, timm and nvidia-ml-py only)."""

from __future__ import annotations

import argparse
import os

from dippm_nas.cli._common import parse_ints
from dippm_nas.errors import DippmError


def cmd_manifest(args: argparse.Namespace) -> int:
    from dippm_nas.measure.config import write_manifest
    from dippm_nas.measure.manifest import build_manifest, records_manifest

    batches, precisions = parse_ints(args.batches), args.precisions.split(",")
    if args.from_records:
        if not os.path.exists(args.from_records):
            raise DippmError(f"no records at {args.from_records}; build them with `dippm-nas dataset`.")
        configs = records_manifest(args.from_records, args.seed, args.per_family, batches, precisions)
    else:
        configs = build_manifest(args.seed, args.per_family, batches, precisions)
    write_manifest(configs, args.out)
    models = {c.model for c in configs}
    families = {c.family for c in configs}
    print(f"{len(configs)} configurations of {len(models)} models from {len(families)} timm families -> {args.out}")
    return 0


def cmd_measure(args: argparse.Namespace) -> int:
    from dippm_nas.measure import read_manifest, run

    if not os.path.exists(args.manifest):
        raise DippmError(f"no manifest at {args.manifest}; write one with `dippm-nas manifest --out {args.manifest}`.")
    try:
        run(read_manifest(args.manifest), args.out, args.device, args.budget_s, args.by,
            what="kernels" if args.kernels else "latency")
    except RuntimeError as exc:
        raise DippmError(str(exc)) from exc
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``manifest`` and ``measure``."""
    mf = sub.add_parser("manifest", help="write a seeded list of configurations to measure (timm families)")
    mf.add_argument("--out", required=True, help="manifest CSV to write")
    mf.add_argument("--seed", type=int, default=0)
    mf.add_argument("--per-family", type=int, default=3, help="models per timm family (default: 3)")
    mf.add_argument("--batches", default="1,8,32,128,256", help="default: 1,8,32,128,256")
    mf.add_argument("--precisions", default="fp32,fp16", help="default: fp32,fp16")
    mf.add_argument("--from-records", metavar="CSV", nargs="?", const="data/records.csv", default=None,
                    help="draw the models from the data set's records (default data/records.csv) at the input "
                         "size they were measured at, so their featurized graphs serve the new rows too")
    mf.set_defaults(func=cmd_manifest)
    me = sub.add_parser("measure", help="measure latency, energy and memory on this machine's GPU",
                        description="Runs each configuration of the manifest with random weights and appends "
                                    "a row with its provenance to --out as it finishes; a rerun skips what is "
                                    "already there. Needs only torch, timm and nvidia-ml-py.")
    me.add_argument("--manifest", required=True, help="manifest CSV from `dippm-nas manifest`")
    me.add_argument("--out", required=True, help="CSV to append to, e.g. data/measurements/h100.csv")
    me.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu tests the harness (default: cuda)")
    me.add_argument("--budget-s", type=float, default=None, help="stop cleanly before this many seconds")
    me.add_argument("--by", default="dippm-nas harness", help="who measured, for the provenance")
    me.add_argument("--kernels", action="store_true",
                    help="profile instead (torch.profiler): one row per ATen operator and per GPU kernel with its "
                         "calls and self time per iteration, to a file of its own, e.g. "
                         "data/measurements/kernels/h100.csv (never among the latency rows)")
    me.set_defaults(func=cmd_measure)
