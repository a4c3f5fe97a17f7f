r"""The roofline stage: each operator's bound on one GPU, and the unit its arithmetic runs on.

For each operator :math:`i` with :math:`F_i` FLOPs and :math:`B_i` bytes moved:

.. math::

    t_i = \max(F_i / P_{unit}, B_i / W, n_i t_{mem}) + k_i \cdot t_{launch}

where :math:`P_{unit}` is the GPU's peak for the unit that runs it at the precision (tensor cores for
matrix products and for convolutions whose channels per group suit them, the CUDA cores otherwise), :math:`W` the
memory bandwidth, :math:`k_i` the number of kernels it launches, and :math:`n_i` the iterations each
thread of a kernel runs one after another where ATen's kernel loops in every thread (bilinear upsampling
of NCHW planes), each waiting one memory round trip :math:`t_{mem}`. Views (reshape, permute,
slicing) are free, as in PyTorch eager; the copies eager makes where a view is impossible are nodes of
the graph (:mod:`dippm_nas.graph.eager_layout`).

Half precision means ``torch.autocast``: each operator moves its activations in the precision autocast runs it in
(its kind's policy in the operator registry: convolutions and matrix products in the lower precision,
normalisations in float32, everything else in the widest type of its inputs, so a transformer's residual stream
stays float32) and pays the casts between them. A model whose own tensors are half (its weights cast with
``model.half()``) pays no cast: each operator moves its tensors at their own dtypes, and a matrix product or
convolution of half operands runs on the tensor cores of that dtype whatever the precision's flags. A tensor-core
convolution on NCHW activations at half precision also pays the transpose of its input that cuDNN runs before it.

What an operator moves and how many kernels it launches depend on the graph and the precision alone
(:class:`Traffic`, kept with the graph's table); the peaks, the bandwidth and the SMs are the GPU's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dippm_nas.cost.pipeline.table import FULL_BYTES, HALF_BYTES, HALF_OPERAND_DTYPES, NodeTable
from dippm_nas.graph import operators
from dippm_nas.graph.operators.attention import math_fallback_cost
from dippm_nas.hardware.registry import Device
from dippm_nas.precisions import HALF_FORMATS, Precision
from dippm_nas.request import Request

#: GPU time per kernel beyond its roofline time: launch and completion of a short kernel. NVIDIA's
#: "Getting Started with CUDA Graphs" (2019) measures about 3-4 us per short kernel launched from a
#: stream; PyTorch eager's own time on the host to issue an operator is a host profile's (:mod:`dippm_nas.hosts`).
KERNEL_OVERHEAD_US = 4.0

#: One dependent round trip to device memory: about 230-250 ns on the GDDR6 and GDDR6X cards by
#: pointer chasing (Chips and Cheese, "Measuring GPU Memory Latency", 2021: 226 ns on a 6900 XT,
#: Ampere's about the same); HBM parts are in the same range. A kernel whose threads each loop over
#: many elements in turn, with too few threads to hide it, pays it once per iteration: EfficientFormerV2,
#: which upsamples 1024 channels from 7x7 to 14x14 that way two to six times, spends most of its time there.
MEMORY_ROUND_TRIP_NS = 250.0

#: A peak this much above the GPU's FP32 peak is a tensor-core peak: the spec sheet's FP32 peak itself, or
#: one the GPU has no tensor cores for (which falls back to it), is not.
TENSOR_PEAK_OVER_FP32 = 1.001


def on_tensor_cores(peak: np.ndarray | float, gpu: Device) -> np.ndarray | bool:
    """Where a peak (FLOP/s) is a tensor-core peak of ``gpu`` rather than its CUDA cores' FP32 one."""
    return peak > gpu.fp32_tflops * 1e12 * TENSOR_PEAK_OVER_FP32


def peak_tflops(library: str | None, gpu: Device, precision: Precision) -> float:
    """The peak of the unit that runs an operator whose arithmetic runs in ``library`` (``cudnn``,
    ``cublas``, None for neither) at ``precision``, as PyTorch runs it (:mod:`dippm_nas.precisions`): in
    ``fp32`` cuDNN convolutions on TF32 tensor cores where the GPU has them and cuBLAS matrix products in full FP32,
    in ``fp32-strict`` everything in FP32, in ``tf32`` both on TF32 tensor cores.

    >>> from dippm_nas.hardware import get_device
    >>> from dippm_nas.precisions import PRECISIONS
    >>> a100 = get_device("a100-40gb")
    >>> [peak_tflops(lib, a100, PRECISIONS[p]) for lib, p in (("cudnn", "fp32"), ("cublas", "fp32"),
    ...                                                         ("cudnn", "fp32-strict"))]
    [156.0, 19.5, 19.5]
    """
    return gpu.format_tflops(precision.tensor_core_format(library))


