"""The one obvious way in: a model in, a :class:`~dippm_nas.prediction.Prediction` out.

Each public function is a door: it builds one :class:`~dippm_nas.request.Request` from its arguments (every name
read and checked once, before the model is exported) and passes it whole to :func:`predict_request`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from tqdm import tqdm

from dippm_nas.cache.models import cached_graph
from dippm_nas.cost import Estimate, get_cost_model
from dippm_nas.cost.error_table import CALIBRATION_GROUP
from dippm_nas.cost.pipeline.notes import layout_note
from dippm_nas.cost.pipeline.power import slice_energy_note
from dippm_nas.cost_model_names import AUTO
from dippm_nas.errors import DippmError, is_finite_number
from dippm_nas.graph.model_graph import ModelGraph
from dippm_nas.hardware.mig import DEFAULT_MIG_MARGIN, mig_choice, required_memory
from dippm_nas.hardware.registry import DEFAULT_DEVICE, DEFAULT_LAYOUT, Device
from dippm_nas.hosts import HostProfile
from dippm_nas.inputs import DEFAULT_BATCH, InputLike, check_batch
from dippm_nas.modes import DEFAULT_MODE, EAGER_RECORDS, MODE_NOTES
from dippm_nas.prediction import Prediction
from dippm_nas.request import CalibrationLike, Request


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
    operator, ``host`` names whose CPU, :data:`dippm_nas.hosts.HOST_PROFILES`), ``cuda-graphs`` (one
    replay, no operator waits on the host), ``compile`` (``torch.compile``'s kernels, each issued from the host)
    or ``compile-cudagraphs`` (those kernels in one replay).

    ``fits`` says whether the predicted memory plus the ``mig_margin`` fits the device's memory (a MIG
    slice's usable memory); where it does not, the first note says by how much and about which batch
    would. On a MIG slice (``"h100-sxm:7g.80gb"``) the prediction is the slice's: ``mig_profile`` is
    that slice where the model fits it (else None) and ``mig_reason`` says so. ``latency_error`` is the
    answering cost model's error on comparable held-out records, also the last note.

    ``calibration`` (``dippm-nas calibrate``'s file) fits the operator model to the user's own measurements
    of this GPU and host: the calibrated model answers, and its latency error is the calibration's
    leave-one-out error. One of another GPU, precision or mode is refused.
    """
    request = Request.of(device, precision, layout=layout, mig_margin=mig_margin, mode=mode, host=host,
                         calibration=calibration, cost_model=cost_model)
    return predict_request(graph, request)


def predict_request(graph: ModelGraph, request: Request) -> Prediction:
    """:func:`predict_graph` for a :class:`~dippm_nas.request.Request` already built.

    >>> request = Request.of("h100-sxm", "fp16")
    >>> predict_request(build_graph("resnet18", batch=8), request).answered_by
    'operators'
    """
    graph, request, precision_notes = request.resolved(graph)
    estimate = get_cost_model(request.cost_model).estimate(graph, request)
    return _prediction(graph, request, estimate, precision_notes)


def predict_requests(graphs: Sequence[ModelGraph], request: Request) -> list[Prediction]:
    """:func:`predict_request` of each graph (a population of candidates): the graphs a request resolves to the same
    precision are estimated together (:meth:`~dippm_nas.cost.CostModel.estimate_many`), equal to one at a time but
    for the float32 rounding of the operator network, which runs over all their operators at once (within a
    millionth)."""
    resolved = [request.resolved(graph) for graph in graphs]
    together: dict[int, list[int]] = {}
    for i, (_, at, _) in enumerate(resolved):
        together.setdefault(id(at.precision), []).append(i)
    out: list[Prediction | None] = [None] * len(graphs)
    model = get_cost_model(request.cost_model)
    for members in together.values():
        at = resolved[members[0]][1]
        graphs_at = [resolved[i][0] for i in members]
        many = getattr(model, "estimate_many", None)  # a model of the user's own may estimate one at a time
        estimates = many(graphs_at, at) if many else [model.estimate(graph, at) for graph in graphs_at]
        for i, estimate in zip(members, estimates):
            graph, _, notes = resolved[i]
            out[i] = _prediction(graph, at, estimate, notes)
    return out


