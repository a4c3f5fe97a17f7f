r"""The analytical cost model: a roofline per operator, with launch overhead, liveness and power.

It needs no training data and works on every device with a spec sheet. It gets the physics right
(what is compute-bound, what is memory-bound, what a slice or a precision changes) but assumes every
kernel reaches the peak of its unit; the learned model (PMGNS) corrects that from measurements.

For each operator :math:`i` with :math:`F_i` FLOPs and :math:`B_i` bytes moved:

.. math::

    t_i = \max(F_i / P_{unit}, B_i / W, n_i t_{mem}) + k_i \cdot t_{launch}

where :math:`P_{unit}` is the device's peak for the unit that runs it at the precision (tensor cores for
matrix products and for convolutions whose channels per group suit them, the CUDA cores otherwise), :math:`W` the
memory bandwidth, :math:`k_i` the number of kernels it launches, and :math:`n_i` the iterations each
thread of a kernel runs one after another where ATen's kernel loops in every thread (bilinear upsampling
of NCHW planes), each waiting one memory round trip :math:`t_{mem}`. Views (reshape, permute,
slicing) are free, as in PyTorch eager; the copies eager makes where a view is impossible are nodes of
the graph (:mod:`dippm_nas.graph.eager_layout`). Eager PyTorch issues the operators from one host
thread, :math:`h` seconds each, and the GPU starts one only once it is issued, so the latency is
:math:`\max_k (k h + \sum_{i \ge k} t_i)` (:func:`queued_latency`): the GPU's at large batches, the
host's at small ones. Energy is :math:`P_{idle} T + (P_{TDP} - P_{idle}) \sum_i u_i t_i` with :math:`T`
the latency and :math:`u_i` the fraction of :math:`t_i` the bounding unit is busy. Half precision means
``torch.autocast``: each operator moves its activations in the precision autocast runs it in (its kind's
policy in the operator registry: convolutions and matrix products in the lower precision, normalisations in
float32, everything else in the widest type of its inputs, so a transformer's residual stream stays
float32) and pays the casts between them. A model whose own tensors are half (its weights cast with
``model.half()``) pays no cast: each operator moves its tensors at their own dtypes, and a matrix product or
convolution of half operands runs on the tensor cores of that dtype whatever the precision's flags. A
tensor-core convolution on NCHW activations at half precision also pays the transpose of its input that
cuDNN runs before it.
Memory is the CUDA context and the peak of the segments PyTorch's caching allocator reserves when it
serves the library workspace, the weights, the inputs and then the operators' outputs and transient
buffers in execution order (:mod:`dippm_nas.cost.allocator`), each output freed when eager frees it:
after its last reader or, when a module call it was passed into or a local variable still holds it,
once eager drops that reference (``NodeTable.free_step``).

Everything is computed over the columns of a :class:`~dippm_nas.cost.table.NodeTable` (one pass over
the operators), so the learned model, which needs this estimate for every prediction, stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from weakref import WeakKeyDictionary

import numpy as np

from dippm_nas.cost.allocator import MIB, replay
from dippm_nas.cost.base import Estimate, MemoryBreakdown, NodeCost
from dippm_nas.cost.error_table import lookup
from dippm_nas.cost.host import HostProfile, get_host_profile, host_seconds
from dippm_nas.cost.table import FULL_BYTES, HALF_BYTES, HALF_OPERAND_DTYPES, NodeTable, node_table
from dippm_nas.graph import operators
from dippm_nas.graph.cast import graph_at_precision
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.graph.operators.attention import math_fallback_cost
from dippm_nas.hardware.registry import DEFAULT_LAYOUT, Device, check_layout
from dippm_nas.modes import DEFAULT_MODE
from dippm_nas.precisions import DEFAULT_PRECISION, HALF_FORMATS, TF32_FLAGS, PrecisionLike, precision_named

#: GPU time per kernel beyond its roofline time: launch and completion of a short kernel. NVIDIA's
#: "Getting Started with CUDA Graphs" (2019) measures about 3-4 us per short kernel launched from a
#: stream; PyTorch eager's own time on the host to issue an operator is a host profile's (``cost/host.py``).
KERNEL_OVERHEAD_US = 4.0

#: A prediction whose GPU waits on the host for more than this share of its latency says so.
HOST_BOUND_NOTE_SHARE = 0.25


def host_bound_notes(wait_share: float, operators: int, host: str | HostProfile | None = None,
                     half: bool = False) -> tuple[str, ...]:
    """What a user should know when the latency is the host's, not the GPU's (``half``: under autocast)."""
    if wait_share < HOST_BOUND_NOTE_SHARE:
        return ()
    profile = get_host_profile(host)
    return (f"the GPU waits on the host for {wait_share:.0%} of this latency: eager PyTorch issues {operators} "
            f"operators at about {profile.issue_us(half):.0f} us each ({profile.description}); a faster CPU, "
            "CUDA graphs (mode 'cuda-graphs') or torch.compile would shorten it",)

#: One dependent round trip to device memory: about 230-250 ns on the GDDR6 and GDDR6X cards by
#: pointer chasing (Chips and Cheese, "Measuring GPU Memory Latency", 2021: 226 ns on a 6900 XT,
#: Ampere's about the same); HBM parts are in the same range. A kernel whose threads each loop over
#: many elements in turn, with too few threads to hide it, pays it once per iteration: EfficientFormerV2,
#: which upsamples 1024 channels from 7x7 to 14x14 that way two to six times, spends most of its time there.
MEMORY_ROUND_TRIP_NS = 250.0

#: What a PyTorch process holds on the GPU outside its caching allocator once CUDA, cuBLAS and cuDNN
#: are initialised: the CUDA context and the libraries' handles. The reference notes give 300-400 MB
#: for the context alone with lazy module loading (PyTorch's default since 1.13) and the handles on
#: top; the harness measured 599.6 MiB for both together, the same in every run (H100 80GB HBM3,
#: driver 580.159.04, CUDA 13.0, PyTorch 2.11: ``memory_context_mib`` in data/measurements/h100.csv).
CUDA_CONTEXT_MIB = 600.0

#: What the process holds beyond that once the model's own kernels have run: CUDA lazy module loading
#: brings in each kernel's module on first use, and cuDNN and cuBLAS keep per-algorithm state. On an
#: H200 (driver 580.159.04, CUDA 13.0, PyTorch 2.11), NVML's per-process memory minus PyTorch's peak
#: reserved memory was 693-695 MiB in each of six configurations (convolutional and transformer models,
#: fp32 and fp16, batch 8 and 64; ``data/h200/memcheck.txt``) against the 599.6 MiB context the harness
#: measures with two tiny kernels: the kernels' modules add about 95 MiB, whatever the model.
KERNEL_MODULES_MIB = 95.0

#: cuBLAS workspace PyTorch allocates per handle: CUBLAS_WORKSPACE_CONFIG ':4096:8' (8 x 4 MiB), its
#: default on Hopper; older GPUs use less (':4096:2:16:8', about 8 MiB), so this is an upper bound.
CUBLAS_WORKSPACE_MIB = 32.0

#: What a GPU draws while it waits with a context open, as a share of its TDP. Reference notes give
#: 10-20 % for an idle data-centre GPU (an idle A100-SXM4 reads about 50-60 W of its 400 W). This
#: value is fitted on the H100's batch-1 training records, where the GPU waits on the host for most of
#: the latency, by solving measured power = idle + (TDP - idle) x the roofline's busy share.
IDLE_POWER_FRACTION = 0.18


def spec_powers(device: Device) -> tuple[float, float]:
    """The watts ``device`` draws while it waits (:data:`IDLE_POWER_FRACTION` of its TDP) and while its
    bounding unit works (its TDP), as its spec sheet gives them; a calibration may fit both to measured energy."""
    return IDLE_POWER_FRACTION * device.tdp_w, device.tdp_w


def energy_j(latency_s: float, busy_s: float, idle_w: float, busy_w: float) -> float:
    """Joules of one inference: the idle power over the whole latency (the GPU idles while it waits on the
    host) and what the busy power adds over the roofline's busy seconds.

    >>> energy_j(0.010, 0.004, 100.0, 400.0)
    2.2
    """
    return latency_s * idle_w + busy_s * (busy_w - idle_w)


def version_numbers(version: str) -> tuple[int, ...]:
    """The numbers of a version string, without its local part.

    >>> version_numbers("2.11.0+cu130")
    (2, 11, 0)
    """
    return tuple(int(p) for p in version.split("+")[0].split(".") if p.isdigit())


def torch_major_minor(version: str | None) -> tuple[int, int] | None:
    """(major, minor) of a PyTorch version string; None for the current one (or an unreadable one)."""
    numbers = version_numbers(version or "")
    return (numbers + (0,))[:2] if numbers else None


#: What bounds an operator, as :class:`~dippm_nas.cost.base.NodeCost` names it.
BOUNDS = ("compute", "memory", "overhead", "free")


def _element_bytes(precision: PrecisionLike) -> int | None:
    """Bytes of an element autocast runs at, None without autocast: which allocations the table replays."""
    numbers = precision_named(precision)
    return numbers.element_bytes if numbers.autocast else None


def _library_kinds(table: NodeTable) -> np.ndarray:
    """Per operator, whether a library (cuDNN, cuBLAS) runs its arithmetic, which may put it on tensor cores."""
    return operators.kind_table().has_library[table.kind]


def _peak_live(table: NodeTable, precision: PrecisionLike, casts: np.ndarray, workspace: np.ndarray) -> float:
    """Peak bytes of the live outputs plus each operator's transient bytes while it runs."""
    inputs = table.input_bytes
    if not len(table):
        return inputs
    owns = table.free_step >= 0
    sizes = np.where(owns, table.allocations(_element_bytes(precision)), 0.0)
    freed = np.bincount(table.free_step[owns], weights=sizes[owns], minlength=len(table) + 1)[:len(table)]
    live = inputs + np.cumsum(sizes) - (np.cumsum(freed) - freed)  # after each operator allocates
    return max(inputs, float((live + casts.sum(axis=1) + workspace.sum(axis=1)).max()))


