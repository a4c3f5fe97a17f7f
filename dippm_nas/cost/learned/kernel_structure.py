r"""How an operator's kernel uses a GPU: its tiles and waves over the SMs, the bytes it must move, the
clock the GPU sustains, as numbers the learned operator model reads (:mod:`dippm_nas.cost.learned.operator_network`).

An operator is a row of :class:`KernelColumns`, whatever it comes from (a graph's operators, a sweep's
points, NeuSight's corpus). Each GEMM-class operator (a matrix product, an implicit-GEMM convolution,
attention's two products) expands into **candidates**, one per output tile the library could run it with
(and, for a 3x3 stride-1 convolution on the CUDA cores, Winograd's); the library picks the fastest, so the
operator's time is the fastest candidate's. For a candidate with tiles of :math:`t_m \times t_n` over a
GEMM of :math:`B` batches of :math:`M \times N` outputs and depth :math:`K`:

.. math::

    T = B \lceil M/t_m \rceil \lceil N/t_n \rceil, \qquad W = \lceil T / S \rceil, \qquad
    t_{compute} = W \cdot \frac{2 t_m t_n K_p}{P / S}

with :math:`S` SMs, :math:`P` the unit's peak and :math:`K_p` the depth padded to the tile's step: one
wave of tiles after another, a partial last wave as long as a full one. The memory term is the bytes the
operator must move over the bandwidth. A memory-bound operator has one candidate. The learned model
scales both terms by the share of the peak and of the bandwidth a kernel achieves, so no candidate is
ever faster than its bound.

Nothing here names a GPU: every feature is the operator against the spec sheet (times at the peak, the
intensity against the ridge point, bytes against the L2, threads against the SMs' slots), so a GPU
never measured is a new spec sheet. The one exception is the architecture generation (compute
capability) of GEMM-class kernels: cuBLAS and cuDNN ship other kernels, picked by other heuristics, for
each generation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

import numpy as np

from dippm_nas.graph import operators
from dippm_nas.hardware.registry import Device

#: The kinds of kernel the model tells apart, as the operator registry declares them, in its order.
GROUPS = tuple(kernel.name for kernel in operators.kernels())
#: The groups whose work is tiled GEMMs.
GEMM_GROUPS = frozenset(kernel.name for kernel in operators.kernels() if kernel.tiled)
#: The unit a kernel's arithmetic runs on: the CUDA cores in FP32, tensor cores in TF32 or at half precision.
UNITS = ("cuda_cores", "tensor_tf32", "tensor_half")
#: Output tiles (rows x columns) of the kernels cuBLAS and cuDNN pick from, and the depth each step of
#: the main loop covers: SGEMM kernels on the CUDA cores (``sgemm_128x64``, ...; NeuSight's corpus names
#: them) and tensor-core kernels.
CUDA_CORE_TILES = ((128, 128), (128, 64), (64, 128), (64, 64), (128, 32), (32, 128), (64, 32), (32, 64), (32, 32))
TENSOR_CORE_TILES = ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64))
CUDA_CORE_K_STEP, TENSOR_CORE_K_STEP = 8, 32
#: Winograd F(2x2, 3x3) needs 2.25 times fewer multiplications than a direct 3x3 convolution; its
#: transforms read and write the activations about twice as often; its kernels' output tiles.
WINOGRAD_FLOP_SAVING = 2.25
WINOGRAD_EXTRA_TRAFFIC = 2.0
WINOGRAD_TILES = ((128, 128), (128, 64))
#: Threads an SM holds at once: the slots an elementwise kernel fills wave after wave.
THREADS_PER_SM = 2048
#: Bytes the rows of a GEMM's operands must be a multiple of for the tensor cores' 16-byte vector loads: a
#: matrix product or convolution whose depth or output columns miss it gets a kernel without them from cuBLAS and
#: cuDNN, at a fraction of the peak (about a fifth, where an aligned one reaches three quarters: the harness's
#: Hopper sweeps). The CUDA cores' FP32 kernels show no such step.
OPERAND_ALIGNMENT_BYTES = 16
#: The groups whose operands a library loads by rows (attention's fused kernels pad their own tiles).
ROW_LOADED_GROUPS = frozenset(kernel.name for kernel in operators.kernels() if kernel.loads_rows)
#: The compute capability the generation feature is centred on.
GENERATION_CENTRE = 7.5

#: Candidate kinds: a tiled GEMM, Winograd, a tile the measurement names (training only), one pass of bytes.
TILED, WINOGRAD, NAMED_TILE, STREAM = 0, 1, 2, 3


@dataclass(frozen=True, eq=False)
class KernelColumns:
    """Operators as columns: what the operator model reads of each, whatever they come from."""

    group: np.ndarray  # index into GROUPS
    unit: np.ndarray  # index into UNITS
    element_bytes: np.ndarray  # of the tensors its arithmetic reads
    flops: np.ndarray
    moved: np.ndarray  # the bytes it must move at least
    gemm: np.ndarray  # [n, 4]: batches, M, N, K; zeros for an operator that is not a GEMM
    rows: np.ndarray  # [n, 2]: rows and row length of a memory-bound operator's tensor
    winograd: np.ndarray  # a 3x3 stride-1 convolution cuDNN may run as Winograd
    weight_operand: np.ndarray  # a GEMM whose second operand is a weight, read transposed (a linear layer)
    peak: np.ndarray  # FLOP/s of its unit at its precision, the spec sheet's
    #: [n, 2]: a tile the measurement names (rows x columns), zeros where none does
    named_tile: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.group)

    def take(self, index: np.ndarray) -> KernelColumns:
        """The operators at ``index``."""
        return KernelColumns(**{f.name: None if getattr(self, f.name) is None else getattr(self, f.name)[index]
                                for f in fields(self)})

    @staticmethod
    def concatenate(parts: list[KernelColumns]) -> KernelColumns:
        """Several sets of operators as one."""
        def joined(name: str) -> np.ndarray | None:
            values = [getattr(p, name) for p in parts]
            if name == "named_tile":
                values = [v if v is not None else np.zeros((len(p), 2)) for v, p in zip(values, parts)]
            return np.concatenate(values)

        return KernelColumns(**{f.name: joined(f.name) for f in fields(KernelColumns)})


@dataclass(frozen=True, eq=False)
class Candidates:
    """The candidates of a set of operators on one GPU: which operator each is, its kind, its features,
    and its compute and memory times at the peak and the bandwidth."""

    operator: np.ndarray  # index into the operators
    kind: np.ndarray  # TILED, WINOGRAD, NAMED_TILE or STREAM
    features: np.ndarray  # [candidates, len(FEATURE_NAMES)]
    compute_s: np.ndarray
    memory_s: np.ndarray
    #: log of the GPU's power headroom for the candidate's unit (:func:`power_headroom`)
    log_headroom: np.ndarray
    tensor_cores: np.ndarray  # the candidate runs on tensor cores


FEATURE_NAMES = (
    *(f"group={g}" for g in GROUPS), *(f"unit={u}" for u in UNITS), "winograd", "weight_operand",
    "log_tile_m", "log_tile_n", "log_waves", "last_wave_fill", "log_k", "k_fill", "log_intensity_over_ridge",
    "log_bytes_over_l2", "log_rows", "log_row_length", "log_thread_waves", "generation", "misaligned",
)


def power_headroom(device: Device, peak: np.ndarray) -> np.ndarray:
    r"""The power a GPU may spend per unit of arithmetic at its peak, relative to what its process spends:
    :math:`\mathrm{TDP} / (P_{TFLOP/s} \cdot \mathrm{process_{nm}})`. Dynamic power grows with the clock,
    the peak and the energy of a switch (which shrinks with the process); a GPU whose TDP leaves little
    of it (a 70 W T4, a 72 W L4) cannot hold its boost clock through a long kernel."""
    return device.tdp_w / (peak / 1e12 * max(device.process_nm, 1.0))


def misaligned(columns: KernelColumns) -> np.ndarray:
    """The tensor-core matrix products and convolutions whose depth or output columns are not a multiple of
    :data:`OPERAND_ALIGNMENT_BYTES` at their element size.

    >>> import numpy as np
    >>> c = KernelColumns(group=np.array([0, 0]), unit=np.array([2, 2]), element_bytes=np.array([2.0, 2.0]),
    ...                   flops=np.ones(2), moved=np.ones(2), gemm=np.array([[1, 64, 4096, 4096], [1, 64, 5671, 4096]]),
    ...                   rows=np.zeros((2, 2)), winograd=np.zeros(2, bool), weight_operand=np.ones(2, bool),
    ...                   peak=np.ones(2))
    >>> misaligned(c).tolist()
    [False, True]
    """
    _, _, n, k = columns.gemm.T
    row_bytes = np.stack([n, k]) * columns.element_bytes
    off = (np.round(row_bytes) % OPERAND_ALIGNMENT_BYTES != 0).any(axis=0)
    loaded_by_rows = np.isin(columns.group, [GROUPS.index(g) for g in ROW_LOADED_GROUPS])
    return off & loaded_by_rows & (columns.unit > 0)


def _log2p(x: np.ndarray) -> np.ndarray:
    return np.log2(1.0 + np.maximum(x, 0.0))


def _tiled(index: np.ndarray, kind: int, tiles: tuple[tuple[int, int], ...]) -> tuple[np.ndarray, ...]:
    """The candidates of each operator at ``index``, one per tile, operator by operator."""
    shapes = np.asarray(tiles, dtype=np.float64)
    return (np.repeat(index, len(shapes)), np.full(len(index) * len(shapes), kind), np.tile(shapes[:, 0], len(index)),
            np.tile(shapes[:, 1], len(index)))


def _expand(columns: KernelColumns, use_named_tiles: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Candidate rows as (operator, kind, tile rows, tile columns), ordered by operator and, within one, as the
    parts come: its tiles, Winograd's, the tile its measurement names, one pass of bytes."""
    gemm_like = np.isin(columns.group, [GROUPS.index(g) for g in GEMM_GROUPS]) & (columns.gemm > 0).all(axis=1)
    tensor = columns.unit > 0
    parts = [_tiled(np.flatnonzero(gemm_like & ~tensor), TILED, CUDA_CORE_TILES),
             _tiled(np.flatnonzero(gemm_like & tensor), TILED, TENSOR_CORE_TILES),
             _tiled(np.flatnonzero(gemm_like & ~tensor & columns.winograd), WINOGRAD, WINOGRAD_TILES)]
    if use_named_tiles and columns.named_tile is not None:
        named = np.flatnonzero(gemm_like & (columns.named_tile[:, 0] > 0))
        parts.append((named, np.full(len(named), NAMED_TILE), columns.named_tile[named, 0],
                      columns.named_tile[named, 1]))
    stream = np.flatnonzero(~gemm_like)
    parts.append((stream, np.full(len(stream), STREAM), np.zeros(len(stream)), np.zeros(len(stream))))
    operator, kind, tm, tn = (np.concatenate(p).astype(np.float64) for p in zip(*parts))
    order = np.argsort(operator, kind="stable")
    return operator[order].astype(np.int64), kind[order].astype(np.int64), tm[order], tn[order]


