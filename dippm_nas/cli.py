"""The ``dippm-nas`` command: predict, devices, mig.

Bad input prints one line, ``error: ...``, and exits with status 2; ``--json`` output is for scripts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Sequence

from dippm_nas.errors import DippmError

EXIT_USAGE = 2

_EPILOG = """\
MODEL is a timm model name (resnet50), a path to an .onnx file, 'package.module:factory' (a
callable returning a torch.nn.Module), or 'hf:<model_type>' (a Hugging Face transformers
architecture from its default config, e.g. hf:bert, hf:gpt2; needs the [transformers] extra).
It may also be a Keras .keras/.h5 file, a TensorFlow SavedModel directory or a .tflite file (the
[tensorflow] extra; shapes channels last, e.g. --input-shape 224,224,3), or a Paddle inference
model: its .json/.pdmodel program beside its .pdiparams, or their directory (the [paddle] extra).
No weights are downloaded and nothing runs on a GPU.

examples:
  dippm-nas predict resnet50 --batch 8
  dippm-nas predict vit_base_patch16_224 --device h100-sxm --precision fp16 --json
  dippm-nas predict hf:bert --input input_ids=128:int64 --batch 4
  dippm-nas predict mobilenet_v2.tflite --batch 4
  dippm-nas mig convnext_tiny --batch 32 --device a100-80gb
  dippm-nas devices
