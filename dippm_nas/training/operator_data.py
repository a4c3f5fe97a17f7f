"""Operator-level ground truth for the operator model, read as measured.

Three sources, each with its own protocol:

* ``data/neusight/operators/<op>/<GPU>.csv.xz``, NeuSight's corpus: 256,509 fp32 operators (batched and
  plain matrix products, convolutions, elementwise operators, softmax, layer norm) on five GPUs, each
  with the kernel cuBLAS or cuDNN chose. Its latency is CUDA events around one call, so it holds, besides
  the kernel, the gap while the host issues the call: the **protocol gap**, a property of the measuring
  machine's CPU, not of its GPU. Per machine and operator it is read off the smallest measurements
  (:func:`protocol_gaps`), and a GPU held out gets the median of the other machines' gaps.
* ``data/measurements/sweeps/*.csv``, the harness's operator sweeps: one operator at a time at every
  precision, events around each iteration queued behind a GPU sleep, so no host gap.
* ``data/vidur``, Vidur's fp16 GEMMs of LLM layers on an A100 80GB and an H100
  (:mod:`dippm_nas.training.vidur`): the kernel's CUDA time under torch.profiler, so no host gap either.

Every row becomes a :class:`OperatorSamples` row: the operator as
:class:`~dippm_nas.cost.learned.kernel_structure.KernelColumns` describes it, its GPU, its measured seconds and
what it was.
"""

from __future__ import annotations

import csv
import lzma
from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from dippm_nas.cost.learned.kernel_structure import (
    GEMM_GROUPS,
    GROUPS,
    UNITS,
    KernelColumns,
    tile_of_kernel_name,
    winograd_eligible,
)
from dippm_nas.cost.learned.operator_network import MIN_KERNEL_S
from dippm_nas.cost.pipeline.roofline import on_tensor_cores, peak_tflops
from dippm_nas.cost.pipeline.table import FULL_BYTES
from dippm_nas.graph import operators
from dippm_nas.graph.model_graph import Node, operator_node
from dippm_nas.graph.operators._rules import rows_of_last_axis
from dippm_nas.graph.operators.conv import conv_output_size
from dippm_nas.hardware.registry import get_device
from dippm_nas.measure.sweep_operators import KINDS
from dippm_nas.precisions import precision_named
from dippm_nas.training.paths import project
from dippm_nas.training.records import GPU_NAMES, NEUSIGHT_GPUS, origin_of
from dippm_nas.training.vidur import VIDUR_GPUS, VIDUR_PRECISION, measured_gemms

#: NeuSight's protocol: fp32 tensors, cuDNN's TF32 off and matmuls at PyTorch's default (full FP32).
CORPUS_PRECISION = "fp32-strict"
#: NeuSight's elementwise operators: (input tensors, output tensors) of (B, H) float32 elements; a ``u``
#: suffix takes a Python scalar.
CORPUS_ELEMENTWISE = {"add": 2, "mul": 2, "div": 2, "pow": 2, "addu": 1, "mulu": 1, "divu": 1, "powu": 1,
                      "relu": 1, "gelu": 1, "tanh": 1}
#: The library that runs each group's arithmetic, as the registry's categories say (none: the CUDA cores).
GROUP_LIBRARY = {c.kernel: c.library for c in operators.categories() if c.library is not None}
#: NeuSight's operators as the registry spells them (its README names the PyTorch call of each).
CORPUS_SPELLINGS = {"bmm": "relax.matmul", "linear": "relax.linear", "conv": "relax.nn.conv2d",
                    "ln": "relax.nn.layer_norm", "softmax": "relax.nn.softmax", "add": "relax.add",
                    "mul": "relax.multiply", "div": "relax.divide", "pow": "relax.power", "addu": "relax.add",
                    "mulu": "relax.multiply", "divu": "relax.divide", "powu": "relax.power", "relu": "relax.nn.relu",
                    "gelu": "relax.nn.gelu", "tanh": "relax.tanh"}
#: The operator name of Vidur's GEMMs: linear layers, kept apart from the sweeps' in the reports.
VIDUR_OPERATOR = "vidur_linear"
#: Operators that count as GEMM-class in the reports (the rest are memory-bound).
GEMM_CLASS = frozenset({"bmm", "linear", "conv", "mm", "conv2d", "sdpa", VIDUR_OPERATOR})


