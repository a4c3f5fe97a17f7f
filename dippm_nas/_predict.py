"""The one obvious way in: a model in, a :class:`Prediction` out."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from tqdm import tqdm

from dippm_nas.cache.models import cached_graph
from dippm_nas.cost import Estimate, NodeCost, Prediction, get_cost_model
from dippm_nas.cost.calibration import Calibration, load_calibration
from dippm_nas.cost.card import operator_model_mismatch
from dippm_nas.cost.choice import AUTO, check_cost_model, estimate_with
from dippm_nas.cost.host import HostProfile, get_host_profile
from dippm_nas.errors import DippmError
from dippm_nas.graph.cast import graph_at_precision
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.hardware.mig import DEFAULT_MIG_MARGIN, check_mig_margin, required_memory, select_mig_profile
from dippm_nas.hardware.registry import DEFAULT_DEVICE, DEFAULT_LAYOUT, Device, check_layout, get_device
from dippm_nas.inputs import DEFAULT_BATCH, InputLike, check_batch
from dippm_nas.modes import DEFAULT_MODE, check_mode
from dippm_nas.precisions import Precision, precision_named

#: A calibration as the API takes it: a file :mod:`dippm_nas.cost.calibration` wrote, or one loaded; None: none.
CalibrationLike = Calibration | str | os.PathLike | None


@dataclass(frozen=True)
class Request:
    """What a prediction is asked for besides the model, checked and resolved once where it enters the library
    and passed whole below it: nothing under it reads a name again. ``precision`` None is the model's own
    (:func:`~dippm_nas.graph.cast.graph_at_precision`), or the calibration's where there is one."""

    gpu: Device
    precision: Precision | None
    layout: str
    mig_margin: float
    mode: str
    host: HostProfile
    calibration: Calibration | None = None
    cost_model: str = AUTO

    @classmethod
    def checked(cls, device: str | Device, precision: str | Precision | None, layout: str, mig_margin: float,
                mode: str, host: str | HostProfile | None, calibration: CalibrationLike = None,
                cost_model: str = AUTO) -> Request:
        """The request, or the DippmError of its first bad argument (each says what to do). A calibration
        (a file's path, or one loaded) must be of the device's GPU, the precision and the mode; ``cost_model``
        is checked here, before any export."""
        check_cost_model(cost_model)
        gpu = get_device(device)
        if precision is not None:
            precision = precision_named(precision)
        layout = check_layout(layout)
        check_mig_margin(mig_margin)
        mode = check_mode(mode)
        host = get_host_profile(host)
        if calibration is not None and not isinstance(calibration, Calibration | str | os.PathLike):
            raise DippmError(f"calibration must be the path of a `dippm-nas calibrate` file (or a Calibration), not "
                             f"{calibration!r}.")
        if calibration is not None and not isinstance(calibration, Calibration):
            calibration = load_calibration(calibration)
        if calibration is not None:
            precision = precision or precision_named(calibration.precision)
            calibration.check_for(gpu.whole_gpu().key, precision.name, mode)
        return cls(gpu, precision, layout, mig_margin, mode, host, calibration, cost_model)

    def on(self, gpu: Device) -> Request:
        """The same request on another device (a MIG slice of this one)."""
        return replace(self, gpu=gpu)


def build_graph(model: Any, input_shape: InputLike = None, batch: int = 1) -> ModelGraph:
    """Import ``model`` (see :func:`dippm_nas.frontends.load_model`) and turn it into a ModelGraph, every
    time: :func:`dippm_nas.predict` reads a model's graph from the disk cache where it can
    (:mod:`dippm_nas.cache.models`). The frontends and TVM are imported here, on first use."""
    from dippm_nas.frontends import load_model
    from dippm_nas.graph.from_relax import relax_to_graph

    loaded = load_model(model, input_shape, batch)
    graph = relax_to_graph(loaded.mod, loaded.name)
    return replace(graph, source=loaded.source, family=loaded.family, warnings=loaded.warnings)


