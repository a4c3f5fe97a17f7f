"""Input specs: the shape and dtype of each model input, without the batch dimension."""

from __future__ import annotations

import numbers
import re
from collections.abc import Sequence
from dataclasses import dataclass

from dippm_nas.errors import InputSpecError

DTYPES = ("float32", "float16", "bfloat16", "int64", "int32", "bool")
IMAGE_SHAPE = (3, 224, 224)


@dataclass(frozen=True)
class TensorSpec:
    """One model input. ``shape`` excludes the batch dimension, which the prediction adds.

    Raises :class:`~dippm_nas.errors.InputSpecError` for a dimension that is not a positive integer
    or a dtype outside ``DTYPES``.

    >>> spec = TensorSpec((128,), "int64", "input_ids")
    >>> spec.with_batch(8), str(spec)
    ((8, 128), 'input_ids=128:int64')
    """

    shape: tuple[int, ...]
    dtype: str = "float32"
    name: str = "x"

    def __post_init__(self) -> None:
        if not self.shape or any(not isinstance(d, int) or d <= 0 for d in self.shape):
            raise InputSpecError(
                f"input {self.name!r} has shape {self.shape}; every dimension must be a positive integer "
                "(leave the batch dimension out: e.g. 3,224,224 for an image, 128 for token ids)."
            )
        if self.dtype not in DTYPES:
            advice = (" TVM's importer takes no complex tensors: give the real and imaginary parts as two float32 "
                      "inputs (a model that takes them apart)." if self.dtype.startswith("complex") else "")
            raise InputSpecError(f"input {self.name!r} has dtype {self.dtype!r}; choose one of: {', '.join(DTYPES)}."
                                 + advice)

    def with_batch(self, batch: int) -> tuple[int, ...]:
        """The full tensor shape, with ``batch`` as the leading dimension."""
        return (batch, *self.shape)

    def __str__(self) -> str:
        return f"{self.name}={','.join(map(str, self.shape))}:{self.dtype}"


InputSpec = tuple[TensorSpec, ...]
InputLike = Sequence[int] | TensorSpec | Sequence[TensorSpec] | str | None


#: The largest batch taken: a tensor dimension past a signed 32-bit index is beyond every GPU's memory and
#: many of its kernels' indexing.
MAX_BATCH = 2**31 - 1


#: The batch a prediction is made at where none is given.
DEFAULT_BATCH = 8


def check_batch(batch: object) -> int:
    """``batch`` as an int if it is an integer from 1 to :data:`MAX_BATCH` (NumPy's too; a bool is not), else
    :class:`InputSpecError`.

    >>> import numpy as np
    >>> check_batch(np.int64(8))
    8
    """
    if not isinstance(batch, numbers.Integral) or isinstance(batch, bool) or not 0 < batch <= MAX_BATCH:
        shown = f"{batch!r} ({type(batch).__name__})" if not isinstance(batch, int | float) else repr(batch)
        raise InputSpecError(f"batch size must be a positive integer up to {MAX_BATCH:,}, got {shown}.")
    return int(batch)


def parse_shape(text: str) -> tuple[int, ...]:
    """``"3,224,224"`` or ``"3x224x224"`` -> ``(3, 224, 224)``.

    >>> parse_shape("3x224x224")
    (3, 224, 224)
    """
    inner = text.strip().strip("()[]").strip()
    parts = re.split(r"\s*[,x]\s*|\s+", inner) if inner else []
    try:
        if not parts or "" in parts:
            raise ValueError("an empty dimension")
        return tuple(int(p) for p in parts)
    except ValueError:
        raise InputSpecError(
            f"cannot read the shape {text!r}: give integers separated by commas, without the batch, "
            "e.g. 3,224,224."
        ) from None


def parse_tensor_spec(text: str, index: int = 0) -> TensorSpec:
    """``"input_ids=128:int64"``, ``"128:int64"`` or ``"3,224,224"``; an unnamed spec is ``input{index}``.

    >>> parse_tensor_spec("input_ids=128:int64")
    TensorSpec(shape=(128,), dtype='int64', name='input_ids')
    """
    name, equals, rest = text.rpartition("=") if "=" in text else ("", "", text)
    if equals and not name.strip():
        raise InputSpecError(f"the input {text!r} has an empty name: write NAME=SHAPE[:DTYPE], e.g. "
                             "input_ids=128:int64, or leave out the '='.")
    shape_text, _, dtype = rest.partition(":")
    return TensorSpec(parse_shape(shape_text), dtype or "float32", name.strip() or f"input{index}")


def normalize_inputs(inputs: InputLike) -> InputSpec | None:
    """Accept a shape, a spec, a list of specs or a CLI string; None means 'the model's default'.

    >>> normalize_inputs((3, 224, 224))
    (TensorSpec(shape=(3, 224, 224), dtype='float32', name='x'),)
    >>> [str(s) for s in normalize_inputs("ids=128:int64;mask=128:int64")]
    ['ids=128:int64', 'mask=128:int64']
    """
    if inputs is None:
        return None
    if isinstance(inputs, str):
        if not inputs.strip():
            raise InputSpecError("cannot read the shape '': give integers separated by commas, without the batch, "
                                 "e.g. 3,224,224, or no shape for the model's own.")
        return tuple(parse_tensor_spec(part, i) for i, part in enumerate(inputs.split(";")) if part.strip())
    if isinstance(inputs, TensorSpec):
        return (inputs,)
    items = list(inputs)
    if items and all(isinstance(i, TensorSpec) for i in items):
        return tuple(items)  # type: ignore[arg-type]
    if items and all(isinstance(i, int) for i in items):
        return (TensorSpec(tuple(items), "float32", "x"),)  # type: ignore[arg-type]
    raise InputSpecError(
        f"cannot read the input spec {inputs!r}: give a shape such as (3, 224, 224) or a list of "
        "dippm_nas.TensorSpec(shape, dtype, name)."
    )
