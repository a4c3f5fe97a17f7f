"""What the command groups share: table printing and argument parsing helpers."""

from __future__ import annotations

import argparse
import os

from dippm_nas.cost_model_names import CHOICES
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


#: The cost models ``--cost-model`` takes: ``auto`` and every shipped one.
COST_MODELS = CHOICES
#: The largest ``--mig-margin`` the command line takes: 1.0 asks a slice for twice the predicted memory.
MAX_MIG_MARGIN = 1.0
#: Suffixes of model files: a model argument ending in one that does not exist is answered at once.
MODEL_FILE_SUFFIXES = (".onnx", ".keras", ".h5", ".tflite", ".pdmodel")


def check_model_path(model: str) -> None:
    """A model argument that names a model file which does not exist is an error before anything is imported."""
    suffix = os.path.splitext(model)[1].lower()
    if suffix in MODEL_FILE_SUFFIXES and not os.path.exists(model):
        kind = "ONNX file" if suffix == ".onnx" else "model file"
        raise DippmError(f"no such {kind}: {model}")


def check_mig_margin(margin: float) -> float:
    """``--mig-margin`` as a fraction from 0 to :data:`MAX_MIG_MARGIN`, else one clear error."""
    from dippm_nas.hardware.mig import check_mig_margin as check

    check(margin)
    if margin > MAX_MIG_MARGIN:
        raise DippmError(f"--mig-margin {margin:g} asks a MIG slice for {1 + margin:g} times the predicted memory; "
                         f"the margin is a fraction from 0 to {MAX_MIG_MARGIN:g} (0.05, the default, adds 5 %).")
    return margin


def check_model_args(args: argparse.Namespace) -> None:
    """Everything ``predict`` and ``mig`` can check from the arguments alone, before torch, TVM or timm is
    imported: the batch, the device (and MIG profile), the margin, the inputs and a model file's existence."""
    from dippm_nas.hardware.registry import get_device
    from dippm_nas.inputs import check_batch, normalize_inputs
    from dippm_nas.model_names import check_factory_module, check_timm_name, read_onnx

    check_batch(args.batch)
    get_device(args.device)
    check_mig_margin(args.mig_margin)
    normalize_inputs(inputs_of(args))
    check_model_path(args.model)
    if args.model.lower().endswith(".onnx"):
        read_onnx(args.model)  # onnx alone: a file that is no model is answered before torch and TVM load
    arch = args.model.partition(":")[2]
    if "=" in arch or "|" in arch:  # maybe a search space's candidate (whose package imports torch)
        from search_spaces import candidate_named, is_candidate_name

        if is_candidate_name(args.model):
            candidate_named(args.model)  # an architecture the space does not have: said before TVM loads
    check_factory_module(args.model)
    check_timm_name(args.model)
    if getattr(args, "top", 0) < 0:
        raise DippmError(f"--top {args.top}: give how many of the slowest operators to list, 1 or more "
                         "(0, the default, lists none).")