def queued_latency(time_s: np.ndarray, host_s: np.ndarray, gpu_scales: np.ndarray) -> np.ndarray:
    """Seconds until the last operator ends, one per scale of every operator's GPU time, when one host
    thread issues the operators in order and the GPU runs them in that order: operator i starts once
    issued (at ``host_s[:i+1].sum()``) and once operator i - 1 has ended, so the end is the largest,
    over k, of the time k is issued plus the GPU time of k and everything after it.

    Here the host binds: halving the GPU's time shortens the latency by a fifth, not a half.

    >>> queued_latency(np.array([1.0, 1.0]), np.array([3.0, 0.5]), np.array([1.0, 0.5])).tolist()
    [5.0, 4.0]
    """
    if not len(time_s):
        return np.zeros(len(gpu_scales))
    issued = np.cumsum(host_s)
    remaining = np.cumsum(time_s[::-1])[::-1]
    return (issued[None, :] + gpu_scales[:, None] * remaining[None, :]).max(axis=1)


def peak_tflops(library: str | None, device: Device, precision: PrecisionLike) -> float:
    """The peak of the unit that runs an operator whose arithmetic runs in ``library`` (``cudnn``,
    ``cublas``, None for neither) at ``precision``, as PyTorch runs it (:mod:`dippm_nas.precisions`): in
    ``fp32`` cuDNN convolutions on TF32 tensor cores where the GPU has them and cuBLAS matrix products in full FP32,
    in ``fp32-strict`` everything in FP32, in ``tf32`` both on TF32 tensor cores.

    >>> from dippm_nas.hardware import get_device
    >>> a100 = get_device("a100-40gb")
    >>> [peak_tflops(lib, a100, p) for lib, p in (("cudnn", "fp32"), ("cublas", "fp32"), ("cudnn", "fp32-strict"))]
    [156.0, 19.5, 19.5]
    """
    unit = precision_named(precision).tensor_core_format(library)
    if unit is None:
        return device.fp32_tflops
    if unit == "tf32":
        return device.tf32_tflops or device.fp32_tflops
    return device.tensor_tflops(precision)