def _prediction(graph: ModelGraph, request: Request, estimate: Estimate, precision_notes: tuple[str, ...]
                ) -> Prediction:
    """The prediction of ``estimate``: the memory's fit on the device and the MIG slice it takes, and the notes."""
    gpu, margin = request.gpu, request.mig_margin
    fits_memory = required_memory(estimate.memory_mib, margin) <= gpu.memory_mib
    if gpu.slice_of:
        profile, reason = _slice_fit(estimate.memory_mib, gpu, margin, fits_memory)
    else:
        choice = mig_choice(estimate.memory_mib, gpu, margin)
        profile, reason = choice.profile, choice.reason
    memory_note = () if fits_memory else (_out_of_memory_note(estimate, gpu, graph.batch, margin),)
    error = estimate.error
    if error is not None and request.mode != DEFAULT_MODE and error.group != CALIBRATION_GROUP:
        error = replace(error, widened=(*error.widened, EAGER_RECORDS))  # a calibration's rows are of its mode
    error_note = (error.note,) if error else ()
    mode_note = (MODE_NOTES[request.mode],) if request.mode in MODE_NOTES else ()
    slice_note = (slice_energy_note(gpu),) if gpu.slice_of else ()
    notes = (memory_note + precision_notes + tuple(graph.warnings) + layout_note(graph, request)
             + estimate.notes + mode_note + slice_note + error_note)
    return Prediction(
        model=graph.name, latency_ms=estimate.latency_ms, energy_j=estimate.energy_j,
        memory_mib=estimate.memory_mib, mig_profile=profile, device=gpu.key,
        precision=request.precision.name, batch=graph.batch, cost_model=estimate.cost_model,
        answered_by=estimate.answered_by, layout=request.layout,
        mig_reason=reason, gflops=graph.flops / 1e9, params_m=graph.param_count / 1e6,
        notes=notes, fits=fits_memory, memory_available_mib=gpu.memory_mib, latency_error=error,
        mode=request.mode, host=request.host.name if not request.replayed else "",
        host_share=estimate.host_share, estimate=estimate,
    )


def _slice_fit(memory_mib: float, gpu: Device, margin: float, fits_slice: bool) -> tuple[str | None, str]:
    """The MIG profile and reason of a prediction made on a slice: the slice itself where the model fits it."""
    whole = gpu.whole_gpu()
    need = required_memory(memory_mib, margin)
    smallest = mig_choice(memory_mib, whole, margin).profile
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
    request = Request.of(device, precision, layout=layout, mig_margin=mig_margin, mode=mode, host=host,
                         calibration=calibration, cost_model=cost_model)
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
    request = Request.of(device, precision, layout=layout, mig_margin=mig_margin, mode=mode, host=host,
                         calibration=calibration, cost_model=cost_model)
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
    request = Request.of(device, precision, layout=layout, mig_margin=mig_margin, mode=mode, host=host,
                         calibration=calibration, cost_model=cost_model)
    request.mig_gpu()  # before the export
    graph = model if isinstance(model, ModelGraph) else checked_graph(model, input_shape, batch)
    return slice_estimates(graph, request)


def slice_estimates(graph: ModelGraph, request: Request, whole: Prediction | None = None) -> list[SliceEstimate]:
    """:func:`mig_table` for a graph and a request already built; ``whole``: the prediction of the same graph
    and request on the whole GPU, where the caller has made it (``dippm-nas mig`` prints it)."""
    gpu = request.mig_gpu()
    graph, request, _ = request.resolved(graph)  # cast once, not once a slice
    whole = whole or predict_request(graph, request.on(gpu))
    request = replace(request, cost_model=whole.answered_by)  # the same model on every slice as on the whole GPU
    rows = []
    for profile in gpu.mig_profiles:
        p = predict_request(graph, request.on(gpu.as_slice(profile)))
        rows.append(SliceEstimate(profile.name, profile.usable_mib, profile.sm_count, bool(p.fits), p.latency_ms,
                                  p.energy_j, p.memory_mib, p.energy_j_per_sample, p.cost_model))
    return rows


