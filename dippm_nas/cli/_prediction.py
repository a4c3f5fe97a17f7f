"""``dippm-nas predict``, ``mig`` and ``devices``: what a model costs on a GPU, and which GPUs there are."""

from __future__ import annotations

import argparse
import json
import sys

from dippm_nas.cli._common import check_model_args, format_table, inputs_of, request_of

EPILOG = """\
MODEL is a timm model name (resnet50), a path to an .onnx file, 'package.module:factory' (a
callable returning a torch.nn.Module), 'space:architecture' (a search space's candidate as
`dippm-nas measure --space` writes it, e.g. 'nb201:|nor_conv_3x3~0|+|...|'), or 'hf:<model_type>'
(a Hugging Face transformers architecture from its default config, e.g. hf:bert, hf:gpt2; needs
the [transformers] extra).
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


def add_model_args(parser: argparse.ArgumentParser) -> None:
    from dippm_nas.cost_model_names import AUTO, cost_model_names
    from dippm_nas.hardware.mig import DEFAULT_MIG_MARGIN, MAX_MIG_MARGIN
    from dippm_nas.hardware.registry import DEFAULT_DEVICE, DEFAULT_LAYOUT, LAYOUTS
    from dippm_nas.inputs import DEFAULT_BATCH
    from dippm_nas.modes import DEFAULT_MODE, EXECUTION_MODES
    from dippm_nas.precisions import PRECISIONS, precision_help

    parser.add_argument("model", help="timm name, .onnx, .keras, .tflite, SavedModel dir, Paddle .json/.pdmodel, "
                                      "'module:factory', 'space:architecture' or 'hf:<type>'")
    parser.add_argument("--input-shape", metavar="SHAPE",
                        help="one float input's shape without the batch, e.g. 3,224,224 (default: the model's own)")
    parser.add_argument("--input", action="append", metavar="NAME=SHAPE[:DTYPE]", default=[],
                        help="an input by name, repeatable for several inputs, e.g. input_ids=128:int64")
    parser.add_argument("--batch", type=int, default=DEFAULT_BATCH, help=f"batch size (default: {DEFAULT_BATCH})")
    parser.add_argument("--device", default=DEFAULT_DEVICE,
                        help="GPU key from `dippm-nas devices`, or KEY:PROFILE for a MIG slice "
                             f"(default: {DEFAULT_DEVICE})")
    parser.add_argument("--precision", default=None, type=str.lower, choices=list(PRECISIONS),
                        help=f"as PyTorch runs the model: {precision_help()} (default: the model's own, fp32 or, "
                             "for a model whose weights are all half, its half-weights precision)")
    parser.add_argument("--layout", default=DEFAULT_LAYOUT, type=str.lower, choices=list(LAYOUTS),
                        help="memory layout the model runs in: nchw (PyTorch's default) or nhwc "
                             f"(channels_last) (default: {DEFAULT_LAYOUT})")
    parser.add_argument("--cost-model", default=AUTO, choices=list(cost_model_names()),
                        help="auto (the operator model; on a GPU it never learned from, corrected by its residual "
                             "in the regimes where that erred less with each GPU held out: the residual's card; "
                             "the analytical model where the operator model's weights do not match this version; "
                             "the calibrated model with --calibration), operators (each kernel learned from its "
                             "tiles, waves and the spec sheet), residual (the operator model with PMGNS's bounded "
                             "correction, everywhere), analytical (the roofline alone), pmgns (DIPPM's GraphSAGE "
                             "correction of the roofline's total) or calibrated (the operator model fitted to your "
                             f"--calibration) (default: {AUTO})")
    parser.add_argument("--mig-margin", type=float, default=DEFAULT_MIG_MARGIN,
                        help="safety margin on memory when choosing a MIG slice, a fraction from 0 to "
                             f"{MAX_MIG_MARGIN:g} (default: {DEFAULT_MIG_MARGIN})")
    parser.add_argument("--mode", default=DEFAULT_MODE, type=str.lower, choices=list(EXECUTION_MODES),
                        help="how the forward pass is issued: eager (PyTorch's default, each operator from the host), "
                             "cuda-graphs (one replay, no host wait), compile (torch.compile's default: fused "
                             "kernels, channels-last convolutions where Inductor picks them) or compile-cudagraphs "
                             "(torch.compile's reduce-overhead: compile's kernels in one replay) "
                             f"(default: {DEFAULT_MODE})")
    parser.add_argument("--host", default=None, metavar="PROFILE",
                        help="whose CPU issues eager's operators: a host profile of dippm_nas.hosts "
                             "(default: h100-harness, the host of the H100s the harness measured)")
    parser.add_argument("--calibration", default=None, metavar="PROFILE.json",
                        help="a calibration of this GPU, precision and mode from `dippm-nas calibrate` (your own "
                             "measurements): the calibrated operator model answers")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def cmd_predict(args: argparse.Namespace) -> int:
    """``dippm-nas predict``: the arguments are checked before the library's heavy parts are imported."""
    request = request_of(args)
    check_model_args(args)
    from dippm_nas._predict import checked_graph, predict_request

    p = predict_request(checked_graph(args.model, inputs_of(args), args.batch), request)
    operators = p.estimate.top_nodes(args.top) if args.top else []
    if args.json:
        out = p.to_dict()
        if args.top:
            out["top_operators"] = [vars(c) for c in operators]
        print(json.dumps(out, indent=2))
        return 0
    print(format_table(prediction_rows(p), ["", "prediction"]))
    if p.estimate and p.estimate.memory:
        m = p.estimate.memory
        learned = abs(m.total_mib - p.memory_mib) > 0.5  # PMGNS corrected the total, not its parts
        label = f"analytical memory {m.total_mib:.0f} MiB (PMGNS corrects the total)" if learned else "memory"
        print(f"\n{label} = context {m.context_mib:.0f} + weights {m.weights_mib:.0f} + activations "
              f"{m.activations_mib:.0f} + workspace {m.workspace_mib:.0f} + allocator {m.allocator_mib:.0f} "
              f"+ kernels' modules {m.modules_mib:.0f} MiB")
    if operators:
        rows = [[str(c.node), c.op, f"{c.time_ms:.4f}", f"{c.flops / 1e9:.3f}", f"{c.bytes / 2**20:.2f}", c.bound,
                 c.unit] for c in operators]
        print("\n" + format_table(rows, ["node", "operator", "ms", "GFLOPs", "MiB moved", "bound", "unit"]))
    for note in p.notes:
        print(f"note: {note}")
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    from dippm_nas.cost.learned.card import OPERATOR_WEIGHTS, PMGNS_WEIGHTS, load_card
    from dippm_nas.hardware.registry import list_devices, spec_template

    if args.template:
        print(spec_template(), end="")
        return 0
    devices = list_devices()
    measured, pmgns = ((card.gpus_in_training if card else frozenset())
                       for card in (load_card(OPERATOR_WEIGHTS), load_card(PMGNS_WEIGHTS)))
    if args.json:
        print(json.dumps([d.to_dict() | {"operator_model_measured": d.key in measured,
                                         "pmgns_trained_on_records": d.key in pmgns} for d in devices], indent=2))
        return 0
    rows = [[d.key, d.name, str(d.sm_count), f"{d.fp32_tflops:g}", f"{d.fp16_tflops or 0:g}",
             f"{d.memory_gib:g}", f"{d.memory_bw_gbs:g}", f"{d.tdp_w:g}",
             " ".join(p.name for p in d.mig_profiles) or "-", "yours" if d.source else d.verified,
             "measurements" if d.key in measured else "spec sheet"] for d in devices]
    header = ["key", "name", "SMs", "FP32 TF", "FP16 TF", "GiB", "GB/s", "TDP W", "MIG profiles", "verified",
              "model reads"]
    print(format_table(rows, header))
    print("\nA MIG slice is addressed as KEY:PROFILE, e.g. a100-40gb:1g.5gb. Caveats: dippm-nas devices --json. "
          "Your own GPU: dippm-nas devices --template.")
    if measured:
        print("The operator model answers on every GPU: from measurements of its operators where it has them, from "
              "the spec sheet elsewhere (its error on GPUs held out of training: docs/operators.md).")
    return 0


