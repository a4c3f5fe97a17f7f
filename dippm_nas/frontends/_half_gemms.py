"""Half-precision GEMMs and convolutions as PyTorch types them, while TVM's torch importer runs.

TVM's importer asks every matrix product and convolution for a ``float32`` output (``out_dtype="float32"``
in its converters), whatever its operands. For a model whose weights are float32 that is PyTorch's own
type; for a model built in float16 or bfloat16 (``model.half()``) it is not: PyTorch accumulates in
float32 inside the kernel and writes the operands' dtype, so a half model's bias add, its next layer
and every byte the graph counts stay half. Relax refuses the float32 product added to a half bias,
and the operator would become a generic node.

:func:`half_gemms_stay_half` re-types those outputs while an import runs: a GEMM-class Relax operator
asked for ``float32`` on half operands writes the operands' dtype. Relax's operators are module
functions that the importer looks up when it converts a node (``relax.op.nn.conv2d``), or binds when it
is built (``partial(relax.op.linear_algebra.matmul, ...)``), so both the importer's construction and its
conversion run inside the context. Nothing else about them changes, and operands of float32 are left
as TVM writes them.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator

from tvm import relax
from tvm.relax.op import linear_algebra
from tvm.relax.op import nn as relax_nn

from dippm_nas.precisions import HALF_FORMATS

#: The Relax operators the importer asks for float32 outputs, as (module, attribute).
_GEMM_OPERATORS = (
    (linear_algebra, "matmul"), (relax.op, "matmul"),
    *((relax_nn, name) for name in ("conv1d", "conv2d", "conv3d", "conv1d_transpose", "conv2d_transpose",
                                    "conv3d_transpose")),
)
#: One import re-types at a time: the operators are module attributes, shared by every thread.
_LOCK = threading.RLock()


def _operand_dtype(expr: object) -> str:
    """The dtype of a Relax expression's tensor type ('' where it has none)."""
    return str(getattr(getattr(expr, "ty", None), "dtype", ""))


def _keeps_half(operator: Callable) -> Callable:
    """``operator`` with a float32 output asked for half operands turned into the operands' dtype."""

    @functools.wraps(operator)
    def typed(data, *args, **kwargs):
        dtype = _operand_dtype(data)
        if dtype in HALF_FORMATS and str(kwargs.get("out_dtype")) == "float32":
            kwargs["out_dtype"] = dtype
        return operator(data, *args, **kwargs)

    typed.__wrapped_by_dippm__ = True
    return typed


@contextlib.contextmanager
def half_gemms_stay_half() -> Iterator[None]:
    """While it is open, TVM's GEMM-class Relax operators write a half model's dtype, as PyTorch does.

    >>> from tvm import relax
    >>> x = relax.Var("x", relax.TensorType((4, 8), "float16"))
    >>> w = relax.Var("w", relax.TensorType((8, 2), "float16"))
    >>> with half_gemms_stay_half():
    ...     inside = relax.op.linear_algebra.matmul(x, w, out_dtype="float32")
    >>> str(relax.BlockBuilder().normalize(inside).ty.dtype)
    'float16'
    """
    with _LOCK:
        saved = [(module, name, getattr(module, name)) for module, name in _GEMM_OPERATORS]
        try:
            for module, name, operator in saved:
                if not getattr(operator, "__wrapped_by_dippm__", False):
                    setattr(module, name, _keeps_half(operator))
            yield
        finally:
            for module, name, operator in saved:
                setattr(module, name, operator)