@dataclass(frozen=True)
class SliceChoice:
    """The smallest MIG slice that runs a model within a latency bound and holds its memory: ``slice`` is that
    slice's estimate, None where no slice does, and ``reason`` says why in one line."""

    slice: SliceEstimate | None
    reason: str
    max_latency_ms: float

    @property
    def profile(self) -> str | None:
        """The chosen profile's name, None where no slice meets the bound."""
        return self.slice.profile if self.slice else None

    def to_dict(self) -> dict[str, object]:
        """The choice as JSON-ready values."""
        return {"profile": self.profile, "reason": self.reason, "max_latency_ms": self.max_latency_ms}


def check_max_latency(max_latency_ms: object) -> float:
    """A latency bound must be a finite number of ms above 0: at or below 0 no slice could meet it."""
    if not is_finite_number(max_latency_ms) or max_latency_ms <= 0:
        raise DippmError(f"the latency bound must be a finite number of ms per batch above 0, got {max_latency_ms!r}.")
    return float(max_latency_ms)


def choose_slice(rows: Sequence[SliceEstimate], max_latency_ms: float, gpu: str) -> SliceChoice:
    """The first of ``rows`` (a :func:`mig_table`, smallest slice first: usable memory, then SMs) whose memory fits
    and whose latency is at most ``max_latency_ms`` (a bound :func:`check_max_latency` passed); where none is, the
    reason names the fastest slice that holds the model, or says that none holds it.

    >>> rows = [SliceEstimate("1g.5gb", 4864.0, 14, True, 9.0, 0.1),
    ...         SliceEstimate("7g.40gb", 40448.0, 98, True, 2.0, 0.1)]
    >>> choose_slice(rows, 5.0, "a100-40gb").profile
    '7g.40gb'
    >>> print(choose_slice(rows, 1.0, "a100-40gb").reason)
    no MIG slice of a100-40gb runs it within 1 ms per batch: the fastest, 7g.40gb, takes 2 ms
    """
    bound = float(max_latency_ms)
    for row in rows:
        if row.fits and row.latency_ms <= bound:
            return SliceChoice(row, f"{row.profile} is the smallest slice that holds the model "
                               f"({row.memory_mib:,.0f} MiB predicted, {row.usable_mib:,.0f} MiB usable) and runs it "
                               f"within {bound:g} ms per batch ({row.latency_ms:.3g} ms)", bound)
    holding = [row for row in rows if row.fits]
    if not holding:
        return SliceChoice(None, f"no MIG slice of {gpu} holds the model's memory, whatever the latency bound", bound)
    fastest = min(holding, key=lambda row: row.latency_ms)
    return SliceChoice(None, f"no MIG slice of {gpu} runs it within {bound:g} ms per batch: the fastest, "
                       f"{fastest.profile}, takes {fastest.latency_ms:.3g} ms", bound)


def smallest_slice(model: Any, max_latency_ms: float, device: str | Device = DEFAULT_DEVICE,
                   precision: str | None = None, cost_model: str = AUTO, mig_margin: float = DEFAULT_MIG_MARGIN, *,
                   input_shape: InputLike = None, batch: int = DEFAULT_BATCH, layout: str = DEFAULT_LAYOUT,
                   mode: str = DEFAULT_MODE, host: str | HostProfile | None = None,
                   calibration: CalibrationLike = None) -> SliceChoice:
    """The smallest MIG slice of ``device`` whose latency is at most ``max_latency_ms`` (ms per batch) and whose
    usable memory holds the model with the ``mig_margin``: :func:`mig_table`'s rows, the first that meets both.
    A bound no slice meets gives a choice whose ``profile`` is None and whose ``reason`` says so.

    >>> choice = smallest_slice("resnet18", 50.0, "a100-40gb", batch=8)
    >>> choice.profile
    '1g.5gb'
    """
    bound = check_max_latency(max_latency_ms)
    request = Request.of(device, precision, layout=layout, mig_margin=mig_margin, mode=mode, host=host,
                         calibration=calibration, cost_model=cost_model)
    gpu = request.mig_gpu()  # before the export
    graph = model if isinstance(model, ModelGraph) else checked_graph(model, input_shape, batch)
    return choose_slice(slice_estimates(graph, request), bound, gpu.key)