@dataclass(frozen=True, eq=False)
class OperatorSamples:
    """Measured operators: their columns, GPU (registry key), operator name, protocol, measured seconds and
    the file each came from."""

    columns: KernelColumns
    gpu: np.ndarray
    operator: np.ndarray
    protocol: np.ndarray  # "corpus" (host gap included), "sweep" or "vidur" (the kernel alone)
    precision: np.ndarray
    seconds: np.ndarray
    source: np.ndarray

    def __len__(self) -> int:
        return len(self.gpu)

    def take(self, index: np.ndarray) -> OperatorSamples:
        """The samples at ``index``."""
        return OperatorSamples(self.columns.take(index), *(getattr(self, f.name)[index] for f in fields(self)[1:]))

    @staticmethod
    def concatenate(parts: list[OperatorSamples]) -> OperatorSamples:
        """Several sets of samples as one."""
        return OperatorSamples(KernelColumns.concatenate([p.columns for p in parts]),
                               *(np.concatenate([getattr(p, f.name) for p in parts])
                                 for f in fields(OperatorSamples)[1:]))


@dataclass
class _Builder:
    """Rows collected one by one, then made columns."""

    values: dict

    @classmethod
    def empty(cls) -> _Builder:
        return cls({name: [] for name in ("group", "unit", "element_bytes", "flops", "moved", "gemm", "rows",
                                          "winograd", "weight_operand", "peak", "named_tile", "gpu", "operator",
                                          "protocol", "precision", "seconds", "source")})

    def add(self, **row: object) -> None:
        for name, column in self.values.items():
            column.append(row.get(name, _DEFAULTS.get(name)))

    def samples(self) -> OperatorSamples:
        v = {k: np.array(c) for k, c in self.values.items()}
        columns = KernelColumns(group=v["group"].astype(np.int64), unit=v["unit"].astype(np.int64),
                                element_bytes=v["element_bytes"].astype(float), flops=v["flops"].astype(float),
                                moved=v["moved"].astype(float), gemm=v["gemm"].astype(float).reshape(-1, 4),
                                rows=v["rows"].astype(float).reshape(-1, 2), winograd=v["winograd"].astype(bool),
                                weight_operand=v["weight_operand"].astype(bool), peak=v["peak"].astype(float),
                                named_tile=v["named_tile"].astype(float).reshape(-1, 2))
        return OperatorSamples(columns, v["gpu"].astype(str), v["operator"].astype(str), v["protocol"].astype(str),
                               v["precision"].astype(str), v["seconds"].astype(float), v["source"].astype(str))


_DEFAULTS = {"gemm": (0, 0, 0, 0), "rows": (0, 0), "winograd": False, "weight_operand": False, "named_tile": (0, 0),
             "unit": 0, "element_bytes": 4}


def _unit(peak: float, gpu: str, precision: str) -> int:
    """The unit a peak is the peak of: tensor cores where it is above the FP32 one."""
    if not on_tensor_cores(peak, get_device(gpu)):
        return UNITS.index("cuda_cores")
    return UNITS.index("tensor_half" if precision_named(precision).half_dtype else "tensor_tf32")


def _peak(group: str, gpu: str, precision: str) -> float:
    return peak_tflops(GROUP_LIBRARY.get(group), get_device(gpu), precision_named(precision)) * 1e12


def corpus_samples(folder: Path) -> OperatorSamples:
    """NeuSight's corpus in ``folder`` (``data/neusight/operators``): every row of a GPU in the registry."""
    rows = _Builder.empty()
    root = project().root
    for path in sorted(folder.glob("*/*.csv.xz")):
        gpu = NEUSIGHT_GPUS.get(path.name.removesuffix(".csv.xz"))
        if gpu is None:
            continue
        name, origin = path.parent.name, origin_of(path, root)
        peaks = {g: _peak(g, gpu, CORPUS_PRECISION) for g in GROUPS}
        with lzma.open(path, "rt", newline="") as fh:
            for row in csv.DictReader(fh):
                common = {"gpu": gpu, "operator": name, "protocol": "corpus", "precision": CORPUS_PRECISION,
                          "seconds": float(row["Latency"]) * 1e-3, "source": origin}
                rows.add(**common, **_corpus_operator(name, row, peaks))
    return rows.samples()


