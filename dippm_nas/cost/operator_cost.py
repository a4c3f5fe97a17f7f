"""The operator-level cost model: every operator's kernel timed by the learned operator model, the whole
model through the host queue, energy and memory as the analytical model has them.

Each operator of the graph becomes a row of :class:`~dippm_nas.cost.kernel_structure.KernelColumns` on the
unit the roofline prices it on; the operator model (:mod:`dippm_nas.cost.operator_model`) gives its
kernel's time, which replaces the roofline's core term. What the roofline charges beyond the core (the
casts autocast adds, cuDNN's transposes, eager's math attention, more kernels than one) stays, and so do
the host's time to issue each operator and the queue that composes them
(:func:`~dippm_nas.cost.analytical.queued_latency`): eager at small batches waits on the host, under
CUDA graphs it does not. No operator is predicted faster than its roofline (for a 3x3 convolution cuDNN
may run as Winograd, the Winograd arithmetic's). Energy is the analytical power model over the new latency,
and memory the analytical liveness model, which learned times do not change.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from weakref import WeakKeyDictionary

import numpy as np

from dippm_nas.cost.analytical import KERNEL_OVERHEAD_US, AnalyticalCostModel, Roofline
from dippm_nas.cost.base import Estimate, NotCovered
from dippm_nas.cost.calibration import Calibration
from dippm_nas.cost.card import OPERATOR_WEIGHTS, operator_model_mismatch
from dippm_nas.cost.error_table import lookup
from dippm_nas.cost.host import HostProfile, get_host_profile
from dippm_nas.cost.kernel_structure import (
    GEMM_GROUPS,
    GROUPS,
    UNITS,
    WINOGRAD_FLOP_SAVING,
    KernelColumns,
    winograd_eligible,
)
from dippm_nas.cost.table import FULL_BYTES, HALF_BYTES, SHAPE_COLUMNS, NodeTable, node_table
from dippm_nas.graph import operators
from dippm_nas.graph.cast import graph_at_precision
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.hardware.registry import DEFAULT_LAYOUT, Device, check_layout
from dippm_nas.modes import DEFAULT_MODE
from dippm_nas.precisions import DEFAULT_PRECISION, PrecisionLike, precision_named


@dataclass(frozen=True)
class LatencyParts:
    """Per operator in issue order: GPU seconds of the GEMM-class kernels (0 for the others), of the other
    kernels (0 for GEMM-class ones), and the host's seconds to issue it."""

    gemm_s: np.ndarray
    other_s: np.ndarray
    host_s: np.ndarray
    busy_s: float = 0.0  # the roofline's busy seconds, which the energy reads (:func:`~.analytical.energy_j`)

    def latency_s(self, gemm_scale: np.ndarray, memory_scale: np.ndarray, host_scale: np.ndarray) -> np.ndarray:
        """The queued latency (:func:`~dippm_nas.cost.analytical.queued_latency`) for each set of scales:
        the largest, over operators k, of the time k is issued plus the GPU time of k and all after it."""
        issued = np.cumsum(self.host_s)
        gemm_left = np.cumsum(self.gemm_s[::-1])[::-1]
        other_left = np.cumsum(self.other_s[::-1])[::-1]
        ends = (host_scale[:, None] * issued[None, :] + gemm_scale[:, None] * gemm_left[None, :]
                + memory_scale[:, None] * other_left[None, :])
        return ends.max(axis=1)


def _group_of_kind(kernels: tuple[str, ...]) -> np.ndarray:
    """The model's group of each kind of the vocabulary, from one of the registry's per-kind kernel columns."""
    return np.array([GROUPS.index(kernel) for kernel in kernels])


def kernel_groups(table: NodeTable) -> np.ndarray:
    """Each operator's kernel group (an index into :data:`~dippm_nas.cost.kernel_structure.GROUPS`): its
    registry entry's, or the one its category names for operators whose shapes keep them off the tensor
    cores (the convolutions cuDNN runs on the CUDA cores)."""
    kinds = operators.kind_table()
    return np.where(table.cuda_core_conv, _group_of_kind(kinds.cuda_core_kernel)[table.kind],
                    _group_of_kind(kinds.kernel)[table.kind])


