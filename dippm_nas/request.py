"""What a prediction is asked for besides the model: one :class:`Request`, checked and resolved once where it
enters the library (the API, the command line, the Optuna integration, ``mig``) and passed whole below it.

Every name a user gives (a device, a precision, a host, a cost model, a calibration file) is read here, once:
nothing under a door reads a name again or checks an argument twice, and the cost models take the request as
it is (:meth:`dippm_nas.cost.CostModel.estimate`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from dippm_nas.calibration import Calibration, load_calibration
from dippm_nas.cost_model_names import AUTO, CALIBRATED, check_cost_model
from dippm_nas.errors import DippmError
from dippm_nas.hardware.mig import DEFAULT_MIG_MARGIN, check_mig_margin
from dippm_nas.hardware.registry import DEFAULT_DEVICE, DEFAULT_LAYOUT, Device, check_layout, get_device
from dippm_nas.hosts import HostProfile, get_host_profile
from dippm_nas.modes import COMPILED_MODES, DEFAULT_MODE, REPLAYED_MODES, check_mode
from dippm_nas.precisions import Precision, precision_named

if TYPE_CHECKING:
    from dippm_nas.graph.model_graph import ModelGraph

#: A calibration as a request takes it: a file ``dippm-nas calibrate`` wrote, or one loaded; None: none.
CalibrationLike = Calibration | str | os.PathLike | None


@dataclass(frozen=True)
class Request:
    """Everything a prediction needs besides the model's graph, resolved: the device (or MIG slice) as a
    :class:`~dippm_nas.hardware.Device`, the precision as a :class:`~dippm_nas.precisions.Precision`, the layout,
    the MIG margin, how the operators are issued (``mode`` and the ``host`` profile), a user's ``calibration``
    and the cost model that answers. ``precision`` None is the model's own, decided with the graph
    (:meth:`resolved`); ``runtime`` is the PyTorch version priced, (major, minor), None for the current one.

    Build one with :meth:`of`, which checks every argument and says what was wrong in one line:

    >>> request = Request.of("h100-sxm", "fp16", mode="cuda-graphs")
    >>> request.gpu.key, request.precision.name, request.mode, request.cost_model
    ('h100-sxm', 'fp16', 'cuda-graphs', 'auto')
    """

    gpu: Device
    precision: Precision | None
    layout: str = DEFAULT_LAYOUT
    mig_margin: float = DEFAULT_MIG_MARGIN
    mode: str = DEFAULT_MODE
    host: HostProfile = get_host_profile()
    calibration: Calibration | None = None
    cost_model: str = AUTO
    runtime: tuple[int, int] | None = None

    @classmethod
    def of(cls, device: str | Device = DEFAULT_DEVICE, precision: str | Precision | None = None, *,
           layout: str = DEFAULT_LAYOUT, mig_margin: float = DEFAULT_MIG_MARGIN, mode: str = DEFAULT_MODE,
           host: str | HostProfile | None = None, calibration: CalibrationLike = None,
           cost_model: str = AUTO) -> Request:
        """The request, or the DippmError of its first bad argument (each says what to do), every name read once.

        A calibration (a file's path, or one loaded) must be of the device's GPU, the precision and the mode; it
        sets the precision where none is given and the host (its own, fitted), and only ``auto`` or
        ``calibrated`` may answer it.
        """
        cost_model = check_cost_model(cost_model)
        gpu = get_device(device)
        asked = precision_named(precision) if precision is not None else None
        if asked is not None:
            gpu.runs(asked)  # a precision PyTorch does not run on the GPU: said before the model is built
        layout = check_layout(layout)
        mig_margin = check_mig_margin(mig_margin)
        mode = check_mode(mode)
        calibration = _calibration(calibration)
        if calibration is None:
            if cost_model == CALIBRATED:
                raise DippmError(f"the {CALIBRATED} cost model needs a calibration of this GPU: pass one (--calibration"
                                 " PROFILE.json, written by `dippm-nas calibrate`), or choose another cost model.")
            return cls(gpu, asked, layout, mig_margin, mode, get_host_profile(host), None, cost_model)
        if cost_model not in (AUTO, CALIBRATED):
            raise DippmError(f"a calibration is answered by the {CALIBRATED} cost model (the operator model, fitted), "
                             f"not {cost_model}: leave the cost model at {AUTO} or {CALIBRATED}, or predict without "
                             "the calibration.")
        precision = asked or precision_named(calibration.precision)
        calibration.check_for(gpu.whole_gpu().key, precision.name, mode)
        fitted = calibration.fitted_host(get_host_profile(calibration.host))
        return cls(gpu, precision, layout, mig_margin, mode, fitted, calibration, cost_model)

    @property
    def compiled(self) -> bool:
        """Whether the model runs as ``torch.compile`` builds it: the fusion stage's kernels, not eager's."""
        return self.mode in COMPILED_MODES

    @property
    def replayed(self) -> bool:
        """Whether the forward pass is replayed as a CUDA graph: no host time between kernels."""
        return self.mode in REPLAYED_MODES

    def mig_gpu(self) -> Device:
        """The whole GPU of the request's device (a slice stands for its GPU), or a DippmError where it has no MIG."""
        gpu = self.gpu.whole_gpu()
        if not gpu.has_mig:
            from dippm_nas.hardware.registry import list_devices

            raise DippmError(f"{gpu.key} ({gpu.name}) does not support MIG; MIG-capable devices: "
                             + ", ".join(d.key for d in list_devices() if d.has_mig) + ".")
        return gpu

    def on(self, gpu: Device) -> Request:
        """The same request on another device (a MIG slice of this one)."""
        return replace(self, gpu=gpu)

    def resolved(self, graph: ModelGraph) -> tuple[ModelGraph, Request, tuple[str, ...]]:
        """The graph the request prices (cast once where the precision casts the model's weights), the request at
        the precision the graph runs at on its GPU, and the notes that say what was decided
        (:func:`~dippm_nas.graph.cast.graph_at_precision`, :meth:`~dippm_nas.hardware.Device.runs`). A calibration
        must hold for that precision too."""
        from dippm_nas.graph.cast import graph_at_precision  # numpy loads with the graph, not with the arguments

        graph, precision, notes = graph_at_precision(graph, self.precision)
        precision, on_gpu = self.gpu.runs(precision)
        notes += on_gpu
        if precision is self.precision:
            return graph, self, notes
        if self.calibration is not None:
            self.calibration.check_for(self.gpu.whole_gpu().key, precision.name, self.mode)
        return graph, replace(self, precision=precision), notes


def version_numbers(version: str) -> tuple[int, ...]:
    """The numbers of a version string, without its local part.

    >>> version_numbers("2.11.0+cu130")
    (2, 11, 0)
    """
    return tuple(int(p) for p in version.split("+")[0].split(".") if p.isdigit())


def torch_major_minor(version: str | None) -> tuple[int, int] | None:
    """(major, minor) of a PyTorch version string, as a request's ``runtime``; None for the current one (or an
    unreadable one)."""
    numbers = version_numbers(version or "")
    return (numbers + (0,))[:2] if numbers else None


def _calibration(calibration: CalibrationLike) -> Calibration | None:
    """A calibration as given: loaded from its file where it is a path."""
    if calibration is None or isinstance(calibration, Calibration):
        return calibration
    if not isinstance(calibration, str | os.PathLike):
        raise DippmError(f"calibration must be the path of a `dippm-nas calibrate` file (or a Calibration), not "
                         f"{calibration!r}.")
    return load_calibration(calibration)
