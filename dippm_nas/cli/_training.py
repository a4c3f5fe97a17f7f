"""``dippm-nas dataset``, ``train``, ``evaluate`` and ``calibrate``: the learned models' data, training,
accuracy, and their fit to a user's own measurements.

They read and write a project directory (``--project``, default: the current directory), never the
installed package's, except that ``train`` and ``evaluate --ship`` write the shipped weights.
"""

from __future__ import annotations

import argparse
import importlib
import os
from pathlib import Path

from dippm_nas.errors import DippmError
from dippm_nas.user_files import check_writable


def cmd_dataset(args: argparse.Namespace) -> int:
    """Import the project's measurements into its records; featurize their models when asked."""
    from dippm_nas.training.featurize import featurize, forget
    from dippm_nas.training.records import load_records, write_records

    paths = _project(args)
    records = load_records()
    write_records(records)
    keys = {r.graph_key for r in records}
    print(f"{len(records)} records ({len({r.device for r in records})} devices) -> {paths.records}; "
          f"{len(keys)} graphs")
    store = paths.graph_store
    if args.rebuild:
        dropped = forget(args.rebuild, store)
        print(f"dropped {len(dropped)} stored graphs matching {args.rebuild!r}: {', '.join(dropped) or '-'}")
    if args.featurize or args.rebuild:
        failures = featurize(keys, store, args.jobs, args.retry_failed)
        print(f"{len(keys) - len(failures)} graphs in {store}; {len(failures)} failed "
              f"(listed in {store.with_name('failures.csv')})")
    return 0


def _project(args: argparse.Namespace):
    """The project directory the command works in (``--project``, else ``$DIPPM_NAS_PROJECT`` or the
    current directory); one without a data set is an error that says what to do."""
    from dippm_nas.training.paths import PROJECT_ENV, project

    if args.project:
        os.environ[PROJECT_ENV] = os.path.abspath(args.project)
    paths = project()
    if not (paths.timm_benchmarks.is_dir() or paths.measurements.is_dir()):
        raise DippmError(f"{paths.root} has no data set (data/timm or data/measurements); run this in a dippm-nas "
                         "checkout or pass --project DIR.")
    return paths


def _training_config(args: argparse.Namespace):
    """The training settings the arguments ask for, checked before any data is loaded."""
    from dippm_nas.training.train import TrainConfig

    try:
        return TrainConfig(epochs=args.epochs, seed=args.seed, patience=args.patience, refit=not args.no_refit,
                           members=args.members)
    except ValueError as error:  # a setting TrainConfig refuses: said before any data is loaded
        raise DippmError(str(error)) from None


def _training_set(args: argparse.Namespace):
    """The project's records with their graphs and analytical estimates, ready to train on."""
    from dippm_nas.training.dataset import build_training_set
    from dippm_nas.training.records import load_records

    _project(args)
    return build_training_set(load_records())


def _shipper(ts):
    """Saves a fitted random-split model as the shipped weights, and says so."""
    from dippm_nas.cost.learned.card import PMGNS_WEIGHTS
    from dippm_nas.training.ship import save
    from dippm_nas.training.train import final_training_records

    def ship(fitted, split, test, held_out_family=None) -> None:
        trained_on = final_training_records(split, fitted.config)
        extra = {"split": split.description, "test_latency": test, "n_train": len(trained_on), "n_val": len(split.val),
                 "n_test": len(split.test), "data": "data/records.csv (timm benchmarks as published, harness rows)"}
        if held_out_family is not None:  # the same configuration on the family split's test set
            extra["held_out_family_latency"] = held_out_family
        save(fitted, ts, trained_on, PMGNS_WEIGHTS, extra)
        parameters = sum(p.numel() for model in fitted.models for p in model.parameters())
        print(f"PMGNS (GraphSAGE, {len(fitted.models)} members) trained on {len(trained_on)} records, "
              f"{fitted.epochs_run} "
              f"epochs (chosen by early stopping on validation); test "
              f"latency MAPE {test['mape']:.2%}, Kendall tau {test['tau']:.3f}, within 10 % {test['within10']:.1%}; "
              f"weights {PMGNS_WEIGHTS}.safetensors ({parameters:,} parameters), card {PMGNS_WEIGHTS}.json")

    return ship


def _operator_data(args: argparse.Namespace):
    """The project's operator samples and the whole-model records the operator model trains on."""
    from dippm_nas.training.operator_data import load_operator_samples
    from dippm_nas.training.operator_records import record_set, training_records
    from dippm_nas.training.records import load_records

    _project(args)
    return load_operator_samples(), record_set(training_records(load_records(), args.seed))