def kernel_columns(table: NodeTable, peak: np.ndarray, device: Device, precision: PrecisionLike) -> KernelColumns:
    """A graph's operators as the operator model reads them, on the units ``peak`` (the roofline's) prices
    them on. The bytes are what each operator itself must move at its dtype; autocast's casts and cuDNN's
    transposes stay the roofline's."""
    numbers = precision_named(precision)
    group = kernel_groups(table)
    lower = numbers.autocast & ~table.autocast.stays_f32
    own_half = table.half_operands  # a model's own half tensors: half bytes and half tensor cores, no autocast
    element_bytes = np.where(lower, float(numbers.element_bytes), np.where(own_half, float(HALF_BYTES),
                                                                           float(FULL_BYTES)))
    moved = (table.f32_read + table.f32_written + table.weight_numel) * element_bytes + table.other_bytes
    tensor = peak > device.fp32_tflops * 1e12 * 1.001
    tensor_unit = np.where(own_half | numbers.autocast, UNITS.index("tensor_half"), UNITS.index("tensor_tf32"))
    unit = np.where(tensor, tensor_unit, UNITS.index("cuda_cores"))
    shape = table.shape_attrs
    kernel = shape[:, SHAPE_COLUMNS.index("kernel_h")]
    square = kernel == shape[:, SHAPE_COLUMNS.index("kernel_w")]
    stride = np.maximum(shape[:, SHAPE_COLUMNS.index("strides_0")], shape[:, SHAPE_COLUMNS.index("strides_1")])
    conv = group == GROUPS.index("conv")
    return KernelColumns(
        group=group, unit=unit, element_bytes=element_bytes, flops=table.flops, moved=moved, gemm=table.gemm,
        rows=table.rows, winograd=conv & square & winograd_eligible(kernel, stride)
        & (shape[:, SHAPE_COLUMNS.index("groups")] <= 1),
        weight_operand=(group == GROUPS.index("gemm")) & table.has_weights, peak=peak)


def core_and_floor(columns: KernelColumns, roofline: Roofline, device: Device) -> tuple[np.ndarray, np.ndarray]:
    """Per operator, the roofline's time of the kernel alone (what the learned time replaces: its FLOPs at the
    peak or its own bytes at the bandwidth, and one launch) and the least time it may take: the roofline's,
    with Winograd's arithmetic for a 3x3 convolution on the CUDA cores."""
    core = np.maximum(columns.flops / roofline.peak, columns.moved / (device.memory_bw_gbs * 1e9))
    core = core + KERNEL_OVERHEAD_US * 1e-6
    floor = np.where(columns.winograd & (columns.unit == 0), roofline.time_s / WINOGRAD_FLOP_SAVING, roofline.time_s)
    return core, floor


#: Per node table (kept while its graph lives), the operator model's kernel seconds by loaded weights, device,
#: precision and peaks: the residual reads the operator model's times more than once for one prediction.
_KERNEL_SECONDS: WeakKeyDictionary[NodeTable, dict[tuple, tuple[object, np.ndarray]]] = WeakKeyDictionary()