"""


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    from dippm_nas.hardware.mig import DEFAULT_MIG_MARGIN
    from dippm_nas.hardware.registry import LAYOUTS, PRECISIONS

    parser.add_argument("model", help="timm name, .onnx, .keras, .tflite, SavedModel dir, Paddle .json/.pdmodel, "
                                      "'module:factory' or 'hf:<type>'")
    parser.add_argument("--input-shape", metavar="SHAPE",
                        help="one float input's shape without the batch, e.g. 3,224,224 (default: the model's own)")
    parser.add_argument("--input", action="append", metavar="NAME=SHAPE[:DTYPE]", default=[],
                        help="an input by name, repeatable for several inputs, e.g. input_ids=128:int64")
    parser.add_argument("--batch", type=int, default=8, help="batch size (default: 8)")
    parser.add_argument("--device", default="a100-40gb",
                        help="GPU key from `dippm-nas devices`, or KEY:PROFILE for a MIG slice (default: a100-40gb)")
    parser.add_argument("--precision", default="fp32", choices=list(PRECISIONS), help="default: fp32")
    parser.add_argument("--layout", default="nchw", choices=list(LAYOUTS),
                        help="memory layout the model runs in: nchw (PyTorch's default) or nhwc "
                             "(channels_last) (default: nchw)")
    parser.add_argument("--cost-model", default="auto", help="auto, analytical (default: auto)")
    parser.add_argument("--mig-margin", type=float, default=DEFAULT_MIG_MARGIN,
                        help=f"safety margin on memory when choosing a MIG slice (default: {DEFAULT_MIG_MARGIN})")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _inputs(args: argparse.Namespace) -> object:
    if args.input_shape and args.input:
        raise DippmError("give either --input-shape or --input, not both.")
    return args.input_shape or (";".join(args.input) if args.input else None)


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def cmd_predict(args: argparse.Namespace) -> int:
    from dippm_nas._predict import checked_graph, predict_graph, slowest_operators

    graph = checked_graph(args.model, _inputs(args), args.batch, args.device, args.precision, args.layout)
    p = predict_graph(graph, args.device, args.precision, cost_model=args.cost_model, mig_margin=args.mig_margin,
                      layout=args.layout)
    operators, timed_by = slowest_operators(graph, p, args.top) if args.top else ([], "")
    if args.json:
        out = p.to_dict()
        if args.top:
            out["top_operators"] = [vars(c) for c in operators]
            out["top_operators_cost_model"] = timed_by
        print(json.dumps(out, indent=2))
        return 0
    rows = [
        ["model", p.model], ["device", p.device], ["precision", p.precision], ["layout", p.layout], ["batch", str(p.batch)],
        ["latency", f"{p.latency_ms:.3f} ms"], ["energy", f"{p.energy_j:.4f} J per batch"],
        ["memory", f"{p.memory_mb:.0f} MiB"],
        ["MIG profile", f"{p.mig_profile or 'none'} ({p.mig_reason})"],
        ["GFLOPs", f"{p.gflops:.2f}"], ["parameters", f"{p.params_m:.2f} M"],
        ["cost model", p.cost_model],
    ]
    print(_table(rows, ["", "prediction"]))
    if p.estimate and p.estimate.memory:
        m = p.estimate.memory
        learned = abs(m.total_mib - p.memory_mb) > 0.5  # PMGNS corrected the total, not its parts
        label = f"analytical memory {m.total_mib:.0f} MiB (PMGNS corrects the total)" if learned else "memory"
        print(f"\n{label} = context {m.context_mib:.0f} + weights {m.weights_mib:.0f} + activations "
              f"{m.activations_mib:.0f} + workspace {m.workspace_mib:.0f} + allocator {m.allocator_mib:.0f} MiB")
    if operators:
        rows = [[str(c.node), c.op, f"{c.time_ms:.4f}", f"{c.flops / 1e9:.3f}", f"{c.bytes / 2**20:.2f}", c.bound]
                for c in operators]
        if timed_by != p.cost_model:
            print(f"\nthe slowest operators as the {timed_by} model times them ({p.cost_model.split(' ')[0]} "
                  "corrects the total, not each operator):", end="")
        print("\n" + _table(rows, ["node", "operator", "ms", "GFLOPs", "MiB moved", "bound"]))
    for note in p.notes:
        print(f"note: {note}")
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    from dippm_nas.hardware.registry import list_devices

    devices = list_devices()
    if args.json:
        print(json.dumps([d.to_dict() for d in devices], indent=2))
        return 0
    rows = [[d.key, d.name, str(d.sm_count), f"{d.fp32_tflops:g}", f"{d.fp16_tflops or 0:g}",
             f"{d.memory_gib:g}", f"{d.memory_bw_gbs:g}", f"{d.tdp_w:g}",
             " ".join(p.name for p in d.mig_profiles) or "-", d.verified] for d in devices]
    print(_table(rows, ["key", "name", "SMs", "FP32 TF", "FP16 TF", "GiB", "GB/s", "TDP W", "MIG profiles", "verified"]))
    print("\nA MIG slice is addressed as KEY:PROFILE, e.g. a100-40gb:1g.5gb. Caveats: dippm-nas devices --json.")
    return 0


def cmd_mig(args: argparse.Namespace) -> int:
    from dippm_nas._predict import build_graph, mig_table, predict_graph

    graph = build_graph(args.model, _inputs(args), args.batch)
    whole = predict_graph(graph, args.device, args.precision, args.cost_model, args.mig_margin, layout=args.layout)
    rows = mig_table(graph, args.device, args.precision, args.cost_model, args.mig_margin, layout=args.layout)
    if args.json:
        print(json.dumps({"prediction": whole.to_dict(), "profiles": [vars(r) for r in rows]}, indent=2))
        return 0
    print(f"{graph.name} at batch {graph.batch}, {args.precision}, on {whole.device}: "
          f"{whole.memory_mb:.0f} MiB predicted, smallest fitting profile: {whole.mig_profile or 'none'}\n")
    print(_table([[r.profile, str(r.sm_count), f"{r.usable_mib:.0f}", "yes" if r.fits else "no",
                   f"{r.latency_ms:.3f}", f"{r.energy_j:.4f}"] for r in rows],
                 ["profile", "SMs", "usable MiB", "fits", "latency ms", "energy J"]))
    return 0


def cmd_manifest(args: argparse.Namespace) -> int:
    from dippm_nas.measure.config import write_manifest
    from dippm_nas.measure.manifest import build_manifest, records_manifest

    batches, precisions = _ints(args.batches), args.precisions.split(",")
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


def cmd_dataset(args: argparse.Namespace) -> int:
    from dippm_nas.training.featurize import DEFAULT_STORE, featurize
    from dippm_nas.training.records import load_records, write_records

    records = load_records()
    write_records(records)
    keys = {r.graph_key for r in records}
    print(f"{len(records)} records ({len({r.device for r in records})} devices) -> data/records.csv; {len(keys)} graphs")
    if args.rebuild:
        from dippm_nas.training.featurize import forget

        dropped = forget(args.rebuild, DEFAULT_STORE)
        print(f"dropped {len(dropped)} stored graphs matching {args.rebuild!r}: {', '.join(dropped) or '-'}")
    if args.featurize or args.rebuild:
        failures = featurize(keys, DEFAULT_STORE, args.jobs, args.retry_failed)
        print(f"{len(keys) - len(failures)} graphs in {DEFAULT_STORE}; {len(failures)} failed "
              f"(listed in {DEFAULT_STORE.with_name('failures.csv')})")
    return 0


def _training_config(args: argparse.Namespace):
    from dippm_nas.training.train import TrainConfig

    try:
        return TrainConfig(epochs=args.epochs, seed=args.seed, patience=args.patience, refit=not args.no_refit,
                           members=args.members)
    except ValueError as error:  # a setting TrainConfig refuses: said before any data is loaded
        raise DippmError(str(error)) from None


def _training_set():
    from dippm_nas.training.dataset import build_training_set
    from dippm_nas.training.records import load_records

    return build_training_set(load_records())


def _shipper(ts):
    """Saves a fitted random-split model as the shipped weights, and says so."""
    from dippm_nas.cost.learned import WEIGHTS
    from dippm_nas.training.ship import save
    from dippm_nas.training.train import final_training_records

    def ship(fitted, split, test, held_out_family=None) -> None:
        trained_on = final_training_records(split, fitted.config)
        extra = {"split": split.description, "test_latency": test, "n_train": len(trained_on), "n_val": len(split.val),
                 "n_test": len(split.test), "data": "data/records.csv (timm benchmarks as published, harness rows)"}
        if held_out_family is not None:  # the same configuration on the family split's test set
            extra["held_out_family_latency"] = held_out_family
        save(fitted, ts, trained_on, WEIGHTS / "pmgns", extra)
        parameters = sum(p.numel() for model in fitted.models for p in model.parameters())
        print(f"PMGNS (GraphSAGE, {len(fitted.models)} members) trained on {len(trained_on)} records, {fitted.epochs_run} "
              f"epochs (chosen by early stopping on validation); test "
              f"latency MAPE {test['mape']:.2%}, Kendall tau {test['tau']:.3f}, within 10 % {test['within10']:.1%}; "
              f"weights {WEIGHTS / 'pmgns.safetensors'} ({parameters:,} parameters), card {WEIGHTS / 'pmgns.json'}")

    return ship


def cmd_train(args: argparse.Namespace) -> int:
    from dippm_nas.training.metrics import summary
    from dippm_nas.training.splits import random_split
    from dippm_nas.training.train import fit_split, predict_targets

    config = _training_config(args)
    ts = _training_set()
    split = random_split(len(ts.records), args.seed)
    fitted = fit_split(ts, split, config, label="sage/random")
    _shipper(ts)(fitted, split, summary(predict_targets(fitted, ts, split.test)[:, 0], ts.targets[split.test, 0]))
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from dippm_nas.training.evaluate import DOCS, evaluate

    config = _training_config(args)
    ts = _training_set()
    results = evaluate(ts, config, args.comparison_epochs, ship=_shipper(ts) if args.ship else None)
    for name, r in results["splits"].items():
        m = r["metrics"]
        print(f"{name:18s} " + "  ".join(f"{k}: MAPE {v['mape']:.1%} tau {v['tau']:.3f} within10 {v['within10']:.1%}"
                                        for k, v in m.items()))
    print(f"report: {DOCS / 'accuracy.md'}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    import optuna

    from dippm_nas.integration.report import write_report

    try:
        study = optuna.load_study(study_name=args.study, storage=args.storage)
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(args.storage)]
        raise DippmError(f"no study {args.study!r} in {args.storage}; studies there: {', '.join(names) or 'none'}.") from None
    summary = write_report(study, args.out, args.png)
    print(f"{summary.path}: {summary.trials} scored trials, {summary.feasible} feasible, "
          f"{len(summary.pareto)} on a Pareto front" + (f"; PNGs in {args.png}" if args.png else ""))
    if args.screenshot:
        from dippm_nas.integration.browser import screenshot

        print(f"screenshot of the page: {screenshot(summary.path, args.screenshot)}")
    return 0


def _ints(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v]
    except ValueError:
        raise DippmError(f"cannot read {text!r}: give integers separated by commas, e.g. 1,8,32.") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dippm-nas",
        description="Predict inference latency, energy, GPU memory and MIG slice of a neural network "
                    "on an NVIDIA GPU, without the GPU.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("predict", help="latency, energy, memory and MIG slice of one model",
                       epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_model_args(p)
    p.add_argument("--top", type=int, default=0, metavar="N", help="also list the N slowest operators")
    p.set_defaults(func=cmd_predict)
    d = sub.add_parser("devices", help="the GPUs known, their specs and MIG profiles")
    d.add_argument("--json", action="store_true", help="machine-readable output, with caveats")
    d.set_defaults(func=cmd_devices)
    m = sub.add_parser("mig", help="every MIG profile of a device: does the model fit, how fast there")
    _add_model_args(m)
    m.set_defaults(func=cmd_mig)
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
    rp = sub.add_parser("report", help="a self-contained HTML report of a study: Pareto fronts, table, history")
    rp.add_argument("--storage", required=True, help="Optuna storage URL, e.g. sqlite:///nas.db or postgresql://...")
    rp.add_argument("--study", required=True, help="study name")
    rp.add_argument("--out", default="report.html", help="HTML file to write (default: report.html)")
    rp.add_argument("--png", default=None, metavar="DIR", help="also write the plots as PNG files into DIR")
    rp.add_argument("--screenshot", default=None, metavar="PNG", help="also a screenshot of the page (headless Chromium)")
    rp.set_defaults(func=cmd_report)
    ds = sub.add_parser("dataset", help="import the measurements into data/records.csv and featurize their models")
    ds.add_argument("--featurize", action="store_true", help="build the graph of every model (resumable, cached)")
    ds.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2)), help="worker processes")
    ds.add_argument("--retry-failed", action="store_true", help="try again the models that failed before")
    ds.add_argument("--rebuild", metavar="PATTERN",
                    help="featurize again the stored graphs whose key matches this glob, e.g. 'timm:sequencer*' "
                         "after a change to how their operators are read")
    ds.set_defaults(func=cmd_dataset)
    training = (
        ("train", "train PMGNS on the data set and ship its weights",
         "Fits PMGNS (GraphSAGE) on the random 70/15/15 split of data/records.csv as `evaluate` does: early "
         "stopping on validation MAPE with a moving average of the weights, then a refit on training + "
         "validation. Writes dippm_nas/cost/weights/pmgns.safetensors and its model card (JSON). Needs "
         "`dippm-nas dataset --featurize` first; about 20 minutes on two cores.", cmd_train),
        ("evaluate", "every split and baseline; writes docs/accuracy.md",
         "Trains PMGNS on every split (random, families held out, RTX 3090 -> 4090 and back), scores it "
         "against the analytical model, a log-linear regression and the paper's GNN variants on the test "
         "records only, and writes docs/accuracy.md, docs/accuracy/results.json and the plots. About 75 "
         "minutes on two cores with nothing else running.", cmd_evaluate),
    )
    for name, helptext, description, func in training:
        t = sub.add_parser(name, help=helptext, description=description)
        t.add_argument("--epochs", type=int, default=60)
        t.add_argument("--patience", type=int, default=10, help="early stopping on validation MAPE")
        t.add_argument("--seed", type=int, default=0)
        t.add_argument("--members", type=int, default=1,
                       help="networks trained from different seeds, predicting together (their geometric mean): "
                            "on validation three gained about one seed's difference over one, and each adds its "
                            "convolutions to every prediction")
        t.add_argument("--no-refit", action="store_true",
                       help="keep the early-stopped model instead of training again on training + validation "
                            "records for the epochs early stopping chose")
        if name == "evaluate":
            t.add_argument("--comparison-epochs", type=int, default=10,
                           help="epochs for the GNN comparison (the paper compared at 10)")
            t.add_argument("--ship", action="store_true",
                           help="also ship the random split's model, exactly what `train` would write")
        t.set_defaults(func=func)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TQDM_DISABLE", "1")
    try:
        return args.func(args)
    except DippmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