def _half_peaks(table: NodeTable, device: Device) -> np.ndarray:
    """Per operator, the tensor-core peak (FLOP/s) of the half dtype its operands are in (the model's own, not
    autocast's), 0 where they are not half or the spec sheet has no such tensor cores."""
    peaks = [0.0, *((getattr(device, f"{HALF_FORMATS[dtype]}_tflops") or 0.0) * 1e12 for dtype in HALF_OPERAND_DTYPES)]
    return np.asarray(peaks)[table.operand_half]


def _tensor_core_units(table: NodeTable, precision: PrecisionLike) -> np.ndarray:
    """Per operator, the tensor cores its arithmetic would run on, by format: the half dtype of its own
    operands, else the precision's half format, else TF32."""
    numbers = precision_named(precision)
    formats = [HALF_FORMATS[numbers.half_dtype] if numbers.half_dtype else "tf32",
               *(HALF_FORMATS[dtype] for dtype in HALF_OPERAND_DTYPES)]
    return np.asarray([f"tensor cores ({name.upper()})" for name in formats])[table.operand_half]


def units_of(peak: np.ndarray, table: NodeTable, device: Device, precision: PrecisionLike) -> np.ndarray:
    """Per operator, the unit the roofline priced its arithmetic on, from the peak it used (``Roofline.peak``):
    tensor cores (TF32, FP16, BF16) where that peak is above the FP32 one, the CUDA cores otherwise
    (in FP32 for a matrix product, attention or convolution kept off the tensor cores); '' for a view."""
    can_use_tensor_cores = _library_kinds(table)
    tensor = can_use_tensor_cores & (peak != device.fp32_tflops * 1e12)
    units = np.where(tensor, _tensor_core_units(table, precision),
                     np.where(can_use_tensor_cores, "CUDA cores (FP32)", "CUDA cores"))
    return np.where(table.is_view, "", units).astype(object)  # Python strings, as a NodeCost holds them