def predict_graph(graph: ModelGraph, device: str | Device = DEFAULT_DEVICE, precision: str | None = None,
                  cost_model: str = AUTO, mig_margin: float = DEFAULT_MIG_MARGIN, *,
                  layout: str = DEFAULT_LAYOUT, mode: str = DEFAULT_MODE, host: str | HostProfile | None = None,
                  calibration: CalibrationLike = None) -> Prediction:
    """Predict for a graph already built (its batch size is the graph's).

    ``mode`` is how the forward pass is issued: ``eager`` (PyTorch's default: one host thread issues each
    operator, ``host`` names whose CPU, :data:`dippm_nas.cost.host.HOST_PROFILES`) or ``cuda-graphs`` (one
    replay, no operator waits on the host).

    ``fits`` says whether the predicted memory plus the ``mig_margin`` fits the device's memory (a MIG
    slice's usable memory); where it does not, the first note says by how much and about which batch
    would. On a MIG slice (``"h100-sxm:7g.80gb"``) the prediction is the slice's: ``mig_profile`` is
    that slice where the model fits it (else None) and ``mig_reason`` says so. ``latency_error`` is the
    answering cost model's error on comparable held-out records, also the last note.

    ``calibration`` (``dippm-nas calibrate``'s file) fits the operator model to the user's own measurements
    of this GPU and host: the prediction is the operator model's, calibrated, and its latency error the
    calibration's leave-one-out error. One of another GPU, precision or mode is refused.
    """
    request = Request.checked(device, precision, layout, mig_margin, mode, host, calibration, cost_model)
    return predict_request(graph, request)


def predict_request(graph: ModelGraph, request: Request) -> Prediction:
    """:func:`predict_graph` for a request already checked and resolved."""
    graph, precision, precision_notes = graph_at_precision(graph, request.precision)
    gpu, layout, mig_margin, mode = request.gpu, request.layout, request.mig_margin, request.mode
    calibration = request.calibration
    if calibration is not None and precision is not request.precision:
        calibration.check_for(gpu.whole_gpu().key, precision.name, mode)
    host = calibration.host_profile() if calibration else request.host
    estimate, fallback = estimate_with(graph, gpu, precision, layout, request.cost_model, mode=mode, host=host,
                                       calibration=calibration)
    need = required_memory(estimate.memory_mib, mig_margin)
    fits_memory = need <= gpu.memory_mib
    if gpu.slice_of:
        profile, reason = _slice_fit(estimate.memory_mib, gpu, mig_margin, fits_memory)
    else:
        choice = select_mig_profile(estimate.memory_mib, gpu, mig_margin)
        profile, reason = choice.profile, choice.reason
    memory_note = () if fits_memory else (_out_of_memory_note(estimate, gpu, graph.batch, mig_margin),)
    error_note = (estimate.error.note,) if estimate.error else ()
    notes = memory_note + precision_notes + tuple(graph.warnings) + estimate.notes + fallback + error_note
    return Prediction(
        model=graph.name, latency_ms=estimate.latency_ms, energy_j=estimate.energy_j,
        memory_mib=estimate.memory_mib, mig_profile=profile, device=gpu.key,
        precision=precision.name, batch=graph.batch, cost_model=estimate.cost_model, answered_by=estimate.answered_by,
        layout=layout,
        mig_reason=reason, gflops=graph.flops / 1e9, params_m=graph.param_count / 1e6,
        notes=notes, fits=fits_memory, memory_available_mib=gpu.memory_mib, latency_error=estimate.error,
        mode=mode, host=host.name if mode == "eager" else "", estimate=estimate,
    )


def _slice_fit(memory_mib: float, gpu: Device, margin: float, fits_slice: bool) -> tuple[str | None, str]:
    """The MIG profile and reason of a prediction made on a slice: the slice itself where the model fits it."""
    whole = gpu.whole_gpu()
    need = required_memory(memory_mib, margin)
    smallest = select_mig_profile(memory_mib, whole, margin).profile
    verdict = "fits in" if fits_slice else "exceeds"
    reason = (f"the {gpu.slice_of} slice of {whole.key}: {need:.0f} MiB (memory + {margin:.0%} margin) {verdict} "
              f"its {gpu.memory_mib:.0f} MiB usable")
    if smallest is None:
        reason += f"; no profile of {whole.key} holds it"
    elif smallest != gpu.slice_of:
        reason += f"; the smallest profile that holds it is {smallest}"
    return (gpu.slice_of if fits_slice else None), reason


def _out_of_memory_note(estimate: Estimate, gpu: Device, batch: int, margin: float) -> str:
    """Why a model does not fit ``gpu``, and about which batch would: its activations grow with the batch,
    its context, weights and workspace do not."""
    need = required_memory(estimate.memory_mib, margin)
    where = f"the {gpu.memory_mib:,.0f} MiB usable in {gpu.key}" if gpu.slice_of else \
        f"the {gpu.memory_mib:,.0f} MiB of {gpu.key}"
    note = (f"does not fit: {estimate.memory_mib:,.0f} MiB predicted, {need:,.0f} MiB with the {margin:.0%} margin, "
            f"exceeds {where}")
    m = estimate.memory
    if m is not None:
        fixed = m.context_mib + m.weights_mib + m.workspace_mib + m.modules_mib
        per_batch = (m.activations_mib + m.allocator_mib) / batch
        room = gpu.memory_mib / (1 + margin) - fixed
        if room <= 0:
            return note + f"; the context, weights and workspace alone take {fixed:,.0f} MiB: choose a larger device"
        if per_batch > 0 and room // per_batch >= 1:
            return note + (f"; about batch {int(room // per_batch):,} or less would fit (activations grow with the "
                           "batch), or choose a lower precision or a larger device")
    return note + "; choose a smaller batch, a lower precision or a larger device"