@dataclass(frozen=True, eq=False)
class Traffic:
    """What each operator moves and launches at one precision, whatever the GPU: the graph's and the precision's
    alone, so a table keeps it (:meth:`~dippm_nas.cost.pipeline.table.NodeTable.derived`)."""

    moved: np.ndarray  # bytes read and written, casts and transposes included
    overhead_s: np.ndarray  # the kernels' launches
    library: np.ndarray  # a library (cuDNN, cuBLAS) runs its arithmetic, which may put it on tensor cores
    on_math: np.ndarray  # eager's math attention runs it, its GEMMs and passes one after another
    float32_math: bool  # ... computing in float32


def runtime_key(table: NodeTable, runtime: tuple[int, int] | None) -> tuple[int, int] | None:
    """The PyTorch ``runtime`` as far as it changes what ``table``'s graph costs: eager's math attention is the one
    operator priced by version (:func:`~dippm_nas.graph.operators.attention.math_fallback_cost`), so a graph
    without it costs the same under every version (None)."""
    return runtime if table.math_fallback[:, 0].any() else None


def traffic(table: NodeTable, precision: Precision, layout: str, runtime: tuple[int, int] | None,
            casts_fused: bool = False) -> Traffic:
    """:class:`Traffic` of ``table`` at ``precision`` and ``layout``, under PyTorch ``runtime`` (None: the current
    one), computed once per table and kept with it; ``casts_fused``: autocast's casts of activations are part of
    the kernels that produce them (``torch.compile``), not kernels of their own."""
    runtime = runtime_key(table, runtime)
    return table.derived(("traffic", precision.name, layout, runtime, casts_fused),
                         lambda: _traffic(table, precision, layout, runtime, casts_fused))


def _traffic(table: NodeTable, precision: Precision, layout: str, runtime: tuple[int, int] | None,
             casts_fused: bool) -> Traffic:
    half, h, f = precision.autocast, precision.element_bytes, FULL_BYTES
    library = operators.kind_table().has_library[table.kind]
    kernels = table.kernels.copy()  # most operators are one kernel; an LSTM says how many
    own_half = table.half_operands  # operands half as the model has them, whatever the precision
    if half:
        # Autocast runs each operator in its own precision and casts activations between them (each kind's
        # autocast policy). It also casts each fp32 weight of an operator a library runs (convolution, matrix
        # product, attention) to the lower precision per forward, whether or not it then runs on tensor cores:
        # one more kernel that reads and writes each element, and the operator then reads the copy.
        cast = library & table.has_weights
        moved = table.autocast.moved(h, casts_fused) + table.other_bytes + np.where(
            cast, table.weight_numel * (f + h + h), table.weight_bytes)
        kernels += cast if casts_fused else table.autocast.casts + cast
        if layout == "nchw":
            # cuDNN's tensor-core kernels read NHWC: given NCHW tensors (PyTorch's default) it transposes the
            # input first (nchwToNhwcKernel in a profile, reading and writing it once), and the kernel writes
            # NCHW itself (`..._nhwckrsc_nchw` in its name). channels_last tensors are NHWC already. No output
            # transpose is charged: the input's alone matches what timm measured NCHW to cost over NHWC
            # (resnet50, fp16, RTX 4090).
            transposed = table.nchw_transposed_numel > 0
            moved += table.nchw_transposed_numel * h * 2
            kernels += transposed
    else:
        moved = (table.f32_read + table.f32_written) * f + table.other_bytes + table.weight_bytes
        if layout == "nchw" and own_half.any():  # cuDNN's transpose, as under autocast, at the model's dtype
            transposed = np.where(own_half, table.nchw_transposed_numel, 0.0)
            moved = moved + transposed * HALF_BYTES * 2
            kernels += transposed > 0
    math_moved, math_kernels, _, float32_math = math_fallback_cost(
        table.math_fallback, precision.half_dtype is not None, h, runtime)
    moved = moved + math_moved
    kernels += math_kernels
    kept = Traffic(moved=moved, overhead_s=kernels * KERNEL_OVERHEAD_US * 1e-6, library=library,
                   on_math=table.math_fallback[:, 0] > 0, float32_math=float32_math)
    for column in (kept.moved, kept.overhead_s, kept.on_math):
        column.flags.writeable = False  # kept with the table: every later prediction of the graph reads them
    return kept


@dataclass(frozen=True, eq=False)
class Roofline:
    """Per-operator bounds of one graph on one GPU at one precision, as arrays in graph order (views are 0)."""

    time_s: np.ndarray
    busy_s: np.ndarray  # the part of time_s the bounding unit works
    moved: np.ndarray  # bytes read and written
    bound: np.ndarray  # index into BOUNDS (:mod:`dippm_nas.cost.estimate`)
    peak: np.ndarray  # FLOP/s of the unit each operator's arithmetic is priced on (:func:`units`)


