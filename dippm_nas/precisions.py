"""The precisions a prediction or a measurement is made at, as PyTorch runs them: one table.

``fp32`` is PyTorch's defaults: cuDNN convolutions may use TF32 (``torch.backends.cudnn.allow_tf32`` is
True) while cuBLAS matmuls do not (``torch.backends.cuda.matmul.allow_tf32`` is False).
``fp32-strict`` turns TF32 off everywhere, ``tf32`` on everywhere; ``fp16`` and ``bf16`` are
``torch.autocast`` with PyTorch's default flags. Everything else follows from a row: the bytes of an
element autocast runs in, the unit a library's GEMMs and convolutions run on, the peak of the spec sheet
that prices them, the flags the harness sets. A new precision is a new row.

Nothing here imports torch or TVM: the graph, the cost models and the harness all read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from dippm_nas.errors import DippmError, suggest
from dippm_nas.graph.tensor import dtype_bytes

#: The libraries whose kernels run GEMMs and convolutions, and the PyTorch flag that lets each use TF32.
TF32_FLAGS = {"cudnn": "cudnn.allow_tf32", "cublas": "matmul.allow_tf32"}
#: The dtype of a tensor outside autocast.
FULL_DTYPE = "float32"
#: PyTorch's defaults, the precision a prediction is made at unless it names another.
DEFAULT_PRECISION = "fp32"


@dataclass(frozen=True)
class Precision:
    """One precision: the dtype autocast runs in (None: no autocast) and the TF32 flags it sets.

    >>> PRECISIONS["fp32"].tf32["cudnn"], PRECISIONS["fp32"].tf32["cublas"]
    (True, False)
    >>> PRECISIONS["bf16"].element_bytes, PRECISIONS["bf16"].tensor_core_format("cublas")
    (2, 'bf16')
    """

    name: str
    description: str
    tf32_cudnn: bool
    tf32_matmul: bool
    autocast_dtype: str | None = None
    #: The precision whose measurements a learned model without records of this one reads it as: the
    #: one that runs on the same units (bf16 on the fp16 tensor cores at the same peak; TF32 on or off
    #: everywhere differs from PyTorch's fp32 defaults only in which operators run on tensor cores).
    stand_in: str | None = None

    @property
    def autocast(self) -> bool:
        """Whether the forward pass runs under ``torch.autocast``."""
        return self.autocast_dtype is not None

    @property
    def element_bytes(self) -> int:
        """Bytes of an element of the tensors autocast runs its lower-precision operators on (4 without autocast)."""
        return dtype_bytes(self.autocast_dtype or FULL_DTYPE)

    @property
    def tf32(self) -> dict[str, bool]:
        """Per library (:data:`TF32_FLAGS`), whether its GEMMs and convolutions may use TF32."""
        return {"cudnn": self.tf32_cudnn, "cublas": self.tf32_matmul}

    def tensor_core_format(self, library: str | None) -> str | None:
        """The format a GEMM or convolution of ``library`` runs in on tensor cores at this precision
        (``tf32``, or the autocast precision's own name); None where it runs on the CUDA cores in FP32,
        as every operator without a library does."""
        if library is None:
            return None
        if self.autocast:
            return self.name
        return "tf32" if self.tf32[library] else None

    @property
    def peak_column(self) -> str:
        """The spec sheet's peak that bounds this precision's GEMMs at best (``fp32``, ``tf32``, ``fp16``, ...)."""
        return self.tensor_core_format("cublas") or "fp32"

    def flags(self) -> dict[str, bool]:
        """The TF32 flags as a measured row's columns."""
        return {"tf32_matmul": self.tf32_matmul, "tf32_cudnn": self.tf32_cudnn}


#: Every precision, in the order a user is offered them.
PRECISIONS: dict[str, Precision] = {p.name: p for p in (
    Precision("fp32", "float32 weights and activations; PyTorch defaults (cuDNN convolutions may use TF32, "
              "matmuls do not)", tf32_matmul=False, tf32_cudnn=True),
    Precision("fp32-strict", "float32 with TF32 off everywhere (cudnn.allow_tf32 and matmul.allow_tf32 False)",
              tf32_matmul=False, tf32_cudnn=False, stand_in="fp32"),
    Precision("tf32", "float32 storage with TF32 tensor-core math for matmuls and convolutions", tf32_matmul=True,
              tf32_cudnn=True, stand_in="fp32"),
    Precision("fp16", "float16 autocast (torch.autocast(dtype=torch.float16))", tf32_matmul=False, tf32_cudnn=True,
              autocast_dtype="float16"),
    Precision("bf16", "bfloat16 autocast (torch.autocast(dtype=torch.bfloat16))", tf32_matmul=False,
              tf32_cudnn=True, autocast_dtype="bfloat16", stand_in="fp16"),
)}


def autocast_element_sizes() -> tuple[int, ...]:
    """The distinct element sizes autocast runs at over the table, ascending: the graph's per-operator
    allocations are kept at each of them."""
    return tuple(sorted({p.element_bytes for p in PRECISIONS.values() if p.autocast}))


def precision_named(name: str) -> Precision:
    """The precision called ``name``; an unknown name raises DippmError listing the known ones.

    >>> precision_named("fp16").autocast
    True
    """
    if name not in PRECISIONS:
        raise DippmError(f"unknown precision {name!r}; choose one of: {', '.join(PRECISIONS)}."
                         + suggest(name, PRECISIONS))
    return PRECISIONS[name]
