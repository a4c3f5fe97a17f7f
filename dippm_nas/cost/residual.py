"""The residual: PMGNS over the operator model, a bounded whole-graph correction of what its kernels miss.

The network is the seed's (:mod:`dippm_nas.cost.pmgns`: three GraphSAGE blocks, the read-outs, the fully
connected head over the static features); what it reads and corrects is the operator model's estimate: each
operator's time the operator model's, composed through the same host queue, so its latency correction scales
the operator model's GPU time and leaves the host's. It is bounded to a factor of two either way
(:data:`~dippm_nas.cost.pmgns.RESIDUAL_LOG_RATIO`). It learns from whole-model records, each read through
the operator model trained without that record's GPU (:mod:`dippm_nas.training.residual_training`), so what it learns is
what the operator model misses on a GPU it never saw, the case a user of an unmeasured GPU is in.

``auto`` applies it only in the regimes the residual card lists (:mod:`dippm_nas.cost.choice`); asked for by
name (``--cost-model residual``) it answers everywhere its card covers. Its weights are tied to the operator
model they were trained over: after the operator model is retrained it declines, saying so, until it is
retrained too.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from functools import cache
from pathlib import Path

from dippm_nas.cost.base import Estimate
from dippm_nas.cost.card import OPERATOR_WEIGHTS, WEIGHTS
from dippm_nas.cost.learned import PMGNSCostModel
from dippm_nas.cost.learned_inputs import Timing
from dippm_nas.cost.operator_cost import OperatorCostModel
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.hardware.registry import Device
from dippm_nas.precisions import Precision

#: Where the shipped residual's weights and card are.
RESIDUAL_WEIGHTS = WEIGHTS / "residual"


@cache
def operator_model_fingerprint(path: Path = OPERATOR_WEIGHTS) -> str:
    """The sha256 of the operator model's weights at ``path``: the residual card names the one it corrects."""
    return hashlib.sha256(path.with_suffix(".safetensors").read_bytes()).hexdigest()


def corrects_installed(card: dict, operators: Path = OPERATOR_WEIGHTS) -> bool:
    """Whether the residual card ``card`` was trained over the operator model at ``operators``."""
    return card.get("base_fingerprint") == operator_model_fingerprint(operators)


class ResidualCostModel(PMGNSCostModel):
    """The operator model's estimate, corrected by the residual network at ``path``; it declines
    (:class:`~dippm_nas.cost.base.NotCovered`) where PMGNS would, and where the operator model at
    ``operators`` is not the one its card was trained over."""

    name = "residual"

    def __init__(self, path: Path = RESIDUAL_WEIGHTS, operators: Path = OPERATOR_WEIGHTS):
        super().__init__(path)
        self.operators = OperatorCostModel(operators)

    @property
    def timing(self) -> Timing:  # type: ignore[override]
        """The operator model's time of each operator."""
        return self.operators.operator_seconds

    def covers(self, device: Device, precision: str) -> str | None:
        """PMGNS's reasons, then the operator model's, then whether it is the one the residual was trained over."""
        reason = self.operators.covers() or super().covers(device, precision)
        if reason:
            return reason
        if not corrects_installed(self.card.raw, self.operators.path):
            return ("the residual was trained over another operator model than the one installed: retrain it "
                    "(dippm-nas evaluate --leave-one-gpu-out --ship)")
        return None

    def finished(self, estimate: Estimate, base_ms: float, gpu_ratio: float, graph: ModelGraph, device: Device,
                 precision: Precision, layout: str, execution: dict, base: Estimate | None = None) -> Estimate:
        """The corrected estimate with a note of how far the residual moved the operator model's latency, and
        each operator's time: the operator model's (``base`` where the caller made it), scaled as the residual
        scales the GPU's time."""
        timed = base if base is not None else self.operators.estimate(graph, device, precision, layout, **execution)
        nodes = tuple(n.scaled(gpu_ratio) for n in timed.nodes)
        note = (f"the residual (PMGNS over the operator model) moved the operator model's {base_ms:.4g} ms by "
                f"{estimate.latency_ms / base_ms - 1:+.1%}; each operator's time is the operator model's times "
                f"{gpu_ratio:.3g}")
        return replace(estimate, nodes=nodes, notes=estimate.notes + (note,))
