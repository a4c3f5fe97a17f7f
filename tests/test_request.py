"""A request is resolved once where it enters the library: below it nothing reads a precision's or a host's name
again, whichever cost model answers."""

from __future__ import annotations

import sys

import pytest

import dippm_nas
import dippm_nas.cost.host as host_module
import dippm_nas.precisions as precision_module
from dippm_nas.cost.host import HostProfile


def _count_resolutions(monkeypatch) -> dict[str, int]:
    """Wrap every module's reference to ``precision_named`` and ``get_host_profile``, counting the calls that
    read a name (a resolved Precision or HostProfile passes through uncounted)."""
    counts = {"precision": 0, "host": 0}
    named, profile = precision_module.precision_named, host_module.get_host_profile

    def counted_precision(name):
        counts["precision"] += isinstance(name, str)
        return named(name)

    def counted_host(host=None):
        counts["host"] += not isinstance(host, HostProfile)
        return profile(host)

    for module in [m for n, m in sys.modules.items() if n.startswith("dippm_nas")]:
        if getattr(module, "precision_named", None) is named:
            monkeypatch.setattr(module, "precision_named", counted_precision)
        if getattr(module, "get_host_profile", None) is profile:
            monkeypatch.setattr(module, "get_host_profile", counted_host)
    return counts


@pytest.mark.parametrize("cost_model", ["auto", "analytical", "operators", "pmgns", "residual"])
def test_a_prediction_reads_the_precision_and_the_host_once(monkeypatch, cost_model):
    graph = dippm_nas.build_graph("resnet18", batch=8)
    dippm_nas.predict_graph(graph, "a100-40gb", "fp16", cost_model)  # loads what a first prediction loads
    counts = _count_resolutions(monkeypatch)
    p = dippm_nas.predict_graph(graph, "a100-40gb", "fp16", cost_model)
    assert p.precision == "fp16" and p.latency_ms > 0
    assert counts == {"precision": 1, "host": 1}


def test_a_search_reads_them_once_for_all_its_candidates(monkeypatch):
    from dippm_nas.integration import HardwareCostModel

    graph = dippm_nas.build_graph("resnet18", batch=8)
    cost = HardwareCostModel(batch=8, precision="fp16")
    cost.predict(graph)
    counts = _count_resolutions(monkeypatch)
    assert all(cost.predict(graph).latency_ms > 0 for _ in range(3))
    assert counts == {"precision": 0, "host": 0}
