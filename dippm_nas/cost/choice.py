"""Which cost model answers a request: decided here, and nowhere else.

``auto`` is the operator model (:mod:`dippm_nas.cost.operator_cost`): every operator's kernel timed from its
structure on the target GPU and the GPU's spec sheet, learned across GPUs, composed through the host's queue.
It reads a GPU nobody measured as its spec sheet, so it answers on every GPU and precision. PMGNS, DIPPM's
whole-graph correction of the roofline, answers instead in the regimes (a precision and a range of batches,
in eager mode, as the records ran) where, each GPU held out in turn, it erred less than the operator model on
every held-out GPU with records there: the routing card (``weights/routing.json``,
:mod:`dippm_nas.training.routing`) lists them, and the prediction's notes say so and what the operator model
would have said. Where the operator model's shipped
weights do not match this version's features the analytical model (the roofline, which needs no training)
answers, with a note that says why. A calibration (``dippm-nas calibrate``) fits the operator model, so a
calibrated request is the operator model's, calibrated.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from dippm_nas.cost.base import Estimate, NotCovered, cost_model_names, get_cost_model
from dippm_nas.cost.calibration import CALIBRATED_MODEL, Calibration
from dippm_nas.cost.card import WEIGHTS
from dippm_nas.cost.coverage import not_covered
from dippm_nas.cost.host import HostProfile
from dippm_nas.errors import DippmError, suggest
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.hardware.registry import Device
from dippm_nas.precisions import precision_named

#: What the user asks for to let this module choose.
AUTO = "auto"
#: The model ``auto`` answers with, the one it falls back to where that one declines, and the one that answers in
#: the routing card's regimes.
DEFAULT_COST_MODEL = "operators"
FALLBACK_COST_MODEL = "analytical"
LEARNED_COST_MODEL = "pmgns"
#: The routing card :mod:`dippm_nas.training.routing` writes.
ROUTING = WEIGHTS / "routing.json"


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


def estimate_with(graph: ModelGraph, gpu: Device, precision: str, layout: str, cost_model: str = AUTO, *,
                  mode: str = "eager", host: str | HostProfile | None = None,
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
    regime = pmgns_regime(precision, graph.batch) if mode == "eager" else None  # the records are eager
    if regime is None or not_covered(precision) is not None:
        return estimate, ()
    learned = get_cost_model(LEARNED_COST_MODEL).estimate(graph, gpu, precision, layout, **execution)
    figures = ", ".join(f"{g} {regime['pmgns_mape'][g]:.0%} against {regime['operators_mape'][g]:.0%}"
                        for g in regime["gpus"])
    return learned, (f"PMGNS answered: at {regime['precision']}, batch {regime['batch_min']}-{regime['batch_max']}, "
                     f"it erred less than the operator model on every GPU held out of both ({figures}); the operator "
                     f"model says {estimate.latency_ms:.4g} ms",)


@cache
def _routing(path: Path) -> tuple[dict, ...]:
    """The regimes of the routing card at ``path``; none without one."""
    return tuple(json.loads(path.read_text())["pmgns"]) if path.exists() else ()


def pmgns_regime(precision: str, batch: int, path: Path | None = None) -> dict | None:
    """The routing card's regime that holds a request at ``precision`` and ``batch``, or None where the operator
    model answers (``path``: a card other than the shipped). A precision no record measured (bf16, half weights)
    has no regime: nothing showed PMGNS better there.
    """
    regimes = _routing(path or ROUTING)
    return next((r for r in regimes if r["precision"] == precision_named(precision).name
                 and r["batch_min"] <= batch <= r["batch_max"]), None)
