r"""PMGNS: the learned cost model (DIPPM's Performance Model Graph Network Structure), as a correction
to the analytical model.

Three graph-convolution blocks embed the operators; each record's graph is read out three ways (the
mean and the max over its operators, and the mean weighted by each operator's share of the analytical
latency on the record's device, batch and precision), joined with the static features (graph, batch,
device spec sheet, precision, and the analytical estimate), and fully connected layers predict, per
target, the log of measured over analytical:

.. math::

    h^{(l+1)}_v = \mathrm{ReLU}\big(\mathrm{LN}(W_1 h^{(l)}_v + W_2 \,\mathrm{mean}_{u \in N(v)} h^{(l)}_u)\big),
    \qquad \hat y_t = y^{\mathrm{analytical}}_t \exp\big(f_t([\mathrm{mean}_v h^{(3)}_v, \max_v h^{(3)}_v,
    \textstyle\sum_v w_v h^{(3)}_v, s])\big)

with :math:`s` the static features and :math:`w_v = t_v / \sum_u t_u` the analytical time share of
operator :math:`v`. The plain mean and max give every operator the same weight, while the efficiency
of real kernels is that of the few operators that take the time, and which ones those are changes with
the batch and the device: at batch 1 launch overheads spread the time over every operator, at batch
256 the large convolutions hold it.
Predicting a correction to the analytical model lets the physics carry what the data does not cover
(a new device or size changes the analytical term and the weights), and the network learns only the
efficiency of real kernels. The latency's correction therefore scales the GPU time alone: where the GPU
waits on the host to issue operators (eager PyTorch at small batches), the host's time stays as the
analytical model has it (:func:`log_latency`). GraphSAGE is the default
convolution; GCN, GAT and GIN are registered for the paper's comparison, and ``mlp`` drops the graph.

The time-weighted read-out, next to the mean and max, was chosen on the family split's validation set.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

TARGETS = ("latency_ms", "energy_j", "memory_mb")
#: The epsilon of every convolution block's layer norm (torch's default).
LAYER_NORM_EPS = 1e-5
#: The correction is bounded: at most a factor e^4 (about 55) either way from the analytical model,
#: so a model far outside the training data cannot be predicted absurdly.
MAX_LOG_RATIO = 4.0
#: The residual of the operator model (the same network over the operator model's estimate) is bounded
#: tighter: at most a factor of two either way. The operator model times every kernel from its structure;
#: a whole graph it misses by more than that is a fault of its physics, to be mended there, not hidden here.
RESIDUAL_LOG_RATIO = math.log(2.0)
#: The latency correction scales the GPU time of every operator, not the host's time to issue them
#: (:func:`dippm_nas.cost.pipeline.host_queue.queued_latency`): where the GPU waits on the host (eager PyTorch at
#: small batches) no efficiency of kernels changes the latency. Each record carries its log-latency
#: at these log-ratios of GPU time, and a correction reads it off, linear in between.
LATENCY_CURVE_LOG_RATIOS = np.linspace(-MAX_LOG_RATIO, MAX_LOG_RATIO, 33)


def log_latency(curve: torch.Tensor, log_ratio: torch.Tensor) -> torch.Tensor:
    """Per record, the log-latency (ms) at a correction ``log_ratio`` of its GPU time, from its
    ``curve`` ([records, len(LATENCY_CURVE_LOG_RATIOS)]); differentiable in ``log_ratio``."""
    points = len(LATENCY_CURVE_LOG_RATIOS)
    step = 2 * MAX_LOG_RATIO / (points - 1)
    position = (log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO) + MAX_LOG_RATIO) / step
    left = position.detach().floor().clamp(max=points - 2).long()
    weight = position - left
    below = curve.gather(1, left[:, None])[:, 0]
    above = curve.gather(1, (left + 1)[:, None])[:, 0]
    return below + weight * (above - below)


def _sage(d_in: int, d_out: int) -> nn.Module:
    from torch_geometric.nn import SAGEConv

    return SAGEConv(d_in, d_out)


def _gcn(d_in: int, d_out: int) -> nn.Module:
    from torch_geometric.nn import GCNConv

    return GCNConv(d_in, d_out)


def _gat(d_in: int, d_out: int) -> nn.Module:
    from torch_geometric.nn import GATConv

    return GATConv(d_in, d_out // 4, heads=4)


def _gin(d_in: int, d_out: int) -> nn.Module:
    from torch_geometric.nn import GINConv

    return GINConv(nn.Sequential(nn.Linear(d_in, d_out), nn.ReLU(), nn.Linear(d_out, d_out)))


CONVOLUTIONS: dict[str, Callable[[int, int], nn.Module]] = {"sage": _sage, "gcn": _gcn, "gat": _gat, "gin": _gin}


class PMGNS(nn.Module):
    """One network: ``layers`` convolution blocks of width ``hidden``, the three-way read-out and the head.

    ``conv`` names one of :data:`CONVOLUTIONS`, or ``mlp`` for the head on the static features alone.
    The output has one log-ratio per target (:data:`TARGETS`), within +-``bound``.
    """

    def __init__(self, node_dim: int, static_dim: int, conv: str = "sage", hidden: int = 128,
                 layers: int = 3, head: tuple[int, ...] = (256, 128), targets: int = len(TARGETS),
                 bound: float = MAX_LOG_RATIO):
        super().__init__()
        self.conv_name = conv
        self.bound = bound
        self.uses_graph = conv != "mlp"
        pooled = 0
        if self.uses_graph:
            self.convs = nn.ModuleList(
                [CONVOLUTIONS[conv](node_dim if i == 0 else hidden, hidden) for i in range(layers)])
            self.norms = nn.ModuleList([nn.LayerNorm(hidden, eps=LAYER_NORM_EPS) for _ in range(layers)])
            pooled = 3 * hidden
        dims = (pooled + static_dim, *head)
        mlp: list[nn.Module] = []
        for a, b in zip(dims, dims[1:]):
            mlp += [nn.Linear(a, b), nn.ReLU()]
        mlp.append(nn.Linear(dims[-1], targets))
        self.head = nn.Sequential(*mlp)

    def convolve(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """Every operator's embedding after the convolution blocks."""
        h = x
        for conv, norm in zip(self.convs, self.norms):
            h = torch.relu(norm(conv(h, edge_index)))
        return h

    @staticmethod
    def readout(h: torch.Tensor, batch: torch.Tensor, graph_of: torch.Tensor, time_share: torch.Tensor) -> torch.Tensor:
        """Per record: the mean and max over its graph's operators, and their mean weighted by
        ``time_share`` (``[records, operators]``, sparse in training; each row sums to 1)."""
        from torch_geometric.nn import global_max_pool, global_mean_pool

        # Before the pooling: the order of these products is the order autograd sums their gradients
        # into h, and training follows its rounding; in this order `dippm-nas train` reproduces the
        # shipped weights.
        weighted = time_share @ h
        graphs = int(batch.max()) + 1 if batch.numel() else 0
        pooled = torch.cat([global_mean_pool(h, batch, graphs), global_max_pool(h, batch, graphs)], dim=1)
        return torch.cat([pooled[graph_of], weighted], dim=1)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, batch: torch.Tensor, graph_of: torch.Tensor,
                static: torch.Tensor, time_share: torch.Tensor) -> torch.Tensor:
        """Log-ratio corrections, one row per record; ``graph_of[r]`` is record r's graph in the batch and
        ``time_share[r]`` its operators' shares of the analytical latency (see :meth:`readout`)."""
        if self.uses_graph:
            embedding = self.readout(self.convolve(x, edge_index), batch, graph_of, time_share)
            features = torch.cat([embedding, static], dim=1)
        else:
            features = static
        return self.correction(features)

    def correction(self, features: torch.Tensor) -> torch.Tensor:
        """The head: read-out embedding and static features to bounded log-ratios."""
        return bounded(self.head(features), self.bound)


def bounded(raw: torch.Tensor, bound: float = MAX_LOG_RATIO) -> torch.Tensor:
    """The head's output as a log-ratio within +-``bound`` (smoothly: the identity near 0)."""
    return bound * torch.tanh(raw / bound)