def candidates(columns: KernelColumns, device: Device, use_named_tiles: bool = False) -> Candidates:
    """Every operator's candidates on ``device``, ordered by operator; ``use_named_tiles`` adds, for training,
    a candidate with the tile the measurement names."""
    op, kind, tm, tn = _expand(columns, use_named_tiles)
    c = columns.take(op)
    sms, bandwidth = float(device.sm_count), device.memory_bw_gbs * 1e9
    l2 = device.l2_mb * 2**20
    tiled = kind != STREAM
    batches, m, n, k = np.maximum(c.gemm.T, 0.0)
    tensor = c.unit > 0
    k_step = np.where(tensor, TENSOR_CORE_K_STEP, CUDA_CORE_K_STEP)
    k_padded = np.ceil(np.maximum(k, 1.0) / k_step) * k_step
    winograd = kind == WINOGRAD
    arithmetic = np.where(winograd, 1.0 / WINOGRAD_FLOP_SAVING, 1.0)
    # the operator's FLOPs over its GEMM's: attention runs two products per tile
    per_gemm = np.where(tiled, c.flops / np.maximum(2.0 * batches * m * n * k, 1.0), 1.0)
    safe_tm, safe_tn = np.maximum(tm, 1.0), np.maximum(tn, 1.0)
    tiles = np.where(tiled, batches * np.ceil(m / safe_tm) * np.ceil(n / safe_tn), 0.0)
    waves = np.ceil(tiles / sms)
    fill = np.where(tiled, tiles / sms - np.maximum(waves - 1, 0), 0.0)
    peak_per_sm = c.peak / sms
    tile_flops = 2.0 * tm * tn * k_padded * per_gemm * arithmetic
    compute_s = np.where(tiled, waves * tile_flops / peak_per_sm, c.flops / c.peak)
    memory_s = c.moved * np.where(winograd, WINOGRAD_EXTRA_TRAFFIC, 1.0) / bandwidth
    rows, row_length = c.rows.T
    elements = c.moved / np.maximum(c.element_bytes, 1.0)
    x = np.zeros((len(op), len(FEATURE_NAMES)))
    x[np.arange(len(op)), c.group] = 1.0
    x[np.arange(len(op)), len(GROUPS) + c.unit] = 1.0
    reduces = ~tiled & (c.group != GROUPS.index("elementwise"))
    dense = np.stack([
        winograd.astype(float), c.weight_operand.astype(float),
        np.log2(safe_tm), np.log2(safe_tn), _log2p(waves), fill, _log2p(k_padded), np.where(tiled, k / k_padded, 0.0),
        np.log2((c.flops + 1.0) / (c.moved + 1.0)) - np.log2(c.peak / bandwidth), np.log2((c.moved + 1.0) / l2),
        np.where(reduces, _log2p(rows), 0.0), np.where(reduces, _log2p(row_length), 0.0),
        np.log2(elements / (sms * THREADS_PER_SM) + 1e-3),
        np.where(tiled, device.compute_capability - GENERATION_CENTRE, 0.0),
        (tiled & misaligned(c)).astype(float),
    ], axis=1)
    x[:, len(GROUPS) + len(UNITS):] = dense
    return Candidates(operator=op, kind=kind, features=x, compute_s=compute_s, memory_s=memory_s,
                      log_headroom=np.log(power_headroom(device, c.peak)), tensor_cores=tensor)


def winograd_eligible(kernel: np.ndarray, stride: np.ndarray) -> np.ndarray:
    """The convolutions cuDNN can run as Winograd F(2x2, 3x3): 3x3 windows at stride 1."""
    return (kernel == 3) & (stride <= 1)


def tile_of_kernel_name(name: str) -> tuple[int, int]:
    """The output tile (rows x columns, as PyTorch's row-major operands see it) a cuBLAS or cuDNN kernel
    name gives, e.g. ``volta_sgemm_128x64_nn``: cuBLAS computes the column-major transpose, so its
    ``128x64`` is 64 rows by 128 columns of PyTorch's output. (0, 0) for a name without one.

    >>> tile_of_kernel_name("volta_sgemm_128x64_nn"), tile_of_kernel_name("vectorized_elementwise_kernel")
    ((64, 128), (0, 0))
    """
    found = re.search(r"(?:sgemm|scudnn(?:_winograd)?|gemm)_(\d+)x(\d+)", name.lower())
    return (int(found.group(2)), int(found.group(1))) if found else (0, 0)

