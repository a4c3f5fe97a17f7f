"""``auto``, the default: which cost model answers a request, decided here and nowhere else.

``auto`` is the operator model (:mod:`dippm_nas.cost.models.operators`): every operator's kernel timed from its
structure on the target GPU and the GPU's spec sheet, learned across GPUs, composed through the host's queue. It
reads a GPU nobody measured as its spec sheet, so it answers on every GPU and precision. On such a GPU its residual
(:mod:`dippm_nas.cost.models.residual`: PMGNS over the operator model, bounded to a factor of two) corrects it in
the regimes (a precision and a range of batches, in eager mode, as the records ran) where, each GPU held out in
turn, the corrected model erred less than the operator model alone on every held-out GPU with records there: the
residual's card lists them (written by :mod:`dippm_nas.training.residual_training`), and the prediction's notes say
so and how far the residual moved it. Where the operator model's shipped weights do not match this version's
features the analytical model (the roofline, which needs no training) answers, with a note that says why. A
request that carries a calibration (``dippm-nas calibrate``) is the calibrated operator model's, without the
residual (:mod:`dippm_nas.cost.models.calibrated`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import cache

from dippm_nas.cost.estimate import Estimate, NotCovered
from dippm_nas.cost.learned.card import RESIDUAL_WEIGHTS, load_card
from dippm_nas.cost.models.analytical import AnalyticalCostModel
from dippm_nas.cost.models.calibrated import CalibratedCostModel
from dippm_nas.cost.models.operators import OperatorCostModel
from dippm_nas.cost.models.residual import ResidualCostModel
from dippm_nas.cost.pipeline.summary import Timed
from dippm_nas.cost.pipeline.table import node_table
from dippm_nas.cost_model_names import AUTO
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.precisions import Precision
from dippm_nas.request import Request


class AutoCostModel:
    """The operator model; its residual where the residual's card turns it on and the operator model never learned
    from the GPU; the analytical model where the operator model declines; the calibrated model for a calibration.

    >>> import dippm_nas
    >>> graph, request, _ = dippm_nas.Request.of("l4", "fp16").resolved(dippm_nas.build_graph("resnet18", batch=32))
    >>> AutoCostModel().estimate(graph, request).answered_by
    'residual'
    """

    name = AUTO

    def __init__(self) -> None:
        self.operators = OperatorCostModel()
        self.residual = ResidualCostModel()
        self.analytical = AnalyticalCostModel()
        self.calibrated = CalibratedCostModel(self.operators)

    def covers(self, request: Request) -> str | None:
        """None: another model answers wherever the one chosen declines."""
        return None

    def estimate(self, graph: ModelGraph, request: Request) -> Estimate:
        """The chosen model's estimate, its notes saying why another answered than the operator model."""
        return self.estimate_many([graph], request)[0]

    def estimate_many(self, graphs: Sequence[ModelGraph], request: Request) -> list[Estimate]:
        """:meth:`estimate` of each graph, the operator network run once over all their operators."""
        if request.calibration is not None:
            return self.calibrated.estimate_many(graphs, request)
        try:
            timed = self.operators.timed_many([node_table(graph) for graph in graphs], request)
        except NotCovered as reason:
            note = f"{reason}: {self.analytical.name} (roofline) estimate"
            return [replace(e, notes=e.notes + (note,)) for e in self.analytical.estimate_many(graphs, request)]
        return [self._chosen(graph, t, request) for graph, t in zip(graphs, timed)]

    def _chosen(self, graph: ModelGraph, timed: Timed, request: Request) -> Estimate:
        """The operator model's estimate of ``timed``, or its residual's where the card turns it on."""
        estimate = self.operators.finished(graph, timed, request)
        regime = residual_regime(request.precision, graph.batch) if request.mode == "eager" else None  # records: eager
        if regime is None or request.gpu.whole_gpu().key in self.operators.gpus_in_training():
            return estimate  # where the operator model learned from the GPU itself, it answers alone
        try:
            corrected = self.residual.corrected(graph, request, timed, estimate)
        except NotCovered as reason:
            return replace(estimate, notes=estimate.notes + (f"the residual was not applied: {reason}",))
        figures = ", ".join(f"{g} {regime['residual_mape'][g]:.0%} against {regime['operators_mape'][g]:.0%}"
                            for g in regime["gpus"])
        return replace(corrected, notes=corrected.notes + (
            f"the residual applies at {regime['precision']}, batch {regime['batch_min']}-{regime['batch_max']}: with "
            f"each GPU held out, it erred less than the operator model alone on every one with records there "
            f"({figures})",))


def residual_regime(precision: Precision, batch: int, card: dict | None = None) -> dict | None:
    """The residual card's regime that holds a request at ``precision`` and ``batch``, or None where the operator
    model answers alone (``card``: the JSON of a card other than the shipped). A precision no record measured
    (bf16, half weights) has no regime: nothing showed the residual helps there."""
    regimes = card.get("regimes", ()) if card is not None else _shipped_regimes()
    return next((r for r in regimes if r["precision"] == precision.name
                 and r["batch_min"] <= batch <= r["batch_max"]), None)


@cache
def _shipped_regimes() -> tuple[dict, ...]:
    """The shipped residual card's regimes, read once; none without a card."""
    card = load_card(RESIDUAL_WEIGHTS)
    return card.regimes if card is not None else ()