def _corpus_node(name: str, row: dict[str, str]) -> Node:
    """One corpus row as a graph's node (NeuSight's dimension names, README of the corpus), float32."""
    if name == "bmm":  # (B, M, N) @ (B, N, K)
        b, m, n, k = (int(row[x]) for x in "BMNK")
        inputs, weights, outputs, attrs = ((b, m, n), (b, n, k)), (), ((b, m, k),), {}
    elif name == "linear":  # nn.Linear(N, K) on (B, M, N), bias included
        b, m, n, k = (int(row[x]) for x in "BMNK")
        inputs, weights, outputs, attrs = ((b, m, n),), ((k, n), (k,)), ((b, m, k),), {}
    elif name == "conv":
        b, c, o, r, h, s, p = (int(row[x]) for x in ("B", "Input_Channel", "Output_Channel", "Kernel_Szie",
                                                      "Input_Size", "Stride", "Padding"))
        out = conv_output_size(h, r, s, p)
        inputs, weights, outputs = ((b, c, h, h),), ((o, c, r, r),), ((b, o, out, out),)
        attrs = {"strides": (s, s), "padding": (p,) * 4, "groups": 1}
    else:  # (B, H) tensors: layer norm without affine parameters, softmax over H, elementwise
        shape = (int(row["B"]), int(row["H"]))
        inputs = (shape,) * CORPUS_ELEMENTWISE.get(name, 1)
        weights, outputs, attrs = (), (shape,), {"axis": -1}
    return operator_node(CORPUS_SPELLINGS[name], inputs, weights, outputs, attrs)


def _corpus_operator(name: str, row: dict[str, str], peaks: dict[str, float]) -> dict[str, object]:
    """One corpus row as the model's columns: the registry's view of it, the tile its kernel's name gives.
    NeuSight's convolutions are read as the tensor-core-shaped group whatever their channels (most have
    channels off the tensor cores' multiple of 8): the shipped operator model was trained so, at FP32,
    where neither group runs on tensor cores."""
    kernel = row["Kernel Name"]
    named = tile_of_kernel_name(kernel) if "winograd" not in (kernel + row.get("Kernels", "")).lower() else (0, 0)
    node = _corpus_node(name, row)
    view = kernel_view(node)
    if name == "conv":
        view["group"] = GROUPS.index("conv")
    moved = FULL_BYTES * _elements(node)
    return {**view, "flops": float(node.flops), "moved": moved, "peak": peaks[GROUPS[view["group"]]],
            "named_tile": named if view["gemm"] != (0, 0, 0, 0) else (0, 0)}


def _elements(node: Node) -> int:
    """Elements of every tensor an operator reads and writes: the least it moves, over the element size."""
    return sum(t.numel for t in (*node.inputs, *node.weights, *node.outputs))


def kernel_view(node: Node) -> dict[str, object]:
    """What the operator registry says of an operator's kernel, as the model's columns: its kind of kernel
    (the one its category names off the tensor cores where its shapes keep it there), its GEMM view, the rows it
    works through, whether cuDNN may run it as Winograd, and whether its second operand is a weight."""
    entry = operators.operator(node.kind)
    if entry is None:
        raise KeyError(f"the operator registry has no kind {node.kind!r}")
    off_tensor_cores = entry.cuda_cores is not None and bool(entry.cuda_cores(node))
    kernel = (entry.category.cuda_core_kernel or entry.kernel_group) if off_tensor_cores else entry.kernel_group
    gemm = tuple(entry.gemm(node)) if entry.gemm else (0, 0, 0, 0)
    tiled = kernel in GEMM_GROUPS
    rows = (0, 0) if tiled else tuple(entry.rows(node)) if entry.rows else rows_of_last_axis(node)
    window = entry.kernel_size(node) if entry.kernel_size else None
    stride = (node.attrs.get("strides") or (1,))[0]
    winograd = window is not None and bool(winograd_eligible(np.array(window[0]), np.array(stride)))
    return {"group": GROUPS.index(kernel), "gemm": gemm, "rows": rows, "winograd": winograd,
            "weight_operand": kernel == "gemm" and bool(node.weights)}


def runs_other_kernels(kind: str, precision: str) -> bool:
    """Whether a sweep point of ``kind`` at ``precision`` timed other kernels than its row describes: under
    autocast an operator whose registry entry runs in float32 (layer and group norm, softmax, sum) is handed the
    sweep's half tensor and runs a cast and a float32 kernel, or one kernel that reads half and writes float32,
    while the row counts half bytes. The graph prices such an operator as its float32 kernel plus autocast's
    casts, so the model learns its kernel from the same shape's float32 rows instead.

    >>> runs_other_kernels("layer_norm", "fp16"), runs_other_kernels("layer_norm", "fp32")
    (True, False)
    >>> runs_other_kernels("layer_norm", "fp16-weights"), runs_other_kernels("gelu", "bf16")
    (False, False)
    """
    entry = operators.operator(kind)
    return (precision_named(precision).autocast and entry is not None
            and entry.autocast_policy == operators.AUTOCAST_FLOAT32)


