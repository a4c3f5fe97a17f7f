"""The residual: PMGNS over the operator model, a bounded whole-graph correction of what its kernels miss.

The network is the seed's (:mod:`dippm_nas.cost.learned.pmgns_network`: three GraphSAGE blocks, the read-outs,
the fully connected head over the static features); what it reads and corrects is the operator model's timing:
each operator's time the operator model's, composed through the same host queue, so its latency correction scales
the operator model's GPU time and leaves the host's. It is bounded to a factor of two either way
(:data:`~dippm_nas.cost.learned.pmgns_network.RESIDUAL_LOG_RATIO`). It learns from whole-model records, each read
through the operator model trained without that record's GPU (:mod:`dippm_nas.training.residual_training`), so
what it learns is what the operator model misses on a GPU it never saw, the case a user of an unmeasured GPU is in.

``auto`` applies it only in the regimes the residual's card lists (:mod:`dippm_nas.cost.models.auto`); asked for by
name (``--cost-model residual``) it answers everywhere its card covers. Its weights are tied to the operator model
they were trained over: after the operator model is retrained it declines, saying so, until it is retrained too.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from functools import cache
from pathlib import Path

from dippm_nas.cost.estimate import Estimate, NotCovered, OneAtATime
from dippm_nas.cost.learned.card import OPERATOR_WEIGHTS, RESIDUAL_WEIGHTS, load_card
from dippm_nas.cost.models.operators import OperatorCostModel
from dippm_nas.cost.models.pmgns import GraphCorrection
from dippm_nas.cost.pipeline.summary import Timed
from dippm_nas.cost.pipeline.table import node_table
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.request import Request


@cache
def operator_model_fingerprint(path: Path = OPERATOR_WEIGHTS) -> str:
    """The sha256 of the operator model's weights at ``path``: the residual's card names the one it corrects."""
    return hashlib.sha256(path.with_suffix(".safetensors").read_bytes()).hexdigest()


def corrects_installed(card: dict, operators: Path = OPERATOR_WEIGHTS) -> bool:
    """Whether the residual card ``card`` (its JSON) was trained over the operator model at ``operators``."""
    return card.get("base_fingerprint") == operator_model_fingerprint(operators)


class ResidualCostModel(OneAtATime):
    """The operator model's estimate, corrected by the residual network at ``path``; it declines
    (:class:`~dippm_nas.cost.estimate.NotCovered`) where the network or the operator model at ``operators``
    cannot answer, and where that operator model is not the one its card was trained over."""

    name = "residual"

    def __init__(self, path: Path = RESIDUAL_WEIGHTS, operators: Path = OPERATOR_WEIGHTS):
        self.operators = OperatorCostModel(operators)
        self.correction = GraphCorrection(self.name, path, self.operators)

    def covers(self, request: Request) -> str | None:
        """The operator model's reasons, then the network's, then whether it corrects the operator model installed."""
        reason = self.operators.covers(request) or self.correction.covers(request)
        if reason:
            return reason
        if not corrects_installed(load_card(self.correction.path).raw, self.operators.path):
            return ("the residual was trained over another operator model than the one installed: retrain it "
                    "(dippm-nas evaluate --leave-one-gpu-out --ship)")
        return None

    def estimate(self, graph: ModelGraph, request: Request) -> Estimate:
        """Latency, energy and memory of one inference of ``graph`` at its batch, with each operator's time."""
        timed = self.operators.timed(node_table(graph), request)
        return self.corrected(graph, request, timed, self.operators.finished(graph, timed, request))

    def corrected(self, graph: ModelGraph, request: Request, timed: Timed, base: Estimate) -> Estimate:
        """The operator model's estimate ``base`` (of ``timed``) corrected, with a note of how far the residual moved
        its latency, and each operator's time the operator model's, scaled as the residual scales the GPU's time."""
        reason = self.covers(request)
        if reason:
            raise NotCovered(reason)
        answer = self.correction.correct(graph, request, reuse=timed)
        estimate = answer.estimate
        note = (f"the residual (PMGNS over the operator model) moved the operator model's {answer.base_ms:.4g} ms by "
                f"{estimate.latency_ms / answer.base_ms - 1:+.1%}; each operator's time is the operator model's times "
                f"{answer.gpu_ratio:.3g}")
        return replace(estimate, operators=base.operators.scaled(answer.gpu_ratio), notes=estimate.notes + (note,))
