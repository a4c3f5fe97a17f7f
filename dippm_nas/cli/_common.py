"""What the command groups share: table printing and argument parsing helpers."""

from __future__ import annotations

import argparse
import os

from dippm_nas.errors import DippmError


def format_table(rows: list[list[str]], header: list[str]) -> str:
    """``rows`` under ``header`` as left-aligned text columns, with a rule under the header."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def parse_ints(text: str) -> list[int]:
    """``"1,8,32"`` as ``[1, 8, 32]``; anything else is one clear error."""
    try:
        return [int(v) for v in text.split(",") if v]
    except ValueError:
        raise DippmError(f"cannot read {text!r}: give integers separated by commas, e.g. 1,8,32.") from None


def inputs_of(args: argparse.Namespace) -> object:
    """The model's inputs as ``--input-shape`` or ``--input`` gave them (not both), in the form
    :func:`dippm_nas.predict` takes."""
    if args.input_shape and args.input:
        raise DippmError("give either --input-shape or --input, not both.")
    if args.input_shape is not None:
        return args.input_shape  # "" included: an empty shape is an error, not the model's default
    return ";".join(args.input) if args.input else None


#: ``search_spaces.SEARCH_SPACES``' names, named here so that an argument error imports no torch (a test keeps them
#: equal).
SPACE_NAMES = ("mobilenetv3", "resnet", "vit", "nb201", "timm_zoo")

#: Suffixes of model files: a model argument ending in one that does not exist is answered at once.
MODEL_FILE_SUFFIXES = (".onnx", ".keras", ".h5", ".tflite", ".pdmodel")


def check_model_path(model: str) -> None:
    """A model argument that names a model file which does not exist is an error before anything is imported."""
    suffix = os.path.splitext(model)[1].lower()
    if suffix in MODEL_FILE_SUFFIXES and not os.path.exists(model):
        kind = "ONNX file" if suffix == ".onnx" else "model file"
        raise DippmError(f"no such {kind}: {model}")


def request_of(args: argparse.Namespace):
    """The :class:`~dippm_nas.request.Request` the arguments make, every one checked and resolved once
    (``--calibration`` loaded and checked against the device, precision and mode), before the model is built: the
    command line only builds a request."""
    from dippm_nas.request import Request

    return Request.of(args.device, args.precision, layout=args.layout, mig_margin=args.mig_margin, mode=args.mode,
                      host=args.host, calibration=args.calibration, cost_model=args.cost_model)


def check_model_args(args: argparse.Namespace) -> None:
    """What ``predict`` and ``mig`` can check of the model from the arguments alone, before torch, TVM or timm is
    imported: the batch, the inputs and a model file's existence or name."""
    from dippm_nas.errors import ModelLoadError
    from dippm_nas.inputs import check_batch, normalize_inputs
    from dippm_nas.model_names import check_factory_module, check_timm_name, read_onnx

    check_batch(args.batch)
    normalize_inputs(inputs_of(args))
    check_model_path(args.model)
    if args.model.lower().endswith(".onnx"):
        read_onnx(args.model)  # onnx alone: a file that is no model is answered before torch and TVM load
    arch = args.model.partition(":")[2]
    if "=" in arch or "|" in arch:  # maybe a search space's candidate (whose package imports torch)
        _check_candidate(args.model)
    try:
        check_factory_module(args.model)
    except ModelLoadError:  # no such module: maybe a candidate of an architecture the space does not have
        if args.model.partition(":")[0] in SPACE_NAMES:
            _check_candidate(args.model)
        raise
    check_timm_name(args.model)
    if getattr(args, "top", 0) < 0:
        raise DippmError(f"--top {args.top}: give how many of the slowest operators to list, 1 or more "
                         "(0, the default, lists none).")


def _check_candidate(model: str) -> None:
    """Where ``model`` names a search space's candidate, an architecture the space does not have is said here,
    before TVM loads."""
    from search_spaces import candidate_named, is_candidate_name

    if is_candidate_name(model):
        candidate_named(model)