#: How ``mig`` attributes energy to a slice (:func:`~dippm_nas.cost.pipeline.power.slice_energy_note` says it of
#: one slice).
SLICE_ENERGY = ("energy of a slice: the GPU's waiting and busy watts times the slice's share of its SMs, over the "
                "slice's own latency and busy time; slices of the same SMs draw the same watts and differ in joules "
                "by how long they run, which their share of the memory bandwidth sets")


def cmd_mig(args: argparse.Namespace) -> int:
    """``dippm-nas mig``: the arguments, and that the device has MIG, are checked before the heavy imports."""
    request = request_of(args)
    gpu = request.mig_gpu()
    check_model_args(args)
    from dippm_nas._predict import check_max_latency, checked_graph, choose_slice, predict_request, slice_estimates

    bound = None if args.max_latency_ms is None else check_max_latency(args.max_latency_ms)
    graph = checked_graph(args.model, inputs_of(args), args.batch)
    whole = predict_request(graph, request.on(gpu))  # a slice key stands for its GPU
    rows = slice_estimates(graph, request, whole)
    choice = None if bound is None else choose_slice(rows, bound, gpu.key)
    status = 1 if choice is not None and choice.slice is None else 0
    if args.json:
        print(json.dumps({"cost_model": whole.cost_model, "prediction": whole.to_dict(),
                          "profiles": [r.to_dict() for r in rows], "slice_energy": SLICE_ENERGY,
                          **({"choice": choice.to_dict()} if choice else {}),
                          "units": {"usable_mib": "MiB", "memory_mib": "MiB", "latency_ms": "ms per batch",
                                    "energy_j": "J per batch", "energy_j_per_sample": "J per sample"}}, indent=2))
        return status
    fits = "fits" if whole.fits else "does NOT fit"
    print(f"{graph.name} at batch {graph.batch}, {whole.precision}, on {whole.device}: {whole.memory_mib:,.0f} MiB "
          f"predicted ({fits} the whole GPU's {whole.memory_available_mib:,.0f} MiB), smallest fitting profile: "
          f"{whole.mig_profile or 'none'}")
    print(f"cost model, the same for the whole GPU and every slice: {whole.cost_model}\n")
    table = [["whole GPU", str(request.gpu.whole_gpu().sm_count), f"{whole.memory_available_mib:.0f}",
              "yes" if whole.fits else "no", f"{whole.latency_ms:.3f}", f"{whole.energy_j:.4f}",
              f"{whole.energy_j_per_sample:.4g}"]]
    table += [[r.profile, str(r.sm_count), f"{r.usable_mib:.0f}", "yes" if r.fits else "no",
               f"{r.latency_ms:.3f}", f"{r.energy_j:.4f}", f"{r.energy_j_per_sample:.4g}"] for r in rows]
    print(format_table(table, ["profile", "SMs", "usable MiB", "fits", "latency ms/batch", "energy J/batch",
                               "J/sample"]))
    for note in whole.notes:
        print(f"note: {note}")
    print(f"note: {SLICE_ENERGY}")
    if request.gpu.slice_of:
        print(f"note: {args.device} names one slice; mig lists every slice of {whole.device} (`dippm-nas predict "
              f"--device {args.device}` predicts that one alone)")
    if choice is not None:
        print(choice.reason, file=sys.stdout if choice.slice else sys.stderr)
    return status