def roofline(table: NodeTable, request: Request, casts_fused: bool = False) -> Roofline:
    """Every operator's roofline time on the request's GPU at its precision and layout (``casts_fused``: as
    :func:`traffic`)."""
    gpu, precision = request.gpu, request.precision
    moves = traffic(table, precision, request.layout, request.runtime, casts_fused)
    by_library = {lib: peak_tflops(lib, gpu, precision) for lib in set(operators.kind_table().library)}
    peak = (np.array([by_library[lib] for lib in operators.kind_table().library]) * 1e12)[table.kind]
    own_half = table.half_operands
    if own_half.any():  # a library's product of half operands runs on that dtype's tensor cores
        half_peak = _half_peaks(table, gpu)
        peak = np.where(own_half & moves.library & (half_peak > 0), half_peak, peak)
    # A convolution whose channels per group keep it off the tensor cores (depthwise, an RGB stem) runs on the
    # CUDA cores; at half precision cuDNN's kernels for it compute in float32 ("pseudo-half": half storage,
    # float32 arithmetic). So does math attention's float32 GEMM.
    on_math = moves.on_math
    peak = np.where(table.cuda_core_conv | (on_math & moves.float32_math), gpu.fp32_tflops * 1e12, peak)
    compute_s = table.flops / peak
    memory_s = moves.moved / (gpu.memory_bw_gbs * 1e9)
    overhead_s = moves.overhead_s
    # Math attention is a dozen kernels one after another: its GEMMs' time and its passes over the scores add up
    # rather than overlap.
    busy_s = np.where(on_math, compute_s + memory_s, np.maximum(compute_s, memory_s))
    # A kernel that loops over planes in every thread (ATen's NCHW bilinear upsampling) is bound by memory
    # latency: each iteration waits on its loads, one wave of blocks after another.
    waves = np.ceil(table.serial_blocks / gpu.sm_count)
    latency_s = table.serial_iterations * waves * MEMORY_ROUND_TRIP_NS * 1e-9
    run_s = np.maximum(busy_s, latency_s)
    view = table.is_view
    bound = np.where(overhead_s > run_s, 2, np.where(compute_s >= np.maximum(memory_s, latency_s), 0, 1))
    return Roofline(time_s=np.where(view, 0.0, run_s + overhead_s), busy_s=np.where(view, 0.0, busy_s),
                    moved=np.where(view, 0.0, moves.moved), bound=np.where(view, 3, bound), peak=peak)


def _half_peaks(table: NodeTable, gpu: Device) -> np.ndarray:
    """Per operator, the tensor-core peak (FLOP/s) of the half dtype its operands are in (the model's own, not
    autocast's), 0 where they are not half or the spec sheet has no such tensor cores."""
    peaks = [0.0, *((getattr(gpu, f"{HALF_FORMATS[dtype]}_tflops") or 0.0) * 1e12 for dtype in HALF_OPERAND_DTYPES)]
    return np.asarray(peaks)[table.operand_half]


def units(table: NodeTable, peak: np.ndarray, request: Request) -> np.ndarray:
    """Per operator, the unit the roofline priced its arithmetic on, from the peak it used (:attr:`Roofline.peak`):
    tensor cores (TF32, FP16, BF16) for matrix products, attention and convolutions whose channels suit them where
    the precision's flags allow it, the CUDA cores otherwise (in FP32 arithmetic for a matrix product, attention or
    convolution kept off the tensor cores, on half tensors where they are half: "FP32 math on FP16"); '' for a
    view.

    >>> import dippm_nas
    >>> from dippm_nas.cost.pipeline.table import node_table
    >>> table = node_table(dippm_nas.build_graph("resnet18", batch=1))
    >>> request = dippm_nas.Request.of("a100-40gb", "fp32")
    >>> sorted(set(units(table, roofline(table, request).peak, request)) - {""})
    ['CUDA cores', 'CUDA cores (FP32)', 'tensor cores (TF32)']
    """
    library = operators.kind_table().has_library[table.kind]
    tensor = library & on_tensor_cores(peak, request.gpu)
    precision = request.precision
    formats = [HALF_FORMATS[precision.half_dtype] if precision.half_dtype else "tf32",
               *(HALF_FORMATS[dtype] for dtype in HALF_OPERAND_DTYPES)]
    tensor_units = np.asarray([f"tensor cores ({name.upper()})" for name in formats])[table.operand_half]
    fp32_units = np.asarray(["CUDA cores (FP32)" if i == 0 and not precision.half_dtype
                             else f"CUDA cores (FP32 math on {name.upper()})" for i, name in enumerate(formats)])
    named = np.where(tensor, tensor_units, np.where(library, fp32_units[table.operand_half], "CUDA cores"))
    return np.where(table.is_view, "", named).astype(object)  # Python strings, as a NodeCost holds them
