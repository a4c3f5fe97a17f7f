"""``dippm-nas manifest``, ``measure``, ``sweep`` and ``campaign``: the ground-truth harness (torch, timm and
nvidia-ml-py only)."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

from dippm_nas.cli._common import parse_ints
from dippm_nas.errors import DippmError
from dippm_nas.precisions import DEFAULT_PRECISION, PRECISIONS, precision_help
from dippm_nas.user_files import check_writable

#: ``measure.campaign.STEP_NAMES``, named here so that ``--help`` imports no torch (a test keeps them equal).
STEP_NAMES = ("host", "spaces", "compiled", "gemms", "sweep", "models", "kernels")


def cmd_manifest(args: argparse.Namespace) -> int:
    """``dippm-nas manifest``: the arguments are checked before torch and timm are imported."""
    check_writable(args.out, "--out")
    batches, precisions = parse_ints(args.batches), args.precisions.split(",")
    if args.from_records and not os.path.exists(args.from_records):
        raise DippmError(f"no records at {args.from_records}; build them with `dippm-nas dataset`.")
    unknown = sorted(set(precisions) - set(PRECISIONS))
    if unknown:
        raise DippmError(f"--precisions {args.precisions}: unknown {', '.join(unknown)}; give some of "
                         f"{', '.join(PRECISIONS)}, comma-separated.")
    if args.spaces:
        return _spaces_manifest(args, batches, precisions)
    from dippm_nas.measure.config import write_manifest
    from dippm_nas.measure.manifest import build_manifest, records_manifest

    if args.from_records:
        configs = records_manifest(args.from_records, args.seed, args.per_family, batches, precisions)
    else:
        configs = build_manifest(args.seed, args.per_family, batches, precisions)
    write_manifest(configs, args.out)
    models = {c.model for c in configs}
    families = {c.family for c in configs}
    print(f"{len(configs)} configurations of {len(models)} models from {len(families)} timm families -> {args.out}")
    return 0


def _spaces_manifest(args: argparse.Namespace, batches: list[int], precisions: list[str]) -> int:
    """``manifest --spaces``: the spaces and the count are checked before any candidate is built."""
    from search_spaces import get_search_space

    names = [name.strip() for name in args.spaces.split(",") if name.strip()]
    for name in names:
        get_search_space(name)
    if args.per_space < 1:
        raise DippmError(f"--per-space {args.per_space}: give how many candidates of each space, 1 or more.")
    from dippm_nas.measure.config import write_manifest
    from dippm_nas.measure.space import spaces_manifest

    configs = spaces_manifest(names, args.per_space, batches, precisions, args.seed,
                              progress=lambda line: print(line, file=sys.stderr))
    write_manifest(configs, args.out)
    candidates = {(c.source, c.model) for c in configs}
    print(f"{len(configs)} configurations of {len(candidates)} candidates of {len(names)} search spaces -> {args.out}")
    return 0


#: The ten configurations ``measure --quick`` times at each precision, for ``dippm-nas calibrate``: host-bound
#: ones (batch 1 and 8), GEMM-bound ones (ResNet, ViT, Swin at 64 and 256) and bandwidth-bound ones (depthwise
#: MobileNetV3 and EfficientNet at 64 and 256), so that each of the calibration's three scales has rows that
#: depend on it.
QUICK_MANIFEST = Path(__file__).resolve().parents[1] / "measure" / "data" / "calibration_quick.csv"


def cmd_measure(args: argparse.Namespace) -> int:
    """``dippm-nas measure``: a missing manifest is said before torch and timm are imported."""
    if sum((args.quick, args.manifest is not None, args.space is not None)) != 1:
        raise DippmError("give one of --manifest, --quick (the ten configurations a calibration needs) and --space "
                         "(candidates of a search space).")
    check_writable(args.out, "--out")
    what = _measurement(args)
    if args.space is not None:
        if what != "latency":
            raise DippmError("--space times eager rows for `dippm-nas calibrate`; to profile or compile a space's "
                             "candidates, write a manifest with `dippm-nas manifest --spaces NAME` and give it to "
                             "--manifest.")
        return _measure_space(args)
    manifest = QUICK_MANIFEST if args.quick else args.manifest
    if not os.path.exists(manifest):
        raise DippmError(f"no manifest at {manifest}; write one with `dippm-nas manifest --out {manifest}`.")
    from dippm_nas.measure import read_manifest, run

    configs = read_manifest(manifest)
    if args.quick:  # the manifest's configurations of PyTorch's defaults, at the precision asked
        configs = [replace(c, precision=args.precision) for c in configs if c.precision == DEFAULT_PRECISION]
    try:
        run(configs, args.out, args.device, args.budget_s, args.by, what=what)
    except RuntimeError as exc:
        raise DippmError(str(exc)) from exc
    return 0


def _measurement(args: argparse.Namespace) -> str:
    """Which rows ``measure`` takes: latency (eager), kernels (a profile) or compiled (eager and compiled)."""
    if args.kernels and args.mode == "compile":
        raise DippmError("give --kernels or --mode compile, not both: each writes rows of its own kind to a file of "
                         "its own.")
    return "kernels" if args.kernels else "compiled" if args.mode == "compile" else "latency"


def _measure_space(args: argparse.Namespace) -> int:
    """``measure --space``: the space, the count and the batch are checked before anything is measured."""
    from search_spaces import get_search_space

    space = get_search_space(args.space)
    batches = parse_ints(args.batch)
    if args.n < 1 or not batches or min(batches) < 1:
        raise DippmError(f"--n {args.n} --batch {args.batch}: give how many candidates to measure and their batch "
                         "(or batches, comma-separated), each 1 or more (about ten rows calibrate best).")
    from dippm_nas.measure.space import measure_space

    try:
        measure_space(space, args.out, args.n, batches, args.precision, args.device, args.seed, args.budget_s,
                      args.by)
    except RuntimeError as exc:
        raise DippmError(str(exc)) from exc
    print(f"calibrate with: dippm-nas calibrate {args.out} --device YOUR_GPU --out YOUR_GPU.json")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``manifest`` and ``measure``."""
    mf = sub.add_parser("manifest", help="write a seeded list of configurations to measure (timm families or "
                                         "search-space candidates)")
    mf.add_argument("--out", required=True, help="manifest CSV to write")
    mf.add_argument("--seed", type=int, default=0)
    mf.add_argument("--per-family", type=int, default=3, help="models per timm family (default: 3)")
    mf.add_argument("--batches", default="1,8,32,128,256", help="default: 1,8,32,128,256")
    mf.add_argument("--precisions", default="fp32,fp16",
                    help=f"comma-separated, of {', '.join(PRECISIONS)} (default: fp32,fp16)")
    mf.add_argument("--from-records", metavar="CSV", nargs="?", const="data/records.csv", default=None,
                    help="draw the models from the data set's records (default data/records.csv) at the input "
                         "size they were measured at, so their featurized graphs serve the new rows too")
    mf.add_argument("--spaces", default=None, metavar="NAMES",
                    help="instead of timm's families: --per-space candidates of each of these search spaces "
                         "(comma-separated, e.g. mobilenetv3,resnet,vit,nb201), their smallest, their largest and "
                         "the rest spread over FLOPs, every one at every batch and precision, ordered so that a run "
                         "cut short spans candidates, settings and spaces")
    mf.add_argument("--per-space", type=int, default=8, help="with --spaces: candidates of each (default: 8)")
    mf.set_defaults(func=cmd_manifest)
    me = sub.add_parser("measure", help="measure latency, energy and memory on this machine's GPU",
                        description="Runs each configuration of the manifest with random weights and appends "
                                    "a row with its provenance to --out as it finishes; a rerun skips what is "
                                    "already there. Needs only torch, timm and nvidia-ml-py.")
    me.add_argument("--manifest", default=None, help="manifest CSV from `dippm-nas manifest`")
    me.add_argument("--quick", action="store_true",
                    help="instead of --manifest: the ten configurations (timm models at batch 1 to 256) that "
                         "`dippm-nas calibrate` fits a GPU and its host best with, a few minutes")
    me.add_argument("--space", default=None, metavar="NAME",
                    help="instead of --manifest: --n candidates of this search space (e.g. nb201, mobilenetv3; an "
                         "unknown name lists them) that span it, its smallest and largest and the rest spread over "
                         "predicted latency, each row naming its candidate as space:architecture; `dippm-nas "
                         "calibrate` fits your GPU to them")
    me.add_argument("--n", type=int, default=10, help="with --space: how many candidates (default: 10)")
    me.add_argument("--batch", default="64",
                    help="with --space: their batch size, or sizes comma-separated (each candidate at each: "
                         "--n 5 --batch 1,64 measures ten rows, and batch 1's tell the host's time from the "
                         "kernels'; default: 64)")
    me.add_argument("--seed", type=int, default=0, help="with --space: the draw of candidates (default: 0); rerun "
                                                          "with it to resume")
    me.add_argument("--precision", default=DEFAULT_PRECISION, type=str.lower, choices=list(PRECISIONS),
                    help=f"with --quick or --space: the precision to measure, the one the calibration is for: "
                         f"{precision_help()} (default: {DEFAULT_PRECISION})")
    me.add_argument("--out", required=True, help="CSV to append to, e.g. data/measurements/h100.csv")
    me.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu tests the harness (default: cuda)")
    me.add_argument("--budget-s", type=float, default=None, help="stop cleanly before this many seconds")
    me.add_argument("--by", default="dippm-nas harness", help="who measured, for the provenance")
    me.add_argument("--kernels", action="store_true",
                    help="profile instead (torch.profiler): one row per ATen operator and per GPU kernel with its "
                         "calls and self time per iteration, to a file of its own, e.g. "
                         "data/measurements/kernels/h100.csv (never among the latency rows)")
    me.add_argument("--mode", default="eager", choices=["eager", "compile"],
                    help="compile: time each configuration eager and then as torch.compile(model) (default backend "
                         "and mode), with its compile time apart, one row each to a file of its own, e.g. "
                         "data/measurements/compiled/h100.csv (never among the latency rows; default: eager)")
    me.set_defaults(func=cmd_measure)
    sw = sub.add_parser(
        "sweep", help="time single operators over a seeded sample of shapes and precisions (cost-model data)",
        description="Times single operators (GEMM, batched GEMM, conv2d, attention, normalisations, elementwise, "
                    "reductions, pooling) over a seeded, stratified sample of the shapes real models give them, "
                    f"each at every precision ({', '.join(PRECISIONS)}), and appends one row per "
                    "point with its FLOPs, bytes and provenance: the ground truth of a per-operator cost model. "
                    "The order is round-robin over operators and precisions, so a run cut short still covers them "
                    "all; a rerun with the same --seed skips the points already in --out. Needs only torch, timm "
                    "and nvidia-ml-py.")
    sw.add_argument("--out", required=True,
                    help="CSV of its own to append to, e.g. data/measurements/sweeps/h100.csv (never among the model "
                         "rows of data/measurements/*.csv)")
    sw.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu tests the sweep (default: cuda)")
    sw.add_argument("--budget-s", type=float, default=None, help="stop cleanly before this many seconds")
    sw.add_argument("--seed", type=int, default=0, help="the sample of shapes (default: 0); rerun with it to resume")
    sw.add_argument("--by", default="dippm-nas harness", help="who measured, for the provenance")
    sw.add_argument("--points", default=None, metavar="PLAN.csv",
                    help="instead of the seeded sample: the points this CSV's key column lists, in its order (e.g. "
                         "data/manifests/vidur_gemms.csv, Vidur's LLM GEMMs); its rows leave seed empty")
    sw.add_argument("--limit", type=int, default=None, help=argparse.SUPPRESS)  # tests: stop after this many points
    sw.set_defaults(func=cmd_sweep)
    ca = sub.add_parser(
        "campaign", help="spend a few minutes of a GPU on every kind of ground truth, resumably",
        description="One command for a session on a GPU: the host's per-operator cost, the search spaces' "
                    "candidates, Vidur's LLM GEMMs at fp16-weights, an operator sweep, the model "
                    "manifest (fp32, fp16 and fp16-weights at batch 1, 8, 64, 256 first, then bf16, bf16-weights and "
                    "fp32-strict; the data set's "
                    "least-measured families first) and kernel profiles, each step given its share of the time "
                    "left when it starts, each appending to a file of its own under --out-dir and resuming where "
                    "the last session stopped. --plan prints the time split without measuring. Needs only torch, "
                    "timm and nvidia-ml-py.")
    ca.add_argument("--out-dir", default="data/measurements", help="where the files go (default: data/measurements)")
    ca.add_argument("--budget-s", type=float, required=True,
                    help="the whole campaign's seconds: the time you have the GPU for, less a margin (e.g. 540 of "
                         "ten minutes)")
    ca.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu tests the campaign (default: cuda)")
    ca.add_argument("--manifest", default=None,
                    help="model configurations to measure (default: drawn from --records, see above)")
    ca.add_argument("--records", default="data/records.csv", help="the data set the default manifest draws from")
    ca.add_argument("--kernels-manifest", default="data/manifests/kernels_per_family.csv",
                    help="configurations to profile in the last step ('' for none)")
    ca.add_argument("--spaces-manifest", default="data/manifests/spaces.csv",
                    help="the search spaces' candidates of the spaces step, from `dippm-nas manifest --spaces` "
                         "('' for none)")
    ca.add_argument("--gemms-plan", default="data/manifests/vidur_gemms.csv",
                    help="the sweep points of the gemms step, from `python benchmarks/vidur_gemms.py --plan` "
                         "('' for none)")
    ca.add_argument("--seed", type=int, default=0, help="the sweep's and the manifest's seed (default: 0)")
    ca.add_argument("--by", default="dippm-nas harness", help="who measured, for the provenance")
    ca.add_argument("--steps", default=",".join(STEP_NAMES),
                    help="the steps to run, comma-separated, in the plan's order whatever the order given; the last "
                         f"takes all the time left (default: {','.join(STEP_NAMES)}). One step per call runs each "
                         "in a process of its own, so a broken CUDA context ends that step alone")
    ca.add_argument("--plan", action="store_true", help="print the plan for --budget-s and stop")
    ca.set_defaults(func=cmd_campaign)