def prediction_rows(p) -> list[list[str]]:
    """The ``predict`` table of a :class:`~dippm_nas.cost.Prediction`, each number with its unit: on a MIG
    slice, the slice's fit; ``fits: no`` with what it needs where the model does not fit the memory."""
    fits = "yes" if p.fits else (f"no: see the first note ({p.memory_mib:,.0f} MiB predicted, "
                                 f"{p.memory_available_mib:,.0f} MiB on the device)")
    on_slice = ":" in p.device
    mig = (f"{p.mig_profile or 'does not fit'} ({p.mig_reason})" if on_slice
           else f"{p.mig_profile or 'none'} ({p.mig_reason})")
    rows = [
        ["model", p.model], ["device", p.device + (" (a MIG slice)" if on_slice else "")],
        ["precision", p.precision], ["layout", p.layout], ["batch", str(p.batch)],
        ["execution", p.mode + (f" (host {p.host})" if p.host else "")],
        ["latency", f"{p.latency_ms:.3f} ms per batch"],
        ["energy", f"{p.energy_j:.4f} J per batch, {p.energy_j_per_sample:.4g} J per sample"],
        ["memory", f"{p.memory_mib:,.0f} MiB of {p.memory_available_mib:,.0f} MiB"], ["fits", fits],
        ["MIG slice" if on_slice else "MIG profile", mig],
        ["GFLOPs", f"{p.gflops:.2f} per batch"], ["parameters", f"{p.params_m:.2f} M"],
        ["cost model", p.cost_model],
    ]
    if p.latency_error is not None:
        e = p.latency_error
        measured = "rows of the calibration, each left out of its fit" if e.group == "calibration" else \
            "comparable test records"
        rows.append(["latency error", f"{e.mape:.1%} MAPE on {e.records} {measured} (see the last note)"])
    return rows


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``predict``, ``devices`` and ``mig``."""
    p = sub.add_parser("predict", help="latency, energy, memory and MIG slice of one model",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    p.add_argument("--top", type=int, default=0, metavar="N", help="also list the N slowest operators")
    p.set_defaults(func=cmd_predict)
    d = sub.add_parser("devices", help="the GPUs known, their specs and MIG profiles",
                       description="Every GPU of the shipped spec sheet and of your own: rows in CSV files that "
                                   "DIPPM_NAS_DEVICES names (paths separated as in PATH) or in "
                                   "~/.config/dippm-nas/devices/ ($XDG_CONFIG_HOME/dippm-nas/devices/), with the "
                                   "shipped sheet's columns; a MIG table of your GPU is a CSV with "
                                   "mig_profiles.csv's columns beside it.")
    d.add_argument("--json", action="store_true", help="machine-readable output, with caveats")
    d.add_argument("--template", action="store_true",
                   help="print a spec-sheet row to fill in with your GPU's datasheet, e.g. "
                        "`dippm-nas devices --template > ~/.config/dippm-nas/devices/my-gpu.csv`")
    d.set_defaults(func=cmd_devices)
    m = sub.add_parser("mig", help="every MIG profile of a device: does the model fit, how fast there",
                       description="Every MIG profile of the device (a slice key stands for its GPU): whether the "
                                   "model's predicted memory plus the margin fits the slice's usable memory, and its "
                                   "latency and energy there. With --max-latency-ms, also the smallest slice that "
                                   "holds the model and runs it within the bound; the command exits with 1 where no "
                                   "slice does, and says why in one line.")
    add_model_args(m)
    m.add_argument("--max-latency-ms", type=float, default=None, metavar="L",
                   help="choose the smallest slice with latency <= L ms per batch and memory that fits")
    m.set_defaults(func=cmd_mig)
