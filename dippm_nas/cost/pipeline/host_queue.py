r"""The host-queue stage: what eager PyTorch's host adds before the GPU may start each operator, and the latency
of the whole graph when one host thread issues the operators in order and the GPU runs them in that order.

Operator :math:`i` starts once it is issued (at :math:`\sum_{j \le i} h_j`) and once operator :math:`i - 1` has
ended, so the end of the last is the largest, over :math:`k`, of the time :math:`k` is issued plus the GPU time
of :math:`k` and everything after it:

.. math::

    T = \max_k \Big(\sum_{j \le k} h_j + \sum_{i \ge k} t_i\Big)

the GPU's time at large batches, the host's at small ones. Under CUDA graphs the whole forward pass is one
launch and no operator waits on the host: :math:`h = 0`. The same function serves a prediction (numpy), the
operator model's training and a calibration's fit (torch, differentiable), through the array API
(``array_api_compat``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from array_api_compat import array_namespace

from dippm_nas.cost.pipeline.table import NodeTable
from dippm_nas.request import Request


def issue_seconds(table: NodeTable, request: Request) -> np.ndarray:
    """Per operator, what the host adds before the GPU may start it: the request's host profile's dispatch time
    in eager mode (a view: the dispatch without a kernel), nothing where the pass is replayed as a CUDA graph.

    >>> import dippm_nas
    >>> from dippm_nas.cost.pipeline.table import node_table
    >>> table = node_table(dippm_nas.build_graph("resnet18", batch=1))
    >>> float(issue_seconds(table, dippm_nas.Request.of(precision="fp16")).max())
    3.4e-05
    >>> float(issue_seconds(table, dippm_nas.Request.of(mode="cuda-graphs")).max())
    0.0
    """
    if request.replayed:
        return np.zeros(len(table))
    host = request.host
    return np.where(table.is_view, host.view_us, host.issue_us(request.precision.autocast)) * 1e-6


def queued_latency(host_s: Any, gpu_s: Sequence[Any], host_scale: Any = None, gpu_scales: Sequence[Any] | None = None
                   ) -> Any:
    """Seconds until the last operator ends, along the last axis (operators in issue order): each operator's
    issue time ``host_s`` and its GPU time as the sum of the parts ``gpu_s`` (one part, or the GEMM-class kernels
    and the others apart), each part's time left from an operator on scaled by ``gpu_scales`` and the issue times by
    ``host_scale`` where given (a scale array's axes lead the result's). numpy arrays or torch tensors alike.

    Here the host binds: halving the GPU's time shortens the latency by a fifth, not a half.

    >>> queued_latency(np.array([3.0, 0.5]), [np.array([1.0, 1.0])], gpu_scales=[np.array([1.0, 0.5])]).tolist()
    [5.0, 4.0]
    """
    xp = array_namespace(host_s, *gpu_s)
    issued = xp.cumulative_sum(host_s, axis=-1)
    ends = issued if host_scale is None else host_scale[..., None] * issued
    for i, part in enumerate(gpu_s):
        remaining = xp.flip(xp.cumulative_sum(xp.flip(part, axis=-1), axis=-1), axis=-1)
        ends = ends + (remaining if gpu_scales is None else gpu_scales[i][..., None] * remaining)
    if ends.shape[-1] == 0:  # nothing runs
        return xp.zeros(ends.shape[:-1], dtype=ends.dtype)
    return xp.max(ends, axis=-1)
