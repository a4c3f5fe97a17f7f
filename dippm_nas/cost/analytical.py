r"""The analytical cost model: a roofline per operator, with launch overhead, liveness and power.

It needs no training data and works on every device with a spec sheet. It gets the physics right
(what is compute-bound, what is memory-bound, what a slice or a precision changes) but assumes every
kernel reaches the peak of its unit; the learned model (PMGNS) corrects that from measurements.

For each operator :math:`i` with :math:`F_i` FLOPs and :math:`B_i` bytes moved:

.. math::

    t_i = \max(F_i / P_{unit}, B_i / W) + k_i \cdot t_{launch}

where :math:`P_{unit}` is the device's peak for the unit that runs it at the precision, :math:`W` the
memory bandwidth and :math:`k_i` the number of kernels it launches. Views (reshape, permute,
slicing) are free, as in PyTorch eager. Energy is :math:`\sum_i t_i (P_{idle} + (P_{TDP} - P_{idle})
u_i)` with :math:`u_i` the fraction of :math:`t_i` the bounding unit is busy. A tensor-core
convolution on NCHW activations at half precision also pays the two transposes cuDNN runs around it.
Memory is the CUDA
context, the weights, the peak of the live activations over the operators in execution order, and
the library workspace.
"""

from __future__ import annotations

from dippm_nas.cost.base import Estimate, MemoryBreakdown, NodeCost, register_cost_model
from dippm_nas.graph.model_graph import ModelGraph, Node, Tensor
from dippm_nas.hardware.registry import Device, check_layout, check_precision

MIB = 2**20

#: GPU time per kernel beyond its roofline time: launch and completion of a short kernel. NVIDIA's
#: "Getting Started with CUDA Graphs" (2019) measures about 3-4 us per short kernel launched from a
#: stream; PyTorch eager adds its dispatch on top, which hides behind the GPU for larger kernels.
KERNEL_OVERHEAD_US = 4.0

#: CUDA context of a PyTorch process: 300-400 MB with lazy module loading, PyTorch's default since
#: 1.13 (reference/README.md); the middle of that range.
CUDA_CONTEXT_MIB = 350.0

#: cuBLAS workspace PyTorch allocates per handle: CUBLAS_WORKSPACE_CONFIG ':4096:8' (8 x 4 MiB), its
#: default on Hopper; older GPUs use less (':4096:2:16:8', about 8 MiB), so this is an upper bound.
CUBLAS_WORKSPACE_MIB = 32.0

#: PyTorch's caching allocator rounds every block up to 512 bytes and reserves in 2 MiB pages.
ALLOCATOR_BLOCK_BYTES = 512
ALLOCATOR_PAGE_BYTES = 2 * MIB

#: An idle data-centre GPU draws about 10-20 % of its TDP (an idle A100-SXM4 reads about 50-60 W of
#: its 400 W in nvidia-smi); the middle of that range until measured idle power replaces it.
IDLE_POWER_FRACTION = 0.15

HALF_PRECISIONS = frozenset({"fp16", "bf16"})
TENSOR_CORE_CATEGORIES = frozenset({"conv", "matmul", "attention"})


#: cuDNN's tensor-core convolution kernels need channels that are a multiple of 8 per group (cuDNN
#: developer guide, "Tensor Core operations"); others run on the CUDA cores in either layout.
TENSOR_CORE_CHANNEL_MULTIPLE = 8


