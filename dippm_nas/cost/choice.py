"""Which cost model answers a request: decided here, and nowhere else.

``auto`` is the operator model (:mod:`dippm_nas.cost.operator_cost`): every operator's kernel timed from its
structure on the target GPU and the GPU's spec sheet, learned across GPUs, composed through the host's queue.
It reads a GPU nobody measured as its spec sheet, so it answers on every GPU and precision. On such a GPU its
residual (:mod:`dippm_nas.cost.residual`: PMGNS over the operator model, bounded to a factor of two) corrects it
in the regimes (a precision and a range of batches, in eager mode, as the records ran) where, each GPU held out in
turn, the corrected model erred less than the operator model alone on every held-out GPU with records there:
the residual's card lists them (``weights/residual.json``, written by
:mod:`dippm_nas.training.residual_training`), and the prediction's notes say so and how far the residual moved
it. Where the operator model's shipped weights do not match this version's features the analytical model (the
roofline, which needs no training) answers, with a note that says why. A calibration (``dippm-nas calibrate``)
fits the operator model, so a calibrated request is the operator model's, calibrated, without the residual.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from dippm_nas.cost.base import Estimate, NotCovered, cost_model_names, get_cost_model
from dippm_nas.cost.calibration import CALIBRATED_MODEL, Calibration
from dippm_nas.cost.card import WEIGHTS
from dippm_nas.cost.host import HostProfile
from dippm_nas.cost_model_names import AUTO
from dippm_nas.errors import DippmError, suggest
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.hardware.registry import Device
from dippm_nas.modes import DEFAULT_MODE
from dippm_nas.precisions import PrecisionLike, precision_named

#: The model ``auto`` answers with, the one it falls back to where that one declines, and the one that corrects
#: it in the regimes of its card.
DEFAULT_COST_MODEL = "operators"
FALLBACK_COST_MODEL = "analytical"
RESIDUAL_COST_MODEL = "residual"
#: The residual's card, whose ``regimes`` say where ``auto`` applies it.
RESIDUAL_CARD = WEIGHTS / "residual.json"


def check_cost_model(name: str) -> str:
    """``name`` if it is :data:`AUTO` or a registered cost model, else a DippmError that lists them: said where a
    request enters the library, before a model is exported.

    >>> check_cost_model("operators")
    'operators'
    """
    known = (AUTO, *cost_model_names())
    if name not in known:
        raise DippmError(f"unknown cost model {name!r}; known: {', '.join(known)}." + suggest(name, known))
    return name


def estimate_with(graph: ModelGraph, gpu: Device, precision: PrecisionLike, layout: str, cost_model: str = AUTO, *,
                  mode: str = DEFAULT_MODE, host: str | HostProfile | None = None,
                  calibration: Calibration | None = None) -> tuple[Estimate, tuple[str, ...]]:
    """The estimate of the model ``cost_model`` names (``auto``: this module's choice), and the notes that say
    why another answered than the one chosen. A model asked for by name that cannot answer raises
    :class:`~dippm_nas.cost.base.NotCovered`; so does nothing under ``auto``, where the fallback answers."""
    execution = {"mode": mode, "host": host}
    if calibration is not None:
        if cost_model not in (AUTO, CALIBRATED_MODEL):
            raise DippmError(f"a calibration adjusts the {CALIBRATED_MODEL} cost model, not {cost_model}: leave "
                             f"the cost model at {AUTO} or {CALIBRATED_MODEL}, or predict without the calibration.")
        return get_cost_model(CALIBRATED_MODEL).estimate(graph, gpu, precision, layout, calibration=calibration,
                                                         **execution), ()
    if cost_model != AUTO:
        return get_cost_model(cost_model).estimate(graph, gpu, precision, layout, **execution), ()
    try:
        estimate = get_cost_model(DEFAULT_COST_MODEL).estimate(graph, gpu, precision, layout, **execution)
    except NotCovered as reason:
        return get_cost_model(FALLBACK_COST_MODEL).estimate(graph, gpu, precision, layout, **execution), (
            f"{reason}: {FALLBACK_COST_MODEL} (roofline) estimate",)
    regime = residual_regime(precision, graph.batch) if mode == "eager" else None  # the records are eager
    if regime is None or _operator_model_learned(gpu):
        return estimate, ()
    try:
        corrected = get_cost_model(RESIDUAL_COST_MODEL).estimate(graph, gpu, precision, layout, base=estimate,
                                                                 **execution)
    except NotCovered as reason:
        return estimate, (f"the residual was not applied: {reason}",)
    figures = ", ".join(f"{g} {regime['residual_mape'][g]:.0%} against {regime['operators_mape'][g]:.0%}"
                        for g in regime["gpus"])
    return corrected, (f"the residual applies at {regime['precision']}, batch {regime['batch_min']}-"
                       f"{regime['batch_max']}: with each GPU held out, it erred less than the operator model alone "
                       f"on every one with records there ({figures})",)


def _operator_model_learned(gpu: Device) -> bool:
    """Whether the operator model learned from ``gpu``'s own measurements: there it answers alone, since the
    residual learned what it misses on GPUs it never saw."""
    from dippm_nas.cost.operator_cost import OperatorCostModel

    return gpu.whole_gpu().key in OperatorCostModel().gpus_in_training()


@cache
def _regimes(path: Path) -> tuple[dict, ...]:
    """The regimes of the residual card at ``path``; none without one."""
    return tuple(json.loads(path.read_text()).get("regimes", ())) if path.exists() else ()


def residual_regime(precision: PrecisionLike, batch: int, path: Path | None = None) -> dict | None:
    """The residual card's regime that holds a request at ``precision`` and ``batch``, or None where the operator
    model answers alone (``path``: a card other than the shipped). A precision no record measured (bf16, half
    weights) has no regime: nothing showed the residual helps there.
    """
    regimes = _regimes(path or RESIDUAL_CARD)
    return next((r for r in regimes if r["precision"] == precision_named(precision).name
                 and r["batch_min"] <= batch <= r["batch_max"]), None)
