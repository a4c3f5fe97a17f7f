"""A request is resolved once where it enters the library: below it nothing reads a device's, a precision's or a
host's name again, or passes one through their registries, whichever cost model answers."""

from __future__ import annotations

import sys

import pytest

import dippm_nas
import dippm_nas.hardware.registry as device_module
import dippm_nas.hosts as host_module
import dippm_nas.precisions as precision_module
from dippm_nas.calibration import Calibration, CalibrationRow
from dippm_nas.errors import DippmError
from dippm_nas.request import Request

RESOLVERS = {"precision": (precision_module, "precision_named"), "device": (device_module, "get_device"),
             "host": (host_module, "get_host_profile")}


def _count_calls(monkeypatch) -> dict[str, int]:
    """Wrap every module's reference to ``precision_named``, ``get_device`` and ``get_host_profile``, counting
    every call, a resolved Precision, Device or HostProfile passed through included."""
    counts = dict.fromkeys(RESOLVERS, 0)
    for what, (home, name) in RESOLVERS.items():
        original = getattr(home, name)

        def counted(*args, _what=what, _original=original, **kwargs):
            counts[_what] += 1
            return _original(*args, **kwargs)

        for module in [m for n, m in sys.modules.items() if n.startswith(("dippm_nas", "search_spaces"))]:
            if getattr(module, name, None) is original:
                monkeypatch.setattr(module, name, counted)
    return counts


def _calibration() -> Calibration:
    row = CalibrationRow("resnet18", 8, 224, 2.0, 2.1, 2.0, 2.05)
    return Calibration(device="a100-40gb", precision="fp16", mode="eager", gemm_scale=1.1, memory_scale=0.9,
                       host_scale=1.2, rows=(row, row, row), source="made up", version="0", host="h100-harness")


@pytest.mark.parametrize("cost_model", ["auto", "analytical", "operators", "pmgns", "residual", "calibrated"])
def test_a_prediction_resolves_the_device_precision_and_host_once(monkeypatch, cost_model):
    graph = dippm_nas.build_graph("resnet18", batch=32)  # in the residual's regime on a GPU it never saw
    calibration = _calibration() if cost_model == "calibrated" else None
    for device in ("a100-40gb" if calibration else "l4", "a100-40gb:2g.10gb"):
        dippm_nas.predict_graph(graph, device, "fp16", cost_model, calibration=calibration)  # loads what a first
        counts = _count_calls(monkeypatch)  # prediction loads once a process
        p = dippm_nas.predict_graph(graph, device, "fp16", cost_model, calibration=calibration)
        assert p.precision == "fp16" and p.latency_ms > 0
        assert p.answered_by == ("residual" if cost_model == "auto" else cost_model)
        assert max(counts.values()) <= 1, counts
        monkeypatch.undo()


def test_a_search_resolves_nothing_for_its_candidates(monkeypatch):
    from dippm_nas.integration import HardwareCostModel

    graph = dippm_nas.build_graph("resnet18", batch=8)
    cost = HardwareCostModel(batch=8, precision="fp16")
    cost.predict(graph)
    counts = _count_calls(monkeypatch)
    assert all(cost.predict(graph).latency_ms > 0 for _ in range(3))
    assert counts == dict.fromkeys(RESOLVERS, 0)


def test_the_request_checks_every_argument_where_it_enters():
    with pytest.raises(DippmError, match="margin"):
        Request.of(mig_margin=1.5)  # the command line's bound holds for the API too
    with pytest.raises(DippmError, match="calibrated cost model needs a calibration"):
        Request.of(cost_model="calibrated")
    with pytest.raises(DippmError, match="answered by the calibrated cost model .*, not operators"):
        Request.of("a100-40gb", calibration=_calibration(), cost_model="operators")
    request = Request.of("a100-40gb", calibration=_calibration())
    assert request.precision.name == "fp16" and request.host.name == "h100-harness, calibrated"


def test_a_graph_is_cast_once_at_the_door():
    import dippm_nas.graph.cast as cast

    calls = []
    original = cast.cast_floats

    def counted(*args):
        calls.append(args)
        return original(*args)

    graph = dippm_nas.build_graph("resnet18", batch=2)
    cast.cast_floats = counted
    try:
        dippm_nas.mig_table(graph, "a100-40gb", "fp16-weights")
    finally:
        cast.cast_floats = original
    assert len(calls) == 1  # once for the whole GPU and its seven slices