def predict(model: Any, input_shape: InputLike = None, batch: int = DEFAULT_BATCH,
            device: str | Device = DEFAULT_DEVICE, precision: str | None = None, *, cost_model: str = AUTO,
            mig_margin: float = DEFAULT_MIG_MARGIN,
            layout: str = DEFAULT_LAYOUT, mode: str = DEFAULT_MODE, host: str | HostProfile | None = None,
            calibration: CalibrationLike = None) -> Prediction:
    """Latency, energy, memory and MIG slice of one inference of ``batch`` inputs on ``device``.

    ``model`` is a ``torch.nn.Module``, a timm name, an ``.onnx`` path, ``"package.module:factory"``
    or ``"hf:<model_type>"``. ``input_shape`` excludes the batch: ``(3, 224, 224)``, or a list of
    :class:`~dippm_nas.inputs.TensorSpec` for several or non-image inputs; None takes the model's
    default. ``layout`` is the memory layout the model would run in: ``nchw`` (PyTorch's default) or
    ``nhwc`` (channels_last). ``mode`` and ``host``: how the operators are issued, and ``calibration`` a fit
    to the user's own measurements (:func:`predict_graph`).
    ``precision`` is PyTorch's (:data:`dippm_nas.precisions.PRECISIONS`): ``fp32`` its defaults (TF32 in cuDNN
    convolutions, not in matmuls), ``fp32-strict`` and ``tf32`` TF32 off or on everywhere, ``fp16`` and ``bf16``
    autocast over float32 weights, ``fp16-weights`` and ``bf16-weights`` the model cast to half
    (``model.half()``), no autocast. None is the model's own: ``fp32``, or the half-weights precision of a
    model whose weights are all half (the notes say so). Nothing runs on a GPU and no weights are materialised.

    >>> p = predict("resnet18", batch=8, device="h100-sxm", precision="fp16")
    >>> p.answered_by, p.mig_profile, 500 < p.memory_mib < 2000, p.fits
    ('operators', '1g.10gb', True, True)
    """
    request = Request.checked(device, precision, layout, mig_margin, mode, host, calibration, cost_model)
    return predict_request(checked_graph(model, input_shape, batch), request)


def predict_many(models: Sequence[Any], input_shape: InputLike = None, batch: int = DEFAULT_BATCH,
                 device: str | Device = DEFAULT_DEVICE, precision: str | None = None, *, cost_model: str = AUTO,
                 mig_margin: float = DEFAULT_MIG_MARGIN, layout: str = DEFAULT_LAYOUT, mode: str = DEFAULT_MODE,
                 host: str | HostProfile | None = None, calibration: CalibrationLike = None,
                 progress: bool = False) -> list[Prediction]:
    """:func:`predict` of each model with the same arguments, equal to it, the request checked once (a bad
    argument fails before any export) and the graphs read from the disk cache where they are there; a model
    that cannot be built raises, naming it. Candidates of a search space score together through
    :meth:`dippm_nas.integration.HardwareCostModel.score_many`, which exports their new blocks in parallel.

    >>> [p.mig_profile for p in predict_many(["resnet18", "resnet50"], batch=8)]
    ['1g.5gb', '1g.5gb']
    """
    request = Request.checked(device, precision, layout, mig_margin, mode, host, calibration, cost_model)
    out = []
    for i, model in enumerate(tqdm(models, desc="predicting", unit="model", file=sys.stderr, disable=not progress)):
        try:
            graph = checked_graph(model, input_shape, batch)
        except DippmError as exc:
            named = model if isinstance(model, str | os.PathLike) else type(model).__name__
            raise DippmError(f"model {i} ({named}): {exc}") from exc
        out.append(predict_request(graph, request))
    return out


def checked_graph(model: Any, input_shape: InputLike, batch: int) -> ModelGraph:
    """The model's graph at ``batch``; call it once the prediction's other arguments are checked, so that
    bad ones fail before the slow export. A graph built before is read from the user's disk cache
    (:mod:`dippm_nas.cache.models`: ``DIPPM_NAS_CACHE_DIR``, ``DIPPM_NAS_NO_CACHE=1``), without TVM."""
    return cached_graph(model, input_shape, check_batch(batch), build_graph)


