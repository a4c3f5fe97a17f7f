"""Shapes, dtypes and tensors: the leaf types every stage of the graph shares.

Nothing here imports another module of the package, so the graph, the operator vocabulary and the
cost models can all build on it without importing each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Shape = tuple[int, ...]

#: Bytes per element of each dtype name as Relax spells it; an unknown dtype counts as 4.
DTYPE_BYTES: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
    "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}

#: The floating dtypes, those ``model.to(dtype)`` casts.
FLOATING_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16"})

#: A node attribute: for how many steps after its own PyTorch eager keeps the node's output (a module
#: call still running holds it as an argument, or a local variable of a function still running does);
#: set by the torch frontend.
EAGER_HOLD = "eager_hold"
#: A node attribute: the node ran in place in eager (``relu_``, ``add_``), so its output is the storage
#: of its first input, made this many steps before; set by the torch frontend.
EAGER_INPLACE_OF = "eager_inplace_of"


def numel(shape: Shape) -> int:
    """Elements of a tensor of ``shape`` (1 for a scalar).

    >>> numel((8, 3, 224, 224))
    1204224
    """
    return math.prod(shape)


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype``; 4 for a dtype the table does not know.

    >>> dtype_bytes("float16"), dtype_bytes("int8")
    (2, 1)
    """
    return DTYPE_BYTES.get(dtype, 4)


@dataclass(frozen=True)
class Tensor:
    """A tensor's shape and dtype, the unit the graph counts bytes in.

    >>> Tensor((1, 64, 56, 56), "float16").nbytes
    401408
    """

    shape: Shape
    dtype: str = "float32"

    @property
    def numel(self) -> int:
        """Its elements."""
        return numel(self.shape)

    @property
    def nbytes(self) -> int:
        """Its bytes: elements times the dtype's size."""
        return self.numel * dtype_bytes(self.dtype)