def operator_units(table: NodeTable, device: Device, precision: PrecisionLike,
                   torch_version: tuple[int, int] | None = None) -> np.ndarray:
    """Per operator, the unit its arithmetic runs on at ``precision``, as the roofline prices it: tensor
    cores (TF32, FP16, BF16) for matrix products, attention and convolutions whose channels suit them where the
    precision's flags allow it, the CUDA cores otherwise; '' for a view.

    >>> import dippm_nas
    >>> from dippm_nas.cost.table import node_table
    >>> table = node_table(dippm_nas.build_graph("resnet18", batch=1))
    >>> a100 = dippm_nas.get_device("a100-40gb")
    >>> sorted(set(operator_units(table, a100, "fp32")) - {""})
    ['CUDA cores', 'CUDA cores (FP32)', 'tensor cores (TF32)']
    >>> sorted(set(operator_units(table, a100, "fp32-strict")) - {""})
    ['CUDA cores', 'CUDA cores (FP32)']
    """
    roofline = AnalyticalCostModel().roofline(table, device, precision, torch_version=torch_version)
    return units_of(roofline.peak, table, device, precision)


def precision_note(table: NodeTable, units: np.ndarray, device: Device, precision: PrecisionLike) -> tuple[str, ...]:
    """At PyTorch's fp32 defaults on a GPU with TF32, which of the model's convolutions and matrix products run on
    TF32 tensor cores and which in full FP32: the flags decide, not the model. Each category a note tells
    apart (its ``noun``) gets a part, by the TF32 flag of its library."""
    numbers = precision_named(precision)
    if numbers.name != "fp32" or not device.tf32_tflops:
        return ()
    tf32 = units == "tensor cores (TF32)"
    flags = numbers.tf32
    parts = []
    for category in operators.categories():
        members = table.category == category.index
        if not category.noun or not category.library or not members.any():
            continue
        n, flag = int(members.sum()), TF32_FLAGS[category.library]
        if flags[category.library]:
            parts.append(f"{int((members & tf32).sum())} of {n} {category.noun}s on TF32 tensor cores "
                         f"({flag} is True by default)")
        else:
            parts.append(f"{n} {category.noun}{'s' if n > 1 else ''} in full FP32 ({flag} is False by default)")
    if not parts:
        return ()
    return (f"fp32 as PyTorch runs it: {'; '.join(parts)}; precision fp32-strict or tf32 prices other flags",)


