r"""PMGNS: the learned cost model (DIPPM's Performance Model Graph Network Structure), as a correction
to the analytical model.

Three graph-convolution blocks embed the operators; the graph is pooled (mean and max), joined with
the static features (graph, batch, device spec sheet, precision, and the analytical estimate), and
fully connected layers predict, per target, the log of measured over analytical:

.. math::

    h^{(l+1)}_v = \mathrm{ReLU}\big(\mathrm{LN}(W_1 h^{(l)}_v + W_2 \,\mathrm{mean}_{u \in N(v)} h^{(l)}_u)\big),
    \qquad \hat y_t = y^{\mathrm{analytical}}_t \exp\big(f_t([\mathrm{pool}(h^{(3)}), s])\big)

so the physics carries what the data does not cover (a new device or size changes the analytical
term), and the network learns only the efficiency of real kernels. GraphSAGE is the default
convolution; GCN, GAT and GIN are registered for the paper's comparison, and ``mlp`` drops the graph.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

TARGETS = ("latency_ms", "energy_j", "memory_mb")
#: The correction is bounded: at most a factor e^4 (about 55) either way from the analytical model,
#: so a model far outside the training data cannot be predicted absurdly.
MAX_LOG_RATIO = 4.0


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
    def __init__(self, node_dim: int, static_dim: int, conv: str = "sage", hidden: int = 128,
                 layers: int = 3, head: tuple[int, ...] = (256, 128), targets: int = len(TARGETS)):
        super().__init__()
        self.conv_name = conv
        self.uses_graph = conv != "mlp"
        pooled = 0
        if self.uses_graph:
            self.convs = nn.ModuleList(
                [CONVOLUTIONS[conv](node_dim if i == 0 else hidden, hidden) for i in range(layers)])
            self.norms = nn.ModuleList([nn.LayerNorm(hidden) for _ in range(layers)])
            pooled = 2 * hidden
        dims = (pooled + static_dim, *head)
        mlp: list[nn.Module] = []
        for a, b in zip(dims, dims[1:]):
            mlp += [nn.Linear(a, b), nn.ReLU()]
        mlp.append(nn.Linear(dims[-1], targets))
        self.head = nn.Sequential(*mlp)

    def embed(self, x: torch.Tensor, edge_index: torch.Tensor, batch: torch.Tensor, graphs: int) -> torch.Tensor:
        """One embedding per graph: mean and max over its operators after the convolutions."""
        h = x
        for conv, norm in zip(self.convs, self.norms):
            h = torch.relu(norm(conv(h, edge_index)))
        return self.pool(h, batch, graphs)

    @staticmethod
    def pool(h: torch.Tensor, batch: torch.Tensor | None, graphs: int) -> torch.Tensor:
        """Mean and max over each graph's operators; one prediction's fused path pools the same way."""
        from torch_geometric.nn import global_max_pool, global_mean_pool

        if graphs == 1:  # a prediction: the same pooling without the scatter
            return torch.cat([h.mean(0, keepdim=True), h.amax(0, keepdim=True)], dim=1)
        return torch.cat([global_mean_pool(h, batch, graphs), global_max_pool(h, batch, graphs)], dim=1)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, batch: torch.Tensor, graph_of: torch.Tensor,
                static: torch.Tensor) -> torch.Tensor:
        """Log-ratio corrections, one row per record; ``graph_of[r]`` is record r's graph in the batch."""
        if self.uses_graph:
            graphs = int(batch.max()) + 1 if batch.numel() else 0
            features = torch.cat([self.embed(x, edge_index, batch, graphs)[graph_of], static], dim=1)
        else:
            features = static
        return self.correction(features)

    def correction(self, features: torch.Tensor) -> torch.Tensor:
        """The head: pooled embedding and static features to bounded log-ratios."""
        return MAX_LOG_RATIO * torch.tanh(self.head(features) / MAX_LOG_RATIO)
