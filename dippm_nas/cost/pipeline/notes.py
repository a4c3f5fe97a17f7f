"""What a prediction says about what it priced: the host it waits on, and the units PyTorch's flags chose."""

from __future__ import annotations

import numpy as np

from dippm_nas.cost.pipeline.roofline import on_tensor_cores
from dippm_nas.cost.pipeline.table import NodeTable, node_table
from dippm_nas.graph import ModelGraph, operators
from dippm_nas.hardware.registry import DEFAULT_LAYOUT
from dippm_nas.hosts import HostProfile
from dippm_nas.precisions import TF32_FLAGS
from dippm_nas.request import Request

#: A prediction whose GPU waits on the host for more than this share of its latency says so.
HOST_BOUND_NOTE_SHARE = 0.25


def host_bound_notes(wait_share: float, operators_issued: int, host: HostProfile, half: bool) -> tuple[str, ...]:
    """What a user should know when the latency is the host's, not the GPU's (``half``: under autocast)."""
    if wait_share < HOST_BOUND_NOTE_SHARE:
        return ()
    operators_said = f"{operators_issued} operator{'s' * (operators_issued != 1)}"
    return (f"the GPU waits on the host for {wait_share:.0%} of this latency: eager PyTorch issues {operators_said} "
            f"at about {host.issue_us(half):.0f} us each ({host.description}); a faster CPU, "
            "CUDA graphs (mode 'cuda-graphs') or torch.compile would shorten it",)


def precision_note(table: NodeTable, peak: np.ndarray, request: Request) -> tuple[str, ...]:
    """At PyTorch's fp32 defaults on a GPU with TF32, which of the model's convolutions and matrix products run on
    TF32 tensor cores (by the roofline's ``peak``: :func:`~dippm_nas.cost.pipeline.roofline.units`) and which in
    full FP32: the flags decide, not the model. Each category a note tells apart (its ``noun``) gets a part, by the
    TF32 flag of its library."""
    precision = request.precision
    if precision.name != "fp32" or not request.gpu.tf32_tflops:
        return ()
    # on tensor cores, and in TF32 rather than at the half dtype of a model's own half operands
    tf32 = (operators.kind_table().has_library[table.kind] & on_tensor_cores(peak, request.gpu)
            & (table.operand_half == 0) & ~table.is_view)
    flags = precision.tf32
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


def layout_note(graph: ModelGraph, request: Request) -> tuple[str, ...]:
    """Where a layout other than PyTorch's default is asked of a model with no convolution that cuDNN would
    transpose out of NCHW (a transformer, an MLP), that it changes nothing priced: channels_last is a format of 4-D
    image tensors."""
    if request.layout == DEFAULT_LAYOUT or node_table(graph).nchw_transposed_numel.any():
        return ()
    return (f"layout {request.layout} changes nothing priced for {graph.name}: it has no convolution on tensor cores "
            "whose input cuDNN would transpose from NCHW (channels_last is a format of 4-D image tensors)",)