@dataclass(frozen=True, eq=False)
class Roofline:
    """Per-operator seconds of one graph on one device, as arrays in graph order (views are 0)."""

    time_s: np.ndarray
    busy_s: np.ndarray  # the part of time_s the bounding unit works
    moved: np.ndarray  # bytes read and written
    bound: np.ndarray  # index into BOUNDS
    host_s: np.ndarray  # the host's time to issue each operator
    peak: np.ndarray  # FLOP/s of the unit each operator's arithmetic is priced on (:func:`units_of`)

    @cached_property
    def latency_s(self) -> float:
        """GPU time plus what the GPU waits on the host (:func:`queued_latency`)."""
        return float(queued_latency(self.time_s, self.host_s, np.ones(1))[0])

    def latency_curve(self, log_ratios: np.ndarray) -> np.ndarray:
        """The log of the latency (ms) were every operator's GPU time ``exp(log_ratio)`` times the
        roofline's and the host's unchanged: what the learned model's correction of GPU time gives."""
        return np.log(queued_latency(self.time_s, self.host_s, np.exp(log_ratios)) * 1e3)

    def host_wait_share(self) -> float:
        """The fraction of the latency the GPU waits on the host (none where nothing runs)."""
        if not self.latency_s:
            return 0.0
        return max(0.0, 1.0 - float(self.time_s.sum()) / self.latency_s)

    def share(self, bound: str) -> float:
        """The fraction of the GPU's time spent in operators with this bound."""
        total = float(self.time_s.sum()) or 1e-12
        return float(self.time_s[self.bound == BOUNDS.index(bound)].sum()) / total


#: Each graph's memory per set of tensors it holds (:meth:`AnalyticalCostModel.memory`), kept while its node
#: table lives: the allocator's replay is the costliest step of an estimate.
_MEMORY: WeakKeyDictionary[NodeTable, dict[tuple, MemoryBreakdown]] = WeakKeyDictionary()