def sweep_samples(paths: Iterable[Path]) -> OperatorSamples:
    """The ``ok`` rows of the harness's sweep files, of GPUs in the registry, but those that timed other kernels
    than they describe (:func:`runs_other_kernels`)."""
    rows = _Builder.empty()
    root = project().root
    for path in paths:
        origin = origin_of(path, root)
        with open(path, newline="") as fh:
            for row in csv.DictReader(fh):
                gpu = GPU_NAMES.get(row["gpu_name"])
                if (row["status"] != "ok" or gpu is None or row["kind"] not in KINDS
                        or runs_other_kernels(row["kind"], row["precision"])):
                    continue
                rows.add(gpu=gpu, operator=row["kind"], protocol="sweep", precision=row["precision"],
                         seconds=float(row["latency_ms_median"]) * 1e-3, source=origin,
                         **_sweep_operator(row, gpu))
    return rows.samples()


def _sweep_operator(row: dict[str, str], gpu: str) -> dict[str, object]:
    """One sweep point as the model's columns: the registry's view of the operator its kind names
    (:mod:`dippm_nas.measure.sweep_operators`), with the FLOPs and bytes the harness wrote."""
    params = {k: int(v) for k, v in (item.split("=") for item in row["params"].split(";"))}
    precision = row["precision"]
    view = kernel_view(KINDS[row["kind"]].node(params))
    group = GROUPS[view["group"]]
    library = None if group == "conv_cuda_cores" else GROUP_LIBRARY.get(group)
    peak = peak_tflops(library, get_device(gpu), precision_named(precision)) * 1e12
    return {**view, "flops": float(row["flops"]), "moved": float(row["bytes"]), "peak": peak,
            "element_bytes": precision_named(precision).element_bytes, "unit": _unit(peak, gpu, precision)}


def vidur_samples(folder: Path) -> OperatorSamples:
    """Vidur's GEMMs in ``folder`` (``data/vidur``): each linear layer shape of each GPU, an fp16 half-weights
    ``nn.Linear`` without bias at its tokens' rows."""
    rows = _Builder.empty()
    root = project().root
    element = precision_named(VIDUR_PRECISION).element_bytes
    for name, gpu in VIDUR_GPUS.items():
        peak = _peak("gemm", gpu, VIDUR_PRECISION)
        unit = _unit(peak, gpu, VIDUR_PRECISION)
        for (k, n, tokens), ms in measured_gemms(folder / name).items():
            node = operator_node("relax.linear", ((tokens, k),), ((n, k),), ((tokens, n),))
            moved = element * _elements(node)
            rows.add(gpu=gpu, operator=VIDUR_OPERATOR, protocol="vidur", precision=VIDUR_PRECISION, seconds=ms * 1e-3,
                     source=origin_of(folder / name, root), unit=unit, element_bytes=element, flops=float(node.flops),
                     moved=moved, peak=peak, **kernel_view(node))
    return rows.samples()


def load_operator_samples() -> OperatorSamples:
    """Every operator-level sample of the project's data set: NeuSight's corpus, the harness's sweeps and
    Vidur's GEMMs."""
    paths = project()
    corpus = corpus_samples(paths.data / "neusight" / "operators")
    sweeps = sweep_samples(sorted((paths.measurements / "sweeps").glob("*.csv")))
    return OperatorSamples.concatenate([corpus, sweeps, vidur_samples(paths.data / "vidur")])


def protocol_gaps(samples: OperatorSamples) -> dict[tuple[str, str], float]:
    """Per (GPU, operator) of the corpus, the host's gap its measurements hold: the smallest less the least
    time any kernel takes (:data:`~dippm_nas.cost.learned.operator_network.MIN_KERNEL_S`)."""
    gaps: dict[tuple[str, str], float] = {}
    corpus = samples.protocol == "corpus"
    for key in set(zip(samples.gpu[corpus], samples.operator[corpus])):
        mine = corpus & (samples.gpu == key[0]) & (samples.operator == key[1])
        gaps[key] = max(float(samples.seconds[mine].min()) - MIN_KERNEL_S, 0.0)
    return gaps


def gap_of(samples: OperatorSamples, gaps: dict[tuple[str, str], float], known_gpus: Iterable[str]) -> np.ndarray:
    """Each sample's protocol gap: its own machine's where that machine is among ``known_gpus``, else the
    median over the known machines' gaps for its operator (a GPU held out); none for a sweep."""
    known = set(known_gpus)
    median = {}
    for op in set(samples.operator):
        values = [g for (gpu, o), g in gaps.items() if o == op and gpu in known]
        median[op] = float(np.median(values)) if values else 0.0
    return np.array([0.0 if proto != "corpus" else gaps[(gpu, op)] if gpu in known else median[op]
                     for gpu, op, proto in zip(samples.gpu, samples.operator, samples.protocol)])
