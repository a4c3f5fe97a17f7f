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
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from dippm_nas.cost.scaling import Scaling

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
#: (:func:`dippm_nas.cost.analytical.queued_latency`): where the GPU waits on the host (eager PyTorch at
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


#: Where the fused layout's tensors sit in a weights file, beside the members' own.
FUSED_PREFIX = "fused."


@dataclass(frozen=True)
class FusedSage:
    """An ensemble of GraphSAGE :class:`PMGNS` networks rearranged for one prediction, its members side by
    side, derived from the networks' modules (:meth:`of`); the output is theirs up to rounding. A weights
    file keeps it beside the members (:meth:`state`), so a prediction needs no network object and
    torch-geometric is never imported.

    The first convolution is folded into the node features' standardisation: most node-feature
    columns are one-hot (kind, category), and standardised and clipped such a column takes one of
    two values, so its part of ``features @ W.T`` is a row of ``W`` looked up, not multiplied. Every
    convolution projects by its two linear maps at once (by linearity the mean over producers commutes
    with the projection, so one product and one sparse mean replace SAGEConv's two products), every
    member's in one batched product and their means in one sparse product over the shared adjacency,
    and the heads run as batched products too: without torch-geometric's message-passing dispatch,
    which takes longer than the arithmetic, and with one operator per step for the whole ensemble."""

    # [members * 2 * hidden]: the first projections of an operator with every one-hot column off
    base: torch.Tensor
    switch: torch.Tensor  # [one-hot columns, members * 2 * hidden]: what turning each one on adds
    dense_weight: torch.Tensor  # [dense columns, members * 2 * hidden]
    dense_scaling: Scaling  # the node scaling of the dense columns
    later: tuple[torch.Tensor, ...]  # per convolution after the first: [members, hidden, 2 * hidden] (neighbour, own)
    biases: tuple[torch.Tensor, ...]  # per convolution, the first included: [members, hidden]
    norms: tuple[tuple[torch.Tensor, torch.Tensor, float], ...]  # per convolution: weight, bias [members, hidden], eps
    # per linear layer of the heads: [members, in, out], [members, 1, out]
    heads: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    bound: float = MAX_LOG_RATIO  # the members' (PMGNS.bound)

    @classmethod
    def of(cls, models: Sequence[PMGNS], node_scaling: Scaling, one_hot_width: int) -> FusedSage:
        """The trained GraphSAGE ``models``, read from their modules, with the node features' ``node_scaling``
        folded into their first convolution (its first ``one_hot_width`` columns are one-hot)."""
        if any(model.conv_name != "sage" for model in models):
            raise ValueError("only GraphSAGE networks fuse; the others predict as they are")

        def both(conv: nn.Module) -> torch.Tensor:  # [in, 2 * hidden]: the neighbour map's columns, then the own map's
            return torch.cat([conv.lin_l.weight, conv.lin_r.weight]).T

        def linears(model: PMGNS) -> list[nn.Linear]:
            return [layer for layer in model.head if isinstance(layer, nn.Linear)]

        with torch.no_grad():
            first = torch.cat([both(model.convs[0]) for model in models], dim=1)
            k = one_hot_width
            one_hot = node_scaling.columns(slice(None, k))
            off, on = one_hot(torch.zeros(k)), one_hot(torch.ones(k))
            layers = range(len(models[0].convs))
            return cls(
                base=off @ first[:k], switch=(on - off)[:, None] * first[:k], dense_weight=first[k:].contiguous(),
                dense_scaling=node_scaling.columns(slice(k, None)),
                later=tuple(torch.stack([both(model.convs[i]) for model in models]) for i in layers[1:]),
                biases=tuple(torch.stack([model.convs[i].lin_l.bias for model in models]) for i in layers),
                norms=tuple((torch.stack([model.norms[i].weight for model in models]),
                             torch.stack([model.norms[i].bias for model in models]), models[0].norms[i].eps)
                            for i in layers),
                heads=tuple((torch.stack([linears(model)[j].weight.T for model in models]),
                             torch.stack([linears(model)[j].bias[None] for model in models]))
                            for j in range(len(linears(models[0])))), bound=models[0].bound)

    def state(self) -> dict[str, torch.Tensor]:
        """Its tensors by name (under :data:`FUSED_PREFIX`), as a weights file keeps them beside the members'."""
        tensors = {"base": self.base, "switch": self.switch, "dense_weight": self.dense_weight}
        tensors |= {f"later.{i}": t for i, t in enumerate(self.later)}
        tensors |= {f"biases.{i}": t for i, t in enumerate(self.biases)}
        for i, (weight, bias, eps) in enumerate(self.norms):
            tensors |= {f"norms.{i}.weight": weight, f"norms.{i}.bias": bias,
                        f"norms.{i}.eps": torch.tensor(eps, dtype=torch.float64)}
        for j, (weight, bias) in enumerate(self.heads):
            tensors |= {f"heads.{j}.weight": weight, f"heads.{j}.bias": bias}
        return {FUSED_PREFIX + name: t.contiguous() for name, t in tensors.items()}

    @classmethod
    def from_state(cls, tensors: dict[str, torch.Tensor], dense_scaling: Scaling,
                   bound: float = MAX_LOG_RATIO) -> FusedSage:
        """The fused ensemble from :meth:`state`'s tensors (the prefix removed), the dense columns' scaling and
        the members' bound (their card's)."""

        def numbered(name: str) -> int:
            return len({key.split(".")[1] for key in tensors if key.startswith(f"{name}.")})

        return cls(
            base=tensors["base"], switch=tensors["switch"], dense_weight=tensors["dense_weight"],
            dense_scaling=dense_scaling, later=tuple(tensors[f"later.{i}"] for i in range(numbered("later"))),
            biases=tuple(tensors[f"biases.{i}"] for i in range(numbered("biases"))),
            norms=tuple((tensors[f"norms.{i}.weight"], tensors[f"norms.{i}.bias"], float(tensors[f"norms.{i}.eps"]))
                        for i in range(numbered("norms"))),
            heads=tuple((tensors[f"heads.{j}.weight"], tensors[f"heads.{j}.bias"]) for j in range(numbered("heads"))),
            bound=bound)

    def __call__(self, one_hot: tuple[torch.Tensor, torch.Tensor], dense: torch.Tensor,
                 adjacency: torch.Tensor) -> torch.Tensor:
        """Every operator's output of the last convolution block, per member: ``[operators, members, hidden]``,
        from each operator's two one-hot columns (kind, category), its dense node features (unscaled) and
        the adjacency (:func:`~dippm_nas.cost.features.adjacency`)."""
        members, hidden = self.biases[0].shape
        dense = self.dense_scaling(dense)
        kind, category = one_hot
        projected = (self.base + self.switch.index_select(0, kind) + self.switch.index_select(0, category)
                     + dense @ self.dense_weight)
        h = self._block(projected.view(len(dense), members, 2 * hidden), adjacency, 0)
        for i, weight in enumerate(self.later, start=1):
            h = self._block(torch.bmm(h.transpose(0, 1), weight).transpose(0, 1), adjacency, i)
        return h

    def _block(self, projected: torch.Tensor, adjacency: torch.Tensor, i: int) -> torch.Tensor:
        """Convolution block ``i`` from its inputs projected by both linear maps, ``[n, members, 2 * hidden]``."""
        n, members, width = projected.shape
        neighbours, own = projected.split(width // 2, dim=2)
        # the mean over producers: the sparse product torch-geometric's spmm runs for a CSR matrix on the CPU
        mean = torch.sparse.mm(adjacency, neighbours.reshape(n, -1), "mean").view(n, members, -1)
        weight, bias, eps = self.norms[i]
        normed = nn.functional.layer_norm(mean + self.biases[i] + own, (width // 2,), eps=eps)
        return torch.relu(normed * weight + bias)

    def correction(self, h: torch.Tensor, time_share: torch.Tensor, static: torch.Tensor) -> torch.Tensor:
        """Each member's log-ratios, ``[members, targets]``, from :meth:`__call__`'s output, the operators'
        time shares ``[1, operators]`` and the scaled static features ``[1, features]``: the read-out of
        :meth:`PMGNS.readout` (mean, max, time-weighted mean) and the heads."""
        n, members, hidden = h.shape
        weighted = (time_share @ h.reshape(n, -1)).view(members, hidden)
        x = torch.cat([h.mean(0), h.amax(0), weighted, static.expand(members, -1)], dim=1)[:, None]
        for j, (weight, bias) in enumerate(self.heads):
            x = torch.baddbmm(bias, x, weight)
            if j < len(self.heads) - 1:
                x = torch.relu(x)
        return bounded(x[:, 0], self.bound)