class AnalyticalCostModel:
    """Roofline latency, liveness memory and utilisation-driven power; no parameters to train.

    It needs only a spec sheet, so it answers for every device of the registry and its MIG slices
    (never :class:`~dippm_nas.cost.base.NotCovered`).
    """

    name = "analytical"

    def roofline(self, table: NodeTable, device: Device, precision: PrecisionLike, layout: str = DEFAULT_LAYOUT,
                 torch_version: tuple[int, int] | None = None, *, mode: str = DEFAULT_MODE,
                 host: str | HostProfile | None = None) -> Roofline:
        """``torch_version``: PyTorch's (major, minor) where its kernels differ by version; None for the current one.
        ``mode`` and ``host``: how the operators are issued (:mod:`dippm_nas.cost.host`): eager from the
        ``host`` profile's CPU (the default's), or as one CUDA graph."""
        numbers = precision_named(precision)
        half, h, f = numbers.autocast, numbers.element_bytes, FULL_BYTES
        tensor_core = _library_kinds(table)
        kernels = table.kernels.copy()  # most operators are one kernel; an LSTM says how many
        own_half = table.half_operands  # operands half as the model has them, whatever the precision
        if half:
            # Autocast runs each operator in its own precision and casts activations between them
            # (each kind's autocast policy). It also casts each fp32 weight of an operator a library runs
            # (convolution, matrix product, attention) to the lower precision per forward, whether or not it then
            # runs on tensor cores: one more kernel that reads and writes each element, and the operator then
            # reads the copy.
            cast = tensor_core & table.has_weights
            moved = table.autocast.moved(h) + table.other_bytes + np.where(
                cast, table.weight_numel * (f + h + h), table.weight_bytes)
            kernels += table.autocast.casts + cast
            if layout == "nchw":
                # cuDNN's tensor-core kernels read NHWC: given NCHW tensors (PyTorch's default) it
                # transposes the input first (nchwToNhwcKernel in a profile, reading and writing it
                # once), and the kernel writes NCHW itself (`..._nhwckrsc_nchw` in its name).
                # channels_last tensors are NHWC already. No output transpose is charged: the input's
                # alone matches what timm measured NCHW to cost over NHWC (resnet50, fp16, RTX 4090).
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
            table.math_fallback, numbers.half_dtype is not None, h, torch_version)
        moved = moved + math_moved
        kernels += math_kernels
        peaks = np.array([peak_tflops(lib, device, precision) for lib in operators.kind_table().library]) * 1e12
        peak = peaks[table.kind]
        if own_half.any():  # a library's product of half operands runs on that dtype's tensor cores
            half_peak = _half_peaks(table, device)
            peak = np.where(own_half & tensor_core & (half_peak > 0), half_peak, peak)
        # A convolution whose channels per group keep it off the tensor cores (depthwise, an RGB
        # stem) runs on the CUDA cores; at half precision cuDNN's kernels for it compute in float32
        # ("pseudo-half": half storage, float32 arithmetic). So does math attention's float32 GEMM.
        on_math = table.math_fallback[:, 0] > 0
        peak = np.where(table.cuda_core_conv | (on_math & float32_math), device.fp32_tflops * 1e12, peak)
        compute_s = table.flops / peak
        memory_s = moved / (device.memory_bw_gbs * 1e9)
        overhead_s = kernels * KERNEL_OVERHEAD_US * 1e-6
        # Math attention is a dozen kernels one after another: its GEMMs' time and its passes over
        # the scores add up rather than overlap.
        busy_s = np.where(on_math, compute_s + memory_s, np.maximum(compute_s, memory_s))
        # A kernel that loops over planes in every thread (ATen's NCHW bilinear upsampling) is bound
        # by memory latency: each iteration waits on its loads, one wave of blocks after another.
        waves = np.ceil(table.serial_blocks / device.sm_count)
        latency_s = table.serial_iterations * waves * MEMORY_ROUND_TRIP_NS * 1e-9
        run_s = np.maximum(busy_s, latency_s)
        view = table.is_view
        bound = np.where(overhead_s > run_s, 2, np.where(compute_s >= np.maximum(memory_s, latency_s), 0, 1))
        return Roofline(time_s=np.where(view, 0.0, run_s + overhead_s), busy_s=np.where(view, 0.0, busy_s),
                        moved=np.where(view, 0.0, moved), bound=np.where(view, 3, bound),
                        host_s=host_seconds(view, half, mode, host), peak=peak)

    # -- memory ---------------------------------------------------------------------------------
    def transient_bytes(self, table: NodeTable, precision: PrecisionLike, torch_version: tuple[int, int] | None = None
                        ) -> tuple[np.ndarray, np.ndarray]:
        """Bytes each operator holds only while it runs: the cast copies it makes before it allocates
        its output, and the workspace it allocates after (one column per tensor).

        Under autocast each convolution or matrix product casts its float32 weight to half: in inference mode
        autocast casts the weights again at every call (its cache keeps only casts of tensors that
        require grad outside inference mode; PyTorch 2.15 on the CPU casts a Linear's weight three
        times in three calls, once under no_grad). An operator autocast runs in the other precision
        than its input casts that input (a transformer's linear layers read the float32 layer norm's
        output). A tensor-core convolution on NCHW half activations holds cuDNN's NHWC copy of its
        input, unless it is 1x1 with stride 1 (``NodeTable.nhwc_copy_numel``), as the H100 harness's
        peak allocated bytes at batch 256 show; its time still counts the transposition, which fits the
        timm records better. An RGB stem holds an output-sized NHWC buffer instead
        (``NodeTable.nhwc_output_bytes``), as VGG11's measured peak shows. Eager's math attention holds
        its float32 scores and copies (:func:`~dippm_nas.graph.operators.attention.math_fallback_cost`)."""
        numbers = precision_named(precision)
        held = math_fallback_cost(table.math_fallback, numbers.half_dtype is not None, numbers.element_bytes,
                                  torch_version)[2]
        if not numbers.autocast:
            own_half = table.half_operands  # a model's own half convolutions hold cuDNN's copies too, no cast
            if not own_half.any():
                return np.zeros((len(table), 1)), held
            return np.zeros((len(table), 1)), np.column_stack([
                np.where(own_half, table.nhwc_copy_numel * float(HALF_BYTES), 0.0),
                np.where(own_half, table.nhwc_output_bytes(None), 0.0), held])
        h = numbers.element_bytes
        weight = np.where(_library_kinds(table), table.weight_numel * float(h), 0.0)
        return (np.column_stack([weight, table.autocast.copies(h)]),
                np.column_stack([table.nhwc_copy_numel * float(h), table.nhwc_output_bytes(h), held]))

    def peak_activations(self, table: NodeTable, precision: PrecisionLike,
                         torch_version: tuple[int, int] | None = None) -> float:
        """Peak bytes of live tensors when the operators run in order; a view shares its input."""
        return _peak_live(table, precision, *self.transient_bytes(table, precision, torch_version))

    def memory(self, table: NodeTable, precision: PrecisionLike,
               torch_version: tuple[int, int] | None = None) -> MemoryBreakdown:
        """What the process holds: the context outside the caching allocator, and the allocator's
        peak reserved segments (:func:`~dippm_nas.cost.allocator.replay`) split into what is live at
        the activations' peak and the allocator's rounding and fragmentation on top."""
        workspace = CUBLAS_WORKSPACE_MIB * MIB
        transient = self.transient_bytes(table, precision, torch_version)
        element_bytes = _element_bytes(precision)
        # the same tensors give the same replay: a residual over the operator model asks again for its request
        key = (element_bytes, precision_named(precision).name, *(t.tobytes() for t in transient))
        known = _MEMORY.setdefault(table, {})
        if key not in known:
            resident = [workspace, *table.weight_tensor_bytes.tolist(), table.input_bytes]
            allocator = replay(resident, table.allocations(element_bytes), table.free_step, *transient)
            weights, activations = float(table.param_bytes), _peak_live(table, precision, *transient)
            slack = max(0.0, allocator.peak_reserved - weights - activations - workspace)
            known[key] = MemoryBreakdown(CUDA_CONTEXT_MIB, weights / MIB, activations / MIB, CUBLAS_WORKSPACE_MIB,
                                         slack / MIB, KERNEL_MODULES_MIB)
        return known[key]

    # -- the whole graph ------------------------------------------------------------------------
    def summarize(self, table: NodeTable, roofline: Roofline, device: Device, precision: PrecisionLike,
                  graph: ModelGraph | None = None, torch_version: tuple[int, int] | None = None,
                  host: str | HostProfile | None = None) -> Estimate:
        """Latency, energy and memory from a roofline; the per-operator costs when ``graph`` is given."""
        latency_s = roofline.latency_s
        energy = energy_j(latency_s, float(roofline.busy_s.sum()), *spec_powers(device))
        memory = self.memory(table, precision, torch_version)
        nodes: tuple[NodeCost, ...] = ()
        notes: tuple[str, ...] = ()
        if graph is not None:
            units = units_of(roofline.peak, table, device, precision)
            nodes = tuple(NodeCost(n.id, n.op, t * 1e3, n.flops, int(m), BOUNDS[b], u) for n, t, m, b, u in
                          zip(graph.nodes, roofline.time_s.tolist(), roofline.moved.tolist(), roofline.bound.tolist(),
                              units.tolist()))
            notes = precision_note(table, units, device, precision)
        notes += host_bound_notes(roofline.host_wait_share(), int((~table.is_view).sum()), host,
                                  precision_named(precision).autocast)
        return Estimate(latency_ms=latency_s * 1e3, energy_j=energy, memory_mib=memory.total_mib,
                        cost_model=self.name, answered_by=self.name, memory=memory, nodes=nodes, notes=notes)

    def estimate(self, graph: ModelGraph, device: Device, precision: PrecisionLike = DEFAULT_PRECISION,
                 layout: str = DEFAULT_LAYOUT, *,
                 mode: str = DEFAULT_MODE, host: str | HostProfile | None = None) -> Estimate:
        """Latency, energy and memory of one inference of ``graph`` at its batch, with per-operator costs,
        and (``error``) the model's latency error on the measured records most like the request
        (:mod:`dippm_nas.cost.error_table`).

        A precision of half weights prices the graph cast to them (:func:`~dippm_nas.graph.cast.graph_at_precision`).
        Raises :class:`~dippm_nas.errors.DippmError` for an unknown precision or layout, or a precision
        the device has no tensor cores for.

        >>> import dippm_nas
        >>> graph = dippm_nas.build_graph("resnet18", batch=8)
        >>> estimate = AnalyticalCostModel().estimate(graph, dippm_nas.get_device("a100-40gb"))
        >>> estimate.cost_model, 0 < estimate.latency_ms < 100, estimate.memory.weights_mib < estimate.memory_mib
        ('analytical', True, True)
        >>> estimate.top_nodes(1)[0].op
        'nn.conv2d'
        """
        precision, host = precision_named(precision), get_host_profile(host)
        check_layout(layout)
        graph = graph_at_precision(graph, precision)[0]
        table = node_table(graph)
        roofline = self.roofline(table, device, precision, layout, mode=mode, host=host)
        estimate = self.summarize(table, roofline, device, precision, graph, host=host)
        if estimate.latency_ms <= 0:  # nothing runs: no latency to be wrong about
            return estimate
        return replace(estimate, error=lookup(self.name, device, precision, graph.batch))