class OperatorCostModel:
    """The analytical estimate with each operator's kernel timed by the learned operator model at ``path``.

    It raises :class:`~dippm_nas.cost.base.NotCovered` where there is no trained model or its card does
    not match this version's features, with what to run to retrain it.

    >>> import dippm_nas
    >>> graph = dippm_nas.build_graph("resnet18", batch=8)
    >>> estimate = OperatorCostModel().estimate(graph, dippm_nas.get_device("a100-40gb"))
    >>> estimate.cost_model.startswith("operators"), len(estimate.top_nodes(5))
    (True, 5)
    """

    name = "operators"

    def __init__(self, path: Path = OPERATOR_WEIGHTS):
        self.path = path
        self.analytical = AnalyticalCostModel()

    def covers(self) -> str | None:
        """None where a trained model whose features this version computes is at the path, else why not
        (from its card alone: no torch)."""
        return operator_model_mismatch(self.path)

    def gpus_in_training(self) -> frozenset[str]:
        """The GPUs whose operators or whole-model records the model learned from."""
        from dippm_nas.cost.operator_model import load

        card = load(self.path).card
        return frozenset(card["trained_on"]) | frozenset(card.get("records", ()))

    def operator_seconds(self, table: NodeTable, roofline: Roofline, device: Device, precision: PrecisionLike,
                         calibration: Calibration | None = None) -> np.ndarray:
        """Each operator's GPU seconds: the roofline's time beyond its core, plus the kernel's learned time;
        never below the roofline; scaled by ``calibration`` where one is given."""
        seconds, gemm_class = self.timed_operators(table, roofline, device, precision)
        return seconds if calibration is None else calibration.scale_times(seconds, gemm_class)

    def timed_operators(self, table: NodeTable, roofline: Roofline, device: Device,
                        precision: PrecisionLike) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`operator_seconds` uncalibrated, and which operators are GEMM-class (a calibration scales
        them apart from the others)."""
        from dippm_nas.cost.operator_model import load

        columns = kernel_columns(table, roofline.peak, device, precision)
        core, floor = core_and_floor(columns, roofline, device)
        model = load(self.path)
        key = (id(model), device, precision_named(precision).name, roofline.peak.tobytes())
        known = _KERNEL_SECONDS.setdefault(table, {}).get(key)
        if known is None:  # the network runs once per graph and request, however many estimates read it
            run = np.flatnonzero(~table.is_view)
            learned = np.zeros(len(table))
            learned[run] = model.seconds(columns.take(run), device)
            known = _KERNEL_SECONDS[table][key] = (model, learned)  # the model kept: its id is not reused
        learned = known[1]
        seconds = np.where(table.is_view, 0.0, np.maximum(np.maximum(roofline.time_s - core, 0.0) + learned, floor))
        return seconds, np.isin(columns.group, [GROUPS.index(g) for g in GEMM_GROUPS])

    def latency_parts(self, graph: ModelGraph, device: Device, precision: PrecisionLike = DEFAULT_PRECISION,
                      layout: str = DEFAULT_LAYOUT, *, mode: str = DEFAULT_MODE,
                      host: str | HostProfile | None = None) -> LatencyParts:
        """What a calibration scales, per operator in issue order: the GPU seconds of the GEMM-class kernels
        and of the others, and the host's seconds to issue each."""
        table = node_table(graph_at_precision(graph, precision)[0])
        roofline = self.analytical.roofline(table, device, precision, layout, mode=mode, host=host)
        seconds, gemm_class = self.timed_operators(table, roofline, device, precision)
        return LatencyParts(np.where(gemm_class, seconds, 0.0), np.where(gemm_class, 0.0, seconds), roofline.host_s,
                            float(roofline.busy_s.sum()))

    def estimate(self, graph: ModelGraph, device: Device, precision: PrecisionLike = DEFAULT_PRECISION,
                 layout: str = DEFAULT_LAYOUT, *,
                 mode: str = DEFAULT_MODE, host: str | HostProfile | None = None,
                 calibration: Calibration | None = None) -> Estimate:
        """Latency, energy and memory of one inference of ``graph`` at its batch, with each operator's time;
        with ``calibration`` its kernel times, its host (which replaces ``host``), power and memory are the
        fitted ones, and its leave-one-out error is the latency error.

        Raises NotCovered without a trained model that matches this version, and DippmError for an unknown
        precision or layout, or a precision the device has no tensor cores for."""
        precision = precision_named(precision)
        check_layout(layout)
        reason = self.covers()
        if reason:
            raise NotCovered(reason)
        host = calibration.host_profile() if calibration is not None else get_host_profile(host)
        graph = graph_at_precision(graph, precision)[0]
        table = node_table(graph)
        roofline = self.analytical.roofline(table, device, precision, layout, mode=mode, host=host)
        timed = replace(roofline, time_s=self.operator_seconds(table, roofline, device, precision, calibration))
        estimate = self.analytical.summarize(table, timed, device, precision, graph, host=host)
        if calibration is not None:
            estimate = calibration.adjusted(estimate, timed.latency_s, float(timed.busy_s.sum()), device)
        notes = estimate.notes + self._notes(device, precision) + ((calibration.note(),) if calibration else ())
        estimate = replace(estimate, cost_model=self.name, answered_by=self.name, notes=notes)
        if estimate.latency_ms <= 0:
            return estimate
        if calibration is not None:
            return replace(estimate, error=calibration.error())
        return replace(estimate, error=lookup(self.name, device, precision, graph.batch))

    def _notes(self, device: Device, precision: PrecisionLike) -> tuple[str, ...]:
        """Which data backs the operators' units at this precision and on this GPU."""
        from dippm_nas.cost.operator_model import load

        card = load(self.path).card
        trained = card["trained_on"]
        gpu = device.whole_gpu().key
        notes = []
        if device.slice_of:
            notes.append(f"MIG slice {device.slice_of}: no slice was measured; its operators are timed on the "
                         "slice's SMs and its share of the memory bandwidth")
        if gpu not in trained:
            notes.append(f"no operator of {gpu} was measured: the operator model reads its spec sheet (SMs, clock, "
                         f"peaks, bandwidth, L2, TDP, process, generation); docs/operators.md gives its error on GPUs "
                         "held out of its training")
        numbers = precision_named(precision)
        if numbers.half_dtype or numbers.tf32["cublas"] or numbers.tf32["cudnn"]:
            # the operator sweeps name operators by the registry's kinds, NeuSight's fp32 corpus by its own
            swept = sorted(g for g, ops in trained.items() if any(op in ops for op in ("mm", "sdpa")))
            records = ", ".join(sorted(card["records"]))
            notes.append(f"tensor-core operators are learned from the operator sweeps of {', '.join(swept) or 'no GPU'}"
                         f" and the whole-model records of {records} only; fp32 operators on the CUDA cores from "
                         "NeuSight's corpus of five GPUs as well")
        return tuple(notes)
