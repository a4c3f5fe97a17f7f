"""The one obvious way in: a model in, a :class:`Prediction` out."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from dippm_nas.cost import NodeCost, NotCovered, Prediction, get_cost_model
from dippm_nas.errors import DippmError
from dippm_nas.frontends import load_model
from dippm_nas.graph import relax_to_graph
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.hardware.mig import DEFAULT_MIG_MARGIN, fits, select_mig_profile
from dippm_nas.hardware.registry import Device, check_layout, check_precision, get_device
from dippm_nas.inputs import InputLike, check_batch

DEFAULT_DEVICE = "a100-40gb"


def build_graph(model: Any, input_shape: InputLike = None, batch: int = 1) -> ModelGraph:
    """Import ``model`` (see :func:`dippm_nas.frontends.load_model`) and turn it into a ModelGraph."""
    loaded = load_model(model, input_shape, batch)
    graph = relax_to_graph(loaded.mod, loaded.name)
    return replace(graph, source=loaded.source, family=loaded.family, warnings=loaded.warnings)


def predict_graph(graph: ModelGraph, device: str | Device = DEFAULT_DEVICE, precision: str = "fp32",
                  cost_model: str = "auto", mig_margin: float = DEFAULT_MIG_MARGIN, *,
                  layout: str = "nchw") -> Prediction:
    """Predict for a graph already built (its batch size is the graph's)."""
    gpu = get_device(device)
    check_precision(precision)
    check_layout(layout)
    estimate, fallback = _estimate(graph, gpu, precision, layout, cost_model)
    choice = select_mig_profile(estimate.memory_mib, gpu if not gpu.slice_of else gpu.key.split(":")[0], mig_margin)
    notes = tuple(graph.warnings) + estimate.notes + fallback
    return Prediction(
        model=graph.name, latency_ms=estimate.latency_ms, energy_j=estimate.energy_j,
        memory_mb=estimate.memory_mib, mig_profile=choice.profile, device=gpu.key,
        precision=precision, batch=graph.batch, cost_model=estimate.cost_model, layout=layout,
        mig_reason=choice.reason, gflops=graph.flops / 1e9, params_m=graph.param_count / 1e6,
        notes=notes, estimate=estimate,
    )


def _estimate(graph: ModelGraph, gpu: Device, precision: str, layout: str, cost_model: str):
    """``auto``: the learned model where it was trained, else the analytical one, saying why."""
    if cost_model != "auto":
        return get_cost_model(cost_model).estimate(graph, gpu, precision, layout), ()
    try:
        return get_cost_model("pmgns").estimate(graph, gpu, precision, layout), ()
    except NotCovered as reason:
        return get_cost_model("analytical").estimate(graph, gpu, precision, layout), (
            f"{reason}: analytical (roofline) estimate",)


def predict(model: Any, input_shape: InputLike = None, batch: int = 8, device: str | Device = DEFAULT_DEVICE,
            precision: str = "fp32", *, cost_model: str = "auto",
            mig_margin: float = DEFAULT_MIG_MARGIN, layout: str = "nchw") -> Prediction:
    """Latency, energy, memory and MIG slice of one inference of ``batch`` inputs on ``device``.

    ``model`` is a ``torch.nn.Module``, a timm name, an ``.onnx`` path, ``"package.module:factory"``
    or ``"hf:<model_type>"``. ``input_shape`` excludes the batch: ``(3, 224, 224)``, or a list of
    :class:`~dippm_nas.inputs.TensorSpec` for several or non-image inputs; None takes the model's
    default. ``layout`` is the memory layout the model would run in: ``nchw`` (PyTorch's default) or
    ``nhwc`` (channels_last). Nothing runs on a GPU and no weights are materialised.

    >>> p = predict("resnet18", batch=8, device="h100-sxm", precision="fp16")
    >>> p.cost_model.split(" ")[0], p.mig_profile, 500 < p.memory_mb < 2000
    ('pmgns', '1g.10gb', True)
    """
    graph = checked_graph(model, input_shape, batch, device, precision, layout)
    return predict_graph(graph, device, precision, cost_model, mig_margin, layout=layout)


def checked_graph(model: Any, input_shape: InputLike, batch: int, device: str | Device, precision: str,
                  layout: str) -> ModelGraph:
    """The model's graph at ``batch``, once the prediction's arguments are checked: bad ones fail
    before the slow export."""
    get_device(device)
    check_precision(precision)
    check_layout(layout)
    return build_graph(model, input_shape, check_batch(batch))


def slowest_operators(graph: ModelGraph, prediction: Prediction, n: int) -> tuple[list[NodeCost], str]:
    """The ``n`` operators that take the most time, and which model timed them: a learned model
    corrects the total only, so its operators are timed by the analytical roofline."""
    if prediction.estimate and prediction.estimate.nodes:
        return prediction.estimate.top_nodes(n), prediction.estimate.cost_model
    estimate = get_cost_model("analytical").estimate(graph, get_device(prediction.device), prediction.precision,
                                                     prediction.layout)
    return estimate.top_nodes(n), estimate.cost_model


@dataclass(frozen=True)
class SliceEstimate:
    """One MIG profile: does the model fit, and how fast it runs there."""

    profile: str
    usable_mib: float
    sm_count: int
    fits: bool
    latency_ms: float
    energy_j: float


def mig_table(graph: ModelGraph, device: str | Device = DEFAULT_DEVICE, precision: str = "fp32",
              cost_model: str = "auto", mig_margin: float = DEFAULT_MIG_MARGIN, *,
              layout: str = "nchw") -> list[SliceEstimate]:
    """Every MIG profile of ``device`` with fit and latency on that slice."""
    gpu = get_device(device)
    if not gpu.has_mig:
        raise DippmError(f"{gpu.key} ({gpu.name}) does not support MIG; MIG-capable devices: "
                         + ", ".join(d.key for d in _mig_devices()) + ".")
    rows = []
    for profile in gpu.mig_profiles:
        p = predict_graph(graph, gpu.as_slice(profile), precision, cost_model, mig_margin, layout=layout)
        rows.append(SliceEstimate(profile.name, profile.usable_mib, profile.sm_count,
                                  fits(profile, p.memory_mb, mig_margin), p.latency_ms, p.energy_j))
    return rows


def _mig_devices() -> list[Device]:
    from dippm_nas.hardware.registry import list_devices

    return [d for d in list_devices() if d.has_mig]
