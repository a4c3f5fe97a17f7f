"""The kinds of kernel operators run, as the operator-level cost model tells them apart.

Declared in one place and in order, since a kind's position is its column in that model's features
(:data:`dippm_nas.cost.learned.kernel_structure.GROUPS`, which its card records); each family's category or
operator names the kind its operators run.
"""

from dippm_nas.graph.operators._registry import declare_kernel

# cuBLAS's and cuDNN's GEMMs load their operands by rows; attention's fused kernels pad their own tiles.
declare_kernel("gemm", tiled=True, loads_rows=True)
declare_kernel("conv", tiled=True, loads_rows=True)
# cuDNN's convolutions whose channels keep them off the tensor cores (depthwise, an RGB stem)
declare_kernel("conv_cuda_cores", tiled=True)
declare_kernel("attention", tiled=True)
declare_kernel("elementwise")
# normalisations along the last axis, one row at a time (layer norm, RMS norm)
declare_kernel("row_norm")
# normalisations over an NCHW tensor's planes (batch norm, group norm)
declare_kernel("plane_norm")
declare_kernel("softmax")
declare_kernel("reduce")
declare_kernel("pool")