def slowest_operators(graph: ModelGraph, prediction: Prediction, n: int) -> tuple[list[NodeCost], str]:
    """The ``n`` operators that take the most time, and which model timed them: PMGNS (asked by name)
    corrects the total only, so under it the operators are timed by the operator model (the roofline where
    its weights do not match this version)."""
    if prediction.estimate and prediction.estimate.nodes:
        return prediction.estimate.top_nodes(n), prediction.estimate.answered_by
    timer = "analytical" if operator_model_mismatch() else "operators"
    estimate = get_cost_model(timer).estimate(graph, get_device(prediction.device), prediction.precision,
                                              prediction.layout)
    return estimate.top_nodes(n), estimate.answered_by


@dataclass(frozen=True)
class SliceEstimate:
    """One MIG profile: does the model fit, and how fast it runs there.

    ``latency_ms`` and ``energy_j`` are for the whole batch, ``memory_mib`` in MiB; ``cost_model`` is the
    model that answered, the same as for the whole GPU (:func:`mig_table`).
    """

    profile: str
    usable_mib: float
    sm_count: int
    fits: bool
    latency_ms: float
    energy_j: float
    memory_mib: float = 0.0
    energy_j_per_sample: float = 0.0
    cost_model: str = ""

    def to_dict(self) -> dict[str, object]:
        """The fields as JSON-ready values."""
        return dict(vars(self))


def mig_table(model: Any, device: str | Device = DEFAULT_DEVICE, precision: str | None = None,
              cost_model: str = AUTO, mig_margin: float = DEFAULT_MIG_MARGIN, *,
              input_shape: InputLike = None, batch: int = DEFAULT_BATCH, layout: str = DEFAULT_LAYOUT,
              mode: str = DEFAULT_MODE,
              host: str | HostProfile | None = None, calibration: CalibrationLike = None) -> list[SliceEstimate]:
    """Every MIG profile of ``device`` with fit, latency and energy on that slice.

    ``model`` is a :class:`ModelGraph` (its batch is the graph's) or anything :func:`predict` takes, with
    its ``input_shape`` and ``batch``. Every slice is predicted by the cost model that answers for the
    whole GPU (``auto``: the operator model, each kernel timed on the slice's SMs and share of the memory
    bandwidth), so a slice with all of the GPU's SMs predicts as the GPU does. A slice key
    (``a100-40gb:1g.5gb``) stands for its GPU.

    >>> rows = mig_table("resnet18", "h100-sxm", "fp16", batch=8)
    >>> rows[0].profile, rows[0].fits, rows[0].cost_model, len({r.cost_model for r in rows})
    ('1g.10gb', True, 'operators', 1)
    """
    request = Request.checked(device, precision, layout, mig_margin, mode, host, calibration, cost_model)
    _mig_gpu(request)  # before the export
    graph = model if isinstance(model, ModelGraph) else checked_graph(model, input_shape, batch)
    return slice_estimates(graph, request)


def _mig_gpu(request: Request) -> Device:
    """The whole GPU of the request's device, or a DippmError where it has no MIG."""
    gpu = request.gpu.whole_gpu()
    if not gpu.has_mig:
        raise DippmError(f"{gpu.key} ({gpu.name}) does not support MIG; MIG-capable devices: "
                         + ", ".join(d.key for d in _mig_devices()) + ".")
    return gpu


def slice_estimates(graph: ModelGraph, request: Request, whole: Prediction | None = None) -> list[SliceEstimate]:
    """:func:`mig_table` for a graph and a request already checked and resolved; ``whole``: the prediction of
    the same graph and request on the whole GPU, where the caller has made it (``dippm-nas mig`` prints it)."""
    gpu = _mig_gpu(request)
    graph, precision, _ = graph_at_precision(graph, request.precision)  # cast once, not once a slice
    request = replace(request, precision=precision)
    whole = whole or predict_request(graph, request.on(gpu))
    request = replace(request, cost_model=whole.answered_by)  # the same model on every slice as on the whole GPU
    rows = []
    for profile in gpu.mig_profiles:
        p = predict_request(graph, request.on(gpu.as_slice(profile)))
        rows.append(SliceEstimate(profile.name, profile.usable_mib, profile.sm_count, bool(p.fits), p.latency_ms,
                                  p.energy_j, p.memory_mib, p.energy_j_per_sample, p.cost_model))
    return rows


def _mig_devices() -> list[Device]:
    from dippm_nas.hardware.registry import list_devices

    return [d for d in list_devices() if d.has_mig]