def cmd_train_operators(args: argparse.Namespace) -> int:
    """Fit the operator model on every operator sample and training record, and ship it."""
    from dippm_nas.cost.learned.card import OPERATOR_WEIGHTS
    from dippm_nas.cost.models import forget_loaded
    from dippm_nas.training.operator_training import OperatorTraining, fit

    samples, records = _operator_data(args)
    model = fit(samples, records, OperatorTraining(seed=args.seed))
    model.save(OPERATOR_WEIGHTS)
    forget_loaded()
    print(f"operator model trained on {len(samples)} operators of {len(set(samples.gpu))} GPUs and {len(records)} "
          f"records: {OPERATOR_WEIGHTS}.safetensors, card {OPERATOR_WEIGHTS}.json")
    return 0


def cmd_evaluate_operators(args: argparse.Namespace) -> int:
    """Each GPU of the operator data held out, and NeuSight's transformers: docs/operators.md."""
    from dippm_nas.training.operator_report import OperatorFigures, transformer_figures, write_operator_report
    from dippm_nas.training.operator_training import OperatorTraining, leave_one_gpu_out
    from dippm_nas.training.paths import project

    samples, records = _operator_data(args)
    held_out = leave_one_gpu_out(samples, records, OperatorTraining(seed=args.seed))
    print(f"report: {write_operator_report(OperatorFigures.of(held_out), transformer_figures(), project().docs)}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """Fit PMGNS on the random split and ship it (or, with ``--operators``, the operator model; with
    ``--reference-graphs``, write the graphs the learned models' contract is checked on)."""
    if args.reference_graphs:
        from dippm_nas.training.ship import write_reference_graphs

        print(f"reference graphs of the learned models' contract: {write_reference_graphs()}")
        return 0
    if args.operators:
        return cmd_train_operators(args)
    from dippm_nas.training.metrics import summary
    from dippm_nas.training.splits import random_split
    from dippm_nas.training.train import fit_split, predict_targets

    config = _training_config(args)
    ts = _training_set(args)
    split = random_split(len(ts.records), args.seed)
    fitted = fit_split(ts, split, config, label="sage/random")
    _shipper(ts)(fitted, split, summary(predict_targets(fitted, ts, split.test)[:, 0], ts.targets[split.test, 0]))
    return 0


#: The checks against measured data from outside the project that take no options, by their ``evaluate`` flag.
CHECK_REPORTS = {"compiled": "dippm_nas.training.compile_report", "mig": "dippm_nas.training.mig_report"}


def cmd_evaluate(args: argparse.Namespace) -> int:
    """Every split and baseline, rendered into the project's ``docs/accuracy.md``."""
    from dippm_nas.training.accuracy_report import write_report
    from dippm_nas.training.evaluate import evaluate
    from dippm_nas.training.paths import project

    for flag, module in CHECK_REPORTS.items():
        if getattr(args, flag):
            _project(args)
            print(f"report: {importlib.import_module(module).run()}")
            return 0
    if args.calibration:
        from dippm_nas.training.calibration_check import run

        _project(args)
        print(f"report: {run(args.nas_candidates)}")
        return 0
    if args.nas:
        from dippm_nas.training.nas_report import CALIBRATION_ROWS, run

        _project(args)
        if args.nas_candidates < 2 * CALIBRATION_ROWS:
            raise DippmError(f"--nas-candidates {args.nas_candidates}: give {2 * CALIBRATION_ROWS} or more, "
                             f"{CALIBRATION_ROWS} of which calibrate.")
        print(f"report: {run(args.nas_candidates, args.seed)}")
        return 0
    config = _training_config(args)
    if args.operators:
        return cmd_evaluate_operators(args)
    if args.leave_one_gpu_out:
        return _leave_one_gpu_out(args, config)
    ts = _training_set(args)
    evaluation = evaluate(ts, config, args.comparison_epochs, ship=_shipper(ts) if args.ship else None)
    report = write_report(evaluation, ts, project().docs)
    if args.ship:  # the shipped model's error figures, from the same run's test predictions
        _write_error_table()
    for name, r in evaluation.results["splits"].items():
        m = r["metrics"]
        print(f"{name:18s} " + "  ".join(f"{k}: MAPE {v['mape']:.1%} tau {v['tau']:.3f} within10 {v['within10']:.1%}"
                                        for k, v in m.items()))
    print(f"report: {report}")
    return 0


def _leave_one_gpu_out(args: argparse.Namespace, config) -> int:
    """Each GPU held out in turn, rendered into the project's ``docs/transfer.md``."""
    from dippm_nas.training.accuracy_report import write_transfer_report
    from dippm_nas.training.paths import project
    from dippm_nas.training.transfer import TRANSFER_MODELS, evaluate_transfer

    models = tuple(m for m in args.models.split(",") if m)
    unknown = sorted(set(models) - set(TRANSFER_MODELS))
    if unknown or not models:
        raise DippmError(f"--models {args.models!r}: give some of {', '.join(TRANSFER_MODELS)}, comma-separated.")
    ts = _training_set(args)
    gpus = [g for g in args.gpus.split(",") if g] if args.gpus else None
    missing = sorted(set(gpus or ()) - set(ts.devices))
    if missing:
        raise DippmError(f"no record of {', '.join(missing)} in the data set; GPUs with records: "
                         f"{', '.join(sorted(set(ts.devices)))}.")
    result = evaluate_transfer(ts, config, gpus, models,
                               operator_data=_operator_data(args) if "operators" in models else None)
    print(f"report: {write_transfer_report(result, ts, project().docs)}")
    if args.ship:
        _write_error_table()
        if {"operators", "residual"} <= set(models):
            from dippm_nas.training.residual_training import residual_regimes, ship_residual

            regimes = residual_regimes(result.summary())
            for r in regimes:
                print(f"the residual applies at {r['precision']}, batch {r['batch_min']}-{r['batch_max']} "
                      f"({', '.join(r['gpus'])})")
            print(f"residual card: {ship_residual(result.held_out_estimates, regimes, args.seed)}")
    return 0


def _write_error_table() -> None:
    """Rebuild the shipped error table from the evaluation's and the leave-one-GPU-out run's predictions."""
    from dippm_nas.training.held_out_errors import write_error_table
    from dippm_nas.training.paths import project

    print(f"error table: {write_error_table(project().docs / 'accuracy' / 'predictions.csv')}")


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Read the rows, fit, report and write the calibration; the file and device are checked first."""
    from dippm_nas.hardware.registry import get_device
    from dippm_nas.training.calibration_fit import (
        calibrate,
        mode_of_rows,
        precision_of_rows,
        read_rows,
        report,
    )

    gpu = get_device(args.device)
    if gpu.slice_of:
        raise DippmError(f"calibrate the whole GPU ({gpu.whole_gpu().key}): its calibration serves its MIG slices "
                         "too.")
    out = check_writable(args.out, "--out")
    rows = read_rows(args.measurements, args.mode)
    source = Path(args.measurements).name
    precision = args.precision or precision_of_rows(rows, source)
    mode = args.mode or mode_of_rows(rows, source)
    calibration = calibrate(rows, gpu.key, precision, mode, source, cpu_rows=args.cpu_rows)
    print(report(calibration))
    calibration.save(out)
    print(f"calibration of {gpu.key} ({precision}, {mode}) written to {out}; predict with "
          f"--calibration {out}")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``dataset``, ``train``, ``evaluate`` and ``calibrate``."""
    from dippm_nas.hardware.registry import PRECISIONS
    from dippm_nas.modes import EXECUTION_MODES

    ds = sub.add_parser("dataset", help="import the measurements into data/records.csv and featurize their models")
    ds.add_argument("--project", metavar="DIR", help="the project directory (default: the current one)")
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
         "validation. Writes dippm_nas/cost/learned/weights/pmgns.safetensors and its model card (JSON). Needs "
         "`dippm-nas dataset --featurize` first; about 20 minutes on two cores.", cmd_train),
        ("evaluate", "every split and baseline; writes docs/accuracy.md",
         "Trains PMGNS on every split (random, families held out, RTX 3090 -> 4090 and back), scores it "
         "against the analytical model, a log-linear regression and the paper's GNN variants on the test "
         "records only, and writes docs/accuracy.md, docs/accuracy/results.json and the plots. About 75 "
         "minutes on two cores with nothing else running.", cmd_evaluate),
    )
    for name, helptext, description, func in training:
        t = sub.add_parser(name, help=helptext, description=description)
        t.add_argument("--project", metavar="DIR", help="the project directory (default: the current one)")
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
        t.add_argument("--operators", action="store_true",
                       help="the operator model instead of PMGNS: trained on NeuSight's operator corpus, the "
                            "operator sweeps and whole-model records; `evaluate --operators` holds each GPU of the "
                            "operator data out in turn and predicts NeuSight's transformers (docs/operators.md)")
        if name == "train":
            t.add_argument("--reference-graphs", action="store_true",
                           help="instead: build the graphs the learned models' cards check their inputs on (resnet18, "
                                "mobilenetv3_small_100, deit_tiny_patch16_224 at batch 1) and write them beside the "
                                "weights (reference_graphs.json); nothing is trained")
        if name == "evaluate":
            t.add_argument("--comparison-epochs", type=int, default=10,
                           help="epochs for the GNN comparison (the paper compared at 10)")
            t.add_argument("--ship", action="store_true",
                           help="also ship the random split's model, exactly what `train` would write, and "
                                "rebuild the error table predictions cite (with --leave-one-gpu-out: the table, from "
                                "this run's held-out predictions, and the residual with the regimes it applies in)")
            t.add_argument("--leave-one-gpu-out", action="store_true",
                           help="instead: hold each GPU out in turn (train without its records, test on all of "
                                "them) and write docs/transfer.md")
            t.add_argument("--models", default="analytical,operators,residual,pmgns",
                           help="with --leave-one-gpu-out: the models to score (default: analytical,operators,"
                                "residual,pmgns; the operator model trains once per chip, the others once per GPU)")
            t.add_argument("--gpus", default="", help="with --leave-one-gpu-out: only these GPUs, comma-separated")
            t.add_argument("--nas", action="store_true",
                           help="instead: NAS candidates of NAS-Bench-201 and OFA MobileNetV3 against HELP's latencies "
                                "(data/help), zero-shot and after a calibration on ten of them; writes docs/nas.md")
            t.add_argument("--nas-candidates", type=int, default=100, metavar="N",
                           help="with --nas or --calibration: candidates drawn from each space (default: 100)")
            t.add_argument("--calibration", action="store_true",
                           help="instead: on every GPU of timm's and HELP's data, calibrate on ten rows and predict "
                                "the others with and without it (an operator model that never saw the GPU); writes "
                                "docs/calibration.md")
            t.add_argument("--mig", action="store_true",
                           help="instead: every row of MIGPerf's measured MIG slices of an A100-40GB (data/mig) "
                                "predicted on its slice: the error per slice and batch range, each slice against "
                                "7g.40gb, memory per slice and a plot; writes docs/mig.md (a few minutes)")
            t.add_argument("--compiled", action="store_true",
                           help="instead: timm's compiled runs of an RTX 4090 (data/timm_compiled) predicted with "
                                "mode compile, and the eager / compiled ratio against the eager runs of the same "
                                "PyTorch version; writes docs/compile.md")
        t.set_defaults(func=func)
    c = sub.add_parser("calibrate", help="fit the cost model to your own measurements of a GPU and its host",
                       description="Fit up to three scales of one GPU and its host (GEMM-class kernels, the other "
                                   "kernels, the host's time to issue an operator) to measured latencies, as many as "
                                   "the rows can tell apart (they choose by the leave-one-out error); where rows "
                                   "measured energy, the GPU's idle and busy power; where they measured memory, what "
                                   "the process holds outside PyTorch's allocator and a factor on the allocator's "
                                   "reserve; print each row before and after "
                                   "and the leave-one-out errors, and write a calibration that predict, mig and "
                                   "HardwareCostModel take (--calibration). About ten rows spread over batch sizes "
                                   "and models calibrate best.")
    c.add_argument("measurements", metavar="MEASUREMENTS.csv",
                   help="the harness's CSV (dippm-nas measure) or one with columns model,batch,latency_ms (and "
                        "optionally input_size,precision,mode,energy_j,memory_mib: joules for the whole batch, the "
                        "process's peak GPU memory as nvidia-smi shows it); a model is anything predict takes")
    c.add_argument("--device", required=True, help="the GPU measured, a key of `dippm-nas devices`")
    c.add_argument("--precision", default=None, type=str.lower, choices=list(PRECISIONS),
                   help="calibrate the rows of this precision, leaving the others out (default: the precision the "
                        "rows say, fp32 where they say none; a file of several asks you to choose)")
    c.add_argument("--mode", default=None, type=str.lower, choices=list(EXECUTION_MODES),
                   help="calibrate the rows of this execution mode (default: the mode the rows say, eager where "
                        "they say none); cuda-graphs reads the harness's CUDA-graph latencies, compile and "
                        "compile-cudagraphs its compiled rows (measure --mode compile)")
    c.add_argument("--out", required=True, metavar="PROFILE.json", help="the calibration file to write")
    c.add_argument("--cpu-rows", action="store_true",
                   help="fit rows measured on the CPU too (measure --device cpu), which are otherwise left out: to try "
                        "the commands without a GPU; such a calibration says nothing of the GPU")
    c.set_defaults(func=cmd_calibrate)