def _transposed_bytes(node: Node, precision: str, layout: str) -> int:
    """Bytes the NCHW<->NHWC transposes around a half-precision tensor-core convolution move.

    cuDNN's tensor-core kernels read and write NHWC; given NCHW tensors (PyTorch's default layout)
    it transposes the input before the kernel and the output after it (nchwToNhwcKernel and
    nhwcToNchwKernel in an Nsight profile). Each transpose reads and writes its tensor once. With
    ``channels_last`` (``nhwc``) the tensors already are NHWC, and nothing is moved.
    """
    if layout != "nchw" or precision not in HALF_PRECISIONS or node.category != "conv" or not node.weights:
        return 0
    weight = node.weights[0].shape  # O, I/groups, *kernel
    groups = int(node.attrs.get("groups", 1) or 1)
    if len(weight) != 4 or weight[1] % TENSOR_CORE_CHANNEL_MULTIPLE or (weight[0] // groups) % TENSOR_CORE_CHANNEL_MULTIPLE:
        return 0
    return 2 * 2 * (node.inputs[0].numel + node.outputs[0].numel)  # read + write, 2 bytes per element


def _round_up(value: float, step: int) -> float:
    return -(-value // step) * step


class AnalyticalCostModel:
    """Roofline latency, liveness memory and utilisation-driven power; no parameters to train."""

    name = "analytical"

    # -- per-operator ---------------------------------------------------------------------------
    @staticmethod
    def tensor_bytes(t: Tensor, precision: str) -> int:
        """Autocast stores floating-point activations in half precision."""
        if precision in HALF_PRECISIONS and t.dtype == "float32":
            return t.numel * 2
        return t.nbytes

    @staticmethod
    def peak_tflops(node: Node, device: Device, precision: str) -> float:
        if node.category not in TENSOR_CORE_CATEGORIES:
            return device.fp32_tflops
        if precision == "fp32":
            # cuDNN convolutions may use TF32 by default (torch.backends.cudnn.allow_tf32), cuBLAS
            # matmuls may not (torch.backends.cuda.matmul.allow_tf32 is False).
            if node.category == "conv" and device.tf32_tflops:
                return device.tf32_tflops
            return device.fp32_tflops
        if precision == "tf32":
            return device.tf32_tflops or device.fp32_tflops
        return device.tensor_tflops(precision)

    def node_cost(self, node: Node, device: Device, precision: str, layout: str = "nchw") -> tuple[NodeCost, float]:
        """The operator's cost, and the fraction of its time its bounding unit is busy."""
        if node.is_view:
            return NodeCost(node.id, node.op, 0.0, node.flops, 0, "free"), 0.0
        moved = sum(self.tensor_bytes(t, precision) for t in (*node.inputs, *node.outputs))
        kernels = int(node.attrs.get("kernels", 1))  # most operators are one kernel; an LSTM says how many
        if precision in HALF_PRECISIONS and node.category in TENSOR_CORE_CATEGORIES and node.weights:
            # Autocast casts each fp32 weight to half per forward: one more kernel that reads 4
            # bytes and writes 2 per element, and the operator then reads the 2-byte copy.
            moved += sum(t.numel for t in node.weights) * (4 + 2 + 2)
            kernels += 1
        else:
            moved += node.weight_bytes
        transposed = _transposed_bytes(node, precision, layout)
        if transposed:
            moved += transposed
            kernels += 2
        compute_s = node.flops / (self.peak_tflops(node, device, precision) * 1e12)
        memory_s = moved / (device.memory_bw_gbs * 1e9)
        overhead_s = kernels * KERNEL_OVERHEAD_US * 1e-6
        busy_s = max(compute_s, memory_s)
        total_s = busy_s + overhead_s
        bound = "overhead" if overhead_s > busy_s else ("compute" if compute_s >= memory_s else "memory")
        return NodeCost(node.id, node.op, total_s * 1e3, node.flops, moved, bound), busy_s / total_s

    # -- memory ---------------------------------------------------------------------------------
    def peak_activations(self, graph: ModelGraph, precision: str) -> float:
        """Peak bytes of live tensors when the operators run in order; a view shares its input."""
        storage: dict[int, int] = {}  # node -> id of the node whose allocation its output is
        size: dict[int, float] = {}
        last_use: dict[int, int] = {}
        for node in graph.nodes:
            producers = graph.producers[node.id]
            if node.is_view and len(producers) == 1:
                storage[node.id] = storage[producers[0]]
            else:
                storage[node.id] = node.id
                size[node.id] = sum(_round_up(self.tensor_bytes(t, precision), ALLOCATOR_BLOCK_BYTES)
                                    for t in node.outputs)
            for p in producers:
                last_use[storage[p]] = node.id
        for out in graph.outputs:
            last_use[storage[out]] = len(graph.nodes)
        inputs = sum(self.tensor_bytes(t, precision) for t in graph.inputs)
        live = peak = inputs
        frees: dict[int, list[int]] = {}
        for owner, step in last_use.items():
            frees.setdefault(step, []).append(owner)
        for node in graph.nodes:
            live += size.get(node.id, 0.0)
            peak = max(peak, live)
            for owner in frees.get(node.id, ()):
                live -= size.get(owner, 0.0)
            if node.id not in last_use and node.id in size:  # produced, never read
                live -= size[node.id]
        return peak

    def memory(self, graph: ModelGraph, precision: str) -> MemoryBreakdown:
        weights = float(graph.param_bytes)
        if precision in HALF_PRECISIONS:
            # Autocast keeps the half-precision copies of the weights it cast for this forward.
            weights += sum(t.numel * 2 for n in graph.nodes if n.category in TENSOR_CORE_CATEGORIES
                           for t in n.weights)
        activations = _round_up(self.peak_activations(graph, precision), ALLOCATOR_PAGE_BYTES)
        return MemoryBreakdown(CUDA_CONTEXT_MIB, weights / MIB, activations / MIB, CUBLAS_WORKSPACE_MIB)

    # -- the whole graph ------------------------------------------------------------------------
    def estimate(self, graph: ModelGraph, device: Device, precision: str = "fp32", layout: str = "nchw") -> Estimate:
        check_precision(precision)
        check_layout(layout)
        idle_w = IDLE_POWER_FRACTION * device.tdp_w
        costs, energy = [], 0.0
        for node in graph.nodes:
            cost, utilisation = self.node_cost(node, device, precision, layout)
            costs.append(cost)
            energy += cost.time_ms * 1e-3 * (idle_w + (device.tdp_w - idle_w) * utilisation)
        memory = self.memory(graph, precision)
        return Estimate(
            latency_ms=sum(c.time_ms for c in costs),
            energy_j=energy,
            memory_mib=memory.total_mib,
            cost_model=self.name,
            memory=memory,
            nodes=tuple(costs),
        )


register_cost_model("analytical", AnalyticalCostModel)