def cmd_sweep(args: argparse.Namespace) -> int:
    """``dippm-nas sweep``: a missing GPU or a file of other rows is a one-line error, not a traceback."""
    check_writable(args.out, "--out")
    from dippm_nas.measure.sweep import read_points, run_sweep

    points = read_points(args.points) if args.points else None
    try:
        run_sweep(args.out, args.device, args.budget_s, args.seed, args.by, limit=args.limit, points=points)
    except RuntimeError as exc:
        raise DippmError(str(exc)) from exc
    return 0


def cmd_campaign(args: argparse.Namespace) -> int:
    """``dippm-nas campaign``: the plan, then each step within its share of the budget."""
    if args.budget_s <= 0:
        raise DippmError(f"--budget-s {args.budget_s:g}: give the seconds the campaign may take, e.g. 540.")
    steps = [name.strip() for name in args.steps.split(",") if name.strip()]
    unknown = [name for name in steps if name not in STEP_NAMES]
    if unknown or not steps:
        raise DippmError(f"--steps {args.steps!r}: {'unknown step ' + ', '.join(unknown) if unknown else 'no step'}; "
                         f"name one or more of {', '.join(STEP_NAMES)}, comma-separated.")
    from dippm_nas.measure.campaign import describe_plan, run_campaign
    from dippm_nas.measure.config import read_manifest

    if args.plan:
        print("\n".join(describe_plan(args.budget_s, steps)))
        return 0
    for path in (args.manifest, args.kernels_manifest or None, args.spaces_manifest or None):
        if path and not os.path.exists(path):
            raise DippmError(f"no manifest at {path}; write one with `dippm-nas manifest --out {path}`.")
    if args.gemms_plan and not os.path.exists(args.gemms_plan):
        raise DippmError(f"no plan of points at {args.gemms_plan}; write it with "
                         f"`python benchmarks/vidur_gemms.py --plan {args.gemms_plan}`.")
    if args.manifest is None and not os.path.exists(args.records):
        raise DippmError(f"no records at {args.records} to draw the models from; give --manifest or --records.")
    try:
        run_campaign(args.out_dir, args.budget_s, args.device,
                     manifest=read_manifest(args.manifest) if args.manifest else None, records_csv=args.records,
                     kernels_manifest=args.kernels_manifest or None, seed=args.seed, measured_by=args.by,
                     steps=steps, spaces_manifest=args.spaces_manifest or None, gemms_plan=args.gemms_plan or None)
    except RuntimeError as exc:
        raise DippmError(str(exc)) from exc
    return 0
