"""The memory stage: what the process holds on the GPU during one inference, as NVML counts it.

Memory is the CUDA context and the peak of the segments PyTorch's caching allocator reserves when it serves the
library workspace, the weights, the inputs and then the operators' outputs and transient buffers in execution
order (:mod:`dippm_nas.cost.pipeline.allocator`), each output freed when eager frees it: after its last reader
or, when a module call it was passed into or a local variable still holds it, once eager drops that reference
(``NodeTable.free_step``). It depends on the graph and the precision alone, not on the GPU, so it is computed
once per graph and precision and kept with the graph's table.
"""

from __future__ import annotations

import numpy as np

from dippm_nas.cost.estimate import MemoryBreakdown
from dippm_nas.cost.pipeline.allocator import MIB, replay
from dippm_nas.cost.pipeline.roofline import runtime_key
from dippm_nas.cost.pipeline.table import HALF_BYTES, NodeTable
from dippm_nas.graph import operators
from dippm_nas.graph.operators.attention import math_fallback_cost
from dippm_nas.precisions import Precision

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


def _element_bytes(precision: Precision) -> int | None:
    """Bytes of an element autocast runs at, None without autocast: which allocations the table replays."""
    return precision.element_bytes if precision.autocast else None


def transient_bytes(table: NodeTable, precision: Precision, runtime: tuple[int, int] | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Bytes each operator holds only while it runs: the cast copies it makes before it allocates its output,
    and the workspace it allocates after (one column per tensor).

    Under autocast each convolution or matrix product casts its float32 weight to half: in inference mode
    autocast casts the weights again at every call (its cache keeps only casts of tensors that require grad
    outside inference mode; PyTorch 2.15 on the CPU casts a Linear's weight three times in three calls, once
    under no_grad). An operator autocast runs in the other precision than its input casts that input (a
    transformer's linear layers read the float32 layer norm's output). A tensor-core convolution on NCHW half
    activations holds cuDNN's NHWC copy of its input, unless it is 1x1 with stride 1
    (``NodeTable.nhwc_copy_numel``), as the H100 harness's peak allocated bytes at batch 256 show; its time still
    counts the transposition, which fits the timm records better. An RGB stem holds an output-sized NHWC buffer
    instead (``NodeTable.nhwc_output_bytes``), as VGG11's measured peak shows. Eager's math attention holds its
    float32 scores and copies (:func:`~dippm_nas.graph.operators.attention.math_fallback_cost`)."""
    held = math_fallback_cost(table.math_fallback, precision.half_dtype is not None, precision.element_bytes,
                              runtime)[2]
    if not precision.autocast:
        own_half = table.half_operands  # a model's own half convolutions hold cuDNN's copies too, no cast
        if not own_half.any():
            return np.zeros((len(table), 1)), held
        return np.zeros((len(table), 1)), np.column_stack([
            np.where(own_half, table.nhwc_copy_numel * float(HALF_BYTES), 0.0),
            np.where(own_half, table.nhwc_output_bytes(None), 0.0), held])
    h = precision.element_bytes
    weight = np.where(operators.kind_table().has_library[table.kind], table.weight_numel * float(h), 0.0)
    return (np.column_stack([weight, table.autocast.copies(h)]),
            np.column_stack([table.nhwc_copy_numel * float(h), table.nhwc_output_bytes(h), held]))


def peak_live(table: NodeTable, precision: Precision, casts: np.ndarray, workspace: np.ndarray) -> float:
    """Peak bytes of the live outputs plus each operator's transient bytes while it runs; a view shares its input."""
    inputs = table.input_bytes
    if not len(table):
        return inputs
    owns = table.free_step >= 0
    sizes = np.where(owns, table.allocations(_element_bytes(precision)), 0.0)
    freed = np.bincount(table.free_step[owns], weights=sizes[owns], minlength=len(table) + 1)[:len(table)]
    live = inputs + np.cumsum(sizes) - (np.cumsum(freed) - freed)  # after each operator allocates
    return max(inputs, float((live + casts.sum(axis=1) + workspace.sum(axis=1)).max()))


def memory(table: NodeTable, precision: Precision, runtime: tuple[int, int] | None = None) -> MemoryBreakdown:
    """What the process holds: the context outside the caching allocator, and the allocator's peak reserved
    segments (:func:`~dippm_nas.cost.pipeline.allocator.replay`) split into what is live at the activations' peak
    and the allocator's rounding and fragmentation on top; computed once per graph and precision."""
    runtime = runtime_key(table, runtime)
    return table.derived(("memory", precision.name, runtime), lambda: _memory(table, precision, runtime))


def _memory(table: NodeTable, precision: Precision, runtime: tuple[int, int] | None) -> MemoryBreakdown:
    workspace = CUBLAS_WORKSPACE_MIB * MIB
    transient = transient_bytes(table, precision, runtime)
    resident = [workspace, *table.weight_tensor_bytes.tolist(), table.input_bytes]
    allocator = replay(resident, table.allocations(_element_bytes(precision)), table.free_step, *transient)
    weights, activations = float(table.param_bytes), peak_live(table, precision, *transient)
    slack = max(0.0, allocator.peak_reserved - weights - activations - workspace)
    return MemoryBreakdown(CUDA_CONTEXT_MIB, weights / MIB, activations / MIB, CUBLAS_WORKSPACE_MIB, slack / MIB,
                           KERNEL_MODULES_MIB)
