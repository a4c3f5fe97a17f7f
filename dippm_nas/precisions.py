"""The precisions a prediction or a measurement is made at, as PyTorch runs them: one table.

``fp32`` is PyTorch's defaults: cuDNN convolutions may use TF32 (``torch.backends.cudnn.allow_tf32`` is
True) while cuBLAS matmuls do not (``torch.backends.cuda.matmul.allow_tf32`` is False).
``fp32-strict`` turns TF32 off everywhere, ``tf32`` on everywhere; ``fp16`` and ``bf16`` are
``torch.autocast`` over float32 weights with PyTorch's default flags; ``fp16-weights`` and ``bf16-weights``
are a model whose weights are half (``model.half()``, ``model.to(torch.bfloat16)``, as most inference
servers run one), without autocast: no cast runs, every tensor is half, and GEMMs and convolutions run on
tensor cores. Everything else follows from a row: the bytes of an element its lower-precision operators
run at, the unit a library's GEMMs and convolutions run on, the peak of the spec sheet that prices them, the
flags and the dtype the harness sets. A new precision is a new row.

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
#: PyTorch's defaults, the precision a prediction is made at unless it names another (or the model's weights
#: are half: :func:`precision_of_weights`).
DEFAULT_PRECISION = "fp32"
#: The half dtypes, by the name of the tensor-core format (and of the spec sheet's peak) they run in.
HALF_FORMATS = {"float16": "fp16", "bfloat16": "bf16"}


@dataclass(frozen=True)
class Precision:
    """One precision: the dtype autocast runs in (None: no autocast), the dtype the model's floating weights
    are cast to (None: as built, float32) and the TF32 flags it sets.

    >>> PRECISIONS["fp32"].tf32["cudnn"], PRECISIONS["fp32"].tf32["cublas"]
    (True, False)
    >>> PRECISIONS["bf16"].element_bytes, PRECISIONS["bf16"].tensor_core_format("cublas")
    (2, 'bf16')
    >>> PRECISIONS["fp16-weights"].autocast, PRECISIONS["fp16-weights"].tensor_core_format("cudnn")
    (False, 'fp16')
    """

    name: str
    description: str
    tf32_cudnn: bool
    tf32_matmul: bool
    autocast_dtype: str | None = None
    #: The dtype the model's floating weights, and so its activations, are in: the model cast with
    #: ``model.to(dtype)`` and fed inputs of that dtype, no autocast.
    weights_dtype: str | None = None
    #: The precision whose measurements a learned model without records of this one reads it as: the
    #: one that runs on the same units (bf16 on the fp16 tensor cores at the same peak; TF32 on or off
    #: everywhere differs from PyTorch's fp32 defaults only in which operators run on tensor cores).
    stand_in: str | None = None

    @property
    def autocast(self) -> bool:
        """Whether the forward pass runs under ``torch.autocast``."""
        return self.autocast_dtype is not None

    @property
    def half_dtype(self) -> str | None:
        """The half dtype its lower-precision operators compute in (autocast's, or the weights'); None for float32."""
        return self.autocast_dtype or self.weights_dtype

    @property
    def element_bytes(self) -> int:
        """Bytes of an element of the tensors its lower-precision operators run on (4 where none does)."""
        return dtype_bytes(self.half_dtype or FULL_DTYPE)

    @property
    def tf32(self) -> dict[str, bool]:
        """Per library (:data:`TF32_FLAGS`), whether its GEMMs and convolutions may use TF32."""
        return {"cudnn": self.tf32_cudnn, "cublas": self.tf32_matmul}

    def tensor_core_format(self, library: str | None) -> str | None:
        """The format a GEMM or convolution of ``library`` runs in on tensor cores at this precision
        (``tf32``, or the half format, ``fp16`` or ``bf16``); None where it runs on the CUDA cores in FP32,
        as every operator without a library does."""
        if library is None:
            return None
        if self.half_dtype:
            return HALF_FORMATS[self.half_dtype]
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
    Precision("fp16-weights", "float16 weights and activations, no autocast (model.half())", tf32_matmul=False,
              tf32_cudnn=True, weights_dtype="float16", stand_in="fp16"),
    Precision("bf16-weights", "bfloat16 weights and activations, no autocast (model.to(torch.bfloat16))",
              tf32_matmul=False, tf32_cudnn=True, weights_dtype="bfloat16", stand_in="fp16"),
)}


#: A precision as functions below a request take it: its name, or the :class:`Precision` the request resolved.
PrecisionLike = str | Precision


def precision_of_weights(dtype: str) -> Precision | None:
    """The precision of a model whose floating weights are all ``dtype``: the half-weights row of that dtype,
    None for float32 (or any dtype no row casts to).

    >>> precision_of_weights("bfloat16").name, precision_of_weights("float32")
    ('bf16-weights', None)
    """
    return next((p for p in PRECISIONS.values() if p.weights_dtype == dtype), None)


def autocast_element_sizes() -> tuple[int, ...]:
    """The distinct element sizes autocast runs at over the table, ascending: the graph's per-operator
    allocations are kept at each of them."""
    return tuple(sorted({p.element_bytes for p in PRECISIONS.values() if p.autocast}))


def precision_help() -> str:
    """Every precision with what it means, for a command's ``--help``: the table's own words."""
    return "; ".join(f"{p.name}: {p.description}" for p in PRECISIONS.values())


def precision_named(name: PrecisionLike) -> Precision:
    """The precision called ``name`` (read once, where a request enters the library: a :class:`Precision` is
    itself); an unknown name raises DippmError listing the known ones.

    >>> precision_named("fp16").autocast, precision_named(PRECISIONS["fp16"]) is PRECISIONS["fp16"]
    (True, True)
    """
    if isinstance(name, Precision):
        return name
    key = name.strip().lower() if isinstance(name, str) else name  # FP16 is fp16, as A100-40GB is a100-40gb
    if key not in PRECISIONS:
        raise DippmError(f"unknown precision {name!r}; choose one of: {', '.join(PRECISIONS)}."
                         + suggest(key, PRECISIONS))
    return PRECISIONS[key]
